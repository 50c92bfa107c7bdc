"""svmattn.analysis.metrics: correlation, token selection, convergence types, numerical rank."""
import numpy as np
import pytest

from svmattn.analysis import metrics
from svmattn.svm import att_svm as svm_lib


# ----------------------------------------------------------------------------
# corr
# ----------------------------------------------------------------------------

def test_corr_properties():
  rng = np.random.default_rng(0)
  A, B = rng.normal(size=(2, 5, 5))
  np.testing.assert_allclose(metrics.corr(A, A), 1.0, rtol=1e-15)
  np.testing.assert_allclose(metrics.corr(A, -A), -1.0, rtol=1e-15)
  np.testing.assert_allclose(metrics.corr(A, B), metrics.corr(B, A), rtol=1e-15)
  np.testing.assert_allclose(metrics.corr(3.0 * A, 0.01 * B), metrics.corr(A, B), rtol=1e-13)
  np.testing.assert_allclose(metrics.corr(A, B), np.sum(A * B) / np.linalg.norm(A) / np.linalg.norm(B), rtol=1e-14)
  # orthogonal matrices: 0
  E1, E2 = np.zeros((2, 3, 3))
  E1[0, 1], E2[1, 0] = 1.0, 2.0
  assert metrics.corr(E1, E2) == 0.0
  # bounded by Cauchy-Schwarz
  many = rng.normal(size=(200, 3, 3))
  c = metrics.corr(many, many[::-1])
  assert c.shape == (200,) and np.all(np.abs(c) <= 1)


def test_corr_broadcasts_over_leading_axes():
  rng = np.random.default_rng(1)
  curves = rng.normal(size=(4, 7, 3, 3))  # (B, S, d, d)
  svm_W = rng.normal(size=(4, 3, 3))
  c = metrics.corr(curves, svm_W[:, None])
  assert c.shape == (4, 7)
  np.testing.assert_allclose(c[2, 5], metrics.corr(curves[2, 5], svm_W[2]), rtol=1e-15)


def test_corr_nan_for_zero_or_nan():
  A = np.eye(3)
  assert np.isnan(metrics.corr(A, np.zeros((3, 3))))
  assert np.isnan(metrics.corr(A, np.full((3, 3), np.nan)))
  c = metrics.corr(np.stack([A, A]), np.stack([A, np.zeros((3, 3))]))
  assert c[0] == 1.0 and np.isnan(c[1])


def test_corr_per_run_is_corr_computed_for_the_runs_with_an_object():
  rng = np.random.default_rng(2)
  A = rng.normal(size=(9, 6, 4, 4))          # (runs, snapshots, d, d)
  A[3, 2, 1, 1] = np.nan                     # a trajectory that diverged
  A[5, :, 0, 0] = np.inf
  B = rng.normal(size=(9, 4, 4))
  B[1] = np.nan                              # no object (not solved)
  B[4, 2, 2] = np.inf
  B[6, 0, 3] = np.nan
  B[7] = 0.0                                 # a zero object
  got, want = metrics.corr_per_run(A, B), metrics.corr(A, B[:, None])
  assert got.shape == (9, 6)
  np.testing.assert_array_equal(got, want)   # the same bits, NaN where corr gives NaN
  assert np.isnan(got[[1, 4, 6, 7]]).all() and np.isfinite(got[[0, 2, 8]]).all()
  assert metrics.corr_per_run(A[:0], B[:0]).shape == (0, 6)
  none = np.full_like(B, np.nan)
  assert np.isnan(metrics.corr_per_run(A, none)).all()


def test_optimal_and_selected_tokens():
  gamma = np.array([[0.1, 0.5, -1.0], [2.0, 1.0, 0.0]])
  np.testing.assert_array_equal(metrics.optimal_tokens(gamma), [1, 0])
  s = np.array([[[0.2, 0.1, 0.7], [0.6, 0.3, 0.1]]])
  np.testing.assert_array_equal(metrics.selected_tokens(s), [[2, 0]])


