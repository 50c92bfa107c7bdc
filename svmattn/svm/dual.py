"""A batched on-device solver of the Frobenius Att-SVM through its dual (JAX).

The Frobenius Att-SVM  min 1/2 ||W||_F^2  s.t.  (x_{i,alpha_i} - x_it)^T W z_i >= 1
has the dual, a nonnegative quadratic program over one multiplier per constraint,

    min_{lambda >= 0}  1/2 lambda^T G lambda - 1^T lambda,     W = sum_j lambda_j u_j z_j^T,

with u_j = x_{i,alpha_i} - x_it, z_j = z_i for constraint j = (i,t), and
G_jk = (u_j^T u_k)(z_j^T z_k): G is built from inner products, never from the
d^2-long rows of the primal constraint matrix. The multipliers of t = alpha_i are
held at 0. Solved by projected Newton (Bertsekas 1982) with a vectorized
projected-arc line search, a fixed iteration budget, and ``vmap`` over data sets.

Every solution comes with its KKT residual (relative violation of dual feasibility,
complementary slackness and primal feasibility). ``att_svm_fro_batch`` accepts a
solution only where the residual is below ``tol`` and re-solves the rest on the
host with the exact NNLS solver of ``svmattn.svm.att_svm`` (which also decides
infeasibility): a data set is never reported from an unconverged solve.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from svmattn.svm import att_svm as svm_lib

_STEPS = 2.0 ** -jnp.arange(0, 30)  # projected-arc line search candidates


def _gram(X, Z, alpha):
  """(G (nT, nT), U (nT, d), Zr (nT, d), free (nT,) bool) of one data set."""
  n, T, d = X.shape
  U = (X[jnp.arange(n), alpha][:, None, :] - X).reshape(n * T, d)
  Zr = jnp.repeat(Z, T, axis=0)
  free = (jnp.arange(T)[None, :] != alpha[:, None]).reshape(-1)
  G = (U @ U.T) * (Zr @ Zr.T)
  G = jnp.where(free[:, None] & free[None, :], G, 0.0)
  return G, U, Zr, free


def _kkt_residual(G, lam, free):
  """Relative KKT residual of the dual: projected gradient, complementarity."""
  g = G @ lam - 1.0                                     # = margin - 1 of W(lambda)
  pg = jnp.where(lam > 0, g, jnp.minimum(g, 0.0))       # projected gradient
  pg = jnp.where(free, pg, 0.0)
  comp = jnp.where(free, lam * g, 0.0)
  scale = 1.0 + jnp.max(jnp.where(free, lam, 0.0))
  return jnp.maximum(jnp.max(jnp.abs(pg)), jnp.max(jnp.abs(comp)) / scale)


def _solve_one(X, Z, alpha, max_iter, tol):
  G, U, Zr, free = _gram(X, Z, alpha)
  N = G.shape[0]
  eye = jnp.eye(N, dtype=G.dtype)
  ridge = 1e-13 * (1.0 + jnp.max(jnp.diag(G)))

  def objective(lam):
    return 0.5 * lam @ (G @ lam) - jnp.sum(lam)

  def body(carry):
    lam, it, _ = carry
    g = G @ lam - 1.0
    # variables at the bound with a positive gradient stay there (the active set)
    active = (~free) | ((lam <= 0) & (g > 0))
    keep = ~active
    H = jnp.where(keep[:, None] & keep[None, :], G, 0.0) + jnp.where(active, 1.0, ridge) * eye
    direction = jnp.where(keep, -jnp.linalg.solve(H, jnp.where(keep, g, 0.0)), 0.0)
    candidates = jnp.maximum(lam[None, :] + _STEPS[:, None].astype(G.dtype) * direction[None, :], 0.0)
    values = jax.vmap(objective)(candidates)
    f0 = objective(lam)
    decrease = values <= f0 + 1e-4 * ((candidates - lam[None, :]) @ g)
    pick = jnp.where(jnp.any(decrease), jnp.argmax(decrease), jnp.argmin(values))
    new = jnp.where(values[pick] <= f0, candidates[pick], lam)
    return new, it + 1, _kkt_residual(G, new, free)

  def cond(carry):
    _, it, res = carry
    return (it < max_iter) & (res > tol)

  lam0 = jnp.zeros(N, G.dtype)
  lam, iters, res = jax.lax.while_loop(cond, body, (lam0, 0, _kkt_residual(G, lam0, free)))
  W = (U * lam[:, None]).T @ Zr
  return W, lam.reshape(X.shape[0], X.shape[1]), res, iters


@functools.partial(jax.jit, static_argnames=("max_iter",))
def solve_dual_batch(X, Z, alpha, max_iter: int = 100, tol: float = 1e-12):
  """Projected Newton on the dual for a batch: X (B,n,T,d), Z (B,n,d), alpha (B,n).

  Returns (W (B,d,d), dual (B,n,T), kkt_residual (B,), iterations (B,)). An
  infeasible data set shows up as a large residual (its dual is unbounded).
  """
  return jax.vmap(lambda x, z, a: _solve_one(x, z, a, max_iter, tol))(X, Z, alpha)


def att_svm_fro_batch(X, Z, alpha, tol: float = 1e-9, max_iter: int = 100):
  """Frobenius Att-SVM of B data sets on device, checked, with host fallback.

  Returns a dict of NumPy arrays: W (B,d,d) (NaN where not optimal), status (B,)
  ("optimal" / "infeasible" / "failed"), kkt_residual (B,) of the device solve,
  fallback (B,) bool where the host NNLS solver was used instead.
  """
  X = np.asarray(X, np.float64)
  Z = np.asarray(Z, np.float64)
  alpha = np.asarray(alpha, np.int64)
  W, _, res, _ = jax.device_get(solve_dual_batch(X, Z, alpha, max_iter=max_iter, tol=tol * 1e-3))
  W = np.array(W)
  res = np.asarray(res)
  fallback = ~(res <= tol) | ~np.all(np.isfinite(W.reshape(len(W), -1)), axis=1)
  status = np.array(["optimal"] * len(W), dtype=object)
  for b in np.flatnonzero(fallback):
    r = svm_lib.att_svm(X[b], Z[b], alpha[b], "fro")
    status[b] = r.status
    W[b] = r.W if r.ok else np.nan
  return {"W": W, "status": status.astype(str), "kkt_residual": res, "fallback": fallback}
