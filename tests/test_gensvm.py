"""Gen-SVM: a hand-built case with a known answer, the constraints and KKT conditions
of W^fin and W^mm on random cases (and against an independent conic solve), the
discard rules, infeasible systems, and the lambda head's optimal attention."""
import numpy as np
import pytest

from svmattn.svm import gensvm
from svmattn.analysis import metrics
from svmattn.svm import att_svm as svm_lib

TINY = 1e-9  # a masked probability (below tau_L = 1e-6)


def _hand_built():
  """n=2, T=3, d=3, tokens e_1, e_2, e_3 (X_i = I), z_1 = e_1, z_2 = e_2, so the logit of
  token t in sequence i is W[t, i]. Sequence 1 selects tokens {0, 1} (ratio 0.6 : 0.4),
  sequence 2 selects token 1 alone."""
  X = np.stack([np.eye(3), np.eye(3)])
  Z = np.eye(3)[:2]
  s = np.array([[0.6, 0.4 - TINY, TINY], [TINY, 1 - 2 * TINY, TINY]])
  # Known answers, column by column (the columns decouple):
  b = np.log(0.6 / (0.4 - TINY))
  W_fin = np.zeros((3, 3))
  W_fin[:, 0] = [b / 2, -b / 2, 0]          # min a^2 + c^2 s.t. a - c = b
  W_mm = np.zeros((3, 3))
  W_mm[:, 0] = [1 / 3, 1 / 3, -2 / 3]       # min 2a^2 + c^2 s.t. a - c = 1 (W00 = W10 = a)
  W_mm[:, 1] = [-1 / 3, 2 / 3, -1 / 3]      # the single-token SVM of sequence 2
  W_1 = W_mm.copy()
  W_1[:, 0] = [2 / 3, -1 / 3, -1 / 3]       # sequence 1 with token 0 alone
  return X, Z, s, W_fin, W_mm, W_1


def test_hand_built_case_has_the_known_solution():
  X, Z, s, W_fin, W_mm, W_1 = _hand_built()
  W_gd = W_fin + 7.0 * W_mm
  W_gd[1, 2] += 0.3                          # a direction no constraint sees (z has no 3rd query)
  r = gensvm.gen_svm(X, Z, s, W_gd)
  assert r.ok, r.reason
  np.testing.assert_array_equal(r.selected, [[True, True, False], [False, True, False]])
  np.testing.assert_array_equal(r.alpha, [0, 1])
  np.testing.assert_allclose(r.W_fin, W_fin, atol=1e-12)
  np.testing.assert_allclose(r.W_mm, W_mm, atol=1e-12)
  np.testing.assert_allclose(r.W_1token, W_1, atol=1e-12)
  np.testing.assert_allclose(r.C, 7.0, rtol=1e-12)
  np.testing.assert_allclose(r.W_svmeq, W_fin + 7.0 * W_mm, atol=1e-11)
  np.testing.assert_allclose(r.max_masked, TINY)
  # support: every margin constraint of W^mm is active here, with positive multipliers
  assert np.all(r.dual_mm[~r.selected] > 0) and np.all(r.dual_mm[r.selected] == 0)
  # W_GD is closest in direction to W^SVMeq
  c = {k: metrics.corr(W_gd, getattr(r, k)) for k in ("W_svmeq", "W_mm", "W_1token")}
  assert c["W_svmeq"] > c["W_mm"] > c["W_1token"]


def _random_case(seed, n=3, T=4, d=5):
  """Random unit tokens and queries; selected sets of sizes 1..T-1 with random ratios,
  masked probabilities ~1e-9..1e-12."""
  rng = np.random.default_rng(seed)
  X = rng.normal(size=(n, T, d))
  X /= np.linalg.norm(X, axis=-1, keepdims=True)
  Z = rng.normal(size=(n, d))
  Z /= np.linalg.norm(Z, axis=-1, keepdims=True)
  s = np.zeros((n, T))
  for i in range(n):
    k = 1 + i % (T - 1)
    sel = rng.permutation(T)[:k]
    s[i] = 10.0 ** rng.uniform(-12, -9, size=T)
    s[i, sel] = rng.uniform(0.2, 1.0, size=k)
    s[i] /= s[i].sum()
  return X, Z, s, rng.normal(size=(d, d))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_constraints_and_kkt_conditions_on_random_cases(seed):
  X, Z, s, W_gd = _random_case(seed)
  d = X.shape[-1]
  r = gensvm.gen_svm(X, Z, s, W_gd)
  assert r.ok, r.reason
  O = r.selected
  assert O.sum() > X.shape[0]                 # some multi-token selection
  # the pairwise definition, over all pairs (not just against the reference token)
  P_fin, P_mm = gensvm.pair_values(r.W_fin, X, Z), gensvm.pair_values(r.W_mm, X, Z)
  both, cross = O[:, :, None] & O[:, None, :], O[:, :, None] & ~O[:, None, :]
  logs = np.log(s)
  np.testing.assert_allclose(P_fin[both], (logs[:, :, None] - logs[:, None, :])[both], atol=1e-11)
  assert np.all(P_mm[cross] >= 1 - 1e-10)
  np.testing.assert_allclose(P_mm[both], 0, atol=1e-10)
  assert r.fin_residual < 1e-11 and r.mm_min_margin >= 1 - 1e-10 and r.mm_eq_residual < 1e-10
  E, b = gensvm.equality_system(X, Z, s, O)
  A = gensvm.margin_system(X, Z, s, O)
  # W^fin is least-norm: it lies in the row space of E
  mu = np.linalg.lstsq(E.T, r.W_fin.reshape(-1), rcond=None)[0]
  np.testing.assert_allclose(E.T @ mu, r.W_fin.reshape(-1), atol=1e-11)
  # W^mm: lam >= 0, complementary slackness, stationarity w = A^T lam + E^T nu
  lam = r.dual_mm[~O]
  margins = A @ r.W_mm.reshape(-1)
  assert np.all(lam >= 0) and np.any(lam > 0)
  np.testing.assert_allclose(lam * (margins - 1), 0, atol=1e-10)
  rest = r.W_mm.reshape(-1) - A.T @ lam
  nu = np.linalg.lstsq(E.T, rest, rcond=None)[0]
  np.testing.assert_allclose(E.T @ nu, rest, atol=1e-10)
  # W^SVMeq: the least-squares coefficient is stationary
  np.testing.assert_allclose(np.sum((r.W_svmeq - W_gd) * r.W_mm), 0, atol=1e-10)
  # W^1token is the Att-SVM at argmax s
  np.testing.assert_allclose(r.W_1token, svm_lib.att_svm(X, Z, np.argmax(s, -1)).W, atol=1e-12)
  assert r.W_svmeq.shape == (d, d)


