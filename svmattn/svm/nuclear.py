"""The nuclear-norm Att-SVM handed to SCS directly (host side, no cvxpy).

    minimize ||W||_*  s.t.  A vec(W) >= 1
  = minimize (tr P + tr Q) / 2  s.t.  M = [[P, W], [W^T, Q]] PSD,  A vec(W) >= 1.

First the problem is restricted to the column and row spaces the constraints
see (``reduce``: at E2 sizes W z_i only matters for the n=6 queries, so the PSD
block shrinks from 20 to 16). The variable x is M itself in SCS's scaled
lower-triangle vectorization (svec: column-major lower triangle, off-diagonal
entries times sqrt(2)), so the PSD constraint is s = x, and W_ab =
x[idx(p+b, a)] / sqrt(2). The index maps are built once per shape and reused. This skips cvxpy's per-solve overhead
(about half the time at E2 sizes); ``svmattn.svm.att_svm`` checks the result the same way
as any other solver (margins, rescaling so that the smallest margin is 1).
"""
from __future__ import annotations

import functools

import numpy as np

from svmattn.svm import nuclear_ipm

SETTINGS = dict(eps_abs=1e-9, eps_rel=1e-9, max_iters=200_000, verbose=False)


def _basis(M: np.ndarray, rtol: float = 1e-12) -> np.ndarray:
  """Orthonormal basis (columns) of the column space of M."""
  U, s, _ = np.linalg.svd(M, full_matrices=False)
  return U[:, s > rtol * max(s[0], 1e-300)] if s.size else U[:, :0]


# A row counts as rank one for ``reduce`` when its residual is at the rounding level (an outer
# product's is about 1e-16 of its norm): the spans of its factors then hold it exactly.
EXACT_RANK_ONE = 1e-13


def reduce(A: np.ndarray, d: int):
  """Restrict the problem to the spans the constraints see.

  With A_j the rows of A as d x d matrices, L = span of their columns and
  R = span of their rows, P_L W P_R satisfies the same constraints as W and has
  no larger nuclear (or Frobenius) norm, so some solution lies in L x R. Returns
  (QL (d,rl), QR (d,rr), reduced rows (N, rl*rr)); W = QL Wr QR^T.

  Where every row is rank one, A_j = a_j b_j^T (every Att-SVM row is:
  (x_{i,alpha_i} - x_it) z_i^T; ``nuclear_ipm.rank_one_factors``), L and R are the spans of
  the a_j and of the b_j, whose bases come from d x N matrices instead of the d x Nd
  concatenations of the A_j (numerics version 15: 15-20% of E3's analysis). Other rows
  take the concatenations.
  """
  mats = A.reshape(-1, d, d)
  N = len(mats)
  factors = nuclear_ipm.rank_one_factors(A, d, d, EXACT_RANK_ONE) if N else None
  if factors is not None:
    QL, QR = _basis(factors[0]), _basis(factors[1])
  else:
    QL = _basis(mats.transpose(1, 0, 2).reshape(d, N * d)) if N else np.zeros((d, 0))    # [A_1 ... A_N]
    QR = _basis(mats.transpose(2, 0, 1).reshape(d, N * d)) if N else np.zeros((d, 0))    # [A_1^T ... A_N^T]
  reduced = QL.T @ mats @ QR                  # (numerics version 8: was a three-operand einsum, 10x slower)
  return QL, QR, reduced.reshape(N, -1)


def solve(A: np.ndarray, d: int):
  """min ||W||_* s.t. A vec(W) >= 1 by SCS, on the reduced problem (see ``reduce``).

  Returns (status, w (d*d,) or None, dual (N,) or None, message)."""
  return _reduced(A, d, "scs_direct", lambda p, q: _solve_rect)


def unit_margin(result: tuple, A: np.ndarray, name: str) -> tuple:
  """A solver's (status, w, dual, message) with w rescaled so that its smallest margin is
  exactly 1; "failed" when the solver's margins are far from 1 (an inaccurate solve)."""
  status, w, dual, msg = result
  if status != "optimal":
    return result
  lowest = float(np.min(A @ w))
  if not lowest > 0.5:
    return "failed", None, None, f"{name}: smallest margin {lowest:.3g}"
  return status, w / lowest, dual, msg


