"""Checks over runs that did not train are "not evaluated", never ok or FAIL (svmattn.analysis.checks)."""
import numpy as np

from svmattn.analysis import checks
from svmattn.analysis import metrics


def _check(**kw):
  return {"name": "c", "value": 0.5, "expected": "> 0.4", "ok": True, **kw}


def test_a_check_over_mostly_stalled_or_diverged_runs_is_not_evaluated():
  health = {"W": {"ok": 1, "diverged": 1, "stalled": 2, "unsaturated": 0},
            "KQ": {"ok": 3, "diverged": 0, "stalled": 1, "unsaturated": 0},
            "P": {"ok": 0, "diverged": 0, "stalled": 0, "unsaturated": 4}}
  got = checks.gate([_check(runs=["W"]), _check(runs=["KQ"]), _check(runs=["P"]), _check(), _check(runs=["X"]),
                     _check(runs=["W", "KQ"], ok=False)], health)
  assert got[0]["ok"] is None and got[0]["reason"].startswith("1 diverged, 2 stalled of its 4 runs")
  assert got[0]["value"] == 0.5                                 # kept, for the record
  assert got[1]["ok"] is True and "reason" not in got[1]        # 1 of 4 stalled: evaluated
  assert got[2]["ok"] is True                                   # unsaturated runs count as trained
  assert got[3]["ok"] is True and got[4]["ok"] is True          # no runs named, or no health for them
  assert got[5]["ok"] is None                                   # 4 of 8 over both groups
  assert [checks.verdict(c) for c in got] == ["not evaluated", "ok", "ok", "ok", "ok", "not evaluated"]
  t = checks.tally(got)
  assert (t["ok"], t["total"], t["failing"], len(t["not_evaluated"])) == (4, 4, [], 2)
  assert checks.gate([_check(runs=["W"])], None)[0]["ok"] is True


def test_corr_of_matrices_whose_squares_overflow_or_underflow():
  """A run that blew up to 1e200 (or shrank to 1e-200) still has its correlation, not 0 or NaN; every
  ordinary value is computed as before, bit for bit."""
  rng = np.random.default_rng(0)
  A, B = rng.normal(size=(6, 3, 4)), rng.normal(size=(6, 3, 4))
  plain = np.sum(A * B, axis=(-2, -1)) / np.sqrt(np.sum(A * A, axis=(-2, -1)) * np.sum(B * B, axis=(-2, -1)))
  assert np.array_equal(metrics.corr(A, B), plain)
  with np.errstate(all="raise"):                # no NumPy warning reaches the user
    big, small = metrics.corr(A * 1e200, B), metrics.corr(A * 1e-200, B * 1e-180)
  np.testing.assert_allclose(big, plain, rtol=1e-13)
  np.testing.assert_allclose(small, plain, rtol=1e-13)
  assert np.all(np.isnan(metrics.corr(A * 0, B)))
  C = A.copy()
  C[0, 0, 0] = np.inf
  assert np.isnan(metrics.corr(C, B)[0]) and np.array_equal(metrics.corr(C, B)[1:], plain[1:])


def test_singular_values_and_norms_of_a_diverged_run_are_nan_not_an_exception():
  """A NaN or overflowing snapshot (a run that diverged at --lr=1e300) gets NaN singular values and
  norms, and the Frobenius norm of 1e200-sized matrices is finite; ordinary ones are as before."""
  rng = np.random.default_rng(1)
  A = rng.normal(size=(3, 4, 4))
  B = A.copy()
  B[1, 0, 0] = np.nan
  s = metrics.singular_values(B)
  assert np.isnan(s[1]).all() and np.array_equal(s[[0, 2]], np.linalg.svd(A[[0, 2]], compute_uv=False))
  assert np.isnan(metrics.norm_value(B, "nuc")[1]) and metrics.numerical_rank(B)[1] == 0
  assert np.array_equal(metrics.norm_value(A, "fro"), np.sqrt(np.sum(A * A, axis=(-2, -1))))
  with np.errstate(all="raise"):
    np.testing.assert_allclose(metrics.norm_value(A * 1e200, "fro"), 1e200 * metrics.norm_value(A, "fro"),
                               rtol=1e-13)