# ----------------------------------------------------------------------------
# Convergence types on a hand-built data set
# ----------------------------------------------------------------------------
# One sequence, d = 2, query z = e1, so (x_a - x_t)^T W z = (x_a - x_t)^T w with w = W e1,
# and the Frobenius SVM is the vector SVM min ||w|| s.t. (x_a - x_t)^T w >= 1.
# Tokens x0 = (0,0), x1 = (1,0), x2 = (2,2).  For alpha = 0:
#   -w1 >= 1 and -2 w1 - 2 w2 >= 1  ->  w = (-1, 0); support = {1}; token 2 has margin 2.
# Scores gamma_t = v^T x_t:
#   v = (-1, 2): gamma = (0, -1, 2): opt = 2; alpha = 0 beats its only support token 1 -> local.
#   v = ( 1, 2): gamma = (0,  1, 6): token 1 (support) beats alpha = 0 -> not-local.
# alpha = 1 (the middle token) with x3 = (2,0) added is infeasible on the line x_2 = 0.

X = np.array([[[0.0, 0.0], [1.0, 0.0], [2.0, 2.0]]])
Z = np.array([[1.0, 0.0]])


def _gamma(v):
  """gamma_it = v^T x_it (labels +1): (1, 3)."""
  return X @ np.asarray(v, float)


def test_hand_built_svm():
  r = svm_lib.att_svm(X, Z, np.array([0]))
  assert r.ok
  np.testing.assert_allclose(r.W, [[-1.0, 0.0], [0.0, 0.0]], atol=1e-12)
  np.testing.assert_array_equal(r.support, [[False, True, False]])
  np.testing.assert_allclose(r.margins, [[np.nan, 1.0, 2.0]], atol=1e-12)


def test_convergence_type_local():
  gamma = _gamma([-1.0, 2.0])
  np.testing.assert_allclose(gamma, [[0.0, -1.0, 2.0]])
  alpha = np.array([0])
  r = svm_lib.att_svm(X, Z, alpha)
  assert metrics.is_locally_optimal(gamma, alpha, r)
  assert metrics.convergence_type(gamma, alpha, r) == "local"
  # at opt it is global
  r_opt = svm_lib.att_svm(X, Z, np.array([2]))
  assert metrics.convergence_type(gamma, np.array([2]), r_opt) == "global"


def test_convergence_type_not_local():
  gamma = _gamma([1.0, 2.0])
  np.testing.assert_allclose(gamma, [[0.0, 1.0, 6.0]])
  alpha = np.array([0])
  r = svm_lib.att_svm(X, Z, alpha)
  assert not metrics.is_locally_optimal(gamma, alpha, r)
  assert metrics.convergence_type(gamma, alpha, r) == "not-local"


def test_convergence_type_tie_with_a_support_token_is_not_local():
  gamma = np.array([[0.0, 0.0, 2.0]])  # gamma_alpha = gamma of the support token: not strictly greater
  r = svm_lib.att_svm(X, Z, np.array([0]))
  assert metrics.convergence_type(gamma, np.array([0]), r) == "not-local"


def test_convergence_type_infeasible_is_not_local():
  X_line = np.array([[[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]]])
  alpha = np.array([1])
  r = svm_lib.att_svm(X_line, Z, alpha)
  assert r.status == "infeasible"
  gamma = np.array([[0.0, 1.0, 5.0]])
  assert not metrics.is_locally_optimal(gamma, alpha, r)
  assert metrics.convergence_type(gamma, alpha, r) == "not-local"
  # global is decided by the selection alone
  assert metrics.convergence_type(np.array([[0.0, 9.0, 5.0]]), alpha, r) == "global"


def test_convergence_type_with_two_sequences():
  """Every sequence must be locally optimal: one bad sequence makes the run not-local.
  Queries e1 and e2 decouple the sequences (columns W e1 and W e2)."""
  X2 = np.concatenate([X, X])
  Z2 = np.eye(2)
  good, bad = _gamma([-1.0, 2.0])[0], _gamma([1.0, 2.0])[0]
  alpha = np.array([0, 0])
  r = svm_lib.att_svm(X2, Z2, alpha)
  np.testing.assert_array_equal(r.support, [[False, True, False]] * 2)
  assert metrics.convergence_type(np.stack([good, good]), alpha, r) == "local"
  assert metrics.convergence_type(np.stack([good, bad]), alpha, r) == "not-local"
  alpha = np.array([2, 0])  # sequence 0 at its optimal token, sequence 1 locally optimal
  assert metrics.convergence_type(np.stack([good, good]), alpha, svm_lib.att_svm(X2, Z2, alpha)) == "local"
  alpha = np.array([2, 2])
  assert metrics.convergence_type(np.stack([good, good]), alpha, svm_lib.att_svm(X2, Z2, alpha)) == "global"


