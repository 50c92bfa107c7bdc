"""The nuclear-norm Att-SVM by a primal-dual interior-point method built for its structure.

    minimize ||W||_*  s.t.  <A_j, W> >= 1   (j = 1..N; A_j = a_j b_j^T, rank one)

Every constraint row of an Att-SVM is rank one, A_j = (x_{i,alpha_i} - x_it) z_i^T, and it stays
rank one on the reduced problem (``nuclear.reduce``). Written as the SDP pair (docs/science.md
section 9)

    (P) minimize tr X           s.t. <G_j, X> - x_j = 1,  X PSD (k x k),  x >= 0
    (D) maximize sum_j y_j      s.t. S = I - sum_j y_j G_j PSD,  s = y >= 0

with G_j = u_j v_j^T + v_j u_j^T, u_j = [a_j; 0], v_j = [0; b_j] and k = p + q, the off-diagonal
block of X is W / 2 and y are the constraints' multipliers. The Newton system of the HKM direction
reduces to N equations whose matrix H_ji = tr(G_j X G_i S^-1) is, for rank-two G, four
element-wise products of N x N matrices (a_j^T X11 a_i and the like): O(k^2 N + k N^2) work per
iteration instead of the O(N k^3) of a dense Schur complement, and no cone of k(k+1)/2 entries.
Mehrotra's predictor-corrector takes 15-30 iterations to a relative gap of 1e-10.

A solve that does not reach its tolerances (or whose rows are not rank one) returns None, and the
caller falls back to the general solvers (``nuclear.solve_auto``): the method is an accelerator,
never the only path. Deterministic: the same rows give the same bits.

Numerics versions 16 to 21 ran the same iteration in C, one problem at a time; from version 22
``_ipm`` below (NumPy's batched linear algebra) is the only one (CHANGELOG.md).
"""
from __future__ import annotations

import numpy as np

TOL_GAP = 1e-10      # relative duality gap at which a solve stops
TOL_FEAS = 1e-9      # relative primal and dual infeasibility at which a solve stops
MAX_ITER = 60
# Up to this many constraints N the method is the faster one; above, its dense N x N Newton system
# (2 solves of N^3 / 3 each per iteration) loses to SCS's sparse factorization (measured on E13's
# shapes, reduced blocks of 20 + 8..20 rows: 0.8x nuc_auto's time at N = 120, 1.2x at 240, 1.6x at 480), and
# ``nuclear.solve_ipm_many`` hands the problem to nuc_auto (numerics version 13).
MAX_CONSTRAINTS = 150
STEP = 0.98          # fraction of the step to the boundary of the cone
RANK_ONE_RTOL = 1e-10   # a reduced row counts as rank one when its second singular value is below this


def rank_one_factors(Ar: np.ndarray, p: int, q: int, rtol: float = RANK_ONE_RTOL):
  """(a (p, N), b (q, N)) with Ar[j] = vec(a_j b_j^T), or None where some row is not rank one
  (relative residual above rtol). Ar: (N, p*q). b_j is row j's largest row, normalized."""
  mats = Ar.reshape(-1, p, q)
  norms = np.sqrt(np.sum(mats * mats, axis=2))                  # (N, p)
  rows = mats[np.arange(len(mats)), np.argmax(norms, axis=1)]   # (N, q)
  scale = np.sqrt(np.sum(rows * rows, axis=1))
  if np.any(scale == 0):
    return None
  b = rows / scale[:, None]
  a = np.matmul(mats, b[:, :, None])[:, :, 0]                   # (N, p)
  resid = mats - a[:, :, None] * b[:, None, :]
  if np.any(np.sqrt(np.sum(resid * resid, axis=(1, 2))) > rtol * np.sqrt(np.sum(norms * norms, axis=1))):
    return None
  return a.T, b.T


def solve(Ar: np.ndarray, p: int, q: int):
  """min ||W||_* s.t. Ar vec(W) >= 1 for a p x q W whose constraint rows (N, p*q) are rank one.

  Returns (status "optimal", w (p*q,), multipliers y (N,), message) or None (not rank one, not
  converged, a numerical failure): the caller then solves it another way."""
  return solve_batch(Ar[None], p, q)[0]


