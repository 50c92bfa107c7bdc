"""svmattn.svm.att_svm: Att-SVM solutions checked by their optimality conditions.

Data: the conftest batch (n=3, T=4, d=6, so d >= max(T-1, n): every selection is
feasible), at the optimal tokens and at an arbitrary selection.
"""
import numpy as np
import pytest

from conftest import host
from svmattn.data import datasets as data_lib
from svmattn.models import heads
from svmattn.analysis import metrics
from svmattn.svm import att_svm as svm_lib


def _margins(W, X, Z, alpha):
  """(x_{i,alpha_i} - x_it)^T W z_i (n,T), NaN at t = alpha_i; computed independently of svm."""
  n, T, _ = X.shape
  out = np.full((n, T), np.nan)
  for i in range(n):
    for t in range(T):
      if t != alpha[i]:
        out[i, t] = (X[i, alpha[i]] - X[i, t]) @ W @ Z[i]
  return out


def _dual_matrix(dual, X, Z, alpha):
  """sum_{i,t} dual_it (x_{i,alpha_i} - x_it) z_i^T."""
  n = X.shape[0]
  diff = X[np.arange(n), alpha][:, None, :] - X
  return np.einsum("nt,ntd,ne->de", dual, diff, Z)


@pytest.fixture(scope="module")
def cases(batch):
  """[(X, Z, alpha)]: data sets 0, 1 at opt, data set 2 at a non-optimal selection."""
  ds = host(batch)
  out = []
  for b, kind in ((0, "opt"), (1, "opt"), (2, "other")):
    gamma = np.asarray(heads.token_scores(heads.LINEAR, ds.v[b], ds.X[b], ds.Y[b]))
    alpha = metrics.optimal_tokens(gamma)
    if kind == "other":
      alpha = (alpha + np.array([1, 2, 3])) % ds.X.shape[2]
    out.append((ds.X[b], ds.Z[b], alpha))
  return out


@pytest.fixture(scope="module")
def solved(cases):
  """{(norm, solver): [SVMResult per case]}."""
  combos = [("fro", "nnls"), ("fro", "CLARABEL"), ("nuc", "SCS"), ("nuc", "CLARABEL")]
  return {c: [svm_lib.att_svm(X, Z, a, c[0], c[1]) for X, Z, a in cases] for c in combos}


@pytest.mark.parametrize("combo", [("fro", "nnls"), ("fro", "CLARABEL"), ("nuc", "SCS"), ("nuc", "CLARABEL")])
def test_constraints_hold(cases, solved, combo):
  for (X, Z, alpha), r in zip(cases, solved[combo]):
    assert r.status == "optimal" and r.ok, r.message
    assert r.W.shape == (6, 6) and r.norm == combo[0]
    m = _margins(r.W, X, Z, alpha)
    assert np.nanmin(m) >= 1 - 1e-6
    np.testing.assert_allclose(r.margins, m, rtol=1e-12, atol=1e-12)  # NaN at alpha on both sides
    np.testing.assert_allclose(r.objective, np.linalg.norm(r.W, "fro" if combo[0] == "fro" else "nuc"), rtol=1e-12)


