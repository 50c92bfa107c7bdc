"""notebooks/colab_tpu.ipynb: a valid, output-free notebook, and (slow) executed end to end.

The slow test runs it with nbclient in its TINY mode (SVMATTN_NOTEBOOK_TINY=1: reproduce --quick
--only=E1 and an 8-data-set E2 sweep, on the CPU, under a tmp dir instead of Google Drive), three
times into the same output folder, as a user whose Colab runtime went away would:

  1. the sweep's process is killed (SIGKILL) once a checkpoint exists: its cell fails, work/ stays;
  2. the notebook again: the finished reproduction is skipped, the sweep cell resumes (not afresh);
  3. the notebook again: everything is finished, nothing runs, results.npz is left untouched.

The kernel is a "python3" kernelspec written to a tmp dir (JUPYTER_PATH) for this interpreter,
so that the notebook runs in the repository's environment whatever kernels the machine has.
"""
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
  assert 'REPO = "https://github.com/svmattn/svmattn"' in cells["parameters"].source
  assert '"--resume"' in cells["sweep"].source and '"--quick"' in cells["reproduce"].source


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


def _execute():
  """Run the notebook: (executed notebook, CellExecutionError or None, {tag: output text})."""
  from nbclient import NotebookClient
  from nbclient.exceptions import CellExecutionError
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = NotebookClient(nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": REPO_ROOT}})
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
  assert "backend: cpu" in text["devices"]
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
