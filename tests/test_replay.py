"""experiments.replay: one data set of an E2 run retrained alone, step by step, equals the batch.

Claim (svmattn.train.loop): with a fixed block size a data set's trajectory does not depend
on the batch it ran in, so a replay reproduces the batch's snapshots bit for bit, and a
replay started from a checkpoint of an unfinished run continues the very same trajectory.
The E2 runs are those of test_sweep.py (E2_FLAGS: 10 data sets in batches of 4, blocks
of 2, 150 steps in chunks of 50, a snapshot every 10), shared within a session.
"""
import hashlib
import json
import os
import re
import shutil

import numpy as np
import pytest

from svmattn.analysis import metrics
from test_sweep import BATCH, RUNS, e2, finished_run, load, unfinished_run

# End to end through the binary (a few seconds to a minute each): with the slow tests, which CI runs;
# the README's test command keeps the library's own tests.
pytestmark = pytest.mark.slow

STEPS, CHUNK = 150, 50
PARAMS = ("W", "KQ")


def replay(out, run, *args):
  return e2(out, f"--run={run}", *args, module="experiments.replay", flags=())


def _copy(src, dst):
  shutil.copytree(src, dst)  # the replay writes into OUT: keep the shared runs untouched
  return dst


@pytest.fixture(scope="module")
def partial(tmp_path_factory):
  """(OUT, run, {P: newest checkpoint step or None}) of the unfinished run: the run chosen in
  the batch whose checkpoints the kill left behind."""
  out = _copy(unfinished_run(tmp_path_factory), tmp_path_factory.mktemp("replay") / "partial")
  ckpts = {}
  for name in os.listdir(out / "work"):
    m = re.fullmatch(r"ckpt_c0000_b(\d+)_(\w+)", name)
    steps = [int(s) for s in os.listdir(out / "work" / name) if s.isdigit()] if m else []
    if steps:
      ckpts[(int(m.group(1)), m.group(2))] = max(steps)
  assert len({k for k, _ in ckpts}) == 1, ckpts  # one batch in training at a time
  k = next(iter(ckpts))[0]
  return out, BATCH * k + 1, {p: ckpts.get((k, p)) for p in PARAMS}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, partial):
  """(OUT, results.npz, {run: (exit status, replay json, replay npz)}) for two replays of the
  finished run: the data set the partial run is replayed on (or run 1) and run 9, the last
  batch's second (the batch holds 8 and 9, padded to nothing: blocks of 2)."""
  out = _copy(finished_run(tmp_path_factory), tmp_path_factory.mktemp("replay") / "finished")
  runs = sorted({partial[1] if partial[1] != RUNS - 1 else 1, RUNS - 1})
  replays = {}
  for run in runs:
    proc = replay(out, run, "--save_trajectory")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    with open(out / f"replay_{run}.json") as f:
      replays[run] = (proc, json.load(f), load(out / f"replay_{run}.npz"))
  return out, load(out / "results.npz"), replays


def test_replays_are_identical_to_the_batch(finished):
  out, ref, replays = finished
  assert RUNS - 1 in replays and len(replays) == 2
  for run, (proc, report, arrays) in replays.items():
    assert report["run"] == run and report["source"] == str(out / "runs" / "study.json")
    assert report["study"] == "local_convergence" and report["cell"] == 0
    assert report["compared_with"] == str(out / "runs" / "cell_0000.npz")
    assert report["differ"] == [] and all(report["identical"].values()) and len(report["identical"]) > 20
    assert f"run {run} of the run: {len(report['identical'])}/{len(report['identical'])} per-run arrays " \
           "identical to the batch" in proc.stdout
    np.testing.assert_array_equal(arrays["steps"], np.arange(STEPS + 1))
    at = np.searchsorted(arrays["steps"], ref["steps"])
    np.testing.assert_array_equal(arrays["steps"][at], ref["steps"])
    for p in PARAMS:
      assert report["stages"][p]["from_step"] == 0
      assert f"run {run} {p}: {STEPS + 1} steps from step 0" in proc.stdout
      # the replay's per-step record, read at the snapshot steps, is the batch's record bit for bit
      W = arrays[f"W_{p}"]
      assert W.shape == (STEPS + 1, 5, 5)
      assert np.array_equal(W[-1], ref[f"W_final_{p}"][run])
      assert np.array_equal(arrays[f"max_prob_{p}"][at], ref[f"max_prob_{p}"][run])
      assert np.array_equal(arrays[f"loss_{p}"][at], ref[f"loss_{p}"][run])
      assert np.array_equal(arrays[f"attention_{p}"], ref[f"attention_{p}"][run])
      for norm in ("fro", "nuc"):  # the snapshots themselves, through their correlation curves
        curve = metrics.corr(W[at], ref[f"svm_{norm}_{p}"][run])
        assert np.all(np.isfinite(curve))
        assert np.array_equal(curve, ref[f"corr_{p}_{norm}"][run]), (run, p, norm)