def test_equality_margin_svm_agrees_with_a_conic_solver():
  cp = pytest.importorskip("cvxpy")
  X, Z, s, _ = _random_case(5)
  d = X.shape[-1]
  O = gensvm.selected_sets(s)
  E, _ = gensvm.equality_system(X, Z, s, O)
  A = gensvm.margin_system(X, Z, s, O)
  status, W, _, _ = gensvm.equality_margin_svm(A, E, d)
  assert status == "optimal"
  w = cp.Variable(d * d)
  prob = cp.Problem(cp.Minimize(cp.sum_squares(w)), [A @ w >= 1, E @ w == 0])
  prob.solve(solver="CLARABEL")
  np.testing.assert_allclose(np.linalg.norm(W), np.sqrt(prob.value), rtol=1e-6)
  np.testing.assert_allclose(W.reshape(-1), w.value, atol=1e-5)


@pytest.mark.parametrize("row, reason", [
    ([0.5, 0.4995, 5e-4, 0.0], "intermediate"),      # 5e-4 in (tau_L, tau_H]
    ([0.5, 0.499, 1e-3, 0.0], "intermediate"),       # tau_H itself is in (tau_L, tau_H]
    ([0.6, 0.4 - 1e-6, 1e-6, 0.0], ""),              # tau_L itself is masked
    ([0.4, 0.3, 0.2, 0.1], "finite"),                # nothing <= tau_L anywhere
])
def test_discard_rules(row, reason):
  s = np.array([row, row if reason == "finite" else [1 - 2e-9, 1e-9, 1e-9, 0.0]])
  got = gensvm.discard_reason(s)
  assert got.split(":")[0] == reason, got
  X, Z, _, W = _random_case(0, n=2)
  r = gensvm.gen_svm(X, Z, s, W)
  if reason:
    assert r.status == "discarded" and r.reason == got and r.W_svmeq is None and not r.ok
  else:
    assert r.ok, r.reason
  forced = gensvm.gen_svm(X, Z, s, W, apply_discard=False)
  assert forced.status != "discarded"


def test_inconsistent_equalities_and_infeasible_margins_are_statuses():
  # d = 1: both sequences ask the scalar W for different log-ratios of the same token pair
  X = np.array([[[1.0], [0.0], [-3.0]], [[1.0], [0.0], [-3.0]]])
  Z = np.ones((2, 1))
  s = np.array([[0.6, 0.4 - TINY, TINY], [0.3, 0.7 - TINY, TINY]])
  r = gensvm.gen_svm(X, Z, s, np.ones((1, 1)))
  assert r.status == "infeasible" and r.statuses["fin"] == "infeasible" and "W^fin" in r.reason
  # a masked token equal to a selected one: no margin can separate them
  X2 = np.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]])
  s2 = np.array([[1 - TINY, TINY / 2, TINY / 2]])
  r2 = gensvm.gen_svm(X2, np.array([[1.0, 0.5]]), s2, np.eye(2))
  assert r2.status == "infeasible" and r2.statuses["mm"] == "infeasible" and r2.W_svmeq is None


def test_bad_inputs_raise():
  X, Z, s, W = _random_case(0)
  with pytest.raises(ValueError, match="s must have shape"):
    gensvm.gen_svm(X, Z, s[:, :2], W)
  with pytest.raises(ValueError, match="softmax rows"):
    gensvm.gen_svm(X, Z, 2 * s, W)
  with pytest.raises(ValueError, match="tau_L"):
    gensvm.gen_svm(X, Z, s, W, tau_L=1e-2, tau_H=1e-3)
  with pytest.raises(ValueError, match="W_gd"):
    gensvm.gen_svm(X, Z, s, W[:2])