def test_type_fractions():
  fr = metrics.type_fractions(["global", "local", "global", "not-local"])
  assert fr == {"global": 0.5, "local": 0.25, "not-local": 0.25, "tie": 0.0, "diverged": 0.0, "stalled": 0.0, "unsaturated": 0.0}
  assert metrics.type_fractions([]) == {"global": 0.0, "local": 0.0, "not-local": 0.0, "tie": 0.0, "diverged": 0.0, "stalled": 0.0, "unsaturated": 0.0}


# ----------------------------------------------------------------------------
# Ranks
# ----------------------------------------------------------------------------

def test_numerical_rank():
  rng = np.random.default_rng(2)
  U, V = rng.normal(size=(2, 6, 2))
  W = U @ V.T  # rank 2
  assert metrics.numerical_rank(W) == 2
  noisy = W + 1e-9 * rng.normal(size=(6, 6))
  assert metrics.numerical_rank(noisy) == 2
  assert metrics.numerical_rank(noisy, rtol=1e-12) == 6
  batch = np.stack([W, np.eye(6), np.zeros((6, 6)), np.outer(U[:, 0], V[:, 0])])
  np.testing.assert_array_equal(metrics.numerical_rank(batch), [2, 6, 0, 1])
  # scale invariant
  assert metrics.numerical_rank(1e8 * W) == 2 and metrics.numerical_rank(1e-8 * W) == 2


def test_mean_std_ignores_nan():
  x = np.array([[1.0, np.nan], [3.0, 2.0]])
  mean, std = metrics.mean_std(x)
  np.testing.assert_allclose(mean, [2.0, 2.0])
  np.testing.assert_allclose(std, [1.0, 0.0])


def test_ties_in_the_optimal_token_are_their_own_type():
  """A sequence whose largest score is not unique has no opt: 'tie', never 'global', even
  when the selection is argmax's first index and whatever the SVM says."""
  r = svm_lib.att_svm(X, Z, np.array([2]))
  tied = np.array([[0.0, 2.0, 2.0]])
  assert metrics.has_tie(tied) and not metrics.has_tie(np.array([[0.0, 1.0, 2.0]]))
  assert metrics.convergence_type(tied, np.array([1]), r) == "tie"
  assert metrics.convergence_type(tied, np.array([2]), r) == "tie"
  # within rounding of the largest score counts as tied; a clear gap does not
  assert metrics.has_tie(np.array([[1.0, 1.0 + 1e-15, 0.0]]))
  assert not metrics.has_tie(np.array([[1.0, 1.0 + 1e-9, 0.0]]))
  # batched: one tied sequence is enough
  batch = np.stack([np.array([[0.0, 1.0, 2.0], [3.0, 3.0, 0.0]]), np.array([[0.0, 1.0, 2.0], [3.0, 1.0, 0.0]])])
  np.testing.assert_array_equal(metrics.has_tie(batch), [True, False])
  fr = metrics.type_fractions(["tie", "global", "global", "local"])
  assert fr == {"global": 0.5, "local": 0.25, "not-local": 0.0, "tie": 0.25, "diverged": 0.0, "stalled": 0.0, "unsaturated": 0.0}


def test_norms_distances_and_bregman():
  W = np.array([[3.0, -4.0], [0.0, 1.0]])
  s = np.linalg.svd(W, compute_uv=False)
  assert metrics.norm_value(W, "fro") == metrics.norm_value(W, "l2") == pytest.approx(np.sqrt(26))
  assert metrics.norm_value(W, "l1") == 8.0 and metrics.norm_value(W, "linf") == 4.0
  assert metrics.norm_value(W, "nuc") == pytest.approx(s.sum()) and metrics.norm_value(W, "spectral") == pytest.approx(s[0])
  assert metrics.norm_value(W, "l3") == pytest.approx((27 + 64 + 1) ** (1 / 3))
  # scale-free: the same direction is at distance 0 in every norm, opposite directions at 2
  for norm in ("fro", "l1", "linf", "l3", "nuc", "spectral"):
    assert metrics.norm_distance(W, 2.5 * W, norm) == pytest.approx(0.0, abs=1e-15)
    assert metrics.norm_distance(W, -W, norm) == pytest.approx(2.0)
  # Bregman divergence of psi = ||.||_2^2 / 2 between unit vectors is half their squared distance
  B = np.eye(2)
  want = 0.5 * np.sum((W / np.linalg.norm(W) - B / np.sqrt(2)) ** 2)
  assert metrics.bregman_lp(W, B, 2.0) == pytest.approx(want)
  assert metrics.bregman_lp(W, W * 3, 3.0) == pytest.approx(0.0, abs=1e-15)
  assert metrics.bregman_lp(W, B, 3.0) > 0
  with pytest.raises(ValueError, match="unknown norm"):
    metrics.norm_value(W, "bogus")


