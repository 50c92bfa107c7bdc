"""Feasibility of Att-SVM(alpha), batched over data sets (host side: NumPy, SciPy).

Att-SVM(alpha) asks for W with (x_{i,alpha_i} - x_it)^T W z_i >= 1 for all i and
t != alpha_i, i.e. A w >= 1 with rows a_k = vec((x_{i,alpha_i} - x_it) z_i^T)
(``svm.margin_matrix``). The constraint set is a cone shifted away from 0, so
feasibility is scale-free:

    A w >= 1 is feasible  <=>  some w has A w > 0 (strictly)
                          <=>  (Gordan) no lambda >= 0, lambda != 0, with A^T lambda = 0,

i.e. 0 is not in the convex hull of the rows of A. Infeasible examples: a token
equal to x_{i,alpha_i} (a zero row), a token x_{i,alpha_i} that is a convex
combination of the others, and constraints of different sequences that cancel
(sum_k lambda_k a_k = 0, possible once the queries are linearly dependent, n > d).
For generic data with d >= max(T-1, n), A has full row rank and every alpha is
feasible (docs/science.md section 3).

Decision rule (the one of ``svm.att_svm``'s NNLS solver, made scale-free): rows are
divided by s = max_k ||a_k||, and the data set is infeasible when Lawson & Hanson's
NNLS  u = argmin_{u >= 0} ||E u - f||,  E = [A^T/s; 1^T],  f = (0, ..., 0, 1)
has a vanishing residual r = E u - f (||r|| <= 1e-10 or -r[-1] <= 1e-12, the
thresholds of ``svm._solve_nnls``). Since ||r||^2 = -r[-1] at the optimum and
||W^mm|| ~ 1/||r||, this calls infeasible the data sets whose (row-normalized)
Frobenius SVM would need ||W^mm||_F >~ 1e6, as ``svm.att_svm`` does for unit-norm data.

How it is batched (``check``): two stages.
  1. Vectorized certificate, NumPy over chunks of the batch: with the Gram matrix
     G = A A^T / s^2, G_{kl} = (a_k . a_l)(z_k . z_l) / s^2 (N x N, A never formed),
     take the (ridge) least-squares candidate w = A^T (G + 1e-12 I)^{-1} 1 / s (one
     batched LU solve; the d^2 x d^2 normal equations instead when n T > d^2), and
     compute its margins m = A w directly from W = sum_k c_k (x_{i,alpha_i}-x_it) z_i^T.
     If min m > 0 and s ||W||_F / min m <= CERTIFICATE_NORM (1e5, a decade inside
     the NNLS threshold), W / min m is a feasible point of Att-SVM(alpha): decided
     feasible. This settles every generic data set with full-row-rank A (all of
     d >= max(T-1, n)) without a per-data-set loop.
  2. At d = 1 (numerics version 8) each constraint is a number a_k w >= 1, and A w >= 1 is
     infeasible exactly when two constraints have opposite signs or one is zero: then
     lambda = (|a_l|, a_k) / (a_k - a_l) (or lambda = e_l for a_l = 0) is a Gordan certificate,
     exact up to one rounding. Such data sets are decided infeasible at once (method "sign":
     the NNLS below finds the same, as its residual vanishes); the others go on to the NNLS.
  3. The rest (typically small d: infeasible or barely feasible) runs the exact NNLS
     test above in a tight loop, one scipy.optimize.nnls per data set (0.03-0.3 ms
     at E3/E9 sizes: small d means a small E). Infeasible data sets get a Gordan certificate
     lambda = u / sum(u) >= 0 with ||sum_k lambda_k a_k|| / s <= ~1e-6.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

# Thresholds of svm._solve_nnls on the NNLS residual r = E u - f: infeasible when
# ||r|| <= NNLS_RESIDUAL_TOL or -r[-1] <= NNLS_LAST_TOL.
NNLS_RESIDUAL_TOL = 1e-10
NNLS_LAST_TOL = 1e-12
# A least-squares witness W decides "feasible" when s ||W||_F / min margin is at most this.
CERTIFICATE_NORM = 1e5
STATUSES = ("feasible", "infeasible", "failed")
METHODS = ("lstsq", "sign", "nnls")
# Batch chunk of the vectorized stage: at most this many Gram entries (B * N * N) at once.
_CHUNK_ENTRIES = 2_000_000


class Feasibility(NamedTuple):
  """Feasibility of Att-SVM(alpha) for B data sets.

  feasible:  (B,) bool
  status:    (B,) str, "feasible" | "infeasible" | "failed" (an NNLS that raised or
             returned non-finite values; feasible is False there)
  method:    (B,) str, "lstsq" (decided by the vectorized certificate), "sign" (d = 1: two
             constraints of opposite signs, or a zero one) or "nnls"
  witness:   (B, d, d) a W with all margins >= 1 where feasible (the least-squares
             candidate rescaled, or the Frobenius SVM solution when NNLS decided); NaN elsewhere
  gordan:    (B, n, T) lambda >= 0, sum 1, with sum_it lambda_it (x_{i,alpha_i} - x_it) z_i^T ~ 0
             (relative to s) where infeasible (0 at t = alpha_i and masked tokens); NaN elsewhere
  """
  feasible: np.ndarray
  status: np.ndarray
  method: np.ndarray
  witness: np.ndarray
  gordan: np.ndarray


def _check_batch(X, Z, alpha, mask):
  X = np.asarray(X, dtype=np.float64)
  Z = np.asarray(Z, dtype=np.float64)
  alpha = np.asarray(alpha)
  if X.ndim != 4:
    raise ValueError(f"feasibility: X must have shape (B, n, T, d), got {X.shape}")
  B, n, T, d = X.shape
  if T < 2:
    raise ValueError(f"feasibility: X must have T >= 2 tokens per sequence, got T={T}")
  if Z.shape != (B, n, d):
    raise ValueError(f"feasibility: Z must have shape (B, n, d) = {(B, n, d)}, got {Z.shape}")
  if alpha.shape != (B, n):
    raise ValueError(f"feasibility: alpha must have shape (B, n) = {(B, n)}, got {alpha.shape}")
  if alpha.dtype.kind not in "iu":
    if alpha.dtype.kind != "f" or not np.all(alpha == np.round(alpha)):
      raise ValueError(f"feasibility: alpha must hold integer token indices, got dtype {alpha.dtype}")
  alpha = alpha.astype(np.int64)
  if np.any(alpha < 0) or np.any(alpha >= T):
    raise ValueError(f"feasibility: alpha entries must be in [0, T={T}), got values in "
                     f"[{alpha.min()}, {alpha.max()}]")
  if not (np.all(np.isfinite(X)) and np.all(np.isfinite(Z))):
    raise ValueError("feasibility: X and Z must be finite (found NaN or inf)")
  keep = np.ones((B, n, T), bool)
  if mask is not None:
    mask = np.asarray(mask, bool)
    if mask.shape not in ((n, T), (B, n, T)):
      raise ValueError(f"feasibility: mask must have shape (n, T) = {(n, T)} or (B, n, T), got {mask.shape}")
    keep &= mask
  keep[np.arange(B)[:, None], np.arange(n)[None], alpha] = False
  return X, Z, alpha, keep


def _differences(X, alpha, keep):
  """a_it = (x_{i,alpha_i} - x_it), zeroed where no constraint: (B, n, T, d)."""
  B, n = alpha.shape
  top = X[np.arange(B)[:, None], np.arange(n)[None], alpha]          # (B, n, d)
  return (top[:, :, None, :] - X) * keep[..., None]


def _row_scale(D, Z, keep):
  """s = max_k ||a_k|| ||z_k|| over the constraints of each data set: (B,). 1 where all are zero."""
  norms = np.linalg.norm(D, axis=-1) * np.linalg.norm(Z, axis=-1)[:, :, None]   # (B, n, T)
  s = np.max(np.where(keep, norms, 0.0).reshape(len(D), -1), axis=1, initial=0.0)
  return np.where(s > 0, s, 1.0)


def _solve_spd(M, rhs):
  """Batched solve of (M + 1e-12 I) x = rhs for positive semidefinite M (B, k, k)."""
  k = M.shape[-1]
  try:
    return np.linalg.solve(M + 1e-12 * np.eye(k), rhs)
  except np.linalg.LinAlgError:  # not expected (M + eps I is positive definite); be safe
    return np.linalg.pinv(M, rcond=1e-13, hermitian=True) @ rhs


def _certificates(D, Z, keep, s):
  """Stage 1 on a chunk: least-squares witnesses. Returns (decided (B,), W (B,d,d)).

  The ridge least-squares candidate w = (A^T A + eps I)^{-1} A^T 1 on the row-normalized
  A (eps = 1e-12; rows of unconstrained tokens are zero), computed in the smaller of two
  forms: primal, a (d^2 x d^2) system, when there are more constraints than d^2; dual,
  w = A^T (G + eps I)^{-1} 1 with the (nT x nT) Gram matrix G_kl = (a_k . a_l)(z_k . z_l)
  otherwise (A never formed). W is rescaled so that its smallest margin is 1 where decided."""
  B, n, T, d = D.shape
  Dn = D / s[:, None, None, None]
  rhs = keep.reshape(B, n * T, 1).astype(np.float64)
  if d * d < n * T:                                                   # primal: A (B, nT, d^2)
    A = np.einsum("bntd,bne->bntde", Dn, Z).reshape(B, n * T, d * d)
    At = A.transpose(0, 2, 1)
    W = _solve_spd(At @ A, At @ rhs).reshape(B, d, d)
  else:                                                               # dual: Gram (B, nT, nT)
    a = Dn.reshape(B, n * T, d)
    zr = np.repeat(Z, T, axis=1)
    G = (a @ a.transpose(0, 2, 1)) * (zr @ zr.transpose(0, 2, 1))
    c = _solve_spd(G, rhs)
    U = np.einsum("bnt,bntd->bnd", c.reshape(B, n, T), Dn)             # u_i = sum_t c_it a_it
    W = U.transpose(0, 2, 1) @ Z                                      # sum_i u_i z_i^T (d, d)
  margins = np.einsum("bntd,bnd->bnt", Dn, Z @ W.transpose(0, 2, 1))  # a_it^T W z_i
  low = np.min(np.where(keep, margins, np.inf).reshape(B, -1), axis=1)
  size = np.linalg.norm(W.reshape(B, -1), axis=1)
  with np.errstate(divide="ignore", invalid="ignore"):
    decided = (low > 0) & np.isfinite(low) & np.isfinite(size) & (size <= CERTIFICATE_NORM * low)
    W = W / (s * np.where(decided, low, 1.0))[:, None, None]
  return decided, W


def _nnls_one(D, Z, keep, s):
  """Stage 2 for one data set: the NNLS test. D (n,T,d), Z (n,d), keep (n,T), s the row scale.
  Returns (status, W (d,d) or None, lambda (n,T) or None)."""
  n, T, d = D.shape
  rows = np.einsum("ntd,ne->ntde", D / s, Z)[keep].reshape(-1, d * d)     # (N, d*d)
  N = rows.shape[0]
  if N == 0:
    return "feasible", np.zeros((d, d)), None
  E = np.empty((d * d + 1, N), order="F")     # scipy's nnls works on a Fortran-ordered copy
  E[:-1] = rows.T
  E[-1] = 1.0
  f = np.zeros(d * d + 1)
  f[-1] = 1.0
  import scipy.optimize   # here: 0.5 s that run_experiment.import_in_background spends beside compiling
  try:
    u, _ = scipy.optimize.nnls(E, f, maxiter=50 * (N + d * d + 1))
  except Exception:  # noqa: BLE001 - a solver failure is an outcome
    return "failed", None, None
  r = E @ u - f
  if not np.all(np.isfinite(r)):
    return "failed", None, None
  if np.linalg.norm(r) <= NNLS_RESIDUAL_TOL or -r[-1] <= NNLS_LAST_TOL:
    lam = np.zeros((n, T))
    lam[keep] = u / np.sum(u)
    return "infeasible", None, lam
  w = r[:-1] / -r[-1]                      # the normalized problem's Frobenius SVM solution
  low = float(np.min(rows @ w))
  if not low > 0:
    return "failed", None, None
  return "feasible", (w / (low * s)).reshape(d, d), None


def _opposite_signs(a, keep):
  """Stage 2 (d = 1): the constraints a_k w >= 1, a (B, n, T) with keep (B, n, T). Returns (infeasible
  (B,) bool: a kept a_k <= 0 beside a kept a_l >= 0, lambda (B, n, T): the Gordan certificate there)."""
  rows = np.arange(len(a))
  flat, kept = a.reshape(len(a), -1), keep.reshape(len(a), -1)
  hi = np.where(kept, flat, -np.inf)
  lo = np.where(kept, flat, np.inf)
  k, l = np.argmax(hi, axis=1), np.argmin(lo, axis=1)
  ak, al = hi[rows, k], lo[rows, l]
  infeasible = (ak >= 0) & (al <= 0) & np.isfinite(ak) & np.isfinite(al)
  lam = np.zeros_like(flat)
  spread = np.where(ak > al, ak - al, 1.0)
  lam[rows, k] = np.where(ak > al, -al / spread, 0.0)
  lam[rows, l] += np.where(ak > al, ak / spread, 1.0)    # ak == al == 0: the zero constraint alone
  return infeasible, lam.reshape(a.shape)


def check(X, Z, alpha, mask=None) -> Feasibility:
  """Is Att-SVM(alpha) feasible, for each of B data sets?

  X (B, n, T, d) tokens, Z (B, n, d) queries, alpha (B, n) token indices;
  mask: optional (n, T) or (B, n, T) bool, the tokens that get a constraint (default all).
  Feasible means some W has (x_{i,alpha_i} - x_it)^T W z_i >= 1 for every constrained
  t != alpha_i; decided by a batched least-squares certificate, then the exact NNLS test
  where that is undecided (see the module docstring). Returns a ``Feasibility``.
  """
  X, Z, alpha, keep = _check_batch(X, Z, alpha, mask)
  B, n, T, d = X.shape
  D = _differences(X, alpha, keep)
  s = _row_scale(D, Z, keep)
  decided = np.zeros(B, bool)
  witness = np.full((B, d, d), np.nan)
  gordan = np.full((B, n, T), np.nan)
  status = np.full(B, "feasible", dtype="<U10")
  method = np.full(B, "lstsq", dtype="<U5")
  chunk = max(1, _CHUNK_ENTRIES // (n * T) ** 2)
  for lo in range(0, B, chunk):
    sl = slice(lo, lo + chunk)
    ok, W = _certificates(D[sl], Z[sl], keep[sl], s[sl])
    decided[sl] = ok
    witness[sl][ok] = W[ok]
  if d == 1:
    signs, lam = _opposite_signs(D[..., 0] * Z[:, :, None, 0], keep)
    status[signs], method[signs], gordan[signs] = "infeasible", "sign", lam[signs]
    decided |= signs
  for b in np.flatnonzero(~decided):
    st, W, lam = _nnls_one(D[b], Z[b], keep[b], s[b])
    status[b], method[b] = st, "nnls"
    if W is not None:
      witness[b] = W
    if lam is not None:
      gordan[b] = lam
  return Feasibility(status == "feasible", status, method, witness, gordan)


def is_feasible(X, Z, alpha, mask=None) -> np.ndarray:
  """(B,) bool: Att-SVM(alpha) feasible for each data set (``check(...).feasible``)."""
  return check(X, Z, alpha, mask).feasible
