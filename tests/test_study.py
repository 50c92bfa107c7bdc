"""The study pipeline (svmattn.execution): grids of cells, early stops, workers that die with their
parent, flags checked before any work, and E4 (a grid with training) killed and resumed or
shared by two processes, equal to one uninterrupted process."""
import dataclasses
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest

from conftest import REPO_ROOT
import svmattn
from svmattn.report import reproduce
from svmattn.execution import pipeline
from svmattn.execution import study_runner
from test_sweep import ENV, assert_same_results, kill_when, listing, load

# ----------------------------------------------------------------------------
# The pipeline on a host-only toy study (no JAX): grids, early stop, resume
# ----------------------------------------------------------------------------


def _load(cell, runs):
  rng = [np.random.default_rng([cell.label["k"], int(r)]) for r in runs]
  return {"x": np.array([g.normal() for g in rng])}


def _analyze(label, data, stages):
  return {"run": data["runs"], "x": data["x"], "k": np.full(len(data["runs"]), label["k"])}


def _enough(label, arrays):
  return int(np.sum(arrays["x"] > 0)) >= 3


def _toy(batch_size, enough=None, runs=10):
  cells = tuple(pipeline.Cell({"k": k}, runs) for k in (1, 2))
  return pipeline.Study("toy", cells, _load, lambda cell: (), _analyze, batch_size, 0, {"batch": "any"}, enough)


@pytest.mark.parametrize("batch_size", [1, 3, 10])
def test_cells_are_the_same_whatever_the_batch_size(tmp_path, batch_size):
  out = pipeline.run(_toy(batch_size), str(tmp_path), workers=0, show_progress=False)
  for k, arrays in zip((1, 2), out.cells):
    np.testing.assert_array_equal(arrays["run"], np.arange(10))
    np.testing.assert_array_equal(arrays["x"], _load(pipeline.Cell({"k": k}, 10), np.arange(10))["x"])
  assert os.path.exists(tmp_path / "work" / "run.json")   # finish() removes it, not run()


def test_default_workers_one_beside_training_one_per_core_without(monkeypatch):
  """No --svm_workers: 1 beside training (the device's programs use the cores), one per usable
  core (at most MAX_DEFAULT_WORKERS) for a study that trains nothing."""
  assert pipeline.default_workers(True) == 1
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
  assert pipeline.default_workers(False) == 3
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
  assert pipeline.default_workers(False) == pipeline.MAX_DEFAULT_WORKERS
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})
  assert pipeline.default_workers(False) == 0        # one core: the study solves them itself
  assert pipeline.default_workers(True) == 1
  assert pipeline.default_workers(True, light_analysis=True) == 0 == pipeline.default_workers(False, True)


def test_default_workers_count_the_cores_a_parent_shares_out(monkeypatch):
  """SVMATTN_CORE_SHARE (set by `svmattn reproduce` for the experiments it runs at once): the cores a
  study that trains nothing counts on, at most the usable ones; a bad value is ignored."""
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
  for share, want in (("1", 0), ("2", 2), ("3", 3), ("64", 4), ("0", 4), ("x", 4), ("", 4)):
    monkeypatch.setenv(svmattn.CORE_SHARE_ENV, share)
    assert pipeline.default_workers(False) == want, share
    assert pipeline.default_workers(True) == 1
  monkeypatch.setenv(svmattn.CORE_SHARE_ENV, "1")
  assert reproduce._environ(jobs=2)[svmattn.CORE_SHARE_ENV] == "1"   # the share itself, not widened
  monkeypatch.delenv(svmattn.CORE_SHARE_ENV)
  assert reproduce._environ(jobs=2)[svmattn.CORE_SHARE_ENV] == "2"   # 4 cores, 2 experiments at once
  assert reproduce._environ(jobs=3)[svmattn.CORE_SHARE_ENV] == "1"
  assert reproduce._environ(jobs=8)[svmattn.CORE_SHARE_ENV] == "1"
  assert reproduce._environ(jobs=1)[svmattn.CORE_SHARE_ENV] == "4"


