"""reproduce --jobs: experiments run at once, records in registry order, none outlives reproduce.

The experiments' processes are stand-ins (``reproduce.command`` replaced): each writes when it
started and ended and a summary.json, so the scheduling is tested without running an experiment.
"""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import REPO_ROOT
from test_study import _alive, _children, _kill_all
from test_sweep import ENV

from svmattn.report import reproduce

CHILD = textwrap.dedent("""
    import json, os, sys, time
    out, seconds = sys.argv[1], float(sys.argv[2])
    start = time.time()
    time.sleep(seconds)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"checks": [{"name": "c", "ok": True}], "timings_s": {"total": seconds},
                   "span": [start, time.time()]}, f)
""")


def _stand_ins(monkeypatch, seconds: dict):
  def command(run, out):
    return [sys.executable, "-c", CHILD, os.path.join(out, run.dir), str(seconds[run.key])]
  monkeypatch.setattr(reproduce, "command", command)


def _costing(runs, costs):
  """``runs`` with these expected walls (``Run.cost_s``)."""
  return [reproduce.Run(dataclasses.replace(r.experiment, cost_s=c), None) for r, c in zip(runs, costs)]


def test_jobs_run_at_once_and_records_keep_registry_order(tmp_path, monkeypatch):
  chosen = _costing([r for r in reproduce.runs() if r.variant is None][:4], (9, 1, 1, 1))
  # the first run is the longest: with 2 slots the others follow one another beside it
  seconds = dict(zip([r.key for r in chosen], (1.0, 0.2, 0.2, 0.2)))
  _stand_ins(monkeypatch, seconds)
  records = reproduce.run_all(chosen, str(tmp_path), jobs=2)
  assert [r["id"] for r in records] == [r.key for r in chosen]
  assert all(r["returncode"] == 0 and r["checks"] == [{"name": "c", "ok": True}] for r in records)
  spans = [json.load(open(tmp_path / r.dir / "summary.json"))["span"] for r in chosen]
  # at most 2 at once: at every start, fewer than 2 others are running
  for start, _ in spans:
    assert sum(s <= start < e for s, e in spans) <= 2
  assert all(s < spans[0][1] for s, _ in spans[1:]), "the short runs waited for the long one"
  assert all(os.path.exists(tmp_path / r.dir / "log.txt") for r in chosen)


def test_the_longest_start_first_the_paper_before_the_rest(tmp_path, monkeypatch):
  """Starts: the paper's experiments before those beyond it, each group by falling cost_s (ties in
  registry order); the records still come back in registry order."""
  paper = [r for r in reproduce.runs() if r.variant is None and not r.experiment.beyond][:3]
  beyond = [r for r in reproduce.runs() if r.variant is None and r.experiment.beyond][:2]
  chosen = _costing(paper, (1, 5, 1)) + _costing(beyond, (2, 50))
  _stand_ins(monkeypatch, {r.key: 0.1 for r in chosen})
  records = reproduce.run_all(chosen, str(tmp_path), jobs=1)
  assert [r["id"] for r in records] == [r.key for r in chosen]
  starts = {r.key: json.load(open(tmp_path / r.dir / "summary.json"))["span"][0] for r in chosen}
  order = [paper[1], paper[0], paper[2], beyond[1], beyond[0]]
  assert sorted(starts, key=starts.get) == [r.key for r in order]


def test_every_experiment_says_its_cost():
  """reproduce orders its starts by each experiment's cost_s: every one of the registry has one."""
  assert all(r.cost_s > 0 for r in reproduce.runs())


def test_one_job_runs_them_one_after_another(tmp_path, monkeypatch):
  chosen = reproduce.runs()[:3]
  _stand_ins(monkeypatch, {r.key: 0.2 for r in chosen})
  reproduce.run_all(chosen, str(tmp_path), jobs=1)
  spans = sorted(json.load(open(tmp_path / r.dir / "summary.json"))["span"] for r in chosen)
  assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


DRIVER = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    from svmattn.report import reproduce
    child = ("from svmattn.execution import workers; workers.die_with_parent_from_env(); "
             "import os, time; print(os.getpid(), flush=True); time.sleep(600)")
    reproduce.command = lambda run, out: [sys.executable, "-c", child]
    reproduce.run_all(reproduce.runs()[:2], {out!r}, jobs=2)
""")


FORKED = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    from svmattn.report import reproduce
    reproduce.command = lambda run, out: [sys.executable, "-m", "svmattn", "local_convergence",
                                          "--out=" + os.path.join(out, run.dir), "--runs=100000", "--noprogress"]
    assert reproduce.forked.preload() is None
    reproduce.run_all(reproduce.runs()[:2], {out!r}, jobs=2)
""")


@pytest.mark.slow
@pytest.mark.parametrize("driver", [DRIVER, FORKED], ids=["fresh", "forked"])
def test_no_experiment_outlives_a_killed_reproduce(tmp_path, driver):
  """reproduce killed by SIGKILL: the experiments it started (with PARENT_ENV) end too, fresh
  processes or forks of reproduce (svmattn.report.forked), and the forks' SVM workers with them."""
  proc = subprocess.Popen([sys.executable, "-c", driver.format(root=REPO_ROOT, out=str(tmp_path))], env=ENV,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  try:
    deadline, children = time.monotonic() + 120, set()
    while time.monotonic() < deadline and len(children) < 2:
      children = _children(proc.pid)
      time.sleep(0.05)
    assert len(children) >= 2, f"the experiments did not start: {proc.poll()}"
    time.sleep(3.0)                      # past the imports: die_with_parent has run
    children = _children(proc.pid)       # (with the forks' SVM workers)
    assert all(_alive(p) for p in children)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in children):
      time.sleep(0.1)
    assert not [p for p in children if _alive(p)], "an experiment outlived reproduce"
  finally:
    _kill_all(proc)


def test_default_jobs_two_on_the_cpu_one_beside_an_accelerator():
  none = lambda pattern: False           # noqa: E731
  gpu = lambda pattern: pattern.startswith("/dev/nvidia")           # noqa: E731
  tpu = lambda pattern: pattern.startswith("/dev/accel")            # noqa: E731
  assert reproduce.default_jobs({}, none) == 2
  assert reproduce.default_jobs({}, gpu) == 1 and reproduce.default_jobs({}, tpu) == 1
  assert reproduce.default_jobs({"JAX_PLATFORMS": "cpu"}, gpu) == 2      # the accelerator is not used
  assert reproduce.default_jobs({"JAX_PLATFORMS": "tpu,cpu"}, tpu) == 1
  assert reproduce.default_jobs({"JAX_PLATFORMS": "cuda"}, none) == 2    # nothing visible to run on
