"""The README as written: its quickstart runs, its figure index names real experiments and files.

* The figure index: every row's command names a registered experiment, and each file the row names
  is one the experiment's figure module writes (by its source). In the slow tests, every row's
  command runs with ``--quick`` in a fresh directory and writes every file it names.
* The quickstart: its blocks run in order in a fresh directory, as a user would paste them. A
  python block whose first line is ``# NAME.py`` is that file; the other python blocks run as
  scripts; bash blocks run in a shell, with ``.venv/bin/`` standing for this interpreter's
  environment (slow: about a minute).
* The calibration note of a check below the paper's run size (``Experiment.below_calibration``).
"""
from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys

import pytest

from svmattn import registry

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO_ROOT, "README.md")


def _section(title: str) -> str:
  with open(README) as f:
    text = f.read()
  m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, re.S | re.M)
  assert m, f"README.md has no section '## {title}'"
  return m.group(1)


def _index_rows() -> list[tuple[str, str, list[str]]]:
  """(id, command, files) of every row of the README's figure index."""
  rows = []
  for line in _section("The papers' figures, and the commands that redraw them").splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) != 4 or not cells[2].startswith("`svmattn "):
      continue
    command = cells[2].strip("`")
    files = re.findall(r"`([^`]+)`", cells[3])
    rows.append((cells[1], command, files))
  return rows


ROWS = _index_rows()


def test_the_index_has_every_experiment_that_draws_a_figure():
  ids = {r[0] for r in ROWS}
  drawn = {e.id for e in registry.experiments() if e.figures is not None}
  assert drawn <= ids, f"experiments with figures missing from the README's index: {sorted(drawn - ids)}"


@pytest.mark.parametrize("eid,command,files", ROWS, ids=[f"{r[0]}:{r[1].split('--out=')[-1]}" for r in ROWS])
def test_index_row_names_a_registered_experiment_and_its_files(eid, command, files):
  words = command.split()
  experiment = registry.get(words[1])
  assert experiment.id == eid, f"{command}: runs {experiment.id}, the row says {eid}"
  out = [w.split("=", 1)[1] for w in words if w.startswith("--out=")]
  assert len(out) == 1, f"{command}: one --out=DIR expected"
  assert files, f"{command}: the row names no file"
  source = inspect.getsource(inspect.getmodule(experiment.figures))
  for f in files:
    assert os.path.dirname(f) == out[0], f"{f} is not in {command}'s --out"
    assert f'/{os.path.basename(f)}"' in source, f"{experiment.id}'s figures never write {os.path.basename(f)}"


@pytest.mark.slow
@pytest.mark.parametrize("eid,command,files", ROWS, ids=[f"{r[0]}:{r[1].split('--out=')[-1]}" for r in ROWS])
def test_index_row_command_writes_its_files_at_quick_size(eid, command, files, tmp_path):
  args = command.split()[1:] + ["--quick", "--noprogress"]
  got = subprocess.run([sys.executable, "-m", "svmattn", *args], cwd=tmp_path, capture_output=True, text=True,
                       timeout=900)
  assert got.returncode == 0, got.stderr[-3000:]
  for f in files:
    assert (tmp_path / f).is_file(), f"{command} --quick did not write {f}"


# ----------------------------------------------------------------------------
# The quickstart, as written
# ----------------------------------------------------------------------------


def _quickstart_blocks() -> list[tuple[str, str]]:
  return re.findall(r"```(bash|python)\n(.*?)```", _section("Quickstart"), re.S)


def test_quickstart_has_its_five_parts():
  text = "\n".join(code for _, code in _quickstart_blocks())
  for needed in ("svmattn E2 --runs=", "config.sweep", "results.load(", "class MyAttention(nn.Module)",
                 "EXPERIMENT = registry.Experiment(", "svmattn run --config=my_config.py"):
    assert needed in text, f"the README's quickstart lost {needed!r}"