def test_linear_token_scores_agree_with_the_head_and_do_not_depend_on_the_batch(batch):
  """The host token scores equal the model's (jax) scores to within the error bound of two dot
  products of length d (each within d * eps * sum_k |v_k x_k| of the exact value), and a data
  set's scores are bit for bit the same alone or in a batch."""
  import jax
  from conftest import host
  from svmattn.models import heads
  X, Y, Z, v = host(batch)
  gamma = metrics.linear_token_scores(v, X, Y)
  model = np.asarray(jax.vmap(lambda v, X, Y: heads.token_scores(heads.LINEAR, v, X, Y))(v, X, Y))
  d = X.shape[-1]
  bound = 2 * d * np.finfo(np.float64).eps * np.einsum("bntd,bd->bnt", np.abs(X), np.abs(v))
  assert gamma.shape == X.shape[:3] and np.all(np.abs(gamma - model) <= bound)
  for b in (0, len(X) - 1):
    alone = metrics.linear_token_scores(v[b:b + 1], X[b:b + 1], Y[b:b + 1])
    assert np.array_equal(alone[0], gamma[b])
  g32 = metrics.linear_token_scores(v.astype(np.float32), X.astype(np.float32), Y.astype(np.float32))
  assert g32.dtype == np.float32


def test_convergence_types_of_a_batch_equal_one_at_a_time():
  """metrics.convergence_types gives every data set the type convergence_type gives it alone:
  global, local, not-local (an infeasible SVM included), tie and the health labels."""
  rng = np.random.default_rng(3)
  B, n, T, d = 200, 3, 4, 3
  Xb = rng.standard_normal((B, n, T, d))
  Zb = rng.standard_normal((B, n, d))
  gamma = rng.standard_normal((B, n, T))
  gamma[::9, 1, :2] = 5.0                                    # ties
  Xb[::7, 0] = Xb[::7, 0, :1]                                # infeasible selections
  alpha = np.where(rng.random((B, n)) < 0.5, np.argmax(gamma, -1), rng.integers(0, T, (B, n)))
  health = np.where(rng.random(B) < 0.1, "stalled", "ok")
  results = svm_lib.att_svm_batch(Xb, Zb, alpha, "fro", threads=1)
  got = metrics.convergence_types(gamma, alpha, results, health)
  want = [metrics.convergence_type(gamma[b], alpha[b], results[b], health[b]) for b in range(B)]
  assert got.tolist() == want
  assert set(want) == {"global", "local", "not-local", "tie", "stalled"}


def test_spearman_is_scipys_statistic_with_ties_and_without():
  """metrics.spearman (no scipy.stats import) against scipy.stats.spearmanr: average ranks for ties;
  the same statistic to rounding, and NaN for a constant input."""
  import scipy.stats
  rng = np.random.default_rng(0)
  for trial in range(50):
    m = int(rng.integers(2, 40))
    x = rng.integers(0, 5, m).astype(float) if trial % 2 else rng.normal(size=m)
    y = rng.normal(size=m) if trial % 3 else np.round(rng.normal(size=m), 1)
    want = scipy.stats.spearmanr(x, y)[0]
    if np.isnan(want):
      assert np.isnan(metrics.spearman(x, y))
    else:
      assert abs(metrics.spearman(x, y) - want) < 1e-12, trial
  np.testing.assert_array_equal(metrics.average_ranks(np.array([3.0, 1.0, 3.0, 2.0])), [3.5, 1.0, 3.5, 2.0])
  assert np.isnan(metrics.spearman(np.ones(4), np.arange(4.0)))