def solve_batch(Ars: np.ndarray, p: int, q: int) -> list:
  """``solve`` for a stack of problems of one shape (B, N, p*q). Every problem iterates on its own
  (NumPy's batched linear algebra works matrix by matrix, and a problem stops at its own
  convergence), so its result is the same bits whatever else is in the batch."""
  B = Ars.shape[0]
  out = [None] * B
  if B == 0:
    return out
  for b in range(B):
    f = rank_one_factors(Ars[b], p, q)
    if f is not None:
      out[b] = f
  idx = [b for b in range(B) if out[b] is not None]
  res = [None] * B
  if idx:
    a = np.stack([out[b][0] for b in idx])
    bb = np.stack([out[b][1] for b in idx])
    for b, r in zip(idx, _ipm(a, bb, p, q)):
      res[b] = r
  return res


def _sym(M):
  return 0.5 * (M + np.swapaxes(M, -1, -2))


def _mm(*ms):
  out = ms[0]
  for m in ms[1:]:
    out = np.matmul(out, m)
  return out


def _tr(M):
  return np.swapaxes(M, -1, -2)


def _chol(M):
  """Batched Cholesky factors, and a mask of the matrices that have one (the others get I)."""
  try:
    return np.linalg.cholesky(M), np.ones(len(M), bool)
  except np.linalg.LinAlgError:
    L, ok = np.empty_like(M), np.ones(len(M), bool)
    for i, m in enumerate(M):
      try:
        L[i] = np.linalg.cholesky(m)
      except np.linalg.LinAlgError:
        L[i], ok[i] = np.eye(M.shape[-1]), False
    return L, ok


def _each(fn, shape, *stacks):
  """fn on stacks of matrices (it works matrix by matrix), its result of shape (B,) + shape; where
  it raises LinAlgError for the stack, fn on each matrix alone, NaN for those where it still raises
  (their problems then drop out), so one problem's failure changes no other problem's bits."""
  try:
    return fn(*stacks)
  except np.linalg.LinAlgError:
    out = np.full((len(stacks[0]),) + tuple(shape), np.nan)
    for i in range(len(out)):
      try:
        out[i] = fn(*(s[i:i + 1] for s in stacks))[0]
      except np.linalg.LinAlgError:
        pass
    return out


def _max_step(Li, dM):
  """Per matrix, the largest alpha with M + alpha dM PSD, given Li = L^-1 for M = L L^T (inf when
  dM keeps it PSD; NaN where the eigenvalues cannot be computed)."""
  lam = _each(np.linalg.eigvalsh, dM.shape[-1:], _sym(_mm(Li, dM, _tr(Li))))[:, 0]
  with np.errstate(divide="ignore"):
    return np.where(lam >= 0, np.inf, -1.0 / np.minimum(lam, -1e-300))


def _vec_step(v, dv):
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.min(np.where(dv < 0, -v / np.where(dv < 0, dv, -1.0), np.inf), axis=1)


