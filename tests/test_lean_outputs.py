"""Lean outputs: the per-run record keeps each run's matrices as digests (replay compares them bit
for bit; --full_records keeps them whole), --nokeep_runs keeps no per-run records (replay still
reruns a data set), --norms limits the Att-SVMs solved."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT
from svmattn.execution import replay
from svmattn.execution import study_runner


def test_the_lean_record_digests_matrices_and_keeps_the_rest():
  rng = np.random.default_rng(0)
  arrays = {"corr": rng.normal(size=(5, 7)), "selected": rng.integers(0, 3, (5, 2)), "W": rng.normal(size=(5, 3, 3)),
            "W_curve": rng.normal(size=(5, 7, 3, 3)), "outcome": np.array(["a", "b", "c", "d", "e"])}
  rec = study_runner.lean(arrays)
  assert sorted(rec) == ["W__digest", "W_curve__digest", "corr", "outcome", "selected"]
  assert rec["W__digest"].dtype == np.uint64 and rec["W__digest"].shape == (5,)
  assert len(set(rec["W__digest"].tolist())) == 5                     # the runs' rows differ
  np.testing.assert_array_equal(rec["corr"], arrays["corr"])


def test_a_digest_tells_one_bit_apart():
  """A replay's matrix that differs from the record's in one bit, or in dtype or shape, is not identical."""
  W = np.random.default_rng(1).normal(size=(4, 3, 3))
  rec = study_runner.lean({"W": W})
  ref = {k: a[2] for k, a in rec.items()}
  assert replay.compare({"W": W[2:3]}, ref) == {"W": True}
  flipped = W[2:3].copy()
  flipped.view(np.uint64)[0, 1, 1] ^= 1                               # the last bit of one entry
  assert replay.compare({"W": flipped}, ref) == {"W": False}
  assert replay.compare({"W": W[2:3].astype(np.float32)}, ref) == {"W": False}
  assert replay.compare({"W": W[2:3].reshape(1, 9, 1)}, ref) == {"W": False}


def _run(*args):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-m", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=300, env=env)


@pytest.mark.slow   # two end-to-end runs of binaries (CI runs the slow tests too)
def test_nokeep_runs_and_norms(tmp_path):
  out = tmp_path / "e2"
  proc = _run("experiments.local_convergence", f"--out={out}", "--runs=4", "--steps=20", "--chunk_steps=20",
              "--params=W", "--norms=fro", "--nokeep_runs", "--noprogress")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert sorted(os.listdir(out / "runs")) == ["study.json"]
  with open(out / "runs" / "study.json") as f:
    assert json.load(f)["runs_kept"] is False
  with np.load(out / "results.npz") as a:
    assert "corr_W_fro" in a.files and not any("nuc" in k for k in a.files)
  with open(out / "summary.json") as f:
    assert set(json.load(f)["final_corr"]) == {"W_vs_fro"}
  proc = _run("experiments.replay", f"--out={out}", "--run=2")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "made with --nokeep_runs" in proc.stdout
