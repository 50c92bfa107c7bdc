"""The package's imports: no cycles among svmattn's modules, and every svmattn import at the top of its module.

The graph is read from the sources (ast): a module-level ``import svmattn.x`` is an edge to svmattn.x,
``from svmattn.x import y`` one to svmattn.x.y where that is a module, else to svmattn.x (a package's
``__init__`` counts as the package). Heavy third-party packages may still be imported where they are used
(flax, scipy.sparse, cvxpy, matplotlib: tests/test_packaging.py), and the registry finds the study
modules by name (``registry.STUDIES``); an svmattn module imported inside a function would hide a cycle.
"""
import ast
import os

from conftest import REPO_ROOT

PACKAGE = os.path.join(REPO_ROOT, "svmattn")


def _modules() -> dict[str, str]:
  """{dotted name: path} of every module of the package."""
  found = {}
  for folder, _, files in os.walk(PACKAGE):
    for name in files:
      if name.endswith(".py"):
        parts = os.path.relpath(os.path.join(folder, name[:-3]), REPO_ROOT).split(os.sep)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = os.path.join(folder, name)
  return found


def _targets(modules: dict, module: str, node) -> set[str]:
  """The svmattn modules an import statement of ``module`` imports."""
  if isinstance(node, ast.Import):
    names = [a.name for a in node.names]
  else:
    base = node.module or ""
    if node.level:
      package = module.split(".") if modules[module].endswith("__init__.py") else module.split(".")[:-1]
      base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
    names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
  return {n for n in names if n in modules and n != module}


def _imports():
  """({module: the modules it imports at its top level}, [(module, line) of imports inside a function])."""
  modules = _modules()
  edges, local = {m: set() for m in modules}, []
  for module, path in modules.items():
    with open(path) as f:
      tree = ast.parse(f.read())

    def walk(node, in_function: bool) -> None:
      for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
          continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
          targets = _targets(modules, module, child)
          if targets and in_function:
            local.append((module, child.lineno))
          elif targets:
            edges[module] |= targets
        walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    walk(tree, False)
  return edges, local


def _cycles(edges: dict) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(edges[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while not component or component[-1] != v:
        component.append(stack.pop())
        on_stack.discard(component[-1])
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(edges):
    if v not in index:
      visit(v)
  return found


def test_the_package_has_no_import_cycle():
  edges, _ = _imports()
  assert len(edges) > 100 and sum(map(len, edges.values())) > 300      # (the graph was read)
  assert _cycles(edges) == []


def test_a_cycle_is_found():
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_svmattn_import_is_at_the_top_of_its_module():
  _, local = _imports()
  assert local == [], f"svmattn modules imported inside a function: {local}"
