"""E7 regularization paths: the binary end to end at tiny size.

The numbers in summary.json are recomputed here from results.npz (checks are computed,
never hard-coded); the library's properties are tested in test_regpath.py.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT
from svmattn.analysis import metrics

FLAGS = ["--runs=2", "--n=2", "--T=3", "--d=3", "--num_r=4", "--r_min=0.5", "--r_max=40", "--iters=60",
         "--first_iters=120", "--batch=2", "--noprogress"]


def _run(*args):
  env = dict(os.environ, PYTHONPATH=REPO_ROOT)
  return subprocess.run([sys.executable, "-m", "experiments.reg_path", *args], cwd=REPO_ROOT, env=env,
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
  assert summary["flags"]["runs"] == 2 and summary["flags"]["num_r"] == 4
  R = arrays["R"]
  np.testing.assert_allclose(R, np.geomspace(0.5, 40, 4))
  for p in ("W", "KQ"):
    assert arrays[f"W_{p}"].shape == (2, 4, 3, 3)
    for name in ("loss", "constraint", "kkt_cos", "grad_norm", "took_candidate", "corr_" + p + "_fro"):
      assert arrays[f"{name}_{p}" if not name.startswith("corr") else name].shape == (2, 4)
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
    assert set(c) == {"name", "value", "expected", "ok"}
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
