"""Regularization paths of attention (docs/science.md section 4), device side (pure JAX).

For one data set (X (n,T,d), Y (n,), Z (n,d), v) and an increasing grid of
radii R_1 < ... < R_G:

  RP-W:   W_R       = argmin_{||W||_F <= R}                 L(W)
  RP-KQ:  (K_R,Q_R) = argmin_{||K||_F^2 + ||Q||_F^2 <= 2R}  L(K Q^T)

with L the unregularized training loss (``model.make_loss`` with ridge 0).
Predictions (alpha = opt): W_R / R -> W^mm / ||W^mm||_F and
K_R Q_R^T / R -> W^mm_* / ||W^mm_*||_* (note ||K Q^T||_* <= (||K||^2+||Q||^2)/2 = R).
Both radii are written as one "constraint value" c(params) <= R:
c = ||W||_F for W and c = (||K||_F^2 + ||Q||_F^2) / 2 for (K,Q).

Local paths (W only) add the cone around a reference direction U (e.g. W^mm_alpha
of a locally optimal alpha):
  W_R = argmin { L(W) : ||W||_F <= R, cos(W, U) = <W,U> / (||W||_F ||U||_F) >= 1 - delta },
enforced EXACTLY by PROJECTION onto ball /\\ cone: for a closed convex cone with
apex at the origin and a ball centred there, the projection onto the intersection
is the projection onto the cone followed by the projection onto the ball (a
radial rescale); the projection onto the circular cone is closed form
(``project_cone``). (For (K,Q) the set {cos(K Q^T, U) >= 1 - delta} is not convex
and has no closed-form projection; a penalty version met the cone only to ~3e-3
and was left out: ``PathConfig.validate`` rejects cone_delta with param "KQ".)

Solver (one R, warm-started from the previous R): accelerated projected gradient
(FISTA with the gradient-mapping adaptive restart of O'Donoghue & Candes, 2015),
``iters`` iterations; projection onto the ball = rescale when outside. The step
is 1 / lambda, lambda = max(|largest Hessian eigenvalue| (power iteration with
Hessian-vector products, warm-started, re-estimated every ``refresh`` steps),
||grad|| / radius) (the second term is the curvature that the projection onto
the sphere of radius ``radius`` adds). The iteration uses gradients only, never
loss differences: at large R the loss sits within 1e-16 of its limit while its
gradient (computed accurately, see ``model.pooled_token``; norms here are scaled
so that squares of ~1e-170 do not underflow) is still resolved. In float64 this
holds while the smallest margin R / ||W^mm|| stays below ~700 (exp(-700) ~ 1e-304).
The warm start of R_{j+1} extrapolates linearly from the solutions at R_{j-1}
and R_j (exact for paths W_R = R U + Delta, the large-R form), then projects.

Globalization: the problem is nonconvex, and continuation in R can follow a
branch of local minima (in E2-sized problems it does for a sizeable share of data
sets). With ``candidates``, every radius is also solved from a start along a
given direction (e.g. the SVM of the optimal tokens), and the solution of lower
loss is kept when lower by more than 1e-12 relative (distinct branches differ by
far more; rounding by far less). ``PathResult.took_candidate`` / ``candidate_gain``
record where and by how much the candidate won; the KKT cosine checks the result.

Batching: ``regularization_path`` vmaps ``path_one`` over a leading axis B of
data sets and jit-compiles once per (config, shapes, grid length), on JAX's default device.
(Numerics versions 17 to 21 ran the global paths of the linear head in C on the host; from version
22 this program is the only solver: CHANGELOG.md.)
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from svmattn.data import datasets as data_lib
from svmattn.models import heads
from svmattn.models import losses as losses_lib
from svmattn.models import attention as model_lib

Params = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class PathConfig:
  """How a regularization path is computed.

  param: "W" or "KQ"; m: (K,Q) width (None = d); head / loss / model: as in training.
  iters: solver iterations per radius (the first radius gets ``first_iters``).
  refresh: the step size is re-estimated every ``refresh`` iterations.
  power_iters: power-iteration steps per step-size estimate.
  cone_delta: None for the (global) regularization path; a number in (0, 1) for
    the local path inside cos(W, U) >= 1 - cone_delta around a reference U (W only).
  """
  param: str = "W"
  m: int | None = None
  head: str = "linear"
  loss: str = "logistic"
  model: str = "single_query"
  iters: int = 400
  first_iters: int = 2000
  refresh: int = 50
  power_iters: int = 10
  cone_delta: float | None = None
  numerics: str = "exact"           # "authors": the pooled token X^T s (model.pooled_token_plain)

  def validate(self) -> "PathConfig":
    model_lib.get_parameterization(self.param)
    heads.get_head(self.head)
    losses_lib.get_loss(self.loss)
    model_lib.get_model(self.model)
    for name in ("iters", "first_iters", "refresh", "power_iters"):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"PathConfig.{name} must be a positive integer, got {value!r}")
    if self.m is not None and (not isinstance(self.m, (int, np.integer)) or self.m < 1):
      raise ValueError(f"PathConfig.m must be a positive integer or None, got {self.m!r}")
    if self.cone_delta is not None and not 0.0 < self.cone_delta < 1.0:
      raise ValueError(f"PathConfig.cone_delta must be None or in (0, 1), got {self.cone_delta!r}")
    if self.cone_delta is not None and self.param != "W":
      raise ValueError(f"PathConfig.cone_delta: local paths are implemented for param 'W' only "
                       f"(projection onto ball and cone), got param {self.param!r}")
    return self


class PathResult(NamedTuple):
  """Host (NumPy) result of ``regularization_path`` for B data sets on a grid of G radii.

  R:          (G,) the grid
  W:          (B, G, d, d) W_R, or K_R Q_R^T for (K,Q)
  loss:       (B, G) L at the solution
  constraint: (B, G) ||W_R||_F, or (||K_R||^2 + ||Q_R||^2) / 2; feasible iff <= R
  kkt_cos:    (B, G) cos(-grad L, params) over all parameters: 1 at a solution on
              the boundary (the gradient is anti-parallel to the parameters)
  grad_norm:  (B, G) ||grad L|| over all parameters
  cone_cos:   (B, G) cos(W_R, U) for local paths (NaN for global paths)
  took_candidate: (B, G) bool, True where the start along the candidate won (see ``path_one``)
  candidate_gain: (B, G) relative loss improvement of the candidate start over the
              continued one (0 without candidates; see ``path_one``)
  params:     parameters at the last radius, leaves (B, ...)
  """
  R: np.ndarray
  W: np.ndarray
  loss: np.ndarray
  constraint: np.ndarray
  kkt_cos: np.ndarray
  grad_norm: np.ndarray
  cone_cos: np.ndarray
  took_candidate: np.ndarray
  candidate_gain: np.ndarray
  params: Any


# ----------------------------------------------------------------------------
# Grid, tree helpers, projections
# ----------------------------------------------------------------------------

def check_grid(R) -> np.ndarray:
  """The grid as a float64 (G,) array; ValueError unless 1-D, finite, > 0, strictly increasing."""
  R = np.asarray(R, dtype=np.float64)
  if R.ndim != 1 or R.size < 1:
    raise ValueError(f"R grid must be a non-empty 1-D array, got shape {R.shape}")
  if not np.all(np.isfinite(R)):
    raise ValueError(f"R grid must be finite, got {R.tolist()}")
  if np.any(R <= 0):
    raise ValueError(f"R grid must be positive (every R > 0), got min {R.min()}")
  if np.any(np.diff(R) <= 0):
    bad = int(np.argmin(np.diff(R)))
    raise ValueError(f"R grid must be strictly increasing, got R[{bad}]={R[bad]} >= R[{bad + 1}]={R[bad + 1]}")
  return R


def geometric_grid(r_min: float, r_max: float, num: int) -> np.ndarray:
  """num radii from r_min to r_max, evenly spaced in log R (validated)."""
  if not (isinstance(num, (int, np.integer)) and num >= 1):
    raise ValueError(f"geometric_grid: num must be a positive integer, got {num!r}")
  if not (np.isfinite(r_min) and np.isfinite(r_max) and 0 < r_min and (r_min < r_max or num == 1)):
    raise ValueError(f"geometric_grid: need 0 < r_min < r_max, got r_min={r_min}, r_max={r_max}")
  return check_grid(np.geomspace(r_min, r_max, num))


def _vdot(a, b):
  return sum(jnp.sum(x * y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def _norm(a):
  """||a|| over a pytree, scaled by max |a| first: gradients at large R are ~1e-170 and
  their squares would underflow to 0 in float64."""
  leaves = jax.tree_util.tree_leaves(a)
  top = functools.reduce(jnp.maximum, [jnp.max(jnp.abs(x)) for x in leaves])
  safe = jnp.where(top > 0, top, 1.0)
  return top * jnp.sqrt(sum(jnp.sum((x / safe) ** 2) for x in leaves))


def _axpy(alpha, x, y):
  """alpha * x + y over pytrees."""
  return jax.tree_util.tree_map(lambda u, w: alpha * u + w, x, y)


def _scale(alpha, x):
  return jax.tree_util.tree_map(lambda u: alpha * u, x)


def constraint_value(param_name: str, params: Params) -> jax.Array:
  """c(params): ||W||_F for "W", (||K||_F^2 + ||Q||_F^2) / 2 for "KQ" (the bound is c <= R)."""
  if param_name == "W":
    return jnp.sqrt(jnp.sum(params["W"] ** 2))
  return 0.5 * (jnp.sum(params["K"] ** 2) + jnp.sum(params["Q"] ** 2))


def radius(param_name: str, R) -> jax.Array:
  """The Euclidean radius of the ball c(params) <= R: R for W, sqrt(2R) for (K,Q)."""
  return R if param_name == "W" else jnp.sqrt(2.0 * R)


def project_ball(params: Params, rad) -> Params:
  """Euclidean projection of all parameters jointly onto {||params|| <= rad}: a rescale
  by rad / ||params|| when outside (for (K,Q): ||K||^2 + ||Q||^2 <= rad^2 = 2R)."""
  nrm = _norm(params)
  factor = jnp.where(nrm > rad, rad / jnp.where(nrm > 0, nrm, 1.0), 1.0)
  return _scale(factor, params)


def project_cone(W: jax.Array, U: jax.Array, cos_min) -> jax.Array:
  """Euclidean projection of W onto the circular cone {W : <W,U> >= cos_min ||W|| ||U||}.

  With u = U/||U||, a = <W,u>, P = W - a u, r = ||P||, tan(theta) = sqrt(1-c^2)/c:
  W itself if r <= a tan(theta); 0 if r <= -a / tan(theta) (the polar cone);
  otherwise <W, e> e with e = cos(theta) u + sin(theta) P / r (the nearest boundary ray).
  Requires 0 < cos_min < 1.
  """
  u = U / jnp.sqrt(jnp.sum(U * U))
  c = jnp.asarray(cos_min, W.dtype)
  s = jnp.sqrt(1.0 - c * c)
  a = jnp.sum(W * u)
  P = W - a * u
  r = jnp.sqrt(jnp.sum(P * P))
  p_dir = P / jnp.where(r > 0, r, 1.0)
  e = c * u + s * p_dir
  boundary = (a * c + r * s) * e
  inside = r * c <= a * s
  polar = r * s <= -a * c
  return jnp.where(inside, W, jnp.where(polar, jnp.zeros_like(W), boundary))


def cosine(A, B) -> jax.Array:
  """<A,B> / (||A|| ||B||) over pytrees (matrices: Frobenius), underflow-safe; 0 where
  either is 0."""
  na, nb = _norm(A), _norm(B)
  An = _scale(1.0 / jnp.where(na > 0, na, 1.0), A)
  Bn = _scale(1.0 / jnp.where(nb > 0, nb, 1.0), B)
  return jnp.where((na > 0) & (nb > 0), _vdot(An, Bn), 0.0)


# ----------------------------------------------------------------------------
# The solver for one data set
# ----------------------------------------------------------------------------

class _Problem(NamedTuple):
  config: PathConfig
  param: model_lib.Parameterization
  loss: Any       # loss(params, data) -> scalar (ridge 0)
  grad: Any       # grad(params, data) of loss: the closed form where there is one (model.make_grad)


@functools.lru_cache(maxsize=32)
def _problem(config: PathConfig) -> _Problem:
  config.validate()
  param = model_lib.get_parameterization(config.param)
  head = heads.get_head(config.head)
  return _Problem(config, param, model_lib.make_loss(param, head, config.loss, 0.0, config.model,
                                                         numerics=config.numerics),
                  model_lib.make_grad(param, head, config.loss, 0.0, config.model, numerics=config.numerics))


def _projector(prob: _Problem, R, ref):
  """Projection onto the feasible set at radius R: the ball, or ball /\\ cone (local W paths)."""
  cfg = prob.config
  rad = radius(cfg.param, R)
  if cfg.cone_delta is not None:
    cos_min = 1.0 - cfg.cone_delta
    return lambda p: project_ball({"W": project_cone(p["W"], ref, cos_min)}, rad)
  return lambda p: project_ball(p, rad)


def _power_lambda(f, grad_f, x, v, steps):
  """|largest eigenvalue| of the Hessian of f at x by power iteration from v (unit pytree),
  with Hessian-vector products jvp((f, grad_f)). Returns (lambda, v, f(x), grad f(x))
  (the last two are the primal outputs of the jvp: one call site of the loss serves both)."""
  vg = lambda p: (f(p), grad_f(p))  # noqa: E731

  def body(_, carry):
    u = carry[0]
    (value, g), (_, hu) = jax.jvp(vg, (x,), (u,))
    nrm = _norm(hu)
    u_next = jax.tree_util.tree_map(lambda a, b: jnp.where(nrm > 0, a / jnp.where(nrm > 0, nrm, 1.0), b), hu, u)
    return u_next, nrm, value, g

  zero = jnp.zeros((), _dtype(x))
  v, lam, value, g = jax.lax.fori_loop(0, steps, body, (v, zero, zero, jax.tree_util.tree_map(jnp.zeros_like, x)))
  return lam, v, value, g


def _dtype(tree):
  return jax.tree_util.tree_leaves(tree)[0].dtype


def _solve(prob: _Problem, data, R, ref, x0, v0, iters):
  """``iters`` (an int or a traced integer) accelerated projected-gradient steps at
  radius R from x0. Returns (x, v, f(x), grad f(x)): the solution, the power-iteration
  vector, and the minimized objective and its gradient at the solution.

  The loop runs one chunk more than needed, with no step in it, so that the final
  step-size estimate evaluates f and grad f at the solution (fewer call sites of the
  loss in the compiled program)."""
  cfg = prob.config
  f = lambda p: prob.loss(p, data)
  grad_f = lambda p: prob.grad(p, data)  # noqa: E731  (the closed form where there is one)
  proj = _projector(prob, R, ref)
  rad = radius(cfg.param, R)
  x0 = proj(x0)
  chunks = (iters + cfg.refresh - 1) // cfg.refresh
  dt = _dtype(x0)

  def step_size(x, v):
    lam, v, value, g = _power_lambda(f, grad_f, x, v, cfg.power_iters)
    lam = jnp.maximum(jnp.maximum(lam, _norm(g) / rad), jnp.finfo(dt).tiny)
    return 1.0 / lam, v, value, g

  def fista(_, carry):
    x, x_prev, t, tau = carry
    t_next = 0.5 * (1.0 + jnp.sqrt(1.0 + 4.0 * t * t))
    y = _axpy((t - 1.0) / t_next, jax.tree_util.tree_map(jnp.subtract, x, x_prev), x)
    x_new = proj(_axpy(-tau, grad_f(y), y))
    # gradient-mapping restart: the step y -> x_new goes against the momentum x - x_prev
    restart = _vdot(jax.tree_util.tree_map(jnp.subtract, y, x_new),
                    jax.tree_util.tree_map(jnp.subtract, x_new, x)) > 0
    t_next = jnp.where(restart, jnp.ones((), dt), t_next)
    x_keep = jax.tree_util.tree_map(lambda a, b: jnp.where(restart, a, b), x_new, x)
    return x_new, x_keep, t_next, tau

  def chunk(k, carry):
    x, x_prev, t, v, _, _ = carry
    tau, v, value, g = step_size(x, v)
    n = jnp.clip(iters - k * cfg.refresh, 0, cfg.refresh)      # 0 in the last chunk
    x, x_prev, t, _ = jax.lax.fori_loop(0, n, fista, (x, x_prev, t, tau))
    return x, x_prev, t, v, value, g

  init = (x0, x0, jnp.ones((), dt), v0, jnp.zeros((), dt), jax.tree_util.tree_map(jnp.zeros_like, x0))
  x, _, _, v, value, g = jax.lax.fori_loop(0, chunks + 1, chunk, init)
  return x, v, value, g


def _diagnostics(prob: _Problem, data, x, ref, loss, g):
  """(W, loss, constraint value, cos(-grad, x), ||grad||, cone cosine) at x, given the
  loss and its gradient g at x."""
  gn = _norm(g)
  kkt = jnp.where((gn > 0) & (_norm(x) > 0), -cosine(g, x), jnp.nan)
  W = prob.param.to_W(x)
  cone = cosine(W, ref) if prob.config.cone_delta is not None else jnp.asarray(jnp.nan, W.dtype)
  return W, loss, constraint_value(prob.config.param, x), kkt, gn, cone


def _along(config: PathConfig, U: jax.Array, R, rnd: Params) -> Params:
  """A start along the direction U (d,d) at radius R: W = R U/||U||_F, or for (K,Q)
  K = A S^{1/2}, Q = B S^{1/2} from the SVD U = A S B^T scaled so that
  K Q^T = R U/||U||_* (then ||K||^2+||Q||^2 = 2R, the balanced factorization; the
  top-m singular pairs when m < d), plus
  1e-3 of the random start ``rnd`` (zero columns of a rank-deficient K, Q would
  otherwise get zero gradients and stay zero)."""
  if config.param == "W":
    return {"W": R * U / jnp.sqrt(jnp.sum(U * U))}
  d, m = rnd["K"].shape
  A, S, Bt = jnp.linalg.svd(U)
  k = min(m, d)
  c = jnp.sqrt(R / jnp.sum(S))
  K = jnp.zeros((d, m), U.dtype).at[:, :k].set(c * A[:, :k] * jnp.sqrt(S[:k]))
  Q = jnp.zeros((d, m), U.dtype).at[:, :k].set(c * Bt[:k].T * jnp.sqrt(S[:k]))
  return _axpy(1e-3 * jnp.sqrt(2.0 * R) / _norm(rnd), rnd, {"K": K, "Q": Q})


def _random_start(config: PathConfig, key: jax.Array, d: int, R, dtype) -> Params:
  """K, Q i.i.d. N(0,1) from ``key``, rescaled onto ||K||^2+||Q||^2 = 2R (for W: zeros)."""
  if config.param == "W":
    return {"W": jnp.zeros((d, d), dtype)}
  m = config.m or d
  kk, kq = jax.random.split(key)
  rnd = {"K": data_lib.normal(kk, (d, m), dtype), "Q": data_lib.normal(kq, (d, m), dtype)}
  return _scale(jnp.sqrt(2.0 * R) / _norm(rnd), rnd)


def path_one(config: PathConfig, data, R: jax.Array, key: jax.Array, ref=None, candidate=None):
  """The regularization path of ONE data set over the grid R (G,) (lax.scan over R).

  data: one Dataset (X (n,T,d), ...); key: PRNG key of the (K,Q) random start;
  ref: (d,d) cone axis U of a local path (required iff config.cone_delta is set).
  candidate: optional (d,d) direction C of a second start at every radius (for a
    local path, C inside the cone, e.g. C = ref). The problem is nonconvex and
    continuation can follow a branch of local minima; with a candidate, each radius
    is also solved from the start along
    C (``_along``) and the result of lower loss is kept (it must be lower by more
    than 1e-12 relative, i.e. not by rounding) and continued. gain = (loss of the
    continued start - loss of the candidate start) / |loss of the continued start|
    (> 0: the candidate is better; large values mean another branch of minima).
  Starts: W = 0 (global), (K,Q) random (``_random_start``), local paths along ref.
  Returns (outs, params_last, took_candidate (G,) bool, candidate_gain (G,)) with
  outs = (W_R (G,d,d), loss (G,), constraint (G,), kkt_cos (G,), grad_norm (G,), cone_cos (G,)).
  """
  prob = _problem(config)
  d = data.X.shape[-1]
  dt = data.X.dtype
  if (ref is None) != (config.cone_delta is None):
    raise ValueError("path_one: pass ref (the cone axis U, (d,d)) exactly when config.cone_delta is set")
  if ref is None:
    ref = jnp.zeros((d, d), dt)  # unused by global paths
  rnd = _random_start(config, key, d, R[0], dt)
  x0 = rnd if config.cone_delta is None else _along(config, ref, R[0], rnd)
  v0 = jax.tree_util.tree_map(lambda a: jnp.sin(1.0 + jnp.arange(a.size, dtype=dt)).reshape(a.shape), x0)
  v0 = _scale(1.0 / _norm(v0), v0)
  iters = jnp.full(R.shape, config.iters, jnp.int32).at[0].set(config.first_iters)
  select = lambda c, a, b: jax.tree_util.tree_map(lambda u, w: jnp.where(c, u, w), a, b)

  def solve(R_s, start, v, n):
    x, v, value, g = _solve(prob, data, R_s, ref, start, v, n)
    return x, v, _diagnostics(prob, data, x, ref, value, g)

  def body(carry, inputs):
    x, x_prev, R_prev, R_prev2, v, first = carry
    R_s, n = inputs
    # warm start: linear extrapolation in R from the last two solutions; with one
    # solution only, a rescale onto the new sphere if the bound was active
    # (only while the bound is active at both: the form R U + Delta holds on the sphere,
    # and extrapolating interior solutions throws the start into another basin, which
    # made E7's local paths depend on the CPU's rounding: tests/test_regpath.py)
    active = lambda p, r: constraint_value(config.param, p) >= r * (1.0 - 1e-9)
    two = (R_prev > R_prev2) & active(x, R_prev) & active(x_prev, R_prev2)
    step = jnp.where(two, (R_s - R_prev) / jnp.where(two, R_prev - R_prev2, 1.0), 0.0)
    extrapolated = _axpy(step, jax.tree_util.tree_map(jnp.subtract, x, x_prev), x)
    on_boundary = constraint_value(config.param, x) >= R_prev * (1.0 - 1e-9)
    grow = jnp.where(on_boundary, radius(config.param, R_s) / radius(config.param, R_prev), 1.0)
    guess = select(two, extrapolated, _scale(grow, x))
    guess = select(first, x0, guess)
    if candidate is None:
      x_new, v, diag = solve(R_s, guess, v, n)
      took, gain = jnp.asarray(False), jnp.zeros((), dt)
    else:  # both starts in one vmapped solve (one copy of the solver in the program)
      starts = jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), guess, _along(config, candidate, R_s, rnd))
      vs = jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), v)
      xs, vs, diags = jax.vmap(solve, (None, 0, 0, None))(R_s, starts, vs, n)
      losses = diags[1]
      gain = (losses[0] - losses[1]) / jnp.abs(losses[0])
      took = gain > 1e-12
      k = took.astype(jnp.int32)
      x_new, v, diag = jax.tree_util.tree_map(lambda a: a[k], (xs, vs, diags))
    # after the first radius or a switch of branch, do not extrapolate across branches
    restart = first | took
    carry = (x_new, select(restart, x_new, x), R_s, jnp.where(restart, R_s, R_prev), v, jnp.asarray(False))
    return carry, (diag, took, gain)

  init = (x0, x0, R[0], R[0], v0, jnp.asarray(True))
  (x_last, *_), (outs, took, gain) = jax.lax.scan(body, init, (R, iters))
  return outs, x_last, took, gain


# ----------------------------------------------------------------------------
# Batched host entry point
# ----------------------------------------------------------------------------

_JIT_CACHE: dict = {}


def _compiled(config: PathConfig, local: bool, with_candidate: bool):
  key = (config, local, with_candidate)
  if key not in _JIT_CACHE:
    def fn(data, R, keys, ref, cand):
      return path_one(config, data, R, keys, ref, cand)
    axes = (0, None, 0, 0 if local else None, 0 if with_candidate else None)
    _JIT_CACHE[key] = jax.jit(jax.vmap(fn, axes))
  return _JIT_CACHE[key]


def regularization_path(config: PathConfig, data: data_lib.Dataset, R, keys: jax.Array | None = None,
                        ref: np.ndarray | None = None, candidates: np.ndarray | None = None) -> PathResult:
  """Regularization paths of B data sets (vmapped over the leading axis B).

  data: batch of B data sets (leading axis B on every field).
  R: (G,) strictly increasing positive radii (ValueError otherwise).
  keys: (B,) PRNG keys of the (K,Q) random starts (e.g. ``train.init_keys(seed, runs)``);
    required for "KQ", ignored for "W" (may be None).
  ref: (B, d, d) cone axes U of local paths; required iff config.cone_delta is set.
  candidates: optional (B, d, d) directions of a second start at every radius
    (see ``path_one``); ``PathResult.took_candidate`` says where it won.
  """
  config.validate()
  R = check_grid(R)
  data = data_lib.Dataset(*(np.asarray(a) for a in data))
  if data.X.ndim != 4:
    raise ValueError(f"regularization_path: data.X must have shape (B, n, T, d), got {data.X.shape}")
  B, d = data.X.shape[0], data.X.shape[-1]
  dt = data.X.dtype
  if keys is None and config.param == "KQ":
    raise ValueError("regularization_path: keys (B,) are required for the (K,Q) path (random start)")
  if keys is not None and keys.shape[0] != B:
    raise ValueError(f"regularization_path: {keys.shape[0]} keys for {B} data sets")
  local = config.cone_delta is not None
  if local != (ref is not None):
    raise ValueError("regularization_path: pass ref (B, d, d) exactly when config.cone_delta is set")

  def matrices(name, a):
    if a is None:
      return None
    a = np.asarray(a)
    if a.shape != (B, d, d):
      raise ValueError(f"regularization_path: {name} must have shape (B, d, d) = {(B, d, d)}, got {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(np.sum(a * a, axis=(1, 2)) == 0):
      raise ValueError(f"regularization_path: {name} must be finite and nonzero (an unsolved SVM is NaN)")
    return np.asarray(a, dt)

  ref, candidates = matrices("ref", ref), matrices("candidates", candidates)
  if keys is None:   # (W: unused)
    keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(B, dtype=jnp.uint32))
  device = lambda a: None if a is None else jnp.asarray(a)
  fn = _compiled(config, local, candidates is not None)
  outs, params, took, gain = jax.device_get(fn(data_lib.Dataset(*(jnp.asarray(a) for a in data)), jnp.asarray(R, dt),
                                               keys, device(ref), device(candidates)))
  W, loss, cons, kkt, gn, cone = (np.asarray(o) for o in outs)
  return PathResult(R, W, loss, cons, kkt, gn, cone, np.asarray(took), np.asarray(gain), params)
