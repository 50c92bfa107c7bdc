"""Tests of svmattn.svm.feasibility: hand-built infeasible cases, generic feasibility,
certificates (witness margins, Gordan multipliers), agreement with svm.att_svm."""
import numpy as np
import pytest

import svmattn  # noqa: F401  (float64)
from svmattn.svm import feasibility as feas_lib
from svmattn.svm import att_svm as svm_lib


def unit(a):
  return a / np.linalg.norm(a, axis=-1, keepdims=True)


def margins(X, Z, alpha, W):
  """(n, T) margins (x_{i,alpha_i} - x_it)^T W z_i of one data set."""
  top = X[np.arange(len(X)), alpha]
  return np.einsum("ntd,de,ne->nt", top[:, None] - X, W, Z)


def check_certificates(X, Z, alpha, res, mask=None):
  """Witness margins >= 1 where feasible; Gordan multipliers where infeasible."""
  B, n, T, d = X.shape
  for b in range(B):
    keep = np.ones((n, T), bool) if mask is None else mask.copy()
    keep[np.arange(n), alpha[b]] = False
    if res.feasible[b]:
      m = margins(X[b], Z[b], alpha[b], res.witness[b])
      assert np.min(m[keep]) >= 1 - 1e-9
      assert np.all(np.isnan(res.gordan[b]))
    else:
      assert res.status[b] == "infeasible"
      lam = res.gordan[b]
      assert np.all(lam >= 0) and np.all(lam[~keep] == 0)
      np.testing.assert_allclose(lam.sum(), 1.0, atol=1e-12)
      top = X[b, np.arange(n), alpha[b]]
      combo = np.einsum("nt,ntd,ne->de", lam, top[:, None] - X[b], Z[b])
      scale = np.max(np.linalg.norm(top[:, None] - X[b], axis=-1)[keep] *
                     np.repeat(np.linalg.norm(Z[b], axis=-1)[:, None], T, 1)[keep])
      assert np.linalg.norm(combo) <= 1e-6 * scale       # sum_k lambda_k a_k = 0: 0 in conv(rows)
      assert np.all(np.isnan(res.witness[b]))


def test_duplicate_token_is_infeasible():
  rng = np.random.default_rng(0)
  X = unit(rng.normal(size=(1, 3, 4, 5)))
  Z = unit(rng.normal(size=(1, 3, 5)))
  alpha = np.array([[0, 1, 2]])
  assert feas_lib.check(X, Z, alpha).feasible[0]
  X[0, 1, 3] = X[0, 1, 1]                       # sequence 1: a copy of its selected token
  res = feas_lib.check(X, Z, alpha)
  assert not res.feasible[0] and res.status[0] == "infeasible" and res.method[0] == "nnls"
  assert np.isclose(res.gordan[0, 1, 3], 1.0)     # the zero row alone is the certificate
  check_certificates(X, Z, alpha, res)
  assert svm_lib.att_svm(X[0], Z[0], alpha[0]).status == "infeasible"


def test_convex_combination_cannot_be_selected():
  rng = np.random.default_rng(1)
  X = rng.normal(size=(2, 1, 3, 4))
  X[:, 0, 2] = 0.3 * X[:, 0, 0] + 0.7 * X[:, 0, 1]   # token 2 lies between tokens 0 and 1
  Z = rng.normal(size=(2, 1, 4))
  res = feas_lib.check(X, Z, np.array([[2], [0]]))
  assert res.feasible.tolist() == [False, True]       # selecting the middle token is impossible
  check_certificates(X, Z, np.array([[2], [0]]), res)
  np.testing.assert_allclose(res.gordan[0, 0], [0.3, 0.7, 0.0], atol=1e-9)


def test_conflicting_sequences_with_parallel_queries():
  rng = np.random.default_rng(2)
  x = rng.normal(size=(2, 3))
  X = np.stack([x, x])[None]                # two sequences with the same two tokens
  z = rng.normal(size=3)
  alpha = np.array([[0, 1]])                # opposite choices
  for c, feasible in ((2.0, False), (-0.5, True)):
    Z = np.stack([z, c * z])[None]          # z_2 = c z_1: same direction conflicts, opposite agrees
    res = feas_lib.check(X, Z, alpha)
    assert res.feasible[0] == feasible
    check_certificates(X, Z, alpha, res)
    assert svm_lib.att_svm(X[0], Z[0], alpha[0]).ok == feasible


def test_coupled_queries_cancel_although_each_sequence_is_feasible():
  # n = 3 > d = 2: z_3 = z_1 + z_2 and a_3 = -a_1 = -a_2 make a_1 z_1^T + a_2 z_2^T + a_3 z_3^T = 0.
  a = np.array([1.0, 0.5])
  z1, z2 = np.array([1.0, 0.2]), np.array([-0.3, 1.0])
  X = np.zeros((1, 3, 2, 2))
  X[0, 0, 0], X[0, 1, 0], X[0, 2, 1] = a, a, a   # x_{i,0} - x_{i,1} = a, a, -a
  Z = np.stack([z1, z2, z1 + z2])[None]
  alpha = np.zeros((1, 3), np.int64)
  res = feas_lib.check(X, Z, alpha)
  assert not res.feasible[0]
  check_certificates(X, Z, alpha, res)
  np.testing.assert_allclose(res.gordan[0, :, 1], [1 / 3] * 3, atol=1e-9)
  # every sequence alone (and every pair) is feasible
  for keep in ([0], [1], [2], [0, 1], [1, 2]):
    assert feas_lib.check(X[:, keep], Z[:, keep], alpha[:, keep]).feasible[0]
  # a mask that drops one of the three constraints restores feasibility
  mask = np.ones((3, 2), bool)
  mask[2, 0] = False
  mask[2, 1] = False
  res = feas_lib.check(X, Z, alpha, mask=mask)
  assert res.feasible[0]
  check_certificates(X, Z, alpha, res, mask)


