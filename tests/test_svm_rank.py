"""End-to-end test of experiments/svm_rank.py (E3) at a tiny size, in a subprocess."""
import os

import jax
import numpy as np

from conftest import run_binary

import svmattn  # noqa: F401  (float64)
from svmattn.data import datasets as data_lib
from svmattn.svm import feasibility
from svmattn.models import heads
from svmattn.analysis import metrics
from svmattn.svm import att_svm as svm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def check_summary_layout(summary):
  for key in ("experiment", "flags", "timings_s", "environment", "checks"):
    assert key in summary
  assert summary["checks"]
  for c in summary["checks"]:
    assert set(c) == {"name", "value", "expected", "ok"}
    assert isinstance(c["name"], str) and isinstance(c["expected"], str) and isinstance(c["ok"], bool)
    assert isinstance(c["value"], (int, float, str))


def test_svm_rank_end_to_end(tmp_path):
  n, T, runs, factor, seed = 4, 3, 3, 4, 5
  summary, a = run_binary("experiments.svm_rank", tmp_path, f"--runs={runs}", "--ds=1,2,4",
                          f"--shapes={n}:{T}", f"--max_draws_factor={factor}", "--batch=5", f"--seed={seed}")
  check_summary_layout(summary)
  assert summary["rank_rtol"] == 1e-4
  assert os.path.getsize(tmp_path / "rank.png") > 0
  rtol = float(a["rtol"])
  for c, (cn, cT, d) in enumerate(a["cells"]):
    kept = a["kept_runs"][c][a["kept_runs"][c] >= 0]
    draws = int(a["draws"][c])
    assert len(kept) + int(a["infeasible_draws"][c]) == draws        # no failed checks here
    assert len(kept) == runs or draws == factor * runs               # complete, or stopped at the cap
    # replay the draws: the kept runs are exactly the feasible ones among runs 0 .. draws-1
    spec = data_lib.DataSpec(int(cn), int(cT), int(d))
    ds = data_lib.generate(spec, seed, np.arange(draws))
    gamma = np.asarray(jax.vmap(lambda v, X, Y: heads.token_scores(heads.LINEAR, v, X, Y))(ds.v, ds.X, ds.Y))
    opt = metrics.optimal_tokens(gamma)
    X, Z = np.asarray(ds.X), np.asarray(ds.Z)
    np.testing.assert_array_equal(np.flatnonzero(feasibility.is_feasible(X, Z, opt)), kept)
    for b, r in enumerate(kept):
      assert a["status_fro"][c, b] == "optimal"
      for norm in ("fro", "nuc"):
        s = a[f"singular_values_{norm}"][c, b, :d]
        if a[f"status_{norm}"][c, b] == "optimal":
          assert a[f"rank_{norm}"][c, b] == np.sum(s > rtol * s[0])
          assert 1 <= a[f"rank_{norm}"][c, b] <= d
      assert a["rank_fro"][c, b] <= min(n, d)                        # W = sum_i u_i z_i^T
      if b == 0:                                                     # the stored rank is the SVM's
        ref = svm.att_svm(X[r], Z[r], opt[r], "fro")
        assert metrics.numerical_rank(ref.W, rtol) == a["rank_fro"][c, b]
  cells = summary["cells"]
  assert [x["d"] for x in cells] == [1, 2, 4]
  d1 = cells[0]
  assert not d1["complete"] and d1["draws"] == factor * runs   # d = 1, unit tokens: ties, always infeasible
  assert any("d=1" in s for s in summary["incomplete_cells"])
