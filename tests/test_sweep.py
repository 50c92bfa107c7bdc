"""Interrupted runs: train() resumed from checkpoints, and the E2 binary killed and resumed.

The claim (svmattn.train.loop, svmattn.execution.pipeline): a run interrupted at any moment and continued
with --resume produces results bit for bit equal to an uninterrupted run, and the
number of SVM worker processes changes nothing but the wall time.

The E2 runs (``finished_run``, ``unfinished_run``, run once per session) and the helpers are
shared with test_replay.py.
"""
import os
import random
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from conftest import REPO_ROOT
from svmattn.config import common
from svmattn.io import checkpoint as ckpt_lib
from svmattn.train import loop as train_lib
from svmattn.train import native_kernel

# ----------------------------------------------------------------------------
# train(): interrupted after k chunks, resumed from the checkpoints
# ----------------------------------------------------------------------------


class Interrupt(Exception):
  pass


def _config(param):
  # schedule [(10, 2)] * 3: 3 chunks of one compiled shape (schedules are tested in test_train.py);
  # blocks of 3 for a batch of 4: the second block is padded
  return train_lib.TrainConfig(param=param, steps=60, snapshot_every=10, chunk_steps=20, block_size=3)


def _assert_same_trajectory(got, want):
  for field in ("steps", "W", "max_prob", "loss", "attention"):
    a, b = getattr(got, field), getattr(want, field)
    assert a.dtype == b.dtype and np.array_equal(a, b), field
  for a, b in zip(jax.tree_util.tree_leaves(got.params), jax.tree_util.tree_leaves(want.params)):
    assert np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b)


@pytest.mark.parametrize("param, precision, k", [("W", "float64", 2), pytest.param("KQ", "float32", 1, marks=pytest.mark.slow)])
def test_train_interrupted_and_resumed_is_bit_identical(request, tmp_path, param, precision, k):
  data = request.getfixturevalue("batch" if precision == "float64" else "batch32")
  keys = request.getfixturevalue("keys")
  config = _config(param)
  plan = train_lib.schedule(config.steps, config.snapshot_every, config.chunk_steps)
  assert len(plan) == 3
  reference = train_lib.train(config, data, keys)  # no checkpoints at all
  assert reference.W.dtype == np.dtype(precision)
  meta = {"config": param, "precision": precision}

  calls = []

  def stop_after_k(steps):
    calls.append(steps)
    if len(calls) == k:
      raise Interrupt

  with pytest.raises(Interrupt):
    train_lib.train(config, data, keys, progress=stop_after_k, checkpoints=ckpt_lib.Checkpoints(tmp_path, meta))
  assert ckpt_lib.Checkpoints(tmp_path, meta).steps() == list(range(max(1, k - 2), k + 1))  # keep=3

  resumed_calls = []
  ckpt = ckpt_lib.Checkpoints(tmp_path, meta)
  resumed = train_lib.train(config, data, keys, progress=resumed_calls.append, checkpoints=ckpt)
  _assert_same_trajectory(resumed, reference)
  # it did resume: first the steps restored, then only the chunks after the k-th
  done = sum(every * n for every, n in plan[:k])
  assert resumed_calls == [done] + [every * n for every, n in plan[k:]]
  assert ckpt.steps() == [1, 2]   # none after the last chunk: the caller writes the results then

  # a finished run's checkpoints: only the last chunk is trained again, the same trajectory
  again = []
  _assert_same_trajectory(train_lib.train(config, data, keys, progress=again.append,
                                          checkpoints=ckpt_lib.Checkpoints(tmp_path, meta)), reference)
  assert again == [sum(every * n for every, n in plan[:-1]), plan[-1][0] * plan[-1][1]]


