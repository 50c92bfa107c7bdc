"""The direct SCS nuclear-norm Att-SVM against cvxpy (Clarabel), and its reduction."""
import numpy as np
import pytest

import svmattn  # noqa: F401
from svmattn.data import datasets as data_lib
from svmattn.svm import att_svm as svm_lib
from svmattn.svm import nuclear as svm_nuclear


@pytest.fixture(scope="module")
def cases():
  D = data_lib.generate(data_lib.DataSpec(n=3, T=4, d=5), 2, np.arange(6))
  alpha = np.random.RandomState(3).randint(0, 4, (6, 3))
  return np.asarray(D.X), np.asarray(D.Z), alpha


def test_matches_clarabel(cases):
  X, Z, alpha = cases
  for b in range(len(X)):
    ours = svm_lib.att_svm(X[b], Z[b], alpha[b], "nuc", "scs_direct")
    ref = svm_lib.att_svm(X[b], Z[b], alpha[b], "nuc", "CLARABEL")
    assert ours.ok and ref.ok
    assert np.nanmin(ours.margins) >= 1 - 1e-9
    assert abs(ours.objective / ref.objective - 1) <= 1e-6
    # strong duality of the nuclear SVM: objective = sum of the multipliers
    assert abs(ours.dual.sum() / ours.objective - 1) <= 1e-6
    # dual feasibility: || sum_j dual_j A_j ||_2 <= 1
    A, keep = svm_lib.margin_matrix(X[b], Z[b], alpha[b])
    M = (ours.dual[keep] @ A).reshape(5, 5)
    assert np.linalg.norm(M, 2) <= 1 + 1e-6


def test_reduction_keeps_the_constraints(cases):
  X, Z, alpha = cases
  A, _ = svm_lib.margin_matrix(X[0], Z[0], alpha[0])
  QL, QR, Ar = svm_nuclear.reduce(A, 5)
  assert QL.shape == (5, 5) and QR.shape == (5, 3)      # W z_i matters for the n=3 queries only
  np.testing.assert_allclose(QR.T @ QR, np.eye(3), atol=1e-12)
  Wr = np.random.RandomState(0).randn(5, 3)
  np.testing.assert_allclose(Ar @ Wr.reshape(-1), A @ (QL @ Wr @ QR.T).reshape(-1), atol=1e-12)


def test_rank_one_rows_reduce_on_the_spans_of_their_factors(cases):
  """Att-SVM rows are rank one, A_j = a_j b_j^T: ``reduce`` takes the spans of the a_j and the b_j
  (numerics version 15), the subspaces the concatenations of the A_j span (the projectors agree to
  rounding). A row 1e-11 of its norm off rank one takes the concatenations, which see that row's
  full column and row spaces (a tolerance like the interior point's 1e-10 would have dropped them)."""
  X, Z, alpha = cases
  A, _ = svm_lib.margin_matrix(X[0], Z[0], alpha[0])
  mats = A.reshape(-1, 5, 5)
  QL, QR, _ = svm_nuclear.reduce(A, 5)
  CL = svm_nuclear._basis(mats.transpose(1, 0, 2).reshape(5, -1))
  CR = svm_nuclear._basis(mats.transpose(2, 0, 1).reshape(5, -1))
  assert QR.shape == CR.shape == (5, 3)
  np.testing.assert_allclose(QL @ QL.T, CL @ CL.T, atol=1e-12)
  np.testing.assert_allclose(QR @ QR.T, CR @ CR.T, atol=1e-12)
  B = A.copy()
  B[0] += 1e-11 * np.linalg.norm(B[0]) * np.random.RandomState(1).randn(25) / 5
  QL2, QR2, Br = svm_nuclear.reduce(B, 5)
  assert QR2.shape == (5, 5)
  Wr = np.random.RandomState(0).randn(5, 5)
  np.testing.assert_allclose(Br @ Wr.reshape(-1), B @ (QL2 @ Wr @ QR2.T).reshape(-1), atol=1e-12)


def test_infeasible_and_wrong_norm(cases):
  X, Z, _ = cases
  x = X[0].copy()
  x[0, 1] = x[0, 0]
  res = svm_lib.att_svm(x, Z[0], np.zeros(3, int), "nuc", "scs_direct")
  assert res.status == "infeasible" and res.W is None
  with pytest.raises(ValueError, match="nuclear"):
    svm_lib.att_svm(X[0], Z[0], np.zeros(3, int), "fro", "scs_direct")


def test_dual_interior_point_path_matches_scs(cases):
  """clarabel_dual solves the dual (N variables, one PSD cone) and reads W off its cone's dual
  variable: the same optimum as SCS on the primal, to 1e-6, with the same margin checks."""
  X, Z, alpha = cases
  for b in range(len(X)):
    ours = svm_lib.att_svm(X[b], Z[b], alpha[b], "nuc", "clarabel_dual")
    ref = svm_lib.att_svm(X[b], Z[b], alpha[b], "nuc", "scs_direct")
    assert ours.ok and ref.ok and ours.solver == "clarabel_dual"
    assert np.nanmin(ours.margins) == pytest.approx(1.0, abs=1e-12)    # rescaled: smallest margin 1
    assert abs(ours.objective / ref.objective - 1) <= 1e-6
    assert np.linalg.norm(ours.W - ref.W) <= 1e-4 * np.linalg.norm(ref.W)
    assert abs(ours.dual.sum() / ours.objective - 1) <= 1e-6          # strong duality
    assert ours.support.sum() >= 1


def test_dual_path_reports_infeasible():
  """Two tokens with equal keys: no W separates them, the dual is unbounded."""
  X = np.zeros((1, 2, 3))
  X[0, :, 0] = 1.0
  res = svm_lib.att_svm(X, np.ones((1, 3)), np.array([0]), "nuc", "clarabel_dual")
  assert res.status == "infeasible" and res.W is None


def test_dual_path_is_for_the_nuclear_norm_only(cases):
  X, Z, alpha = cases
  with pytest.raises(ValueError, match="nuclear SVM only"):
    svm_lib.att_svm(X[0], Z[0], alpha[0], "fro", "clarabel_dual")


def test_auto_path_picks_by_reduced_size(cases, monkeypatch):
  """nuc_auto solves the dual where the reduced block is small, SCS's primal otherwise: the same
  optimum either way."""
  X, Z, alpha = cases
  ref = svm_lib.att_svm(X[0], Z[0], alpha[0], "nuc", "scs_direct")
  calls = []
  for name in ("_solve_dual_reduced", "_solve_rect"):
    original = getattr(svm_nuclear, name)
    monkeypatch.setattr(svm_nuclear, name, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a))
  for limit, path in ((0, "_solve_rect"), (100, "_solve_dual_reduced")):   # the block here has 5 + 3 rows
    monkeypatch.setattr(svm_nuclear, "AUTO_DUAL_MAX_BLOCK", limit)
    calls.clear()
    res = svm_lib.att_svm(X[0], Z[0], alpha[0], "nuc", "nuc_auto")
    assert calls == [path]
    assert res.ok and abs(res.objective / ref.objective - 1) <= 1e-6