def test_default_solvers(cases, solved):
  X, Z, alpha = cases[0]
  assert svm_lib.att_svm(X, Z, alpha).solver == "nnls"
  r = svm_lib.att_svm(X, Z, alpha, "nuc")
  assert r.solver == "nuc_ipm"
  # the default is deterministic: a repeat solve gives the same bits, and it agrees with cvxpy's SCS
  np.testing.assert_array_equal(r.W, svm_lib.att_svm(X, Z, alpha, "nuc").W)
  ref = solved[("nuc", "SCS")][0].W
  np.testing.assert_allclose(r.W, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_frobenius_kkt(cases, solved):
  """W = sum dual_it (x_{i,alpha_i} - x_it) z_i^T with dual >= 0, dual (margin - 1) = 0, margins >= 1:
  the KKT conditions of min 1/2 ||W||_F^2, which certify optimality."""
  for (X, Z, alpha), r in zip(cases, solved[("fro", "nnls")]):
    n = X.shape[0]
    assert r.dual.shape == (n, X.shape[1])
    assert np.all(r.dual >= 0)
    assert np.all(r.dual[np.arange(n), alpha] == 0)
    np.testing.assert_allclose(_dual_matrix(r.dual, X, Z, alpha), r.W, rtol=0, atol=1e-10 * np.abs(r.W).max())
    slack = np.nan_to_num(_margins(r.W, X, Z, alpha) - 1)
    assert np.all(np.abs(r.dual * slack) <= 1e-10)
    assert np.nanmin(r.margins) >= 1 - 1e-12  # nnls is exact up to rounding
    # strong duality: ||W||_F^2 = sum of the multipliers (= <W, sum dual A>)
    np.testing.assert_allclose(r.objective ** 2, r.dual.sum(), rtol=1e-10)


def test_frobenius_nnls_equals_cvxpy(solved):
  for a, b in zip(solved[("fro", "nnls")], solved[("fro", "CLARABEL")]):
    assert np.linalg.norm(a.W - b.W) <= 1e-6 * np.linalg.norm(a.W)
    np.testing.assert_allclose(a.objective, b.objective, rtol=1e-6)
    np.testing.assert_array_equal(a.support, b.support)


def test_nuclear_scs_and_clarabel_agree(solved):
  for a, b in zip(solved[("nuc", "SCS")], solved[("nuc", "CLARABEL")]):
    np.testing.assert_allclose(a.objective, b.objective, rtol=1e-6)
    assert np.linalg.norm(a.W - b.W) <= 1e-4 * np.linalg.norm(b.W)
    np.testing.assert_array_equal(a.support, b.support)


@pytest.mark.parametrize("solver", ["SCS", "CLARABEL"])
def test_nuclear_optimality_certificate(cases, solved, solver):
  """Dual of min ||W||_* s.t. <A_it, W> >= 1: max sum dual s.t. ||sum dual_it A_it||_2 <= 1, dual >= 0.
  A feasible dual with sum dual = ||W||_* proves W optimal (weak duality)."""
  for (X, Z, alpha), r in zip(cases, solved[("nuc", solver)]):
    assert r.dual is not None and np.all(r.dual >= -1e-9)
    G = _dual_matrix(r.dual, X, Z, alpha)
    assert np.linalg.norm(G, 2) <= 1 + 1e-6
    np.testing.assert_allclose(r.dual.sum(), r.objective, rtol=1e-6)
    # complementary slackness, and the dual matrix aligned with W: <G, W> = ||W||_*
    slack = np.nan_to_num(r.margins - 1)
    assert np.all(np.abs(r.dual * slack) <= 1e-6)
    np.testing.assert_allclose(np.sum(G * r.W), r.objective, rtol=1e-6)


def test_nuclear_and_frobenius_solutions_are_each_minimal(solved):
  """Each norm's solution is feasible for the other problem, so it cannot beat the other's objective."""
  for f, n in zip(solved[("fro", "nnls")], solved[("nuc", "CLARABEL")]):
    assert f.objective <= np.linalg.norm(n.W, "fro") * (1 + 1e-6)
    assert n.objective <= np.linalg.norm(f.W, "nuc") * (1 + 1e-6)


def test_support_tokens_are_the_active_constraints(cases, solved):
  for combo, results in solved.items():
    for (X, Z, alpha), r in zip(cases, results):
      slack = _margins(r.W, X, Z, alpha) - 1
      tol = svm_lib.SUPPORT_TOL[combo[1]]
      np.testing.assert_array_equal(r.support, np.nan_to_num(slack, nan=np.inf) <= tol)
      assert not np.any(r.support[np.arange(X.shape[0]), alpha])
      assert np.all(np.any(r.support, axis=1) | np.all(np.isnan(slack), axis=1))
  # the multipliers vanish off the support (nnls)
  for r in solved[("fro", "nnls")]:
    assert np.all(r.dual[~r.support] == 0)


def test_solution_depends_only_on_support(cases, solved):
  """Dropping the inactive constraints (mask = support) leaves the Frobenius SVM unchanged."""
  dropped = 0
  for (X, Z, alpha), r in zip(cases, solved[("fro", "nnls")]):
    dropped += np.sum(~r.support) - X.shape[0]  # inactive constraints left out
    masked = svm_lib.att_svm(X, Z, alpha, mask=r.support)
    assert masked.ok
    np.testing.assert_allclose(masked.W, r.W, rtol=0, atol=1e-10 * np.abs(r.W).max())
    assert not np.any(masked.support & ~r.support)
  assert dropped > 0


# ----------------------------------------------------------------------------
# Infeasible selections and bad inputs
# ----------------------------------------------------------------------------

def _infeasible(cases):
  X, Z, alpha = cases[0]
  X = X.copy()
  other = (alpha[1] + 1) % X.shape[1]
  X[1, other] = X[1, alpha[1]]  # two identical tokens; alpha selects one of them
  return X, Z, alpha


@pytest.mark.parametrize("norm, solver", [("fro", None), ("fro", "CLARABEL"), ("nuc", None), ("nuc", "CLARABEL")])
def test_infeasible_selection_is_a_status(cases, norm, solver):
  X, Z, alpha = _infeasible(cases)
  r = svm_lib.att_svm(X, Z, alpha, norm, solver)
  assert r.status == "infeasible" and not r.ok, r.message
  assert r.W is None and r.margins is None and r.dual is None
  assert not np.any(r.support)
  assert np.isnan(r.objective)


def test_batch_and_stack(cases):
  X0, Z0, a0 = cases[0]
  X1, Z1, a1 = _infeasible(cases)
  done = []
  results = svm_lib.att_svm_batch(np.stack([X0, X1]), np.stack([Z0, Z1]), np.stack([a0, a1]), progress=done.append)
  assert [r.status for r in results] == ["optimal", "infeasible"] and sum(done) == 2
  st = svm_lib.stack(results, 6)
  np.testing.assert_array_equal(st["W"][0], results[0].W)
  assert np.all(np.isnan(st["W"][1]))
  assert st["status"].tolist() == ["optimal", "infeasible"]
  assert st["support"].shape == (2, 3, 4) and not np.any(st["support"][1])
  assert np.isnan(st["objective"][1]) and st["objective"][0] == results[0].objective


def _bad(cases, what):
  X, Z, alpha = (np.array(a) for a in cases[0])
  if what == "X2d":
    X = X[0]
  elif what == "Zshape":
    Z = Z[:, :-1]
  elif what == "alpha_shape":
    alpha = alpha[:-1]
  elif what == "alpha_high":
    alpha[1] = X.shape[1]
  elif what == "alpha_negative":
    alpha[0] = -1
  elif what == "alpha_fraction":
    alpha = alpha + 0.5
  elif what == "nanX":
    X[0, 1, 2] = np.nan
  elif what == "infZ":
    Z[2, 0] = np.inf
  return X, Z, alpha


@pytest.mark.parametrize("what, match", [
    ("X2d", r"X must have shape \(n, T, d\)"),
    ("Zshape", r"Z must have shape \(n, d\) = \(3, 6\)"),
    ("alpha_shape", r"alpha must have shape \(n,\) = \(3,\)"),
    ("alpha_high", r"alpha entries must be in \[0, T=4\)"),
    ("alpha_negative", r"alpha entries must be in \[0, T=4\)"),
    ("alpha_fraction", r"alpha must hold integer token indices"),
    ("nanX", r"X and Z must be finite"),
    ("infZ", r"X and Z must be finite"),
])
def test_bad_inputs(cases, what, match):
  X, Z, alpha = _bad(cases, what)
  with pytest.raises(ValueError, match=match):
    svm_lib.att_svm(X, Z, alpha)


def test_bad_norm_and_solver(cases):
  X, Z, alpha = cases[0]
  for bad in ("l0.5", "bogus", "l"):
    with pytest.raises(ValueError, match=rf"unknown SVM norm '{bad}'"):
      svm_lib.att_svm(X, Z, alpha, bad)
  with pytest.raises(ValueError, match=r"nnls solver solves the Frobenius SVM only"):
    svm_lib.att_svm(X, Z, alpha, "nuc", "nnls")


@pytest.mark.parametrize("norm", ["fro", "nuc"])
def test_threaded_batch_equals_one_thread(norm):
  D = data_lib.generate(data_lib.DataSpec(n=4, T=5, d=6), 3, np.arange(6))
  X, Z = np.asarray(D.X), np.asarray(D.Z)
  alpha = np.random.RandomState(1).randint(0, 5, (6, 4))
  one = svm_lib.att_svm_batch(X, Z, alpha, norm, threads=1)
  done = []
  many = svm_lib.att_svm_batch(X, Z, alpha, norm, threads=3, progress=done.append)
  assert len(done) == 6
  for a, b in zip(one, many):
    assert a.status == b.status
    np.testing.assert_array_equal(a.W, b.W)     # same bits, in the same order


def _same_result(a, b):
  """Every field of two SVMResults the same bits."""
  import dataclasses
  for f in dataclasses.fields(svm_lib.SVMResult):
    x, y = getattr(a, f.name), getattr(b, f.name)
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
      assert x is not None and y is not None and x.dtype == y.dtype and x.shape == y.shape, f.name
      assert x.tobytes() == y.tobytes(), f.name
    else:
      assert np.array([x]).tobytes() == np.array([y]).tobytes() if isinstance(x, float) else x == y, f.name


@pytest.mark.parametrize("n, T, d, statuses", [(4, 5, 6, {"optimal", "infeasible"}), (5, 5, 2, {"optimal", "infeasible"}),
                                                (3, 4, 1, {"infeasible"}), (2, 1, 3, {"optimal"})])
def test_stacked_frobenius_solves_equal_one_at_a_time(n, T, d, statuses):
  """att_svm_batch stacks Frobenius NNLS jobs of one shape (att_svm._fro_nnls_stack): every result,
  optimal or infeasible, with zeros and tied tokens in the data, is the one att_svm gives alone."""
  rng = np.random.default_rng(n * 100 + T * 10 + d)
  B = 40
  X = rng.standard_normal((B, n, T, d))
  X[::3, 0, T - 1] = 0.0
  X[::4, :, :, 0] = -0.0
  X[::5, n - 1] = X[::5, n - 1, :1]          # all tokens of a sequence equal: infeasible
  Z = rng.standard_normal((B, n, d))
  Z[::6, 0] = 0.0
  alpha = rng.integers(0, T, (B, n))
  stacked = svm_lib.att_svm_batch(X, Z, alpha, "fro", threads=1)
  alone = [svm_lib.att_svm(X[b], Z[b], alpha[b], "fro") for b in range(B)]
  assert {r.status for r in alone} == statuses
  for a, b in zip(alone, stacked):
    _same_result(a, b)


def test_stacked_frobenius_solves_keep_the_errors_and_mixed_shapes(cases):
  X, Z, alpha = (np.array(a) for a in cases[0])
  bad = X.copy()
  bad[0, 1, 2] = np.nan
  with pytest.raises(ValueError, match=r"X and Z must be finite"):
    svm_lib.att_svm_batch(np.stack([X, bad]), np.stack([Z, Z]), np.stack([alpha, alpha]), threads=1)
  with pytest.raises(ValueError, match=r"alpha must hold integer token indices"):
    svm_lib.att_svm_many([(X, Z, alpha), (X, Z, alpha + 0.5)], threads=1)
  other = svm_lib.att_svm(X[:2], Z[:2], alpha[:2])
  mixed = svm_lib.att_svm_many([(X, Z, alpha), (X[:2], Z[:2], alpha[:2]), (X, Z, alpha, "fro", "nnls")], threads=1)
  for a, b in zip([svm_lib.att_svm(X, Z, alpha), other, svm_lib.att_svm(X, Z, alpha)], mixed):
    _same_result(a, b)


def test_a_batch_with_a_bad_job_gives_att_svms_error(cases):
  """A job of the wrong shape in att_svm_many is att_svm's error, not one of the stacking."""
  X, Z, alpha = (np.array(a) for a in cases[0])
  with pytest.raises(ValueError, match=r"X must have shape \(n, T, d\)"):
    svm_lib.att_svm_many([(X, Z, alpha), (X[0], Z, alpha)], threads=1)