def test_checkpoints_at_most_once_per_interval_change_no_result(batch, keys, tmp_path, monkeypatch):
  """With every_s, a chunk is saved only when that long has passed since the last save (a fake clock
  that advances 11 s at each progress report, which follows a chunk's save, every_s 10: chunk 1 is
  not saved, 0 s after the start, chunk 2 is, 11 s after); stopped after chunk 2 and resumed, the
  run continues from chunk 2 and ends bit for bit as an uninterrupted one, and with every_s beyond
  the run it saves nothing and, stopped, starts again from step 0."""
  config = _config("W")
  plan = train_lib.schedule(config.steps, config.snapshot_every, config.chunk_steps)
  reference = train_lib.train(config, batch, keys)
  clock = [1000.0]
  monkeypatch.setattr(ckpt_lib.time, "monotonic", lambda: clock[0])
  calls = []

  def tick_and_stop_after_two(steps):          # progress is reported after a chunk's save
    clock[0] += 11.0
    calls.append(steps)
    if len(calls) == 2:
      raise Interrupt

  for every_s, saved, first in ((10.0, [2], 2), (1e9, [], 0)):
    out = tmp_path / f"every_{every_s:g}"
    calls.clear()
    with pytest.raises(Interrupt):
      train_lib.train(config, batch, keys, progress=tick_and_stop_after_two,
                      checkpoints=ckpt_lib.Checkpoints(out, {}, every_s=every_s))
    assert ckpt_lib.Checkpoints(out, {}).steps() == saved
    resumed_calls = []
    resumed = train_lib.train(config, batch, keys, progress=resumed_calls.append,
                              checkpoints=ckpt_lib.Checkpoints(out, {}, every_s=every_s))
    _assert_same_trajectory(resumed, reference)
    done = sum(every * n for every, n in plan[:first])
    assert resumed_calls == ([done] if first else []) + [every * n for every, n in plan[first:]]


@pytest.mark.slow   # (CI runs it with the slow tests: the test command stays under 5 minutes)
def test_resumed_at_a_chunk_of_another_shape_runs_the_same_programs(batch, keys, tmp_path, monkeypatch):
  """Schedule [(10, 2), (10, 2), (10, 1)]: the last chunk has its own compiled shape, which never
  starts a run. Resumed there, the run uses the programs of the uninterrupted run (XLA may round one
  computation differently in programs holding different parts), and ends bit-identical. (The XLA
  programs: with the native kernel, train.native_train compiles none.)"""
  monkeypatch.setattr(native_kernel, "ENABLED", False)
  monkeypatch.setattr(train_lib, "_JIT_CACHE", {})
  config = train_lib.TrainConfig(param="W", steps=50, snapshot_every=10, chunk_steps=20, block_size=3)
  plan = train_lib.schedule(config.steps, config.snapshot_every, config.chunk_steps)
  assert plan == [(10, 2), (10, 2), (10, 1)]
  used, compiled = [], train_lib._compiled
  monkeypatch.setattr(train_lib, "_compiled", lambda trainer, kind, mesh, *static: (
      used.append((kind,) + static), compiled(trainer, kind, mesh, *static))[1])
  reference = train_lib.train(config, batch, keys)
  uninterrupted = set(used)
  assert uninterrupted == {("chunk", 10, 2, True), ("chunk", 10, 1, False)}

  calls = []

  def stop_after_two(steps):
    calls.append(steps)
    if len(calls) == 2:
      raise Interrupt

  with pytest.raises(Interrupt):
    train_lib.train(config, batch, keys, progress=stop_after_two, checkpoints=ckpt_lib.Checkpoints(tmp_path, {}))
  used.clear()
  resumed = train_lib.train(config, batch, keys, checkpoints=ckpt_lib.Checkpoints(tmp_path, {}))
  assert set(used) == {("chunk", 10, 1, False)}
  _assert_same_trajectory(resumed, reference)


def test_train_refuses_another_runs_checkpoints(batch, keys, tmp_path):
  config = _config("W")
  train_lib.train(config, batch, keys, checkpoints=ckpt_lib.Checkpoints(tmp_path, {"steps": 60}))
  with pytest.raises(ckpt_lib.CheckpointError, match="steps: checkpoint has 60, this run has 99"):
    train_lib.train(config, batch, keys, checkpoints=ckpt_lib.Checkpoints(tmp_path, {"steps": 99}))


# ----------------------------------------------------------------------------
# The E2 binary: killed with SIGKILL and resumed
# ----------------------------------------------------------------------------

