"""notebooks/colab_tpu.ipynb: a valid, output-free notebook, and (slow) executed end to end.

The slow test runs it with nbclient in its TINY mode (SVMATTN_NOTEBOOK_TINY=1: reproduce --quick
--only=E1 and an 8-data-set E2 sweep, on the CPU, under a tmp dir instead of Google Drive), three
times into the same output folder, as a user whose Colab runtime went away would:

  1. the sweep's process is killed (SIGKILL) once a checkpoint exists: its cell fails, work/ stays;
  2. the notebook again: the finished reproduction is skipped, the sweep cell resumes (not afresh);
  3. the notebook again: everything is finished, nothing runs, results.npz is left untouched.

The kernel is a "python3" kernelspec written to a tmp dir (JUPYTER_PATH) for this interpreter,
so that the notebook runs in the repository's environment whatever kernels the machine has.

The install cell's Colab branch runs too (slow): with SVMATTN_NOTEBOOK_VENV=DIR and SVMATTN_REPO=a copy
of this checkout it creates a virtual environment, pip installs svmattn into it with requirements.txt as
constraints, checks the pins, and every later cell runs that environment's python. Fast tests cover the
parameters cell's REPO message, the install cell's git clone at URL@REF and the devices cell's precision.
"""
import ast
import json
import shutil
import subprocess
import os
import re
import signal
import sys
import threading
import time

import nbformat
import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO_ROOT, "notebooks", "colab_tpu.ipynb")
CELLS = ["parameters", "install", "helpers", "devices", "drive", "reproduce", "sweep", "report"]


def _code_cells(nb):
  return {c.metadata["tags"][0]: c for c in nb.cells if c.cell_type == "code"}


def test_notebook_is_valid_clean_and_compiles():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  assert nb.nbformat == 4 and nb.metadata.kernelspec.name == "python3"
  cells = _code_cells(nb)
  assert list(cells) == CELLS
  for tag, cell in cells.items():
    assert not cell.outputs and cell.execution_count is None, f"cell {tag} holds outputs: clear them"
    compile(cell.source, tag, "exec")
  assert 'REPO = ""  # @param {type:"string"}' in cells["parameters"].source    # a Colab form field
  assert '"--resume"' in cells["sweep"].source and '"--quick"' in cells["reproduce"].source
  install = cells["install"].source
  assert '"pip", "install", "-q", "-c", requirements, src, *extra' in install
  assert """f"jax[tpu]=={pinned['jax']}\"""" in install


def _run_cell(cell, namespace):
  exec(compile(cell.source, cell.metadata["tags"][0], "exec"), namespace)
  return namespace


def test_parameters_ask_for_repo_when_installing(monkeypatch):
  cell = _code_cells(nbformat.read(NOTEBOOK, as_version=4))["parameters"]
  monkeypatch.delenv("SVMATTN_REPO", raising=False)
  monkeypatch.delenv("SVMATTN_NOTEBOOK_VENV", raising=False)
  assert _run_cell(cell, {})["REPO"] == ""                      # nothing to install: no REPO needed
  monkeypatch.setenv("SVMATTN_NOTEBOOK_VENV", "/tmp/unused-venv")
  with pytest.raises(ValueError, match=r"^REPO is not set: in the first code cell .*SVMATTN_REPO"):
    _run_cell(cell, {})
  monkeypatch.setenv("SVMATTN_REPO", " https://example.org/me/svmattn@v1 ")
  ns = _run_cell(cell, {})
  assert ns["REPO"] == "https://example.org/me/svmattn@v1" and ns["INSTALL"]


def _definitions(cell, **names):
  """The imports and functions of a cell (nothing else of it runs), with ``names`` as globals."""
  tree = ast.parse(cell.source)
  tree.body = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef))]
  namespace = dict(names)
  exec(compile(tree, cell.metadata["tags"][0], "exec"), namespace)
  return namespace


def test_install_clones_repo_at_its_ref(tmp_path):
  origin = tmp_path / "origin"
  git = lambda *a: subprocess.run(["git", "-C", str(origin), *a], check=True, capture_output=True,   # noqa: E731
                                  text=True).stdout.strip()
  origin.mkdir()
  git("init", "-q")
  for text in ("jax==1\n", "jax==2\n"):
    (origin / "requirements.txt").write_text(text)
    git("add", "requirements.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", text)
  first = git("rev-list", "--max-parents=0", "HEAD")
  fetch = _definitions(_code_cells(nbformat.read(NOTEBOOK, as_version=4))["install"], ON_COLAB=False, os=os)["fetch"]
  assert fetch(str(origin)) == str(origin)                      # a folder: used as it is
  for repo, want in ((f"file://{origin}", "jax==2\n"), (f"file://{origin}@{first}", "jax==1\n"),
                     (f"git+file://{origin}@{first}", "jax==1\n")):
    clone = fetch(repo)
    try:
      assert open(os.path.join(clone, "requirements.txt")).read() == want, repo
    finally:
      shutil.rmtree(clone)