def _reduced(A: np.ndarray, d: int, name: str, pick):
  """Solve the problem restricted to the spans the constraints see (``reduce``) with the
  solver ``pick(rl, rr)`` of the reduced sizes, and map W back: W = QL Wr QR^T."""
  QL, QR, Ar = reduce(A, d)
  rl, rr = QL.shape[1], QR.shape[1]
  if rl == 0 or rr == 0:
    return "infeasible", None, None, f"{name}: every constraint row is zero"
  status, wr, dual, msg = pick(rl, rr)(Ar, rl, rr)
  if wr is None:
    return status, None, dual, msg
  return status, (QL @ wr.reshape(rl, rr) @ QR.T).reshape(-1), dual, msg


@functools.lru_cache(maxsize=64)
def _structure_rect(N: int, p: int, q: int):
  """As _structure for a p x q variable W inside M = [[P, W], [W^T, Q]] of size p + q."""
  import scipy.sparse as sp      # (here: every process that imports the registry imports this module)
  k = p + q
  size = k * (k + 1) // 2
  cols = np.arange(k)

  def idx(r, c):
    return c * k - c * (c - 1) // 2 + (r - c)

  a, b = np.meshgrid(np.arange(p), np.arange(q), indexing="ij")
  w_index = idx(p + b, a).reshape(-1)
  c = np.zeros(size)
  c[idx(cols, cols)] = 0.5
  psd = sp.csc_matrix((-np.ones(size), (N + np.arange(size), np.arange(size))), shape=(N + size, size))
  b_vec = np.concatenate([-np.ones(N), np.zeros(size)])
  return w_index, c, psd, b_vec, size, k


def _solve_rect(A: np.ndarray, p: int, q: int):
  import scipy.sparse as sp
  import scs
  N = A.shape[0]
  w_index, c, psd, b_vec, size, k = _structure_rect(N, p, q)
  rows = np.repeat(np.arange(N), p * q)
  cols = np.tile(w_index, N)
  margins = sp.csc_matrix((-(A / np.sqrt(2.0)).reshape(-1), (rows, cols)), shape=(N + size, size))
  data = {"A": (margins + psd).tocsc(), "b": b_vec, "c": c}
  try:
    solver = scs.SCS(data, {"l": N, "s": [k]}, **SETTINGS)
    sol = solver.solve()
  except Exception as e:  # noqa: BLE001 - a solver failure is an outcome
    return "failed", None, None, f"scs_direct: {type(e).__name__}: {e}"
  info = sol["info"]
  status = info.get("status", "")
  if status.startswith("infeasible"):
    return "infeasible", None, None, f"scs_direct: {status}"
  if not status.startswith("solved") or sol["x"] is None:
    return "failed", None, None, f"scs_direct: {status}"
  w = sol["x"][w_index] / np.sqrt(2.0)
  dual = np.asarray(sol["y"][:N])
  return "optimal", w, dual, "" if status == "solved" else status


# ----------------------------------------------------------------------------
# The dual, by an interior-point method (Clarabel): the exact nuclear path
# ----------------------------------------------------------------------------
#
#   maximize 1^T lam  s.t.  lam >= 0,  ||M(lam)||_2 <= 1,  M(lam) = sum_j lam_j A_j  (rl x rr)
#
# The spectral-norm constraint is the PSD constraint [[I, M], [M^T, I]] >= 0 of size rl + rr,
# with only N variables (the primal SDP has (rl + rr)(rl + rr + 1)/2). Clarabel's dual
# variable of that cone is a PSD matrix [[P, -W/2], [-W^T/2, Q]] whose off-diagonal block
# gives the primal solution W (the nuclear-norm SVM), to interior-point accuracy.

CLARABEL_SETTINGS = dict(tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10, tol_ktratio=1e-8, max_iter=200,
                         verbose=False)


@functools.lru_cache(maxsize=64)
def _structure_dual(p: int, q: int):
  """Clarabel's PSDTriangleCone vectorization of a (p+q) x (p+q) matrix: the upper triangle
  column by column, off-diagonal entries times sqrt(2). Returns (index of entry (a, p+b) for the
  p x q block, as (p*q,), the vector of the identity, size)."""
  k = p + q
  size = k * (k + 1) // 2

  def idx(i, j):      # i <= j
    return j * (j + 1) // 2 + i

  a, b = np.meshgrid(np.arange(p), np.arange(q), indexing="ij")
  block = idx(a, p + b).reshape(-1)
  eye = np.zeros(size)
  eye[idx(np.arange(k), np.arange(k))] = 1.0
  return block, eye, size


def solve_dual(A: np.ndarray, d: int):
  """min ||W||_* s.t. A vec(W) >= 1 through its dual (above) by Clarabel, on the reduced
  problem (``reduce``). Returns (status, w (d*d,) or None, dual multipliers (N,) or None, message)."""
  return _reduced(A, d, "clarabel_dual", lambda p, q: _solve_dual_reduced)