# 10 data sets in batches of 4 (the last one holds 2), blocks of 2; 3 chunks of 50 steps per
# parameterization and batch: 18 checkpoints, 3 batch result files.
E2_FLAGS = ("--n=3", "--T=4", "--d=5", "--runs=10", "--batch_size=4", "--block_size=2", "--steps=150",
            "--chunk_steps=50", "--snapshot_every=10", "--noprogress",
            "--checkpoint_every_s=0")   # (a checkpoint after every chunk: the kills below wait for one)
RUNS, BATCH = 10, 4


# The persistent compilation cache of the binaries, also for experiments.replay (which does not
# turn it on itself): it only saves compile time.
ENV = dict(os.environ, PYTHONPATH=REPO_ROOT, JAX_COMPILATION_CACHE_DIR=common.DEFAULT_CACHE_DIR,
           JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


def e2(out, *args, module="experiments.local_convergence", flags=E2_FLAGS, timeout=300):
  """Run a binary to completion: CompletedProcess."""
  return subprocess.run([sys.executable, "-m", module, f"--out={out}", *flags, *args], cwd=REPO_ROOT, env=ENV,
                        capture_output=True, text=True, timeout=timeout)


def start(out, *args, log=None):
  """Start the E2 binary in its own process group (so that a kill takes its SVM workers too)."""
  log = open(log or os.devnull, "w")
  proc = subprocess.Popen([sys.executable, "-m", "experiments.local_convergence", f"--out={out}", *E2_FLAGS, *args],
                          cwd=REPO_ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
  proc.log = log
  return proc


def listing(out):
  """Every path under OUT/work, relative to it."""
  work = os.path.join(out, "work")
  found = []
  for root, dirs, files in os.walk(work):
    rel = os.path.relpath(root, work)
    found += [os.path.normpath(os.path.join(rel, n)) for n in dirs + files]
  return sorted(found)


def kill_when(proc, out, condition, timeout=300):
  """Poll OUT/work until ``condition(listing)`` holds, then freeze the process group
  (SIGSTOP), check the condition again on the frozen files and SIGKILL the group.

  Returns the listing at the kill, or None if the process ended first (its exit status
  must be 0)."""
  deadline = time.monotonic() + timeout
  try:
    while time.monotonic() < deadline:
      if proc.poll() is not None:
        assert proc.returncode == 0, _log(proc)
        return None
      if condition(listing(out)):
        try:
          os.killpg(proc.pid, signal.SIGSTOP)
        except ProcessLookupError:  # it has just ended
          continue
        frozen = listing(out)
        if condition(frozen):
          os.killpg(proc.pid, signal.SIGKILL)
          proc.wait()
          return frozen
        os.killpg(proc.pid, signal.SIGCONT)
      time.sleep(0.005)
    raise AssertionError(f"no kill within {timeout}s:\n{_log(proc)}")
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
    proc.log.close()


def _log(proc):
  name = proc.log.name
  proc.log.flush()
  return open(name).read()[-3000:] if os.path.exists(name) else ""


def load(path):
  with np.load(path, allow_pickle=False) as f:
    return {k: f[k] for k in f.files}


def assert_same_results(out, reference):
  got, want = load(os.path.join(out, "results.npz")), load(os.path.join(reference, "results.npz"))
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
    nan = np.issubdtype(value.dtype, np.floating)
    assert np.array_equal(got[key], value, equal_nan=nan), key


def assert_finished(out):
  assert not os.path.exists(os.path.join(out, "work"))
  assert os.path.exists(os.path.join(out, "summary.json"))


_FINISHED = {}


def finished_run(tmp_path_factory):
  """OUT of one uninterrupted E2 run with E2_FLAGS (run once per session, then shared)."""
  if "out" not in _FINISHED:
    out = tmp_path_factory.mktemp("e2_finished")
    proc = e2(out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_finished(out)
    _FINISHED["out"] = str(out)
  return _FINISHED["out"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  return finished_run(tmp_path_factory)


def has_checkpoint(paths):
  """A finished checkpoint step of a batch still in training exists."""
  return any(re.fullmatch(r"ckpt_c\d+_b\d+_\w+/\d+", p) for p in paths)


@pytest.mark.slow   # kill -9 and --resume end to end (.ci/run runs it; E4's runs in the default suite)
def test_killed_three_times_then_resumed_equals_uninterrupted(reference, tmp_path):
  """SIGKILL at random moments, three times, then --resume to the end:
    1. a random moment after the first checkpoint appeared, while a checkpoint exists
       (so that the next run must continue a batch from its checkpoint);
    2. (--resume) a random delay after the start, maybe before it wrote anything;
    3. (--resume) a random moment after it wrote something new (a checkpoint, a batch's
       trajectory or results, ...).
  Each kill takes the SVM worker processes too (the process group)."""
  rng = random.Random(20230830)
  out = tmp_path / "killed"
  kills, finished = [], False
  for attempt in range(3):
    proc = start(out, *(["--resume"] if attempt else []), log=tmp_path / f"log_{attempt}.txt")
    before, seen, t0 = set(listing(out)), [], time.monotonic()
    if attempt == 0:
      delay = rng.uniform(0.0, 0.3)

      def condition(paths, seen=seen, delay=delay):
        if not seen and has_checkpoint(paths):
          seen.append(time.monotonic())
        return bool(seen) and time.monotonic() >= seen[0] + delay and has_checkpoint(paths)
    elif attempt == 1:
      delay = rng.uniform(1.0, 4.0)
      condition = lambda paths, t0=t0, delay=delay: time.monotonic() >= t0 + delay  # noqa: E731
    else:
      delay = rng.uniform(0.0, 0.5)

      def condition(paths, before=before, delay=delay, seen=seen):
        if not seen and set(paths) - before:
          seen.append(time.monotonic())
        return bool(seen) and time.monotonic() >= seen[0] + delay
    killed = kill_when(proc, out, condition)
    if killed is None:   # it finished before the kill: nothing left to resume
      finished = True
      break
    kills.append(killed)
  for i, k in enumerate(kills):  # shown with pytest -s
    print(f"kill {i + 1}:", [p for p in k if re.fullmatch(r"ckpt_c\d+_b\d+_\w+/\d+|[^/]*\.npz|[^/]*tmp[^/]*", p)])
  assert kills and has_checkpoint(kills[0]), kills
  if not finished:
    proc = e2(out, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
  assert_finished(out)
  assert_same_results(out, reference)


_UNFINISHED = {}


def unfinished_run(tmp_path_factory):
  """OUT of an E2 run with E2_FLAGS killed while a checkpoint of some batch existed
  (run once per session, then shared; never modified by the tests that use it)."""
  if "out" not in _UNFINISHED:
    out = tmp_path_factory.mktemp("e2_unfinished")
    killed = kill_when(start(out, log=out.parent / "e2_unfinished.log"), out,
                       has_checkpoint)
    assert killed is not None, "the run finished before it could be killed"
    _UNFINISHED["out"] = out
  return _UNFINISHED["out"]


@pytest.fixture(scope="module")
def unfinished(tmp_path_factory):
  return unfinished_run(tmp_path_factory)


@pytest.mark.slow   # (the fast set keeps a sibling of this check; CI runs the slow ones too)
def test_unfinished_run_needs_resume(unfinished):
  before = listing(unfinished)
  proc = e2(unfinished)
  assert proc.returncode != 0
  assert "--resume" in proc.stderr and "unfinished run" in proc.stderr, proc.stderr[-3000:]
  assert listing(unfinished) == before  # refused without touching anything
  assert not os.path.exists(unfinished / "results.npz")


def test_resume_with_other_flags_is_refused(unfinished):
  before = listing(unfinished)
  proc = e2(unfinished, "--resume", flags=tuple(f if not f.startswith("--steps=") else "--steps=200"
                                                for f in E2_FLAGS))
  assert proc.returncode != 0
  assert "another run" in proc.stderr and "steps" in proc.stderr, proc.stderr[-3000:]
  assert re.search(r"steps: the run in \S+ has 150, this command has 200", proc.stderr), proc.stderr[-3000:]
  assert proc.stderr.count("this command has") == 1  # only the differing flag is named
  assert listing(unfinished) == before


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_svm_workers_do_not_change_results(reference, tmp_path, workers):
  proc = e2(tmp_path, f"--svm_workers={workers}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert_finished(tmp_path)
  assert_same_results(tmp_path, reference)
