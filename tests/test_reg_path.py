"""E7 regularization paths: the binary end to end at tiny size, on the study pipeline.

The numbers in summary.json are recomputed here from results.npz (checks are computed,
never hard-coded); the library's properties are tested in test_regpath.py. The path stage
(``svmattn.studies.reg_path.Paths``) saves nothing part-way through a path: a run killed at
any moment and resumed recomputes the unfinished paths and ends with the same results, and a
data set's path does not depend on the batch it is solved in (a batch of one included).
"""
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
from test_sweep import ENV, assert_same_results, kill_when, listing

# End to end through the binary (a few seconds to a minute each): with the slow tests, which CI runs;
# the README's test command keeps the library's own tests.
pytestmark = pytest.mark.slow

# 3 data sets in pipeline batches of 2: the second batch holds one data set (solved as two copies)
RUNS = 3
FLAGS = [f"--runs={RUNS}", "--n=2", "--T=3", "--d=3", "--num_r=4", "--r_min=0.5", "--r_max=40", "--iters=60",
         "--first_iters=120", "--batch=2", "--noprogress"]


def _run(*args, module="experiments.reg_path"):
  return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO_ROOT, env=ENV,
                        capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def e7(tmp_path_factory):
  out = tmp_path_factory.mktemp("e7")
  proc = _run(f"--out={out}", *FLAGS)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(out / "summary.json") as f:
    summary = json.load(f)
  with np.load(out / "results.npz", allow_pickle=False) as r:
    arrays = dict(r)
  return out, proc, summary, arrays


def test_outputs_and_shapes(e7):
  out, proc, summary, arrays = e7
  assert (out / "correlation.png").stat().st_size > 0
  assert "E7 regularization paths" in proc.stdout
  for key in ("experiment", "flags", "timings_s", "environment", "checks", "corr_at_rmax"):
    assert key in summary
  assert summary["flags"]["runs"] == RUNS and summary["flags"]["num_r"] == 4
  assert summary["flags"]["batch_size"] == 2        # --batch is an alias of --batch_size
  assert not (out / "work").exists() and (out / "runs" / "cell_0000.npz").exists()
  R = arrays["R"]
  np.testing.assert_allclose(R, np.geomspace(0.5, 40, 4))
  for p in ("W", "KQ"):
    assert arrays[f"W_{p}"].shape == (RUNS, 4, 3, 3)
    for name in ("loss", "constraint", "kkt_cos", "grad_norm", "took_candidate", "corr_" + p + "_fro"):
      assert arrays[f"{name}_{p}" if not name.startswith("corr") else name].shape == (RUNS, 4)
    assert np.all(arrays[f"constraint_{p}"] <= R * (1 + 1e-12))


def test_optimal_tokens_and_svms(e7):
  _, _, _, arrays = e7
  np.testing.assert_array_equal(arrays["optimal_tokens"], metrics.optimal_tokens(arrays["token_scores"]))
  assert np.all(arrays["svm_fro_status"] == "optimal") and np.all(arrays["svm_nuc_status"] == "optimal")
  # the paths end on the tokens they are predicted to select
  for p in ("W", "KQ"):
    np.testing.assert_array_equal(arrays[f"selected_at_rmax_{p}"].shape, arrays["optimal_tokens"].shape)


def test_checks_are_computed_from_the_results(e7):
  _, _, summary, arrays = e7
  checks = summary["checks"]
  assert len(checks) >= 10
  for c in checks:
    assert set(c) - {"note"} == {"name", "value", "expected", "ok"}
    assert isinstance(c["name"], str) and isinstance(c["expected"], str) and isinstance(c["ok"], bool)
  by_name = {c["name"]: c for c in checks}
  R = arrays["R"]
  for p, norm, what in (("W", "fro", "W_R"), ("KQ", "nuc", "K_R Q_R^T")):
    corr = metrics.corr(arrays[f"W_{p}"], arrays[f"svm_{norm}"][:, None])
    np.testing.assert_allclose(corr, arrays[f"corr_{p}_{norm}"], rtol=1e-12)
    name = [k for k in by_name if k.startswith(f"mean corr({what},") and "largest R" in k][0]
    assert by_name[name]["value"] == pytest.approx(np.mean(corr[:, -1]), rel=1e-12)
    assert by_name[name]["ok"] == bool(np.mean(corr[:, -1]) >= 0.99)
    feas = [c for c in checks if c["name"].startswith(f"{p}: max over data sets and R of (constraint")][0]
    assert feas["value"] == pytest.approx(np.max((arrays[f"constraint_{p}"] - R) / R), abs=1e-18)
    assert feas["ok"]
  assert summary["corr_at_rmax"]["W_vs_fro"]["mean"] == pytest.approx(np.mean(arrays["corr_W_fro"][:, -1]))