@pytest.mark.parametrize("backend, precision, want", [("tpu", "", "float32"), ("cpu", "", "float64"),
                                                      ("gpu", "", "float64"), ("tpu", "float64", "float64")])
def test_devices_cell_sets_the_runs_precision(monkeypatch, backend, precision, want):
  cell = _code_cells(nbformat.read(NOTEBOOK, as_version=4))["devices"]
  monkeypatch.setenv("SVMATTN_PRECISION", "")   # restored after the test (the cell sets it)
  fake_run = lambda cmd: f"[Device(id=0)]\ndefault backend: {backend}\n"   # noqa: E731
  ns = _run_cell(cell, {"os": os, "run": fake_run, "PYTHON": sys.executable, "TPU": backend == "tpu", "PRECISION": precision})
  assert ns["RUN_PRECISION"] == want and os.environ["SVMATTN_PRECISION"] == want


def test_precision_environment_sets_the_binaries_default():
  env = dict(os.environ, SVMATTN_PRECISION="float32", JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-m", "experiments.local_convergence", "--helpfull"], cwd=REPO_ROOT,
                       env=env, capture_output=True, text=True).stdout
  flag = out[out.index("--precision:"):]
  assert "(default: 'float32')" in flag[:flag.index("\n  --", 1)], flag[:600]


# ----------------------------------------------------------------------------
# Executed end to end
# ----------------------------------------------------------------------------

def _listing(out):
  work = os.path.join(out, "work")
  return sorted(os.path.normpath(os.path.join(os.path.relpath(root, work), n))
                for root, dirs, files in os.walk(work) for n in dirs + files)


def _has_checkpoint(paths):
  """A finished checkpoint step of a batch still in training exists."""
  return any(re.fullmatch(r"ckpt_c\d+_b\d+_\w+/\d+", p) for p in paths)


def _sweep_pid(out):
  """The pid of the running `svmattn local_convergence --out=OUT` (not its SVM workers), or None."""
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        args = f.read().decode(errors="replace").split("\0")
    except OSError:
      continue
    if "local_convergence" in args and f"--out={out}" in args:
      return int(pid)
  return None


def _kill_after_a_checkpoint(out, stop, killed):
  """Poll until the sweep in OUT has a checkpoint, freeze it, check again, SIGKILL it (its SVM
  worker exits by itself); appends the frozen listing of OUT/work to ``killed``."""
  while not stop.is_set():
    pid = _sweep_pid(out)
    if pid is not None and _has_checkpoint(_listing(out)):
      try:
        os.kill(pid, signal.SIGSTOP)
      except ProcessLookupError:
        continue
      frozen = _listing(out)
      if _has_checkpoint(frozen):
        os.kill(pid, signal.SIGKILL)
        killed.append(frozen)
        return
      os.kill(pid, signal.SIGCONT)
    time.sleep(0.01)


def _execute(cwd=REPO_ROOT, timeout=300):
  """Run the notebook in ``cwd``: (executed notebook, CellExecutionError or None, {tag: output text})."""
  from nbclient import NotebookClient
  from nbclient.exceptions import CellExecutionError
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = NotebookClient(nb, kernel_name="python3", timeout=timeout, resources={"metadata": {"path": str(cwd)}})
  error = None
  try:
    client.execute()
  except CellExecutionError as e:
    error = e
  text = {}
  for tag, cell in _code_cells(nb).items():
    parts = []
    for o in cell.get("outputs", []):
      parts.append(o.get("text", "") if o.output_type == "stream" else o.get("data", {}).get("text/plain", ""))
      if o.output_type == "error":
        parts.append("\n".join(o.traceback))
    text[tag] = "".join(parts)
  return nb, error, text


@pytest.fixture
def tiny(tmp_path, monkeypatch):
  """The TINY mode's environment and output folder, and a python3 kernel running this interpreter."""
  from ipykernel import kernelspec
  kernelspec.install(prefix=str(tmp_path / "jupyter"))
  monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter" / "share" / "jupyter"))
  monkeypatch.setenv("SVMATTN_NOTEBOOK_TINY", "1")
  monkeypatch.setenv("SVMATTN_NOTEBOOK_OUT", str(tmp_path / "out"))
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  for name in ("SVMATTN_NOTEBOOK_VENV", "SVMATTN_REPO", "SVMATTN_PRECISION"):
    monkeypatch.delenv(name, raising=False)
  return tmp_path / "out"