def test_a_light_analysis_runs_in_this_process_and_gives_the_same_cells(tmp_path):
  """A study marked light_analysis starts no worker without --svm_workers, and its cells are those
  an explicit worker pool gives."""
  light = dataclasses.replace(_toy(3), light_analysis=True)
  started = []
  real_pool = pipeline.workers_lib.pool
  try:
    pipeline.workers_lib.pool = lambda n: started.append(n) or real_pool(n)
    here = pipeline.run(light, str(tmp_path / "here"), show_progress=False)
    assert started == []
    pooled = pipeline.run(light, str(tmp_path / "pooled"), workers=1, show_progress=False)
    assert started == [1]
  finally:
    pipeline.workers_lib.pool = real_pool
  for a, b in zip(here.cells, pooled.cells):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


def test_workers_start_before_the_first_job():
  """``workers.start`` spawns every worker at once (a process pool otherwise spawns one only when a
  job arrives), each importing the module of what it is given; the pool then runs jobs as usual."""
  from svmattn.execution import workers as workers_lib
  pool = workers_lib.pool(2)
  try:
    assert not getattr(pool, "_processes", None)          # nothing spawned before a job or a start
    workers_lib.start(pool, 2, _analyze)
    assert len(pool._processes) == 2
    assert pool.submit(_analyze, {"k": 3}, {"runs": np.arange(2), "x": np.ones(2)}, {}).result(60)["k"].tolist() == [3, 3]
  finally:
    pool.shutdown(wait=True)


def test_a_study_that_trains_nothing_gives_the_same_cells_with_its_default_workers(tmp_path):
  """workers=None (the default: a pool of one process per core here, the toy study trains
  nothing) gives the cells of workers=0 (in the main process), early stop included."""
  inline = pipeline.run(_toy(2, _enough, runs=20), str(tmp_path / "inline"), workers=0, show_progress=False)
  pooled = pipeline.run(_toy(2, _enough, runs=20), str(tmp_path / "pooled"), workers=None, show_progress=False)
  for a, b in zip(inline.cells, pooled.cells):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize("batch_size, workers", [(1, 0), (2, 0), pytest.param(4, 2, marks=pytest.mark.slow)])   # (a sibling: slow)
