"""E1 2-D paths: the binary end to end, and its data sampler (two_clusters)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT
from svmattn.analysis import metrics

RUNS, STEPS = 24, 300


@pytest.fixture(scope="module")
def e1(tmp_path_factory):
  out = tmp_path_factory.mktemp("e1")
  env = dict(os.environ, PYTHONPATH=REPO_ROOT)
  proc = subprocess.run([sys.executable, "-m", "experiments.paths_2d", f"--out={out}", f"--runs={RUNS}",
                         f"--steps={STEPS}", "--snapshot_every=10", "--noprogress"],
                        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(out / "summary.json") as f:
    summary = json.load(f)
  with np.load(out / "results.npz", allow_pickle=False) as r:
    arrays = dict(r)
  return out, proc, summary, arrays


def test_outputs(e1):
  out, proc, summary, arrays = e1
  assert (out / "paths.png").stat().st_size > 0
  assert "E1 2-D paths" in proc.stdout
  for key in ("experiment", "flags", "timings_s", "environment", "checks", "final_corr"):
    assert key in summary
  assert arrays["X"].shape == (RUNS, 2, 3, 2)
  assert arrays["W_W"].shape == arrays["W_KQ"].shape == (RUNS, STEPS // 10 + 1, 2, 2)
  np.testing.assert_array_equal(arrays["steps"], np.arange(0, STEPS + 1, 10))
  # W(0) = 0; K(0) Q(0)^T = 0 since Q(0) = 0 (init scheme "zero")
  assert np.all(arrays["W_W"][:, 0] == 0) and np.all(arrays["W_KQ"][:, 0] == 0)


def test_sampler_statistics(e1):
  """Tokens 0.3 N(0,1) around (-1,0) (sequence 1) and (+1,0) (sequence 2); unit z and v; Y = +1."""
  _, _, _, arrays = e1
  X = arrays["X"]
  for i, centre in enumerate(([-1.0, 0.0], [1.0, 0.0])):
    tokens = X[:, i].reshape(-1, 2)                                   # 72 tokens
    np.testing.assert_allclose(tokens.mean(0), centre, atol=4 * 0.3 / np.sqrt(len(tokens)))
    np.testing.assert_allclose(tokens.std(0), 0.3, rtol=0.25)
  np.testing.assert_allclose(np.linalg.norm(arrays["Z"], axis=-1), 1.0, rtol=1e-12)
  np.testing.assert_allclose(np.linalg.norm(arrays["v"], axis=-1), 1.0, rtol=1e-12)
  assert np.all(arrays["Y"] == 1.0)
  assert len({arrays["X"][b].tobytes() for b in range(RUNS)}) == RUNS   # distinct data sets


def test_checks_are_computed_from_the_results(e1):
  _, _, summary, arrays = e1
  checks = summary["checks"]
  assert len(checks) == 4
  for c in checks:
    assert set(c) == {"name", "value", "expected", "ok"}
  opt = arrays["optimal_tokens"]
  for k, (p, norm) in enumerate((("W", "fro"), ("KQ", "nuc"))):
    corr = metrics.corr(arrays[f"W_{p}"][:, -1], arrays[f"svm_{norm}"])
    np.testing.assert_allclose(corr, arrays[f"corr_{p}_{norm}"], rtol=1e-12)
    assert checks[2 * k]["value"] == pytest.approx(np.min(corr), rel=1e-12)
    assert checks[2 * k]["ok"] == bool(np.min(corr) >= 0.99)
    share = np.mean(np.all(arrays[f"selected_{p}"] == opt, axis=1))
    assert checks[2 * k + 1]["value"] == pytest.approx(share)
  # the direction moves toward the SVM during training (300 steps already)
  first = metrics.corr(arrays["W_W"][:, 1], arrays["svm_fro"])
  assert np.mean(arrays["corr_W_fro"]) > np.mean(first)
  assert summary["drawn_data_set"] in range(RUNS)