@pytest.mark.slow
def test_quickstart_runs_as_written(tmp_path):
  venv_bin = os.path.dirname(sys.executable) + os.sep
  env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
  for k, (kind, code) in enumerate(_quickstart_blocks()):
    first = code.splitlines()[0].strip()
    if kind == "python" and re.fullmatch(r"# [\w.]+\.py", first):
      (tmp_path / first[2:]).write_text(code)
      continue
    if kind == "python":
      got = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=600)
    else:
      script = code.replace(".venv/bin/", venv_bin)
      got = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, f"quickstart block {k} ({kind}) failed:\n{code}\n{got.stderr[-3000:]}"
  assert (tmp_path / "runs/e2_small/summary.json").is_file()
  assert (tmp_path / "runs/sweep/summary.json").is_file()
  assert (tmp_path / "runs/mine/summary.json").is_file()


# ----------------------------------------------------------------------------
# A check below the paper's run size says so
# ----------------------------------------------------------------------------


def test_below_calibration_names_the_sizes_that_are_smaller():
  e2 = registry.get("E2")
  defaults = e2.settings.defaults()
  assert e2.below_calibration(defaults) is None
  assert e2.below_calibration({**defaults, "runs": 1000, "steps": 5000}) is None
  note = e2.below_calibration({**defaults, "runs": 20, "steps": 500})
  assert note == (f"calibrated for {defaults['runs']} runs and {defaults['steps']} steps; "
                  "this run has 20 runs and 500 steps")
  assert e2.below_calibration({**defaults, "steps": 500}) == \
      f"calibrated for {defaults['steps']} steps; this run has 500 steps"


def test_a_small_run_prints_the_note_in_each_check_line(capsys):
  from svmattn.execution import run_experiment
  summary = {"checks": [{"name": "mean final corr W_vs_fro", "value": 0.98, "expected": ">= 0.99", "ok": False,
                         "note": "calibrated for 2000 steps; this run has 500 steps"}],
             "timings_s": {"total": 1.0}}
  run_experiment.print_report(["E2"], summary)
  line = [l for l in capsys.readouterr().out.splitlines() if "W_vs_fro" in l][0]
  assert line.endswith("(expected >= 0.99; calibrated for 2000 steps; this run has 500 steps)")


# ----------------------------------------------------------------------------
# The layout, described once (BUILD.md), matches the tree
# ----------------------------------------------------------------------------


def _layout_entries() -> dict[str, str]:
  """{entry name ('io/', 'rng.py', ...): its text} of BUILD.md's svmattn/ layout block."""
  with open(os.path.join(REPO_ROOT, "BUILD.md")) as f:
    text = f.read()
  block = re.search(r"^## Layout\n.*?\n    svmattn/\n(.*?)\n    experiments/", text, re.S | re.M)
  assert block, "BUILD.md has no '## Layout' block starting with svmattn/"
  entries, name = {}, None
  for line in block.group(1).splitlines():
    m = re.match(r"      (\S+)\s+(.*)", line)
    if m:
      name = m.group(1)
      entries[name] = m.group(2)
    elif name is not None:
      entries[name] += " " + line.strip()
  return entries