@pytest.mark.slow   # kill -9 and --resume end to end (.ci/run runs it; E4's runs in the default suite)
def test_killed_and_resumed_equals_uninterrupted(e7, tmp_path):
  """SIGKILL (the whole process group) at a random moment once the run has written something
  (its data, a finished path, a batch's results), then --resume until it finishes: results.npz
  and the per-run record equal the uninterrupted run's, array by array."""
  reference = e7[0]
  rng = random.Random(7)
  out = tmp_path / "killed"
  kills = 0
  for attempt in range(2):
    log = open(tmp_path / f"log_{attempt}.txt", "w")
    proc = subprocess.Popen([sys.executable, "-m", "experiments.reg_path", f"--out={out}", *FLAGS,
                             *(["--resume"] if attempt else [])], cwd=REPO_ROOT, env=ENV, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = log
    before, seen, delay = set(listing(out)), [], rng.uniform(0.0, 1.0)

    def condition(paths, before=before, seen=seen, delay=delay):
      if not seen and [p for p in set(paths) - before if p != "run.json"]:
        seen.append(time.monotonic())
      return bool(seen) and time.monotonic() >= seen[0] + delay
    if kill_when(proc, out, condition) is None:
      break
    kills += 1
  assert kills >= 1
  if (out / "work").exists():
    proc = _run(f"--out={out}", *FLAGS, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
  assert not (out / "work").exists()
  assert_same_results(out, reference)
  with np.load(out / "runs" / "cell_0000.npz") as a, np.load(reference / "runs" / "cell_0000.npz") as b:
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
      assert np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f"), k


def test_replay_of_the_data_set_alone_equals_its_batch(e7, tmp_path):
  """Run 2 was solved in a batch of one and run 0 in a batch of two; alone (experiments.replay)
  each gives its per-run arrays bit for bit."""
  import shutil
  out = tmp_path / "copy"
  shutil.copytree(e7[0], out)
  for run in (0, 2):
    proc = _run(f"--out={out}", f"--run={run}", module="experiments.replay")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / f"replay_{run}.json") as f:
      report = json.load(f)
    assert report["differ"] == [] and len(report["identical"]) >= 20 and all(report["identical"].values())


BAD_FLAGS = ["--d=0", "--num_r=0", "--r_min=0", "--r_min=500", "--params=W,V"]


def test_bad_flags(tmp_path):
  """Each bad value: exit status != 0, one error naming the flag, no traceback, no --out directory."""
  procs = {flag: subprocess.Popen([sys.executable, "-m", "experiments.reg_path", f"--out={tmp_path / str(i)}",
                                   flag], cwd=REPO_ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
           for i, flag in enumerate(BAD_FLAGS)}
  for i, (flag, p) in enumerate(procs.items()):
    _, err = p.communicate(timeout=120)
    assert p.returncode != 0, flag
    assert "Traceback" not in err, (flag, err[-2000:])
    assert "FATAL Flags parsing error" in err and flag.split("=")[0].lstrip("-") in err, (flag, err[-2000:])
    assert not os.path.exists(tmp_path / str(i)), flag


def test_a_data_sets_path_does_not_depend_on_the_batch_size():
  """XLA compiles a vmapped path solve of 50 data sets differently from one of 25 (every path apart,
  at this size already); ``Paths`` solves every batch in blocks of ``BLOCK``, so a batch of 50 and
  two batches of 25 (and a last batch of one) give every data set the same bits."""
  from svmattn.studies import reg_path as study
  fl = dict(study.SETTINGS.defaults(), n=6, T=8, d=10, attention="cross", seed=0, runs=51, data=None, params=["W", "KQ"], m=None,
            loss="logistic", iters=20, first_iters=40, num_r=2, r_min=0.5, r_max=300.0, candidates=True)
  st = study.build(fl)
  batches = {b: st.load(st.cells[0], np.arange(lo, hi)) for b, (lo, hi) in
             {"all": (0, 50), "first": (0, 25), "second": (25, 50), "last": (50, 51)}.items()}
  for stage in st.stages(st.cells[0]):
    whole, _ = stage.run(batches["all"], np.arange(50), 0, None, None)
    parts = [stage.run(batches[b], np.arange(lo, hi), 0, None, None)[0]
             for b, (lo, hi) in (("first", (0, 25)), ("second", (25, 50)))]
    for key in whole:
      assert np.concatenate([p[key] for p in parts]).tobytes() == whole[key].tobytes(), (stage.name, key)
    alone, _ = stage.run(batches["last"], np.arange(50, 51), 0, None, None)
    again, _ = stage.run(st.load(st.cells[0], np.arange(49, 51)), np.arange(49, 51), 0, None, None)
    for key in alone:
      assert alone[key].tobytes() == again[key][1:].tobytes(), (stage.name, key)
