"""E5 binary end to end at tiny size: kept runs pass the rules, the recorded Gen-SVM
objects and correlations are consistent with the recorded data, the counts add up,
the results do not depend on the batch size, a run killed at a random moment and
resumed gives the same results, the study is rebuilt from its summary's flags, and
bad flags end the binary before it writes anything."""
import json
import os
import random
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO_ROOT
from svmattn.analysis import metrics
from svmattn.data import datasets as data_lib
from svmattn.models import heads
from svmattn.execution import study_runner
from svmattn.studies import multi_token as e5
from svmattn.svm import gensvm
from test_health_studies import check_summary
from test_sweep import ENV
from test_sweep import assert_same_results
from test_sweep import has_checkpoint
from test_sweep import kill_when

# End to end through the binary (a few seconds to a minute each): with the slow tests, which CI runs;
# the README's test command keeps the library's own tests.
pytestmark = pytest.mark.slow

FLAGS = ["--ds=4", "--runs=3", "--steps=300", "--snapshot_every=50", "--chunk_steps=100", "--lr=0.5",
         "--noprogress", "--checkpoint_every_s=0"]   # (a checkpoint after every chunk: the kill waits for one)


def _run(out, *args):
  return subprocess.run([sys.executable, "-m", "experiments.multi_token", f"--out={out}", *FLAGS, *args],
                        cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
  out = {}
  for batch, flag in ((16, "--batch_size"), (5, "--batch")):   # --batch: the old name of --batch_size
    path = tmp_path_factory.mktemp(f"e5_b{batch}")
    proc = _run(path, f"{flag}={batch}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out[batch] = (path, proc.stdout)
  return out


def test_results_are_consistent(outputs):
  path, stdout = outputs[16]
  assert "E5 multi-token" in stdout
  r = np.load(path / "results.npz")
  summary = json.loads((path / "summary.json").read_text())
  runs = r["runs_d4"]
  assert len(runs) == 3 and np.all(np.diff(runs) > 0)
  np.testing.assert_array_equal(r["steps"], np.arange(0, 301, 50))
  # the recorded data are the generator's data sets of those runs, all with a negative label
  spec = data_lib.DataSpec(3, 4, 4)
  regen = data_lib.generate(spec, 0, runs, heads.RELU)
  for name, key in (("X", "X_d4"), ("Z", "Z_d4"), ("v", "V_d4"), ("Y", "Y_d4")):
    np.testing.assert_array_equal(np.asarray(getattr(regen, name)), r[key])
  assert np.all(np.any(r["Y_d4"] < 0, axis=1))
  for b in range(len(runs)):
    s, W = r["attention_d4"][b], r["W_gd_d4"][b]
    assert gensvm.discard_reason(s) == ""
    res = gensvm.gen_svm(r["X_d4"][b], r["Z_d4"][b], s, W)
    assert res.ok
    np.testing.assert_allclose(res.W_svmeq, r["W_svmeq_d4"][b], atol=1e-9)
    for obj in ("svmeq", "mm", "1token"):
      np.testing.assert_allclose(r[f"corr_{obj}_d4"][b, -1], metrics.corr(W, r[f"W_{obj}_d4"][b]), atol=1e-12)
  # counts: every drawn run is skipped or trained; every trained run has one outcome
  c = summary["per_d"]["4"]["counts"]
  assert c["drawn"] == runs[-1] + 1 == c["skipped_no_negative_label"] + c["trained"]
  assert c["trained"] == sum(c[k] for k in ("kept", "intermediate", "finite", "infeasible", "failed"))
  assert c["kept"] == 3
  outcomes = r["trained_outcome_d4"]
  np.testing.assert_array_equal(r["trained_runs_d4"][outcomes == "kept"], runs)
  check_summary(summary, r, {"d4": c["trained"]}, threshold=0.0)      # health of the trained draws
  for key in ("experiment", "flags", "timings_s", "environment", "checks"):
    assert key in summary
  for check in summary["checks"]:
    assert set(check) - {"note"} == {"name", "value", "expected", "ok"} and isinstance(check["ok"], bool)
  assert (path / "correlation.png").stat().st_size > 0 and (path / "scatter.png").stat().st_size > 0
  assert not (path / "work").exists()


def test_per_draw_record_covers_the_draws_in_run_order(outputs):
  """OUT/runs/cell_0000.npz: one row per analyzed draw, in run order; skipped draws are
  those without a negative label, and the kept ones of results.npz are its first kept rows."""
  path, _ = outputs[16]
  rec, r = np.load(path / "runs" / "cell_0000.npz"), np.load(path / "results.npz")
  np.testing.assert_array_equal(rec["runs"], np.arange(len(rec["runs"])))
  assert len(rec["runs"]) % 16 == 0       # whole batches (the cell stops after the batch that has enough)
  np.testing.assert_array_equal(rec["outcome"] == "skipped", ~np.any(rec["Y"] < 0, axis=1))
  kept = np.flatnonzero(rec["outcome"] == "kept")[:3]
  np.testing.assert_array_equal(kept, r["runs_d4"])
  np.testing.assert_array_equal(rec["corr_svmeq"][kept], r["corr_svmeq_d4"])


def test_results_do_not_depend_on_the_batch_size(outputs):
  assert_same_results(outputs[5][0], outputs[16][0])


def test_study_is_rebuilt_from_the_summary_flags(outputs):
  """build(summary["flags"]) is the run's study: the same cells, and a draw (kept or skipped)
  loaded, trained and analyzed alone equals its row of the run's record bit for bit."""
  path, _ = outputs[16]
  fl = json.loads((path / "summary.json").read_text())["flags"]
  saved = json.loads((path / "runs" / "study.json").read_text())
  study = e5.build(fl)
  assert [[c.label, c.runs] for c in study.cells] == [[c["label"], c["runs"]] for c in saved["cells"]]
  assert (study.batch_size, study.seed) == (saved["batch_size"], saved["seed"]) == (16, 0)
  rec = dict(np.load(path / "runs" / "cell_0000.npz"))
  cell = study.cells[0]
  kept, skipped = (np.flatnonzero(rec["outcome"] == o) for o in ("kept", "skipped"))
  assert len(kept) and len(skipped)   # draw 14 of d=4 has no negative label
  for run in (int(kept[-1]), int(skipped[0])):
    runs = np.array([run])
    data = {**study.load(cell, runs), "runs": runs}
    arrays = {s.name: s.run(data, runs, study.seed, None, None)[0] for s in study.stages(cell)}
    got = study_runner.lean(e5.analyze(cell.label, data, arrays))     # (its matrices as the record keeps them)
    assert sorted(got) == sorted(rec)
    for key, want in rec.items():
      a, w = got[key], want[run:run + 1]
      assert a.dtype == w.dtype and a.shape == w.shape, key
      assert np.array_equal(a, w, equal_nan=np.issubdtype(w.dtype, np.floating)), (run, key)


def _start(out, *args, log):
  log = open(log, "w")
  proc = subprocess.Popen([sys.executable, "-m", "experiments.multi_token", f"--out={out}", *FLAGS, *args],
                          cwd=REPO_ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
  proc.log = log
  return proc


@pytest.mark.slow   # kill -9 and --resume end to end (.ci/run runs it; E4's runs in the default suite)
def test_killed_at_a_random_moment_then_resumed_equals_uninterrupted(outputs, tmp_path):
  """Batches of 2 draws (several batches, 3 checkpointed chunks each), one SVM worker:
  SIGKILL of the process group (its SVM worker too) at a random moment after the first
  checkpoint appeared; --resume to the end gives the uninterrupted run's results array by array."""
  seed = random.randrange(1 << 30)
  delay = random.Random(seed).uniform(0.0, 1.0)
  print(f"kill seed {seed}: {delay:.3f}s after the first checkpoint")
  out = tmp_path / "killed"
  args = ("--batch_size=2", "--svm_workers=1")
  seen = []

  def condition(paths):
    if not seen and has_checkpoint(paths):
      seen.append(time.monotonic())
    return bool(seen) and time.monotonic() >= seen[0] + delay

  killed = kill_when(_start(out, *args, log=tmp_path / "log.txt"), out, condition)
  print("killed at:", killed)
  assert killed is not None, "the run finished before it could be killed"
  assert os.path.exists(out / "work" / "run.json") and not (out / "results.npz").exists()
  proc = _run(out, *args, "--resume")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert not (out / "work").exists()
  assert_same_results(out, outputs[16][0])


@pytest.mark.parametrize("flag", ["--ds=0", "--ds=4,x", "--tau_L=0.01"])
def test_bad_flags_end_before_anything_is_written(tmp_path, flag):
  out = tmp_path / "out"
  proc = subprocess.run([sys.executable, "-m", "experiments.multi_token", f"--out={out}", "--noprogress", flag],
                        cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert flag.split("=")[0] in proc.stderr, proc.stderr[-3000:]
  assert not out.exists()


def test_help_text_speaks_of_the_science():
  proc = subprocess.run([sys.executable, "-m", "experiments.multi_token", "--helpfull"], cwd=REPO_ROOT, env=ENV,
                        capture_output=True, text=True, timeout=120)
  text = proc.stdout + proc.stderr
  assert "--target" in text and "W^SVMeq" in text
  assert "issue" not in text.lower()


def test_replay_of_one_kept_run_equals_its_batch(outputs):
  """experiments.replay on a finished E5 run: one kept draw of d=4, alone, gives every per-run
  array of its batch bit for bit (and says so)."""
  path, _ = outputs[16]
  rec = np.load(path / "runs" / "cell_0000.npz")
  run = int(np.flatnonzero(rec["outcome"] == "kept")[1])
  proc = subprocess.run([sys.executable, "-m", "experiments.replay", f"--out={path}", "--cell=d=4", f"--run={run}",
                         "--save_trajectory"],
                        cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  report = json.loads((path / f"replay_{run}.json").read_text())
  assert report["study"] == "multi_token" and report["label"] == {"d": 4} and report["differ"] == []
  assert sorted(report["identical"]) == sorted(k.removesuffix(study_runner.DIGEST) for k in rec.files)
  assert all(report["identical"].values())
  assert f"{len(rec.files)}/{len(rec.files)} per-run arrays identical to the batch" in proc.stdout
  W = np.load(path / f"replay_{run}.npz")["W_W"]
  assert W.shape == (301, 4, 4)          # every step, ending at the batch's W (the record keeps its digest)
  assert study_runner.row_digests(W[-1][None])[0] == rec["W_gd" + study_runner.DIGEST][run]