def test_early_stop_keeps_the_first_batches_that_suffice(tmp_path, batch_size, workers):
  """A cell stops at the first batch after which ``enough`` holds; extra batches trained while
  workers were busy are not used, so the results depend on the batch size only through that."""
  study = _toy(batch_size, _enough, runs=40)
  out = pipeline.run(study, str(tmp_path), workers=workers, show_progress=False)
  for c, arrays in enumerate(out.cells):
    x = _load(study.cells[c], np.arange(40))["x"]
    third = int(np.flatnonzero(x > 0)[2])           # the run at which 3 positives are reached
    end = -(-(third + 1) // batch_size) * batch_size  # the end of that run's batch
    np.testing.assert_array_equal(arrays["run"], np.arange(min(end, 40)))


def test_a_cell_stopping_early_is_not_analyzed_beyond_its_last_batch(tmp_path):
  """With workers, a cell's next batch does not start while one of its batches is being analyzed
  (another cell's does), so the pool analyzes exactly the batches that the cells keep."""
  cells = tuple(pipeline.Cell({"k": k}, 40) for k in (1, 2, 3, 4))
  study = pipeline.Study("toy", cells, _load, lambda cell: (), _analyze, 2, 0, {"batch": "any"}, _enough)
  out = pipeline.run(study, str(tmp_path), workers=2, show_progress=False)
  assert out.work["sets_analyzed"] == sum(len(arrays["run"]) for arrays in out.cells)
  for c, arrays in enumerate(out.cells):
    x = _load(cells[c], np.arange(40))["x"]
    end = -(-(int(np.flatnonzero(x > 0)[2]) + 1) // 2) * 2
    np.testing.assert_array_equal(arrays["run"], np.arange(end))


def test_growing_batches_cover_every_run_once_and_replay_finds_them():
  """Study.grow: GROWTH_START batches of batch_size, then doubling up to GROWTH_CAP times it;
  the batches tile the runs in order, and unit_of finds each run's batch and row."""
  study = dataclasses.replace(_toy(3, _enough, runs=500), grow=True)
  todo = [u for u in pipeline.units(study) if u.cell == 0]
  sizes = [len(u.runs) for u in todo]
  start = pipeline.GROWTH_START
  assert sizes[:start] == [3] * start
  assert sizes[start:start + 3] == [6, 12, 24]
  assert max(sizes) == 3 * pipeline.GROWTH_CAP and sizes[-2] == 3 * pipeline.GROWTH_CAP
  np.testing.assert_array_equal(np.concatenate([u.runs for u in todo]), np.arange(500))
  for u in todo:
    for row, run in enumerate(u.runs):
      assert pipeline.unit_of(study, 0, int(run)) == (u.batch, row)
  plain = _toy(3, _enough, runs=500)
  assert pipeline.identity(study) != pipeline.identity(plain)   # a resume never mixes the two layouts


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_growing_batches_give_the_cells_of_fixed_ones(tmp_path, workers):
  """A growing study's cells hold the runs of the fixed-batch study up to the end of the batch that
  completed them: the same per-run results, whatever the batching."""
  def enough(label, arrays):          # about 20 of 200 runs qualify: the cell needs several batches
    return int(np.sum(arrays["x"] > 1.3)) >= 8
  fixed = pipeline.run(_toy(5, enough, runs=200), str(tmp_path / "fixed"), workers=workers, show_progress=False)
  study = dataclasses.replace(_toy(5, enough, runs=200), grow=True)
  grown = pipeline.run(study, str(tmp_path / "grown"), workers=workers, show_progress=False)
  for c, (a, b) in enumerate(zip(fixed.cells, grown.cells)):
    ends = [int(u.runs[-1]) + 1 for u in pipeline.units(study) if u.cell == c]
    end = next(e for e in ends if e >= len(a["run"]))   # the growing batch holding fixed's last run
    assert len(a["run"]) < 200 and len(ends) > pipeline.GROWTH_START
    np.testing.assert_array_equal(b["run"], np.arange(end))
    np.testing.assert_array_equal(b["x"][:len(a["x"])], a["x"])


@dataclasses.dataclass(frozen=True)
class _DeviceStage:
  """A toy device stage that records the thread and the JAX default device it ran on. With a
  ``meet`` barrier it waits there for the other stage: the two run at once or the wait times out."""
  name: str
  concurrent: bool = True
  meet: Any = dataclasses.field(default=None, compare=False)
  steps = 1

  def run(self, batch, runs, seed, progress, checkpoints):
    import jax
    import threading
    if self.meet is not None:
      self.meet.wait(timeout=60)     # (threading.BrokenBarrierError when the other never comes)
    progress(1)
    y = np.asarray(batch["x"]) * (2.0 if self.name == "a" else 3.0)
    device = jax.numpy.zeros(1).devices().pop()
    return {"y": y, "thread": np.full(len(runs), threading.get_ident()), "device": np.full(len(runs), device.id)}, 0.0


def _analyze_stages(label, data, stages):
  return {"run": data["runs"], **{f"{k}_{name}": v[k] for name, v in stages.items() for k in v}}


@pytest.mark.parametrize("concurrent", [True, False])
def test_concurrent_stages_run_at_once_on_their_own_devices(tmp_path, concurrent):
  """Stages marked ``concurrent`` (E7's paths) run on threads at once (each waits for the other at a
  barrier), stage j with local device j (mod the count) as the default device, with the results of
  running them in turn. (Without the barrier, a stage that finished before the other was handed out
  let the pool reuse its thread on a busy host, and the threads' identities proved nothing.)"""
  import jax
  import threading
  cells = (pipeline.Cell({"k": 1}, 6),)
  meet = threading.Barrier(2) if concurrent else None
  study = pipeline.Study("toy", cells, _load, lambda cell: (_DeviceStage("a", concurrent, meet),
                                                            _DeviceStage("b", concurrent, meet)),
                         _analyze_stages, 3, 0, {"stages": concurrent})
  out = pipeline.run(study, str(tmp_path), workers=0, show_progress=False).cells[0]
  x = _load(cells[0], np.arange(6))["x"]
  np.testing.assert_array_equal(out["y_a"], 2.0 * x)
  np.testing.assert_array_equal(out["y_b"], 3.0 * x)
  devices = [d.id for d in jax.local_devices()]
  if concurrent:
    assert np.all(out["thread_a"] != out["thread_b"])
    assert set(out["device_a"]) == {devices[0]} and set(out["device_b"]) == {devices[1 % len(devices)]}
  else:
    assert np.all(out["thread_a"] == out["thread_b"])


def test_output_counts_the_work_done(tmp_path):
  """Output.work: what the floors of benchmark --suites=stages are computed from."""
  out = pipeline.run(_toy(3), str(tmp_path), workers=0, show_progress=False)
  assert out.work == {"cells": 2, "sets_loaded": 20, "data_bytes": 20 * 8, "dataset_steps": 0, "sets_analyzed": 20}


def _slow_load(cell, runs):
  time.sleep(0.2)
  return _load(cell, runs)


def _slow_analyze(label, data, stages):
  time.sleep(0.6)
  return _analyze(label, data, stages)


def test_the_wait_for_data_is_what_the_loads_add_to_the_wall(tmp_path):
  """timings data_s counts the loads wherever they ran; data_wait_s the main loop's waits for them.
  One unit loads on the main loop itself (the wait holds the load); with four, the next unit loads
  on the prefetch thread while this one is analyzed (0.6 s against a load's 0.2 s), so the loop
  waits for the first load alone."""
  one = pipeline.Study("toy", (pipeline.Cell({"k": 1}, 3),), _slow_load, lambda cell: (), _analyze, 3, 0,
                       {"batch": "any"})
  t = pipeline.run(one, str(tmp_path / "one"), workers=0, show_progress=False).timings
  assert t["data_s"] >= 0.2 and t["data_wait_s"] >= t["data_s"]
  cells = tuple(pipeline.Cell({"k": k}, 10) for k in (1, 2))
  four = pipeline.Study("toy", cells, _slow_load, lambda cell: (), _slow_analyze, 5, 0, {"batch": "any"})
  t = pipeline.run(four, str(tmp_path / "four"), workers=0, show_progress=False).timings
  assert t["data_s"] >= 0.8
  assert 0.2 <= t["data_wait_s"] < 0.5 * t["data_s"]


def _timed_analyze(label, data, stages):
  """_analyze with its start and end recorded. Cell 1's batch is the long one: it ends once cells 4
  and 5 have started, or after 60 s (a loop that waits for every batch in flight starts them only
  after it: then the test fails); the others take 0.05 s. (A fixed 1.5 s for cell 1 failed on a
  loaded machine, where the other worker took longer than that for cells 2-5.)"""
  folder = os.environ["SVMATTN_TEST_TIMES"]
  start = time.time()
  k = label["k"]
  if k == 1:
    while time.time() < start + 60 and not all(os.path.exists(os.path.join(folder, f"k{j}.started")) for j in (4, 5)):
      time.sleep(0.01)
  else:
    open(os.path.join(folder, f"k{k}.started"), "w").close()
    time.sleep(0.05)
  with open(os.path.join(folder, f"k{k}"), "w") as f:
    f.write(f"{start} {time.time()}")
  return _analyze(label, data, stages)


def test_a_study_that_trains_nothing_keeps_its_workers_busy(tmp_path, monkeypatch):
  """With nothing to train (E3, E9), the loop waits for one analysis when workers + 1 are in
  flight, not for all of them: beside a long analysis (cell 1's), the other worker takes the next
  batches as they come. Waiting for all, cell 4's batch would start after cell 1's ended."""
  monkeypatch.setenv("SVMATTN_TEST_TIMES", str(tmp_path))
  cells = tuple(pipeline.Cell({"k": k}, 2) for k in (1, 2, 3, 4, 5))
  study = pipeline.Study("toy", cells, _load, lambda cell: (), _timed_analyze, 2, 0, {"batch": "any"})
  out = pipeline.run(study, str(tmp_path / "out"), workers=2, show_progress=False)
  times = {k: [float(x) for x in (tmp_path / f"k{k}").read_text().split()] for k in (1, 2, 3, 4, 5)}
  assert times[4][0] < times[1][1] and times[5][0] < times[1][1]
  for k, arrays in zip((1, 2, 3, 4, 5), out.cells):
    np.testing.assert_array_equal(arrays["run"], np.arange(2))
    np.testing.assert_array_equal(arrays["x"], _load(cells[k - 1], np.arange(2))["x"])


def test_resume_refuses_another_study(tmp_path):
  pipeline.run(_toy(3), str(tmp_path), workers=0, show_progress=False)
  with pytest.raises(pipeline.StudyError, match="unfinished run"):
    pipeline.run(_toy(3), str(tmp_path), workers=0, show_progress=False)
  with pytest.raises(pipeline.StudyError, match="another run"):
    pipeline.run(_toy(4), str(tmp_path), resume=True, workers=0, show_progress=False)
  again = pipeline.run(_toy(3), str(tmp_path), resume=True, workers=0, show_progress=False)
  np.testing.assert_array_equal(again.cells[1]["run"], np.arange(10))


@pytest.mark.parametrize("damage", ["overwritten", "truncated"])
def test_a_damaged_batch_file_is_computed_again(tmp_path, damage):
  """--resume over a finished batch whose file was damaged recomputes that batch (a warning names it)."""
  first = pipeline.run(_toy(5), str(tmp_path), workers=0, show_progress=False)
  target = tmp_path / "work" / "c0000_b00001.arrays"
  target.write_bytes(b"not a zip" if damage == "overwritten" else target.read_bytes()[:100])
  again = pipeline.run(_toy(5), str(tmp_path), resume=True, workers=0, show_progress=False)
  for a, b in zip(first.cells, again.cells):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  assert again.work["sets_loaded"] == 5        # only the damaged batch was computed again


def test_a_resume_never_continues_another_numerics_versions_run(tmp_path, monkeypatch):
  """The numerics version is part of a run's identity: --resume over a run another version started is
  refused (naming it), and a fresh start replaces it."""
  import svmattn
  pipeline.run(_toy(3), str(tmp_path), workers=0, show_progress=False)      # unfinished: work/ stays
  monkeypatch.setattr(svmattn, "NUMERICS_VERSION", "older")
  with pytest.raises(pipeline.StudyError, match="numerics_version"):
    pipeline.run(_toy(3), str(tmp_path), resume=True, workers=0, show_progress=False)
  out = pipeline.run(_toy(3), str(tmp_path), workers=0, show_progress=False)
  np.testing.assert_array_equal(out.cells[0]["run"], np.arange(10))


def test_a_resume_never_continues_on_another_gd_kernel(tmp_path, monkeypatch):
  """The GD kernel decides a run's rounding, so it is part of the run's identity: a run started on
  one kernel is not resumed on the other, and the refusal names both."""
  from svmattn.train import native_kernel
  monkeypatch.setattr(native_kernel, "kernel_name", lambda: "native-cpu")
  pipeline.run(_toy(3), str(tmp_path), workers=0, show_progress=False)      # unfinished: work/ stays
  monkeypatch.setattr(native_kernel, "kernel_name", lambda: "xla")
  with pytest.raises(pipeline.StudyError, match="gd_kernel: the run in .* has 'native-cpu', this command has 'xla'"):
    pipeline.run(_toy(3), str(tmp_path), resume=True, workers=0, show_progress=False)
  monkeypatch.setattr(native_kernel, "kernel_name", lambda: "native-cpu")
  out = pipeline.run(_toy(3), str(tmp_path), resume=True, workers=0, show_progress=False)
  np.testing.assert_array_equal(out.cells[0]["run"], np.arange(10))


def test_a_fresh_start_replaces_another_runs_work(tmp_path):
  """A failed run's work directory does not block the corrected command: a fresh start over
  another run's work replaces it; --resume with other settings says to drop --resume."""
  pipeline.run(_toy(3), str(tmp_path), workers=0, show_progress=False)      # unfinished: work/ stays
  with pytest.raises(pipeline.StudyError, match="Drop --resume"):
    pipeline.run(_toy(4), str(tmp_path), resume=True, workers=0, show_progress=False)
  out = pipeline.run(_toy(4), str(tmp_path), workers=0, show_progress=False)
  np.testing.assert_array_equal(out.cells[0]["run"], np.arange(10))
  with open(tmp_path / "work" / "run.json") as f:
    assert json.load(f)["batch_size"] == 4


def test_a_fresh_start_removes_the_old_records(tmp_path):
  (tmp_path / "runs").mkdir()
  (tmp_path / "runs" / "cell_0007.npz").write_bytes(b"old")
  pipeline.run(_toy(3), str(tmp_path), workers=0, show_progress=False)
  assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------
# Worker processes exit when their parent is killed
# ----------------------------------------------------------------------------


def _children(pid):
  """Every descendant process of ``pid`` (from /proc)."""
  parent = {}
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        with open(f"/proc/{name}/stat") as f:
          parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
      except (OSError, IndexError, ValueError):
        pass
  found, frontier = set(), {pid}
  while frontier:
    frontier = {p for p, pp in parent.items() if pp in frontier} - found
    found |= frontier
  return found


def _kill_all(proc):
  """Kill ``proc`` and every other process this test process started (a test's cleanup)."""
  if proc.poll() is None:
    proc.kill()
    proc.wait()
  for p in _children(os.getpid()):
    try:
      os.kill(p, signal.SIGKILL)
    except OSError:
      pass


def _alive(pid):
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


@pytest.mark.slow
def test_no_worker_outlives_its_parents_sigkill(tmp_path):
  args = ["--n=3", "--T=4", "--d=5", "--runs=40", "--batch_size=4", "--block_size=4", "--steps=400",
          "--chunk_steps=100", "--svm_workers=2", "--noprogress"]
  proc = subprocess.Popen([sys.executable, "-m", "experiments.local_convergence", f"--out={tmp_path / 'out'}",
                           *args], cwd=REPO_ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  try:
    deadline, workers = time.monotonic() + 120, set()
    while time.monotonic() < deadline and proc.poll() is None:
      workers = _children(proc.pid)
      if len(workers) >= 2:
        break
      time.sleep(0.05)
    assert len(workers) >= 2, f"no worker processes started: {proc.poll()} {workers}"
    time.sleep(0.3)
    workers = _children(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)          # the main process only, not its process group
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in workers):
      time.sleep(0.1)
    left = [p for p in workers if _alive(p)]
    assert not left, f"{len(left)} of {len(workers)} processes outlived their parent"
  finally:
    _kill_all(proc)


PARENT = """
import os, re, sys, time
sys.path.insert(0, {root!r})
from svmattn.execution import workers as workers_lib
pool = workers_lib.pool(1)
fut = pool.submit(re.match, "(a+)+$", "a" * 60 + "b")   # backtracking in C, holding the GIL for ages
while not pool._processes:
  time.sleep(0.01)
print(*pool._processes, flush=True)
time.sleep(600)
"""


def test_a_worker_holding_the_gil_dies_with_its_parent(tmp_path):
  """A solver that holds the GIL (the watch thread cannot run) is still killed with its parent."""
  proc = subprocess.Popen([sys.executable, "-c", PARENT.format(root=REPO_ROOT)], env=ENV, stdout=subprocess.PIPE,
                          text=True)
  try:
    worker = int(proc.stdout.readline().split()[0])
    time.sleep(1.0)                              # the worker is inside sum(), holding the GIL
    assert _alive(worker)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(worker):
      time.sleep(0.05)
    assert not _alive(worker), "the worker outlived its parent"
  finally:
    _kill_all(proc)


# ----------------------------------------------------------------------------
# Bad flags: one error line naming the flag, nothing written, no traceback
# ----------------------------------------------------------------------------

BAD_E2 = ["--n=0", "--T=1", "--m=0", "--lr=nan", "--lr=-1", "--steps=-5", "--optimizer=bogus", "--batch_size=0",
          "--svm_workers=-1", "--params=V", "--query_pos=8", "--runs=0", "--loss_scale=x", "--block_size=0",
          "--num_processes=2"]


@pytest.mark.slow   # long (subprocesses); .ci/run runs the slow tests too
def test_bad_flags_of_local_convergence(tmp_path):
  procs = {}
  for i, flag in enumerate(BAD_E2):
    procs[flag] = subprocess.Popen([sys.executable, "-m", "experiments.local_convergence",
                                    f"--out={tmp_path / str(i)}", flag], cwd=REPO_ROOT, env=ENV,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  for i, (flag, p) in enumerate(procs.items()):
    _, err = p.communicate(timeout=120)
    name = flag.split("=")[0]
    assert p.returncode != 0, flag
    assert "Traceback" not in err, (flag, err[-2000:])
    assert name in err or (flag == "--num_processes=2" and "--coordinator_address" in err), (flag, err[-2000:])
    assert not os.path.exists(tmp_path / str(i)), flag


# ----------------------------------------------------------------------------
# E4: a grid with training, killed and resumed; two processes of two devices
# ----------------------------------------------------------------------------

E4_FLAGS = ("--runs=6", "--n_values=2,3", "--T=3", "--d_min=2", "--d_max=3", "--steps=200", "--chunk_steps=50",
            "--batch_size=4", "--noprogress", "--checkpoint_every_s=0")   # (kills land between checkpoints)


def _e4(out, *args, env=ENV, timeout=300):
  return subprocess.run([sys.executable, "-m", "experiments.overparam", f"--out={out}", *E4_FLAGS, *args],
                        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def e4_reference(tmp_path_factory):
  out = tmp_path_factory.mktemp("e4_reference")
  proc = _e4(out)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert not os.path.exists(out / "work")
  return out


@pytest.mark.slow   # long (subprocesses); .ci/run runs the slow tests too
def test_e4_killed_at_random_moments_then_resumed_equals_uninterrupted(e4_reference, tmp_path):
  rng = random.Random(4)
  out = tmp_path / "killed"
  kills = 0
  for attempt in range(3):
    log = open(tmp_path / f"log_{attempt}.txt", "w")
    proc = subprocess.Popen([sys.executable, "-m", "experiments.overparam", f"--out={out}", *E4_FLAGS,
                             *(["--resume"] if attempt else [])], cwd=REPO_ROOT, env=ENV, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = log
    before, seen = set(listing(out)), []
    delay = rng.uniform(0.0, 1.5)

    def condition(paths, before=before, seen=seen, delay=delay):
      if not seen and set(paths) - before:
        seen.append(time.monotonic())
      return bool(seen) and time.monotonic() >= seen[0] + delay
    if kill_when(proc, out, condition) is None:
      break
    kills += 1
  assert kills >= 1
  if os.path.exists(out / "work"):
    proc = _e4(out, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
  assert not os.path.exists(out / "work")
  assert_same_results(out, e4_reference)
  for c in range(4):
    a, b = load(out / "runs" / f"cell_{c:04d}.npz"), load(e4_reference / "runs" / f"cell_{c:04d}.npz")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f") for k in a)


@pytest.mark.slow   # long (subprocesses); .ci/run runs the slow tests too
def test_e4_two_processes_of_two_devices_equal_one_process(e4_reference, tmp_path):
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  env = dict(ENV, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
  procs = [subprocess.Popen([sys.executable, "-m", "experiments.overparam", f"--out={tmp_path}", *E4_FLAGS,
                             f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={p}"],
                            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for p in range(2)]
  for p in procs:
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
  assert not os.path.exists(tmp_path / "work")
  assert_same_results(tmp_path, e4_reference)


def test_a_directory_in_use_is_refused(tmp_path):
  """Two processes never run one study in one directory (e.g. --resume while the first run is
  still alive): the second is refused, the first's files are untouched."""
  work, lock = pipeline._prepare(str(tmp_path), _toy(3), False, 0, 1)   # this "process" holds the run
  before = sorted(os.listdir(work))
  with pytest.raises(pipeline.StudyError, match="in use by another running process"):
    pipeline.run(_toy(3), str(tmp_path), resume=True, workers=0, show_progress=False)
  assert sorted(os.listdir(work)) == before
  os.close(lock)                                                         # it ended
  out = pipeline.run(_toy(3), str(tmp_path), resume=True, workers=0, show_progress=False)
  np.testing.assert_array_equal(out.cells[0]["run"], np.arange(10))


def test_an_analysis_in_this_process_gets_the_arrays_a_read_back_would_give(tmp_path):
  """pipeline._as_loaded (what an analysis in the training process gets instead of reading the files
  it has just written) against work_files.write then load_arrays, and against an .npz read back:
  the same values, dtypes, shapes and memory order (which decides the order of a reduction's sums),
  and writable copies."""
  from svmattn.io import atomic_files as results_io
  from svmattn.io import work_files
  base = np.arange(24.0).reshape(4, 6) / 7
  arrays = {"c": base, "f": np.asfortranarray(base), "strided": base[:, ::2], "transposed": base.T,
            "transposed_strided": base.T[:, ::2],
            "strings": np.array(["ok", "stalled"]), "flags": np.array([True, False]), "scalar": np.float64(0.1),
            "ints": np.arange(5, dtype=np.int32)[::-1]}
  path, npz = str(tmp_path / "u.arrays"), str(tmp_path / "u.npz")
  work_files.write(path, arrays)
  results_io.write_npz(npz, arrays)
  read, kept, from_npz = pipeline.load_arrays(path), pipeline._as_loaded(arrays), pipeline.load_arrays(npz)
  assert sorted(read) == sorted(kept) == sorted(from_npz)
  for k in read:
    for a in (read[k], from_npz[k]):
      b = kept[k]
      assert (a.dtype, a.shape, a.flags.c_contiguous, a.flags.f_contiguous) == \
          (b.dtype, b.shape, b.flags.c_contiguous, b.flags.f_contiguous), k
      assert a.tobytes(order="A") == b.tobytes(order="A"), k
    assert read[k].flags.writeable and b.flags.writeable and not np.shares_memory(b, np.asarray(arrays[k])), k


def test_a_replay_on_another_gd_kernel_is_refused_naming_both(monkeypatch):
  from svmattn.execution import replay
  from svmattn.train import native_kernel
  monkeypatch.setattr(native_kernel, "kernel_name", lambda: "xla")
  monkeypatch.setattr(native_kernel, "why_not", lambda: "SVMATTN_NATIVE_KERNEL=0")
  with pytest.raises(replay.ReplayError, match="trained on the native-cpu GD kernel, this process has the xla one"):
    replay._same_kernel({"gd_kernel": "native-cpu"}, "OUT/runs/study.json")
  replay._same_kernel({"gd_kernel": "xla"}, "OUT/runs/study.json")          # the same kernel: no error
  replay._same_kernel({}, "OUT/runs/study.json")                            # a record from before: no check


def test_a_finished_run_is_never_replaced(tmp_path):
  """A run into a directory that holds a finished run: the same study is "already complete" (nothing
  rewritten); another study is refused naming what differs, and the finished run stays whole."""

  def write(output):
    (tmp_path / "summary.json").write_text("{}")

  opts = study_runner.Options(workers=0, progress=False)
  study_runner.run(_toy(3), str(tmp_path), write, opts)
  assert study_runner.finished_differences(str(tmp_path), _toy(3)) == []
  before = {p.name: p.read_bytes() for p in (tmp_path / "runs").iterdir()}
  with pytest.raises(study_runner.AlreadyComplete, match="already complete"):
    study_runner.run(_toy(3), str(tmp_path), write, opts)
  with pytest.raises(pipeline.StudyError, match=r"holds a finished run with other settings: batch_size: "
                     r"the finished run has 3, this command has 4\. Nothing was changed"):
    study_runner.run(_toy(4), str(tmp_path), write, opts)
  assert {p.name: p.read_bytes() for p in (tmp_path / "runs").iterdir()} == before
  assert not (tmp_path / "work").exists()
  (tmp_path / "work").mkdir()                      # a run still working here: not a finished one
  assert study_runner.finished_differences(str(tmp_path), _toy(4)) is None


def test_of_two_runs_started_at_once_one_wins_and_the_other_stops_in_one_line(tmp_path, monkeypatch):
  """Two runs into one --out at the same instant: both find no work directory; the one whose
  rename comes second stops with a StudyError naming the other run, and leaves no temporary
  directory (the other run's work directory is untouched)."""
  other = tmp_path / "work"
  real = pipeline.results_io.write_json

  def racing(path, value):             # the other run creates OUT/work between the check and the rename
    real(path, value)
    if not other.exists():
      other.mkdir()
      (other / "run.json").write_text("{\"the other run\": 1}")

  monkeypatch.setattr(pipeline.results_io, "write_json", racing)
  with pytest.raises(pipeline.StudyError, match="another run started in it at the same moment"):
    pipeline.run(_toy(3), str(tmp_path), workers=0, show_progress=False)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]
  assert (other / "run.json").read_text() == "{\"the other run\": 1}"


def test_overwrite_swap_and_its_recovery(tmp_path):
  """overwrite.swap replaces OUT whole by the staged run; a kill between its two renames (no OUT, the
  stage finished) is completed by overwrite.recover, which also removes a replaced run left beside."""
  from svmattn.execution import overwrite
  out = tmp_path / "out"
  stage = overwrite.staging(str(out))
  assert stage == str(tmp_path / ".out.overwrite")
  for d, text in ((out, "old"), (tmp_path / ".out.overwrite", "new")):
    d.mkdir()
    (d / "summary.json").write_text(text)
  (out / "replay_3.npz").write_text("stale")
  overwrite.swap(str(out), stage)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (out / "summary.json").read_text() == "new"
  os.replace(out, tmp_path / ".out.overwrite")        # killed after the first rename of a swap
  (tmp_path / ".out.replaced").mkdir()
  overwrite.recover(str(out))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (out / "summary.json").read_text() == "new"
  (tmp_path / ".out.overwrite").mkdir()
  (tmp_path / ".out.overwrite" / "work").mkdir()          # an unfinished stage is never moved into place
  os.rename(out, tmp_path / "elsewhere")
  overwrite.recover(str(out))
  assert not out.exists() and (tmp_path / ".out.overwrite" / "work").is_dir()