def test_replay_from_a_checkpoint_continues_the_same_trajectory(partial, finished):
  out, run, newest = partial
  assert any(newest.values())
  ask = CHUNK * max(c for c in newest.values() if c) + 7  # the newest checkpoint at or before this step
  proc = replay(out, run, f"--step={ask}", "--save_trajectory")
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  with open(out / f"replay_{run}.json") as f:
    report = json.load(f)
  assert report["source"] == str(out / "work" / "run.json")
  arrays = load(out / f"replay_{run}.npz")
  _, ref, replays = finished
  _, _, from_zero = replays[run]
  for p in PARAMS:
    first = CHUNK * newest[p] if newest[p] else 0
    assert report["stages"][p]["from_step"] == first
    if not newest[p]:
      assert f"{p}: no checkpoint at or before step {ask}; replaying from step 0" in proc.stdout
    W = arrays[f"W_{p}"]
    assert W.shape == (STEPS + 1 - first, 5, 5)
    assert np.array_equal(W[-1], from_zero[f"W_{p}"][-1])      # the replay from step 0
    assert np.array_equal(W, from_zero[f"W_{p}"][first:])       # step by step
    assert np.array_equal(arrays[f"max_prob_{p}"], from_zero[f"max_prob_{p}"][first:])
    assert np.array_equal(W[-1], ref[f"W_final_{p}"][run])     # and the finished run's batch


def test_replay_keeps_no_trajectory_unless_asked(tmp_path, tmp_path_factory, finished):
  """Without --save_trajectory: the same comparison, no per-step file, and the record says how to
  get one; with it, the size of the file is printed."""
  out = _copy(finished_run(tmp_path_factory), tmp_path / "out")
  proc = replay(out, 2)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  report = json.loads((out / "replay_2.json").read_text())
  assert not os.path.exists(out / "replay_2.npz") and report["differ"] == [] and len(report["identical"]) > 20
  assert "--save_trajectory" in report["trajectory"] and "trajectory:" not in proc.stdout
  with_file, _, _ = finished[2][sorted(finished[2])[0]]
  size = re.search(r"trajectory: \S+replay_\d+\.npz, ([0-9.]+) MB \((\d+) steps of 2 training stage", with_file.stdout)
  assert size and int(size.group(2)) == STEPS + 1, with_file.stdout[-2000:]
  refused = replay(out, 2, "--step=10")
  assert refused.returncode != 0 and "pass it with --save_trajectory" in refused.stderr


def test_run_out_of_range(tmp_path, tmp_path_factory):
  out = _copy(finished_run(tmp_path_factory), tmp_path / "out")
  proc = replay(out, RUNS)
  assert proc.returncode != 0
  assert f"error: --run={RUNS}: the study's cell 0 has data sets 0..{RUNS - 1}" in proc.stderr, proc.stderr[-3000:]
  assert not os.path.exists(out / f"replay_{RUNS}.npz")


def test_directory_without_a_run(tmp_path):
  proc = replay(tmp_path, 0)
  assert proc.returncode != 0
  assert f"error: {tmp_path} holds no study run" in proc.stderr, proc.stderr[-3000:]
  assert os.listdir(tmp_path) == []


def test_a_ragged_record_is_named_in_one_line(tmp_path, tmp_path_factory):
  """A run's record whose per-run arrays stop short of the data set replayed: one line naming the
  damaged record, and no replay written."""
  out = _copy(finished_run(tmp_path_factory), tmp_path / "out")
  record = out / "runs" / "cell_0000.npz"
  arrays = load(record)
  key = sorted(k for k, a in arrays.items() if np.ndim(a) and len(a) == RUNS)[0]
  arrays[key] = arrays[key][:RUNS - 2]
  np.savez(record, **arrays)
  study = json.loads((out / "runs" / "study.json").read_text())     # (a record written ragged, as recorded)
  study["cells"][0]["sha256"] = hashlib.sha256(record.read_bytes()).hexdigest()
  (out / "runs" / "study.json").write_text(json.dumps(study))
  proc = replay(out, RUNS - 1)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert f"has no row {RUNS - 1}" in proc.stderr and "damaged" in proc.stderr, proc.stderr[-2000:]
  assert not os.path.exists(out / f"replay_{RUNS - 1}.npz")


def test_a_deleted_or_replaced_record_is_named(tmp_path, tmp_path_factory):
  """A finished run whose runs/cell_0000.npz is gone, or is another file: one line saying so, never
  "not analyzed yet" and never a comparison with the wrong file."""
  out = _copy(finished_run(tmp_path_factory), tmp_path / "out")
  record = out / "runs" / "cell_0000.npz"
  arrays = load(record)
  np.savez_compressed(record, **arrays, note=np.zeros(RUNS))     # every array kept, another file: not the one recorded
  proc = replay(out, 1)
  assert proc.returncode != 0 and "damaged or replaced" in proc.stderr and "Traceback" not in proc.stderr, \
      proc.stderr[-2000:]
  record.unlink()
  proc = replay(out, 1)
  assert proc.returncode != 0 and "cell_0000.npz is missing" in proc.stderr, proc.stderr[-2000:]
  assert "not been analyzed" not in proc.stdout