@pytest.mark.slow   # three kernels and executions: about 20 s on 2 cores (30 s with a cold compilation cache)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the sweep's process in /proc")
def test_notebook_runs_and_its_sweep_resumes_after_a_kill(tiny):
  reproduce, sweep = str(tiny / "reproduce_quick"), str(tiny / "sweep")

  # 1. the sweep killed after its first checkpoint: its cell fails, the run stays resumable
  stop, killed = threading.Event(), []
  killer = threading.Thread(target=_kill_after_a_checkpoint, args=(sweep, stop, killed), daemon=True)
  killer.start()
  try:
    _, error, text = _execute()
  finally:
    stop.set()
    killer.join()
  assert killed, "the sweep finished before it could be killed"
  assert error is not None and "killed by signal 9" in text["sweep"], text["sweep"][-3000:]
  assert f"python: {sys.executable}\n" in text["install"]      # the kernel runs this environment
  assert "not on Colab: nothing installed" in text["install"]
  assert "backend: cpu" in text["devices"] and "runs default to --precision=float64" in text["devices"]
  assert os.path.exists(os.path.join(reproduce, "report.html"))
  assert os.path.exists(os.path.join(reproduce, "paths_2d", "summary.json"))
  assert _has_checkpoint(_listing(sweep)) and not os.path.exists(os.path.join(sweep, "results.npz"))

  # 2. again: the reproduction is skipped, the sweep continues from its checkpoints
  nb, error, text = _execute()
  assert error is None, str(error)[-3000:]
  assert "not run again" in text["reproduce"], text["reproduce"]
  assert "unfinished sweep found; resuming" in text["sweep"], text["sweep"]
  assert "nothing to resume" not in text["sweep"] and "E2 local convergence: 8 data sets" in text["sweep"]
  for name in ("results.npz", "summary.json", "correlation.png", "softmax.png"):
    assert os.path.exists(os.path.join(sweep, name)), name
  assert not os.path.exists(os.path.join(sweep, "work"))
  report = _code_cells(nb)["report"].outputs
  assert any("<iframe srcdoc=" in o.get("data", {}).get("text/html", "") for o in report)
  assert sum("image/png" in o.get("data", {}) for o in report) == 2
  assert "final corr W_vs_fro" in text["report"] and "8 data sets" in text["report"]

  # 3. again: everything is finished; nothing runs
  stamp = os.stat(os.path.join(sweep, "results.npz")).st_mtime_ns
  _, error, text = _execute()
  assert error is None, str(error)[-3000:]
  assert "the sweep is finished; not run again" in text["sweep"], text["sweep"]
  assert "not run again" in text["reproduce"]
  assert os.stat(os.path.join(sweep, "results.npz")).st_mtime_ns == stamp


def _pins():
  with open(os.path.join(REPO_ROOT, "requirements.txt")) as f:
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", f.read(), re.M))


@pytest.mark.slow   # a virtual environment and a pip install of every pinned dependency: about 2-3 min
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the venv's python is bin/python")
def test_notebook_installs_as_on_colab_into_a_fresh_venv(tiny, tmp_path, monkeypatch):
  """The install cell's Colab branch (clone aside, covered above) on a copy of this checkout: svmattn and
  the pinned dependencies go into a new venv, whose python then runs the devices, reproduce and sweep cells."""
  src, venv, cwd = tmp_path / "src", tmp_path / "venv", tmp_path / "cwd"
  files = subprocess.run(["git", "-C", REPO_ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         check=True, capture_output=True).stdout.decode().split("\0")
  for name in filter(None, files):   # the working tree as CI has it (pip builds in the folder it installs)
    if os.path.isfile(os.path.join(REPO_ROOT, name)):
      os.makedirs(os.path.dirname(src / name), exist_ok=True)
      shutil.copy2(os.path.join(REPO_ROOT, name), src / name)
  cwd.mkdir()   # not the checkout: `python -m svmattn` must import the installed package
  monkeypatch.setenv("SVMATTN_NOTEBOOK_VENV", str(venv))
  monkeypatch.setenv("SVMATTN_REPO", str(src))

  _, error, text = _execute(cwd=cwd, timeout=1200)
  assert error is None, str(error)[-3000:]
  install = text["install"]
  assert f"python: {venv}/bin/python\n" in install and f"svmattn {_version()} {venv}/lib/" in install, install
  pins = _pins()
  for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "scipy", "cvxpy"):
    assert f"{name}=={pins[name]} (pinned)" in install, (name, install[-3000:])
  assert "runs default to --precision=float64" in text["devices"]
  assert os.path.exists(os.path.join(tiny, "reproduce_quick", "report.html"))
  assert "E2 local convergence: 8 data sets" in text["sweep"]
  with open(os.path.join(tiny, "sweep", "summary.json")) as f:
    assert json.load(f)["environment"]["jax"] == pins["jax"]


def _version():
  import svmattn
  return svmattn.__version__