def test_the_layout_names_every_module_of_the_package():
  entries = _layout_entries()
  names = {e.name for e in registry.experiments()}
  package = os.path.join(REPO_ROOT, "svmattn")
  for item in sorted(os.listdir(package)):
    path = os.path.join(package, item)
    if item.startswith(("_build", "__pycache__")) or item.endswith(".egg-info"):
      continue
    if os.path.isdir(path):
      assert f"{item}/" in entries, f"BUILD.md's layout leaves out svmattn/{item}/"
      words = set(re.findall(r"[\w.]+", entries[f"{item}/"]))
      for module in sorted(os.listdir(path)):
        stem = module[:-3] if module.endswith(".py") else module
        if module.startswith("__") or module == "_build" or module == "__pycache__":
          continue
        if "one module per experiment" in entries[f"{item}/"]:
          assert stem in names, f"svmattn/{item}/{module}: 'one module per experiment', but no experiment is {stem}"
        else:
          assert stem in words or module in words, f"BUILD.md's layout of {item}/ leaves out {module}"
    elif item.endswith(".py"):
      assert item in entries, f"BUILD.md's layout leaves out svmattn/{item}"
  for name in entries:
    assert os.path.exists(os.path.join(package, name.rstrip("/"))), f"BUILD.md's layout names {name}: not in the tree"
  native = os.path.join(package, "train", "native")
  for source in sorted(os.listdir(native)):
    if not source.startswith("_"):
      assert f"native/{source}" in entries["train/"], f"BUILD.md's layout of train/ leaves out native/{source}"


@pytest.mark.slow
def test_the_library_example_runs_and_prints_the_final_corr(tmp_path):
  """The README's library example as written: it prints the mean final corr(W, Frobenius SVM) of 20
  of E2's data sets, which it says is about 0.99 (E2's 100 runs give 0.9987; normalized GD's
  direction converges to the SVM's, docs/science.md section 8)."""
  blocks = re.findall(r"```python\n(.*?)```", _section("Library"), re.S)
  assert len(blocks) == 1, "the README's library section should hold one python example"
  got = subprocess.run([sys.executable, "-c", blocks[0]], cwd=tmp_path, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")})
  assert got.returncode == 0, got.stderr[-3000:]
  value = float(got.stdout.split()[-1])
  assert 0.97 < value <= 1.0, value


def _library_names() -> list[str]:
  """Every ``svmattn...`` name of the README's library table (with the names listed after a comma)."""
  names = []
  for row in _section("Library").splitlines():
    if not row.startswith("| `svmattn"):
      continue
    cell = row.split("|")[1]
    first = re.findall(r"`(svmattn[\w.]+)", cell)
    names += first
    base = first[0].rsplit(".", 1)[0] if "(" in cell.split(",")[0] else first[0]
    names += [f"{base}.{extra}" for extra in re.findall(r",\s*`(\w+)", cell)]
  return names


@pytest.mark.parametrize("name", _library_names())
def test_every_function_the_readme_lists_exists_and_has_a_docstring(name):
  import importlib
  parts = name.split(".")
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:i]))
    except ImportError:
      continue
    for p in parts[i:]:
      assert hasattr(obj, p), f"the README's library lists {name}: no such name"
      obj = getattr(obj, p)
    break
  doc = inspect.getdoc(obj) or ""
  assert len(doc) >= 40, f"{name} has no docstring a user can read"


SWITCHES = {"SVMATTN_CPU_DEVICES", "SVMATTN_NATIVE_KERNEL", "SVMATTN_PRECISION"}
SET_FOR_CHILDREN = {"SVMATTN_CORE_SHARE", "SVMATTN_DIE_WITH_PARENT"}


def test_the_package_reads_three_documented_environment_switches():
  """Every SVMATTN_* name in svmattn/'s Python is one of BUILD.md's three switches or one of the two variables
  the engine sets for its own children, and BUILD.md's table lists the three."""
  import re
  names = set()
  for root, _, files in os.walk(os.path.join(REPO_ROOT, "svmattn")):
    for name in files:
      if name.endswith(".py"):
        with open(os.path.join(root, name), encoding="utf-8") as f:
          names |= set(re.findall(r"SVMATTN_[A-Z0-9_]+", f.read()))
  assert names <= SWITCHES | SET_FOR_CHILDREN, names - SWITCHES - SET_FOR_CHILDREN
  with open(os.path.join(REPO_ROOT, "BUILD.md"), encoding="utf-8") as f:
    build = f.read()
  table = build[build.index("## Environment switches"):build.index("## Developing")]
  assert {n for n in SWITCHES if f"`{n}=" in table} == SWITCHES
