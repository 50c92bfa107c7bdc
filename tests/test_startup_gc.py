"""The svmattn command starts with Python's cyclic garbage collector off and turns it on, with what
its imports made frozen, once they are done (svmattn.startup_gc); any other import of the package
leaves the collector alone."""
import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest

from svmattn import startup_gc

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A site hook that records, at each collection and at exit, the collector's state and its counts.
SITE = textwrap.dedent("""
    import atexit, gc, json, os
    path = os.environ["GC_RECORD"] + "." + str(os.getpid())
    def record(*_):
        with open(path, "w") as f:
            json.dump({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count(),
                       "collections": [g["collections"] for g in gc.get_stats()]}, f)
    gc.callbacks.append(lambda phase, info: phase == "stop" and record())
    atexit.register(record)
    """)


def _records(tmp_path, *command):
  site = tmp_path / "site"
  site.mkdir()
  (site / "sitecustomize.py").write_text(SITE)
  env = dict(os.environ, GC_RECORD=str(tmp_path / "gc"),
             PYTHONPATH=os.pathsep.join([str(site), REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run([sys.executable, *command], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return {p.name: json.loads(p.read_text()) for p in tmp_path.glob("gc.*")}, proc


def test_a_binary_collects_nothing_while_it_imports(tmp_path):
  records, _ = _records(tmp_path, "-m", "experiments.local_convergence", f"--out={tmp_path}/out", "--runs=3",
                        "--steps=20", "--snapshot_every=10", "--noprogress")
  assert len(records) == 1
  (state,) = records.values()
  assert state["enabled"]                     # on again at the end
  assert state["frozen"] > 50_000             # JAX, SciPy, matplotlib and the engine: frozen when it resumed
  assert state["collections"][2] == 0         # the 2-4 full collections of its imports did not happen


@pytest.mark.slow   # (its fast neighbour: test_a_binary_collects_nothing_while_it_imports, the same mechanism)
def test_svm_workers_resume_too(tmp_path):
  records, _ = _records(tmp_path, "-m", "svmattn", "svm_rank", f"--out={tmp_path}/out", "--runs=4", "--ds=4",
                        "--svm_workers=2", "--noprogress")
  workers = [r for r in records.values() if r["frozen"] > 50_000]
  assert len(workers) >= 2                    # the command and its workers froze their imports
  assert all(r["enabled"] for r in records.values())


def test_importing_the_package_leaves_the_collector_alone(tmp_path):
  records, proc = _records(tmp_path, "-c", "import gc, svmattn; print(gc.isenabled(), gc.get_freeze_count())")
  assert proc.stdout.split() == ["True", "0"]
  assert gc.isenabled() and not startup_gc.started_by_command()      # and in this test process


def test_resume_without_pause_does_nothing():
  frozen = gc.get_freeze_count()
  startup_gc.resume()
  assert gc.isenabled() and gc.get_freeze_count() == frozen