# The reduced PSD block size (rl + rr) up to which the dual's interior point beats SCS on the
# primal (benchmark --suites=svm, nuclear_solvers: 1.2-3x faster at 6-10, 1.2-6x slower at 16-30).
AUTO_DUAL_MAX_BLOCK = 12


def solve_auto(A: np.ndarray, d: int):
  """The faster exact path for the problem's size: the dual by Clarabel when the reduced PSD
  block has at most AUTO_DUAL_MAX_BLOCK rows, else the primal by SCS (``solve``). Same returns."""
  return _reduced(A, d, "nuc_auto", _auto_pick)


def _auto_pick(p: int, q: int):
  """nuc_auto's solver of a reduced p x q problem."""
  return _solve_dual_reduced if p + q <= AUTO_DUAL_MAX_BLOCK else _solve_rect


def _solve_dual_reduced(Ar: np.ndarray, p: int, q: int):
  import clarabel
  import scipy.sparse as sp
  N = Ar.shape[0]
  block, eye, size = _structure_dual(p, q)
  rows = np.repeat(block[None, :], N, axis=0).reshape(-1) + N
  cols = np.repeat(np.arange(N), p * q)
  # s = b - A x in the cone: s_nonneg = lam; s_psd = svec(I) + sqrt(2) * vec of the block M(lam)
  psd = sp.csc_matrix((-np.sqrt(2.0) * Ar.reshape(-1), (rows, cols)), shape=(N + size, N))
  nonneg = sp.csc_matrix((-np.ones(N), (np.arange(N), np.arange(N))), shape=(N + size, N))
  b = np.concatenate([np.zeros(N), eye])
  settings = clarabel.DefaultSettings()
  for key, value in CLARABEL_SETTINGS.items():
    setattr(settings, key, value)
  try:
    solver = clarabel.DefaultSolver(sp.csc_matrix((N, N)), -np.ones(N), (psd + nonneg).tocsc(), b,
                                    [clarabel.NonnegativeConeT(N), clarabel.PSDTriangleConeT(p + q)], settings)
    sol = solver.solve()
  except Exception as e:  # noqa: BLE001 - a solver failure is an outcome
    return "failed", None, None, f"clarabel_dual: {type(e).__name__}: {e}"
  status = str(sol.status)
  if "Unbounded" in status or "DualInfeasible" in status:
    return "infeasible", None, None, f"clarabel_dual: {status} (the dual is unbounded: no W meets the margins)"
  if "Solved" not in status:
    return "failed", None, None, f"clarabel_dual: {status}"
  z = np.asarray(sol.z)[N:]
  wr = -np.sqrt(2.0) * z[block]          # W = -2 Z12, Z12 = z[block] / sqrt(2)
  return "optimal", wr, np.asarray(sol.x), "" if status == "Solved" else status


# ----------------------------------------------------------------------------
# The spectral-norm SVM on the same reduced problem (Clarabel): E10's "spectral"
# ----------------------------------------------------------------------------
#
#   minimize t  s.t.  [[t I, Wr], [Wr^T, t I]] >= 0 (size rl + rr),  Ar vec(Wr) >= 1
#
# ``reduce`` holds for the spectral norm too (P_L W P_R keeps the margins and has no larger
# norm), so the PSD block has rl + rr rows instead of cvxpy's 2d, and cvxpy's per-solve
# canonicalization is skipped.

def solve_spectral(A: np.ndarray, d: int):
  """min ||W||_2 s.t. A vec(W) >= 1 by Clarabel on the reduced problem. Returns (status, w
  (d*d,) or None, the margin constraints' multipliers (N,) or None, message)."""
  return _reduced(A, d, "clarabel_reduced", lambda p, q: _solve_spectral_reduced)


