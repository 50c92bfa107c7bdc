"""svmattn.svm.norms through att_svm: Att-SVMs in the spectral, l1, linf and lp norms.

Checks: l2 is the Frobenius (NNLS) SVM; every solution satisfies its constraints, its objective
is its norm, and a dual certificate (sum of multipliers = objective, dual norm of
sum_k dual_k A_k <= 1) proves it optimal; CLARABEL and SCS agree; hand-solved vector cases;
infeasible data; each solution has the smallest norm of its own kind among all the solutions.
Data: two random sets with n=3, T=4, d=6 (d >= max(T-1, n): feasible for every selection).
"""
import numpy as np
import pytest

from svmattn.svm import att_svm as svm_lib
from svmattn.svm import norms as norms_lib

NEW = ("spectral", "l1", "linf", "l1.75", "l3")
ALL = ("fro", "nuc") + NEW


def _unit(a):
  return a / np.linalg.norm(a, axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def cases():
  rng = np.random.default_rng(7)
  out = []
  for _ in range(2):
    X = _unit(rng.standard_normal((3, 4, 6)))
    Z = _unit(rng.standard_normal((3, 6)))
    out.append((X, Z, rng.integers(0, 4, 3)))
  return out


@pytest.fixture(scope="module")
def solved(cases):
  return {nm: [svm_lib.att_svm(X, Z, a, nm) for X, Z, a in cases] for nm in ALL}


def _margins(W, X, Z, alpha):
  n, T, _ = X.shape
  out = np.full((n, T), np.nan)
  for i in range(n):
    for t in range(T):
      if t != alpha[i]:
        out[i, t] = (X[i, alpha[i]] - X[i, t]) @ W @ Z[i]
  return out


def test_parse_norm():
  assert norms_lib.parse_norm("l2").kind == "fro" and norms_lib.parse_norm("fro").name == "fro"
  assert norms_lib.parse_norm("l1.0").name == "l1" and norms_lib.parse_norm("l3.0").name == "l3"
  assert norms_lib.parse_norm("l1.75") == norms_lib.Norm("l1.75", "lp", 1.75)
  assert norms_lib.parse_norm("linf").p == np.inf
  for bad in ("l0.5", "l1e3", "lp", "l-2", "l0", "inf", "frob", 2, "l"):
    with pytest.raises(ValueError, match="p must be > 1|unknown SVM norm"):
      norms_lib.parse_norm(bad)
  X, Z = np.ones((1, 2, 2)), np.ones((1, 2))
  with pytest.raises(ValueError, match="l<p>"):
    svm_lib.att_svm(X, Z, np.array([0]), "l0.5")
  assert svm_lib.NORMS == ("fro", "nuc")


def test_l2_is_frobenius(cases):
  for X, Z, a in cases:
    fro = svm_lib.att_svm(X, Z, a, "fro")
    for solver in (None, "CLARABEL"):
      r = svm_lib.att_svm(X, Z, a, "l2", solver)
      assert r.ok and r.norm == "l2"
      np.testing.assert_allclose(r.W, fro.W, rtol=0, atol=1e-6)
      np.testing.assert_allclose(r.objective, fro.objective, rtol=1e-6)
    assert svm_lib.att_svm(X, Z, a, "l2").solver == "nnls"
    np.testing.assert_array_equal(svm_lib.att_svm(X, Z, a, "l2").W, fro.W)


@pytest.mark.parametrize("nm", NEW)
def test_constraints_objective_and_dual_certificate(cases, solved, nm):
  for (X, Z, a), r in zip(cases, solved[nm]):
    assert r.status == "optimal" and r.solver == "CLARABEL" and r.norm == nm, r.message
    m = _margins(r.W, X, Z, a)
    assert np.nanmin(m) >= 1 - 1e-6
    np.testing.assert_allclose(np.nanmin(m), 1.0, atol=1e-12)  # rescaled: smallest margin exactly 1
    np.testing.assert_allclose(r.margins, m, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(r.objective, norms_lib.norm_value(r.W, nm), rtol=1e-12)
    # weak duality: for lam >= 0 with ||sum lam_k A_k||_dual <= 1, sum lam <= ||W|| for every feasible W
    lam = r.dual
    assert lam is not None and np.all(lam >= -1e-9)
    diff = X[np.arange(3), a][:, None, :] - X
    M = np.einsum("nt,ntd,ne->de", lam, diff, Z)
    assert norms_lib.dual_norm_value(M, nm) <= 1 + 1e-6
    np.testing.assert_allclose(lam.sum(), r.objective, rtol=1e-6)
    # support = the active constraints; complementary slackness
    assert np.any(r.support)
    np.testing.assert_array_equal(r.support, np.nan_to_num(m, nan=np.inf) - 1 <= svm_lib.SUPPORT_TOL["CLARABEL"])
    assert np.all(lam[~r.support] <= 1e-6 * r.objective)


@pytest.mark.parametrize("nm", NEW)
def test_scs_agrees_with_clarabel(cases, solved, nm):
  X, Z, a = cases[0]
  r = svm_lib.att_svm(X, Z, a, nm, "SCS")
  assert r.ok and r.solver == "SCS", r.message
  np.testing.assert_allclose(r.objective, solved[nm][0].objective, rtol=1e-5)
  assert np.nanmin(r.margins) >= 1 - 1e-6


def test_each_solution_minimizes_its_own_norm(solved):
  """||W_p||_p <= ||W_q||_p for every pair of solutions (all feasible and rescaled to margin >= 1)."""
  for b in range(2):
    for own in ALL:
      best = solved[own][b].objective
      for other in ALL:
        assert best <= norms_lib.norm_value(solved[other][b].W, own) * (1 + 1e-6), (own, other)
    # and the lp norms of the lp solutions are ordered like the norms: ||w||_q <= ||w||_p for q > p
    W = {nm: solved[nm][b].W for nm in ("l1", "l1.75", "fro", "l3", "linf")}
    for nm, Wp in W.items():
      vals = [norms_lib.norm_value(Wp, q) for q in ("l1", "l1.75", "fro", "l3", "linf")]
      assert np.all(np.diff(vals) <= 1e-12)


# ----------------------------------------------------------------------------
# Hand-solved: one sequence, d = 2, query e1, so margins are a_t^T w with w = W e1
# (the second column of W is unconstrained and 0 in the minimum; linf and spectral
# leave it partly free, so only W e1 is checked). alpha = 0, x0 = 0, x1 = -(2, 1),
# x2 = -(0.5, 2): constraints 2 w1 + w2 >= 1 and 0.5 w1 + 2 w2 >= 1.
#   l1:   vertices (0, 1) -> 1, (2, 0) -> 2, (2/7, 3/7) -> 5/7: w = (2/7, 3/7), both active.
#   linf: w1 = w2 = 0.4 (the box of radius 0.4 touches constraint 2 at one corner only);
#         constraint 1 has margin 1.2: support {2}.
#   l2 / spectral (= ||w||_2 here): a2 alone gives (0.5, 2)/4.25, violating constraint 1, so
#         both are active: w = (2/7, 3/7), ||w|| = sqrt(13)/7.
# ----------------------------------------------------------------------------

XH = np.array([[[0.0, 0.0], [-2.0, -1.0], [-0.5, -2.0]]])
ZH = np.array([[1.0, 0.0]])


@pytest.mark.parametrize("nm, w, obj, support", [
    ("l1", [2 / 7, 3 / 7], 5 / 7, [False, True, True]),
    ("linf", [0.4, 0.4], 0.4, [False, False, True]),
    ("spectral", [2 / 7, 3 / 7], np.sqrt(13) / 7, [False, True, True]),
    ("l3", None, None, [False, True, True]),
])
def test_hand_solved(nm, w, obj, support):
  r = svm_lib.att_svm(XH, ZH, np.array([0]), nm)
  assert r.ok, r.message
  np.testing.assert_array_equal(r.support, [support])
  if w is not None:
    np.testing.assert_allclose(r.W[:, 0], w, atol=1e-7)
    np.testing.assert_allclose(r.objective, obj, rtol=1e-7)
  else:  # l3 between l1 and linf: both constraints active, w on the segment of their intersection
    np.testing.assert_allclose(r.W[:, 0], [2 / 7, 3 / 7], atol=1e-7)
  if nm != "linf":
    np.testing.assert_allclose(r.W[:, 1], 0, atol=1e-7)


@pytest.mark.parametrize("nm", NEW)
@pytest.mark.parametrize("solver", ["CLARABEL", "SCS"])
def test_infeasible(nm, solver):
  """x0, x1, x2 on the line x_2 = 0 with alpha = 1 in the middle: w1 >= 1 and -w1 >= 1."""
  X = np.array([[[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]]])
  r = svm_lib.att_svm(X, ZH, np.array([1]), nm, solver)
  assert r.status == "infeasible" and not r.ok, r.message
  assert r.W is None and not r.support.any() and np.isnan(r.objective)


def test_batch_defaults(cases):
  X = np.stack([c[0] for c in cases])
  Z = np.stack([c[1] for c in cases])
  a = np.stack([c[2] for c in cases])
  out = svm_lib.att_svm_batch(X, Z, a, "l1.75", threads=2)
  for (Xb, Zb, ab), r in zip(cases, out):
    ref = svm_lib.att_svm(Xb, Zb, ab, "l1.75")
    assert r.solver == "CLARABEL"
    np.testing.assert_array_equal(r.W, ref.W)  # deterministic


@pytest.mark.parametrize("norm", ["l1", "linf", "l3", "spectral"])
def test_support_and_convergence_types_in_any_norm(norm):
  """The locally-optimal test and the convergence types read only the SVM's support, so they
  work for every norm: on the hand-built case of tests/test_metrics.py (one sequence, d = 2,
  query e1, tokens (0,0), (1,0), (2,2), alpha = 0), token 1 is a support token in every norm
  (its constraint -w1 >= 1 is the only one that binds along w2 = 0)."""
  from svmattn.analysis import metrics
  X = np.array([[[0.0, 0.0], [1.0, 0.0], [2.0, 2.0]]])
  Z = np.array([[1.0, 0.0]])
  r = svm_lib.att_svm(X, Z, np.array([0]), norm)
  assert r.ok and r.support[0, 1]
  assert metrics.convergence_type(np.array([[0.0, -1.0, 2.0]]), np.array([0]), r) == "local"
  assert metrics.convergence_type(np.array([[0.0, 1.0, 6.0]]), np.array([0]), r) == "not-local"
  assert metrics.convergence_type(np.array([[0.0, -1.0, 2.0]]), np.array([2]),
                                  svm_lib.att_svm(X, Z, np.array([2]), norm)) == "global"


def test_spectral_on_the_reduced_problem_agrees_with_clarabel(cases, solved):
  """clarabel_reduced (Clarabel without cvxpy, on the spans the constraints see): the same
  optimum to 1e-6, an exact smallest margin of 1 and a dual certificate."""
  for (X, Z, a), ref in zip(cases, solved["spectral"]):
    r = svm_lib.att_svm(X, Z, a, "spectral", "clarabel_reduced")
    assert r.ok and r.solver == "clarabel_reduced", r.message
    np.testing.assert_allclose(r.objective, ref.objective, rtol=1e-6)
    np.testing.assert_allclose(np.nanmin(_margins(r.W, X, Z, a)), 1.0, atol=1e-12)
    diff = X[np.arange(3), a][:, None, :] - X
    M = np.einsum("nt,ntd,ne->de", r.dual, diff, Z)
    assert norms_lib.dual_norm_value(M, "spectral") <= 1 + 1e-6
    np.testing.assert_allclose(r.dual.sum(), r.objective, rtol=1e-6)


def test_spectral_reduced_infeasible_and_other_norms():
  X = np.array([[[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]]])
  r = svm_lib.att_svm(X, ZH, np.array([1]), "spectral", "clarabel_reduced")
  assert r.status == "infeasible" and r.W is None
  with pytest.raises(ValueError, match="spectral SVM only"):
    svm_lib.att_svm(X, ZH, np.array([1]), "l1", "clarabel_reduced")
