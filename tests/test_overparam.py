"""End-to-end test of experiments/overparam.py (E4) at a tiny size, in a subprocess."""
import os

import numpy as np

from conftest import run_binary

import svmattn  # noqa: F401  (float64)
from svmattn.analysis import metrics
import pytest

# End to end through the binary (a few seconds to a minute each): with the slow tests, which CI runs;
# the README's test command keeps the library's own tests.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_overparam_end_to_end(tmp_path):
  summary, a = run_binary("experiments.overparam", tmp_path, "--runs=12", "--n_values=3", "--T=3",
                          "--d_min=2", "--d_max=3", "--steps=300", "--chunk_steps=100")
  for key in ("experiment", "flags", "timings_s", "environment", "checks"):
    assert key in summary
  for c in summary["checks"]:
    assert set(c) - {"note"} == {"name", "value", "expected", "ok"} and isinstance(c["ok"], bool)
  assert os.path.getsize(tmp_path / "overparam.png") > 0
  types, sel, opt = a["types"], a["selected_n3"], a["optimal_n3"]
  assert types.shape == (1, 2, 12) and sel.shape == opt.shape == (2, 12, 3)
  assert set(np.unique(types)) <= set(metrics.CONVERGENCE_TYPES)
  is_global = np.all(sel == opt, axis=-1)
  healthy = a["health"][0] == "ok"              # unhealthy runs are their own types (analysis.health)
  np.testing.assert_array_equal(types[0][~healthy], a["health"][0][~healthy])
  np.testing.assert_array_equal(types[0] == "global", is_global & healthy)
  bad_svm = (a["svm_status"][0] != "optimal") & healthy
  assert np.all(types[0][bad_svm] == "not-local")   # infeasible SVM is not-local
  shares = np.stack([a[f"share_{t.replace('-', '_')}"] for t in metrics.CONVERGENCE_TYPES])
  np.testing.assert_allclose(shares.sum(0), 1.0)
  np.testing.assert_allclose(a["share_global"][0], (is_global & healthy).mean(-1))
  ok = np.isfinite(a["corr"])
  assert np.all(np.abs(a["corr"][ok]) <= 1 + 1e-12)
  assert np.all(a["finite"])
  # after 300 normalized steps on these tiny problems GD is well aligned with its SVM on average
  assert np.nanmean(a["corr"][a["types"] != "not-local"]) > 0.9
  for x in summary["cells"]:
    assert abs(sum(x[f"share_{t}"] for t in metrics.CONVERGENCE_TYPES) - 1) < 1e-12