def _solve_spectral_reduced(Ar: np.ndarray, p: int, q: int):
  import clarabel
  import scipy.sparse as sp
  N = Ar.shape[0]
  block, eye, size = _structure_dual(p, q)
  n_var = 1 + p * q                                   # x = (t, vec(Wr)) row-major
  # margins: -Ar wr + s = -1, s >= 0
  margins = sp.hstack([sp.csc_matrix((N, 1)), sp.csc_matrix(-Ar)])
  # PSD: s = -A2 x = svec([[t I, Wr], [Wr^T, t I]]): t on the diagonal, sqrt(2) Wr in the block
  diag = np.flatnonzero(eye)
  rows = np.concatenate([diag, block])
  cols = np.concatenate([np.zeros(len(diag), int), 1 + np.arange(p * q)])
  vals = np.concatenate([-np.ones(len(diag)), -np.sqrt(2.0) * np.ones(p * q)])
  psd = sp.csc_matrix((vals, (rows, cols)), shape=(size, n_var))
  q_vec = np.zeros(n_var)
  q_vec[0] = 1.0
  settings = clarabel.DefaultSettings()
  for key, value in CLARABEL_SETTINGS.items():
    setattr(settings, key, value)
  try:
    solver = clarabel.DefaultSolver(sp.csc_matrix((n_var, n_var)), q_vec, sp.vstack([margins, psd]).tocsc(),
                                    np.concatenate([-np.ones(N), np.zeros(size)]),
                                    [clarabel.NonnegativeConeT(N), clarabel.PSDTriangleConeT(p + q)], settings)
    sol = solver.solve()
  except Exception as e:  # noqa: BLE001 - a solver failure is an outcome
    return "failed", None, None, f"clarabel_reduced: {type(e).__name__}: {e}"
  status = str(sol.status)
  if "PrimalInfeasible" in status:
    return "infeasible", None, None, f"clarabel_reduced: {status}"
  if "Solved" not in status:
    return "failed", None, None, f"clarabel_reduced: {status}"
  x = np.asarray(sol.x)
  return "optimal", x[1:], np.asarray(sol.z)[:N], "" if status == "Solved" else status


# ----------------------------------------------------------------------------
# The structured interior point (svmattn.svm.nuclear_ipm), many problems at once
# ----------------------------------------------------------------------------

def solve_ipm_many(problems) -> list:
  """min ||W||_* s.t. A vec(W) >= 1 for every (A, d) of ``problems`` by the interior point of
  ``nuclear_ipm`` on the reduced problems, those of one reduced shape in one stack; a problem with
  more than ``nuclear_ipm.MAX_CONSTRAINTS`` constraints, or one it does not finish (rows not rank
  one, not converged), is solved by ``solve_auto``. Each result is
  the same bits whatever else is in ``problems``. Returns [(status, w or None, dual or None, msg)]."""
  out, groups, reduced = [None] * len(problems), {}, {}
  for i, (A, d) in enumerate(problems):
    if A.shape[0] == 0:
      out[i] = ("optimal", np.zeros(d * d), np.zeros(0), "no constraints")
      continue
    try:
      QL, QR, Ar = reduce(A, d)
    except np.linalg.LinAlgError as e:    # an SVD that did not converge: an outcome
      out[i] = ("failed", None, None, f"nuc_ipm: LinAlgError: {e}")
      continue
    rl, rr = QL.shape[1], QR.shape[1]
    if rl == 0 or rr == 0:
      out[i] = ("infeasible", None, None, "nuc_ipm: every constraint row is zero")
      continue
    reduced[i] = (QL, QR, Ar)
    if Ar.shape[0] > nuclear_ipm.MAX_CONSTRAINTS:   # its N x N Newton system would cost more than SCS
      out[i] = _lift(_auto_pick(rl, rr)(Ar, rl, rr), QL, QR, f"nuc_ipm: {Ar.shape[0]} constraints, solved by nuc_auto")
      continue
    groups.setdefault((Ar.shape[0], rl, rr), []).append(i)
  for (_, rl, rr), members in groups.items():
    results = nuclear_ipm.solve_batch(np.stack([reduced[i][2] for i in members]), rl, rr)
    for i, r in zip(members, results):
      QL, QR, Ar = reduced[i]
      if r is None:           # nuc_auto on the same reduced problem (solve_auto would reduce it again)
        out[i] = _lift(_auto_pick(rl, rr)(Ar, rl, rr), QL, QR, "nuc_ipm fell back to nuc_auto")
      else:
        out[i] = _lift(r, QL, QR, "")
  return out


def _lift(result, QL, QR, note: str):
  """A reduced solve's (status, wr, dual, msg) with W = QL Wr QR^T, its message after ``note``."""
  status, wr, dual, msg = result
  msg = f"{note}: {msg}".rstrip(": ") if note else msg
  if wr is None:
    return status, None, dual, msg
  return status, (QL @ wr.reshape(QL.shape[1], QR.shape[1]) @ QR.T).reshape(-1), dual, msg


def solve_ipm(A: np.ndarray, d: int):
  """``solve_ipm_many`` for one problem."""
  return solve_ipm_many([(A, d)])[0]