@pytest.mark.parametrize("n,T,d", [(3, 4, 3), (4, 3, 4), (2, 6, 5), (6, 6, 8)])
def test_generic_overparameterized_data_always_feasible(n, T, d):
  assert d >= max(T - 1, n)
  rng = np.random.default_rng(n * 100 + T * 10 + d)
  B = 50
  X = rng.normal(size=(B, n, T, d))              # generic, not normalized
  Z = rng.normal(size=(B, n, d))
  alpha = rng.integers(0, T, size=(B, n))
  res = feas_lib.check(X, Z, alpha)
  assert np.all(res.feasible)
  assert np.all(res.method == "lstsq")           # full row rank: the least-squares witness decides
  check_certificates(X, Z, alpha, res)


def test_agrees_with_att_svm_near_infeasibility():
  rng = np.random.default_rng(7)
  statuses = []
  for n, T, d in ((5, 5, 2), (5, 5, 3), (8, 4, 3), (4, 8, 2)):
    B = 40
    X = unit(rng.normal(size=(B, n, T, d)))
    Z = unit(rng.normal(size=(B, n, d)))
    alpha = rng.integers(0, T, size=(B, n))
    res = feas_lib.check(X, Z, alpha)
    check_certificates(X, Z, alpha, res)
    for b in range(B):
      ref = svm_lib.att_svm(X[b], Z[b], alpha[b])
      statuses.append(ref.status)
      assert res.feasible[b] == ref.ok, (n, T, d, b, ref.status, res.method[b])
      if ref.ok and res.method[b] == "nnls":      # NNLS witness = the Frobenius SVM solution itself
        np.testing.assert_allclose(res.witness[b], ref.W, rtol=1e-7, atol=1e-9)
  assert 0.2 < np.mean(np.array(statuses) == "optimal") < 0.9   # both outcomes are exercised


def test_scale_free():
  rng = np.random.default_rng(3)
  X = unit(rng.normal(size=(60, 5, 4, 2)))
  Z = unit(rng.normal(size=(60, 5, 2)))
  alpha = rng.integers(0, 4, size=(60, 5))
  base = feas_lib.check(X, Z, alpha)
  assert 0 < base.feasible.mean() < 1
  scaled = feas_lib.check(1e-4 * X, 1e3 * Z, alpha)
  np.testing.assert_array_equal(base.feasible, scaled.feasible)
  ok = base.feasible
  np.testing.assert_allclose(scaled.witness[ok], base.witness[ok] * 10, rtol=1e-6)   # W scales by 1/(1e-4 * 1e3)


def test_bad_input_is_a_clear_error():
  X = np.zeros((2, 3, 4, 5))
  Z = np.zeros((2, 3, 5))
  with pytest.raises(ValueError, match="alpha must have shape"):
    feas_lib.check(X, Z, np.zeros((2, 4), int))
  with pytest.raises(ValueError, match=r"alpha entries must be in \[0, T=4\)"):
    feas_lib.check(X, Z, np.full((2, 3), 4))
  with pytest.raises(ValueError, match="Z must have shape"):
    feas_lib.check(X, Z[:, :, :4], np.zeros((2, 3), int))
  with pytest.raises(ValueError, match="X must have shape"):
    feas_lib.check(X[0], Z[0], np.zeros(3, int))
  with pytest.raises(ValueError, match="mask must have shape"):
    feas_lib.check(X, Z, np.zeros((2, 3), int), mask=np.ones((4, 3), bool))


@pytest.mark.parametrize("masked", [False, True])
def test_one_dimension_decided_by_signs_as_by_nnls(masked):
  """d = 1: a constraint of each sign (or a zero one) is infeasible at once (method "sign"), with the
  same status as the NNLS test gives every data set alone, and a valid Gordan certificate."""
  rng = np.random.default_rng(7)
  B, n, T = 400, 3, 4
  X = rng.normal(size=(B, n, T, 1))
  Z = rng.normal(size=(B, n, 1))
  best = np.argmax(X[..., 0] * np.sign(Z[:, :, :1]), axis=-1)       # every margin positive: feasible
  alpha = np.where(rng.random((B, 1)) < 0.5, best, rng.integers(0, T, size=(B, n)))   # about half of them
  for b in range(5):                                                 # a zero constraint
    X[b, 0, (alpha[b, 0] + 1) % T] = X[b, 0, alpha[b, 0]]
  mask = rng.random((n, T)) < 0.8 if masked else None
  res = feas_lib.check(X, Z, alpha, mask)
  keep = np.ones((B, n, T), bool) if mask is None else np.broadcast_to(mask, (B, n, T)).copy()
  keep[np.arange(B)[:, None], np.arange(n)[None], alpha] = False
  D = feas_lib._differences(X, alpha, keep)
  s = feas_lib._row_scale(D, Z, keep)
  alone = np.array([feas_lib._nnls_one(D[b], Z[b], keep[b], s[b])[0] for b in range(B)])
  assert np.array_equal(res.status, alone)
  assert 0.2 < np.mean(res.feasible) < 0.8
  assert set(res.method[~res.feasible]) == {"sign"} and "sign" not in set(res.method[res.feasible])
  check_certificates(X, Z, alpha, res, mask)