def test_stack_keeps_statuses_and_fills_missing_with_nan():
  X, Z, s, W = _random_case(1)
  ok = gensvm.gen_svm(X, Z, s, W)
  bad = gensvm.gen_svm(X, Z, np.full_like(s, 1 / s.shape[1]), W)
  st = gensvm.stack([ok, bad], X.shape[-1])
  assert list(st["status"]) == ["optimal", "discarded"]
  assert np.all(np.isfinite(st["W_svmeq"][0])) and np.all(np.isnan(st["W_svmeq"][1]))
  assert st["selected"].shape == (2,) + s.shape


def test_simplex_projection_satisfies_its_optimality_conditions():
  rng = np.random.default_rng(3)
  y = rng.normal(size=(50, 6)) * rng.uniform(0.1, 5, size=(50, 1))
  p = gensvm.simplex_projection(y)
  np.testing.assert_allclose(p.sum(-1), 1, atol=1e-12)
  assert np.all(p >= 0)
  # KKT: p = max(y - mu, 0) with one mu per row: y - p = mu on the support, y <= mu off it
  mu = np.where(p > 0, y - p, np.nan)
  mu_row = np.nanmean(mu, axis=1)
  np.testing.assert_allclose(np.where(p > 0, y - p, mu_row[:, None]), np.broadcast_to(mu_row[:, None], y.shape),
                             atol=1e-12)
  assert np.all(y[p == 0] <= np.broadcast_to(mu_row[:, None], y.shape)[p == 0] + 1e-12)


def test_lambda_head_optimum_maximizes_the_head_and_grows_with_lambda():
  rng = np.random.default_rng(4)
  n, T, d = 4, 4, 7
  X = np.stack([np.linalg.qr(rng.normal(size=(d, T)))[0].T for _ in range(n)])
  v = rng.normal(size=d)
  v /= np.linalg.norm(v)
  h = lambda s, lam: np.einsum("nt,ntd->nd", s, X) @ v - lam * np.sum(np.einsum("nt,ntd->nd", s, X) ** 2, -1)
  sizes = []
  for lam in (0.0, 0.05, 0.2, 0.5, 2.0, 10.0):
    s_star = gensvm.lambda_head_optimum(X, v, lam)
    sizes.append((s_star > 0).sum(-1))
    for _ in range(200):   # no point of the simplex does better
      q = rng.dirichlet(np.full(T, 0.3), size=n)
      assert np.all(h(q, lam) <= h(s_star, lam) + 1e-12)
  assert np.all(sizes[0] == 1) and np.all(np.diff(np.array(sizes), axis=0) >= 0) and np.all(sizes[-1] == T)
  with pytest.raises(ValueError, match="orthonormal"):
    gensvm.lambda_head_optimum(2 * X, v, 0.5)
  with pytest.raises(ValueError, match="lam"):
    gensvm.lambda_head_optimum(X, v, -1.0)


def test_batch_equals_one_at_a_time():
  """gen_svm_many checks and discards a whole batch at once and solves the kept runs: every
  result is gen_svm's for its data set, bit for bit (kept, discarded either way, infeasible)."""
  cases = [_random_case(seed, n=2) for seed in range(4)]
  X, Z, _, W = (np.stack(a) for a in zip(*cases))
  s = np.stack([c[2] for c in cases])
  s[1, 0] = [0.5, 0.4995, 5e-4, 0.0]                     # intermediate
  s[2] = [[0.4, 0.3, 0.2, 0.1]] * 2                     # finite
  X[3, 0, 2] = X[3, 0, np.argmax(s[3, 0])]               # maybe infeasible: a masked copy of the top token
  batch = gensvm.gen_svm_many(X, Z, s, W)
  statuses = []
  for b, r in enumerate(batch):
    one = gensvm.gen_svm(X[b], Z[b], s[b], W[b])
    statuses.append(one.status)
    assert (r.status, r.reason, r.statuses) == (one.status, one.reason, one.statuses)
    np.testing.assert_array_equal(r.selected, one.selected)
    np.testing.assert_array_equal(r.alpha, one.alpha)
    for name in ("W_fin", "W_mm", "W_svmeq", "W_1token", "dual_mm"):
      a, e = getattr(r, name), getattr(one, name)
      assert (a is None) == (e is None) and (a is None or np.array_equal(a, e)), name
    for name in ("C", "max_masked", "fin_residual", "mm_min_margin", "mm_eq_residual"):
      assert np.array_equal(getattr(r, name), getattr(one, name), equal_nan=True), name
  assert statuses[0] == "optimal" and statuses[1] == statuses[2] == "discarded"
  with pytest.raises(ValueError, match="softmax rows"):
    gensvm.gen_svm_many(X, Z, 2 * s, W)
  assert gensvm.gen_svm_many(X[:0], Z[:0], s[:0], W[:0]) == []
