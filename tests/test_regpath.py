"""Regularization paths (svmattn.train.regpath): feasibility, monotone loss, KKT conditions,
convergence to the SVM direction, local paths, projections, vmap vs loop, bad input.

One small seeded problem (the conftest batch: B=4 data sets, n=3, T=4, d=6, so every
Att-SVM is feasible) and a few shared compiled configurations.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import SEED, host
from svmattn.data import datasets as data_lib
from svmattn.models import heads
from svmattn.analysis import metrics
from svmattn.models import attention as model_lib
from svmattn.train import regpath
from svmattn.svm import att_svm as svm_lib
from svmattn.train import loop as train_lib

GRID = regpath.geometric_grid(0.5, 200.0, 8)
CFG = {"W": regpath.PathConfig(param="W", iters=200, first_iters=500),
       "KQ": regpath.PathConfig(param="KQ", iters=400, first_iters=500)}
OWN = {"W": "fro", "KQ": "nuc"}
# Data sets 2 and 3 of the batch have a locally optimal, not globally optimal,
# selection (found by enumerating all T^n selections with metrics.is_locally_optimal;
# the test re-checks it).
LOCAL = {2: [1, 2, 3], 3: [1, 1, 2]}
# The cone must be narrow enough for the local theorem (docs/science.md section 4: "delta small enough"): at
# cone_delta = 0.01, data set 2's loss over the cone has a finite-norm minimizer ON the cone's
# boundary (loss 0.595615) below the limit of its local selection (0.595843), so its true local
# path stays on the boundary (see test_wide_cone_path_is_monotone_and_stays_on_the_boundary). At
# 0.001 both paths leave the boundary: cos(W_200, U) = 0.99965 and 0.99974, 6.5e-4 and 7.4e-4
# above the boundary's 0.999.
LOCAL_CFG = regpath.PathConfig(param="W", iters=200, first_iters=500, cone_delta=0.001)
WIDE_CFG = regpath.PathConfig(param="W", iters=200, first_iters=500, cone_delta=0.01)


def _unit(a):
  """a / ||a|| without underflow (gradients at large R are ~1e-80)."""
  a = np.asarray(a, np.float64)
  a = a / np.max(np.abs(a))
  return a / np.linalg.norm(a)


@pytest.fixture(scope="module")
def problem(batch):
  """Host data, optimal tokens, and the Frobenius / nuclear SVMs of opt."""
  data = host(batch)
  gamma = np.stack([np.asarray(heads.token_scores(heads.LINEAR, data.v[b], data.X[b], data.Y[b]))
                    for b in range(len(data.X))])
  opt = metrics.optimal_tokens(gamma)
  svms = {norm: svm_lib.stack([svm_lib.att_svm(data.X[b], data.Z[b], opt[b], norm) for b in range(len(data.X))], 6)
          for norm in svm_lib.NORMS}
  assert all((s["status"] == "optimal").all() for s in svms.values())
  return data, gamma, opt, svms


@pytest.fixture(scope="module")
def paths(batch, problem):
  """{"W": PathResult, "KQ": PathResult} on the batch, candidates = the SVMs of opt."""
  _, _, _, svms = problem
  keys = train_lib.init_keys(SEED, np.arange(4))
  return {p: regpath.regularization_path(CFG[p], batch, GRID, keys, candidates=svms[OWN[p]]["W"])
          for p in ("W", "KQ")}


@pytest.mark.parametrize("p", ["W", "KQ"])
def test_norm_bound_holds_at_every_radius(paths, p):
  res = paths[p]
  assert res.constraint.shape == (4, len(GRID))
  assert np.all(res.constraint <= GRID * (1 + 1e-13))
  # recompute the constraint from the returned matrices: ||W_R||_F <= R, ||K_R Q_R^T||_* <= R
  norm = "fro" if p == "W" else "nuc"
  assert np.all(np.linalg.norm(res.W, norm, axis=(-2, -1)) <= GRID * (1 + 1e-12))


@pytest.mark.parametrize("p", ["W", "KQ"])
def test_loss_decreases_in_R(paths, p):
  loss = paths[p].loss
  # the minimum over nested balls cannot rise; allow rounding of the loss only
  assert np.all(np.diff(loss, axis=1) <= 4 * np.finfo(np.float64).eps * loss[:, :-1])
  assert np.all(loss[:, -1] < loss[:, 0])


@pytest.mark.parametrize("p", ["W", "KQ"])
def test_direction_approaches_svm_of_optimal_tokens(paths, problem, p):
  _, _, opt, svms = problem
  corr = metrics.corr(paths[p].W, svms[OWN[p]]["W"][:, None])          # (B, G)
  assert np.all(corr[:, -1] >= 0.99), corr[:, -1]
  assert np.all(corr[:, -1] > corr[:, 0])
  upper = corr[:, len(GRID) // 2:]
  assert np.all(np.diff(upper, axis=1) >= -1e-6), upper                # rising on the upper half
  # the path selects the optimal tokens at the largest R
  s = np.stack([np.asarray(model_lib.attention(jnp.asarray(paths[p].W[b, -1]), problem[0].X[b], problem[0].Z[b]))
                for b in range(4)])
  np.testing.assert_array_equal(metrics.selected_tokens(s), opt)


def test_kq_path_is_balanced(paths):
  nuc = np.linalg.norm(paths["KQ"].W[:, -1], "nuc", axis=(-2, -1))
  assert np.all(nuc >= 0.999 * GRID[-1])


@pytest.mark.parametrize("p", ["W", "KQ"])
def test_kkt_gradient_antiparallel_at_the_largest_radius(paths, problem, p):
  """At a minimizer on the sphere, grad L = -mu * params with mu > 0 (independent autodiff)."""
  data = problem[0]
  grad = jax.jit(jax.grad(model_lib.make_loss(model_lib.get_parameterization(p), heads.LINEAR, "logistic", 0.0)))
  for b in range(4):
    params = {k: jnp.asarray(v[b]) for k, v in paths[p].params.items()}
    one = data_lib.take(data, b)
    g = grad(params, one)
    gv = np.concatenate([np.ravel(g[k]) for k in sorted(g)])
    xv = np.concatenate([np.ravel(params[k]) for k in sorted(params)])
    assert np.max(np.abs(gv)) > 0                      # a nonzero multiplier (the bound is active)
    assert -_unit(gv) @ _unit(xv) >= 1 - 1e-8
    assert np.isclose(np.linalg.norm(xv), regpath.radius(p, GRID[-1]), rtol=1e-12)
  assert np.all(1 - paths[p].kkt_cos[:, -1] <= 1e-8)   # the library's own diagnostic agrees


def test_w_is_a_minimizer_on_the_smallest_ball(paths, problem):
  """No nearby point of the smallest ball has a lower loss (a test that the solve converged)."""
  data = problem[0]
  loss = jax.jit(model_lib.make_loss(model_lib.W_PARAM, heads.LINEAR, "logistic", 0.0))
  rng = np.random.default_rng(0)
  R0 = GRID[0]
  for b in range(4):
    one = data_lib.take(data, b)
    W = paths["W"].W[b, 0]
    base = float(loss({"W": jnp.asarray(W)}, one))
    for _ in range(20):
      Wp = W + 1e-3 * rng.standard_normal(W.shape)
      Wp *= min(1.0, R0 / np.linalg.norm(Wp))
      assert float(loss({"W": jnp.asarray(Wp)}, one)) >= base - 1e-15


@pytest.mark.slow   # (CI runs it with the slow tests: the test command stays under 5 minutes)
def test_vmap_equals_loop(batch, paths, problem):
  _, _, _, svms = problem
  keys = train_lib.init_keys(SEED, np.arange(4))
  for b in (0, 2):
    one = regpath.regularization_path(CFG["W"], data_lib.take(batch, np.arange(b, b + 1)), GRID, keys[b:b + 1],
                                      candidates=svms["fro"]["W"][b:b + 1])
    np.testing.assert_allclose(one.W[0], paths["W"].W[b], rtol=1e-12, atol=1e-12 * GRID[-1])  # bit-exact on CPU
    np.testing.assert_allclose(one.loss[0], paths["W"].loss[b], rtol=1e-12)
    np.testing.assert_array_equal(one.took_candidate[0], paths["W"].took_candidate[b])


@pytest.mark.slow   # (the fast set keeps a sibling of this check; CI runs the slow ones too)
def test_local_path_stays_in_the_cone_and_converges_to_the_local_svm(batch, problem):
  data, gamma, opt, _ = problem
  idx = np.array(sorted(LOCAL))
  refs = []
  for b in idx:
    alpha = np.array(LOCAL[b])
    assert not np.array_equal(alpha, opt[b])
    res = svm_lib.att_svm(data.X[b], data.Z[b], alpha)
    assert metrics.is_locally_optimal(gamma[b], alpha, res)
    refs.append(res.W)
  refs = np.stack(refs)
  out = regpath.regularization_path(LOCAL_CFG, data_lib.take(batch, idx), GRID, ref=refs, candidates=refs)
  assert np.all(out.constraint <= GRID * (1 + 1e-13))
  cos = metrics.corr(out.W, refs[:, None])
  assert np.all(cos >= 1 - LOCAL_CFG.cone_delta - 1e-12)                 # the cone holds exactly
  np.testing.assert_allclose(cos, out.cone_cos, atol=1e-12)
  assert np.all(cos[:, -1] > cos[:, 0])
  # at the largest R the cone is inactive (both end >= 6.5e-4 inside it, far above the solver's
  # ~1e-12 accuracy of the projection): the ball's KKT condition holds there
  assert np.all(cos[:, -1] > 1 - LOCAL_CFG.cone_delta + 1e-4), cos[:, -1]
  assert np.all(1 - out.kkt_cos[:, -1] <= 1e-8)
  # and the loss has reached the limit of the local selection, l(Y_i gamma_{i,alpha_i}) averaged:
  # at R = 200 the remaining softmax mass is ~exp(-200 * margin), far below 1e-9
  limit = [np.mean(np.log1p(np.exp(-gamma[b][np.arange(3), LOCAL[b]]))) for b in idx]
  np.testing.assert_allclose(out.loss[:, -1], limit, rtol=1e-9)
  for k, b in enumerate(idx):
    s = np.asarray(model_lib.attention(jnp.asarray(out.W[k, -1]), data.X[b], data.Z[b]))
    np.testing.assert_array_equal(metrics.selected_tokens(s), LOCAL[b])


@pytest.mark.slow   # (CI runs it with the slow tests: the test command stays under 5 minutes)
def test_wide_cone_path_is_monotone_and_stays_on_the_boundary(batch, problem):
  """With cone_delta = 0.01, data set 2's loss over ball /\\ cone is smallest at a finite-norm point
  on the cone's boundary. The path's loss may not rise in R (the sets are nested): an earlier
  solver extrapolated its warm start from interior solutions into another basin, rose from
  0.595615 to 0.595843 at R = 36, and so reached the local SVM on some CPUs (AVX-512) and the
  boundary on others (SSE4.2, AVX2 AMD)."""
  data, gamma, _, _ = problem
  b = 2
  alpha = np.array(LOCAL[b])
  ref = svm_lib.att_svm(data.X[b], data.Z[b], alpha).W[None]
  out = regpath.regularization_path(WIDE_CFG, data_lib.take(batch, np.array([b])), GRID, ref=ref, candidates=ref)
  loss = out.loss[0]
  assert np.all(np.diff(loss) <= 4 * np.finfo(np.float64).eps * loss[:-1]), loss
  limit = np.mean(np.log1p(np.exp(-gamma[b][np.arange(3), alpha])))
  # the boundary minimizer beats the selection's limit by 3.8e-4 relative (rounding is ~1e-16)
  assert loss[-1] < limit * (1 - 1e-4), (loss[-1], limit)
  np.testing.assert_allclose(out.cone_cos[0, -1], 1 - WIDE_CFG.cone_delta, atol=1e-12)


def test_project_cone_and_ball_are_projections():
  """P = P_ball(P_cone(x)) lands in ball /\\ cone, is idempotent, and satisfies the
  projection inequality <x - P, y - P> <= 0 for points y of the set."""
  rng = np.random.default_rng(1)
  d, c, rad = 4, 0.8, 2.0
  U = rng.standard_normal((d, d))
  u = U / np.linalg.norm(U)
  proj = jax.jit(lambda W: regpath.project_ball({"W": regpath.project_cone(W, jnp.asarray(U), c)}, rad)["W"])
  theta = np.arccos(c)
  inside = []                                            # random points of ball /\ cone
  for k in range(200):
    perp = rng.standard_normal((d, d))
    perp -= np.sum(perp * u) * u
    perp /= np.linalg.norm(perp)
    phi = theta if k % 2 else rng.uniform(0, theta)      # half of them on the cone's boundary
    inside.append(rng.uniform(0, rad) * (np.cos(phi) * u + np.sin(phi) * perp))
  for scale in (0.3, 1.0, 5.0):
    for _ in range(30):
      x = scale * rng.standard_normal((d, d))
      P = np.asarray(proj(jnp.asarray(x)))
      assert np.linalg.norm(P) <= rad * (1 + 1e-14)
      nP = np.linalg.norm(P)
      assert nP == 0 or np.sum(P * u) >= c * nP - 1e-12
      np.testing.assert_allclose(np.asarray(proj(jnp.asarray(P))), P, atol=1e-13)
      assert max(np.sum((x - P) * (y - P)) for y in inside) <= 1e-10
  # the polar cone maps to 0, points of the cone inside the ball to themselves
  np.testing.assert_array_equal(np.asarray(proj(jnp.asarray(-u))), 0.0)
  np.testing.assert_allclose(np.asarray(proj(jnp.asarray(inside[0]))), inside[0], atol=1e-15)


@pytest.mark.parametrize("grid", [[1.0, 1.0, 2.0], [2.0, 1.0], [0.0, 1.0], [-1.0, 2.0], [1.0, np.nan],
                                  [], [[0.5, 1.0]], [1.0, np.inf]])
def test_bad_grid_raises(batch, grid):
  with pytest.raises(ValueError, match="R grid"):
    regpath.regularization_path(CFG["W"], batch, grid)


@pytest.mark.parametrize("args", [(0.0, 1.0, 3), (2.0, 1.0, 3), (1.0, 2.0, 0), (1.0, np.inf, 3)])
def test_bad_geometric_grid_raises(args):
  with pytest.raises(ValueError, match="geometric_grid"):
    regpath.geometric_grid(*args)


def test_bad_arguments_raise(batch):
  with pytest.raises(ValueError, match="keys"):
    regpath.regularization_path(CFG["KQ"], batch, GRID)                     # random start needs keys
  with pytest.raises(ValueError, match="ref"):
    regpath.regularization_path(CFG["W"], batch, GRID, ref=np.ones((4, 6, 6)))
  with pytest.raises(ValueError, match="ref"):
    regpath.regularization_path(LOCAL_CFG, batch, GRID)
  with pytest.raises(ValueError, match="candidates"):
    regpath.regularization_path(CFG["W"], batch, GRID, candidates=np.ones((3, 6, 6)))
  with pytest.raises(ValueError, match="candidates"):
    regpath.regularization_path(CFG["W"], batch, GRID, candidates=np.full((4, 6, 6), np.nan))
  for bad in ({"iters": 0}, {"cone_delta": 1.5}, {"param": "V"}, {"param": "KQ", "cone_delta": 0.1}, {"m": 0}):
    with pytest.raises(ValueError):
      regpath.PathConfig(**bad).validate()