def _ipm(a, b, p, q):
  """Mehrotra predictor-corrector, HKM direction, for the stack a (B, p, N), b (B, q, N)."""
  B, N, k = a.shape[0], a.shape[2], p + q
  I = np.eye(k)
  X = np.broadcast_to(I, (B, k, k)).copy()
  S = X.copy()
  x, s, y = np.ones((B, N)), np.ones((B, N)), np.zeros((B, N))
  aT, bT = _tr(a), _tr(b)
  result = [None] * B
  active = np.arange(B)

  def gop(M, a, b):               # <G_j, M> for symmetric M: 2 a_j^T M12 b_j, (B, N)
    return 2.0 * np.sum(a * _mm(M[:, :p, p:], b), axis=1)

  def gsum(v, a, b):              # sum_j v_j G_j, (B, k, k)
    M = np.zeros((len(v), k, k))
    M[:, :p, p:] = _mm(a * v[:, None, :], _tr(b))
    M[:, p:, :p] = _tr(M[:, :p, p:])
    return M

  for it in range(MAX_ITER):
    A_, B_, At, Bt = a[active], b[active], aT[active], bT[active]
    Xa, Sa, xa, sa, ya = X[active], S[active], x[active], s[active], y[active]
    Lx, okx = _chol(Xa)
    Ls, oks = _chol(Sa)
    Lxi, Lsi = _each(np.linalg.inv, (k, k), Lx), _each(np.linalg.inv, (k, k), Ls)
    Y = _mm(_tr(Lsi), Lsi)
    rp = 1.0 - (gop(Xa, A_, B_) - xa)
    Rd = I - gsum(ya, A_, B_) - Sa
    rl = ya - sa
    gap = np.sum(Xa * Sa, axis=(1, 2)) + np.sum(xa * sa, axis=1)
    pobj, dobj = np.trace(Xa, axis1=1, axis2=2), np.sum(ya, axis=1)
    mu = gap / (k + N)
    done = ((gap / (1 + np.abs(pobj) + np.abs(dobj)) < TOL_GAP)
            & (np.linalg.norm(rp, axis=1) / (1 + np.sqrt(N)) < TOL_FEAS)
            & ((np.sqrt(np.sum(Rd * Rd, axis=(1, 2))) + np.linalg.norm(rl, axis=1)) / (1 + np.sqrt(k)) < TOL_FEAS))
    for j in np.flatnonzero(done):
      result[active[j]] = ("optimal", (2.0 * Xa[j, :p, p:]).reshape(-1), ya[j].copy(), f"nuc_ipm: {it} iterations")
    finite = (np.isfinite(gap) & np.all(np.isfinite(rp), axis=1) & np.all(np.isfinite(Rd), axis=(1, 2))
              & np.all(np.isfinite(Lxi), axis=(1, 2)) & np.all(np.isfinite(Lsi), axis=(1, 2)))
    keep = ~done & okx & oks & finite    # a problem that fails drops out (and falls back) alone
    if not np.any(keep):
      break
    if not np.all(keep):
      sel = np.flatnonzero(keep)
      active = active[sel]
      A_, B_, At, Bt = A_[sel], B_[sel], At[sel], Bt[sel]
      Xa, Sa, xa, sa, ya = Xa[sel], Sa[sel], xa[sel], sa[sel], ya[sel]
      Lxi, Lsi, Y, rp, Rd, rl, gap, mu = Lxi[sel], Lsi[sel], Y[sel], rp[sel], Rd[sel], rl[sel], gap[sel], mu[sel]
    # H_ji = tr(G_j X G_i Y) for G = u v^T + v u^T, u = [a; 0], v = [0; b]
    Cx = _mm(At, Xa[:, :p, p:], B_)
    Cy = _mm(At, Y[:, :p, p:], B_)
    t1 = _tr(Cx) * Cy
    H = (t1 + _tr(t1) + _mm(Bt, Xa[:, p:, p:], B_) * _mm(At, Y[:, :p, :p], A_)
         + _mm(At, Xa[:, :p, :p], A_) * _mm(Bt, Y[:, p:, p:], B_))
    xs = xa / sa
    M = H + xs[:, :, None] * np.eye(N)
    XRdY = _mm(Xa, Rd, Y)

    def direction(sigma_mu, corr_mat, corr_vec):
      # HKM: dX = sym(sigma mu Y - X - X dS Y - corr), dS = Rd - sum_i dy_i G_i
      R = sigma_mu[:, None, None] * Y - Xa
      if corr_mat is not None:
        R = R - corr_mat
      comp = sigma_mu[:, None] - xa * sa - (0.0 if corr_vec is None else corr_vec)
      rhs = rp - gop(_sym(R - XRdY), A_, B_) + comp / sa - xs * rl
      dy = _each(np.linalg.solve, (N, 1), M, rhs[:, :, None])[:, :, 0]
      dS = Rd - gsum(dy, A_, B_)
      dX = _sym(R - _mm(Xa, dS, Y))
      ds = rl + dy
      dx = comp / sa - xs * ds
      return dX, dx, dy, dS, ds

    # (a singular Newton system or an eigenvalue failure makes that problem's step NaN: it drops out
    # at the next iteration and falls back, and the others go on with the same bits)
    with np.errstate(invalid="ignore"):
      dX, dx, dy, dS, ds = direction(np.zeros_like(mu), None, None)
      ap = np.minimum(1.0, np.minimum(_max_step(Lxi, dX), _vec_step(xa, dx)))
      ad = np.minimum(1.0, np.minimum(_max_step(Lsi, dS), _vec_step(sa, ds)))
      gap_aff = (np.sum((Xa + ap[:, None, None] * dX) * (Sa + ad[:, None, None] * dS), axis=(1, 2))
                 + np.sum((xa + ap[:, None] * dx) * (sa + ad[:, None] * ds), axis=1))
      sigma = (gap_aff / gap) ** 3
      dX, dx, dy, dS, ds = direction(sigma * mu, _mm(dX, dS, Y), dx * ds)
      ap = np.minimum(1.0, STEP * np.minimum(_max_step(Lxi, dX), _vec_step(xa, dx)))
      ad = np.minimum(1.0, STEP * np.minimum(_max_step(Lsi, dS), _vec_step(sa, ds)))
    X[active] = _sym(Xa + ap[:, None, None] * dX)
    x[active] = xa + ap[:, None] * dx
    S[active] = _sym(Sa + ad[:, None, None] * dS)
    y[active] = ya + ad[:, None] * dy
    s[active] = sa + ad[:, None] * ds
  return result
