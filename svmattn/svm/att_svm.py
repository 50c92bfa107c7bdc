"""Attention SVMs (host side: NumPy, SciPy, cvxpy; never traces JAX).

Att-SVM(alpha) for one data set, X (n,T,d), Z (n,d), alpha (n,):

    minimize ||W||   subject to   (x_{i,alpha_i} - x_it)^T W z_i >= 1,  all i, t != alpha_i,

with ||.|| the Frobenius norm ("fro") or the nuclear norm ("nuc"), or any norm of
``svmattn.svm.norms`` ("l2" = "fro", "spectral", "l1", "linf", "l<p>" for real p > 1;
solved through cvxpy, CLARABEL by default).  Writing
w = vec(W) (row-major), the constraints are one matrix inequality A w >= 1 whose
rows are vec((x_{i,alpha_i} - x_it) z_i^T) (``margin_matrix``).

Solvers
  fro, "nnls"   (default) Lawson & Hanson's reduction of the least-distance
                program to nonnegative least squares: exact up to rounding, and
                it returns the dual multipliers (w = A^T lambda, lambda >= 0).
  nuc, "nuc_ipm" (default)  the engine's interior point for rank-one constraint rows on the
                reduced problem (``svmattn.svm.nuclear_ipm``; a batch's problems of one shape
                stacked by att_svm_many, each the same bits as alone); nuc_auto where it does
                not finish.
  nuc, "scs_direct"  SCS called directly on the problem restricted to the
                spans the constraints see (``svmattn.svm.nuclear``); a fresh solver per
                data set, so a solution depends on its data set alone (bit for bit).
  nuc, "clarabel_dual"  the dual (max 1^T lam, ||sum lam_j A_j||_2 <= 1, N variables) by
                Clarabel's interior-point method on the same reduced problem; W from the
                dual variable of its PSD cone. Agrees with SCS to ~1e-9 in the objective;
                faster than scs_direct when the reduced PSD block is small (rl + rr <= ~10),
                slower above (``python -m experiments.benchmark --suite=svm`` measures both).
  nuc, "nuc_auto"  clarabel_dual where the reduced block has at most 12 rows, else scs_direct.
  fro / nuc, "SCS" (eps 1e-9) or "CLARABEL" (interior point, slower here; the
                independent check)   cvxpy; one DPP problem per
                (number of constraints, d) shape and thread, re-solved with new data,
                cold-started (warm_start=False), so a result depends on its data set only.
  spectral, l1, linf, l<p>: ``svmattn.svm.norms`` (cvxpy; "CLARABEL" default, "SCS" the check).
  Every solution is rescaled so that its smallest margin is exactly 1.

The outcome is an ``SVMResult`` with a status "optimal", "infeasible" or "failed":
a solver failure is recorded, never raised.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import threading
from typing import Callable, Sequence

import numpy as np

import svmattn
from svmattn.svm import norms as norms_lib
from svmattn.svm import nuclear as svm_nuclear

STATUSES = ("optimal", "infeasible", "failed")
NORMS = ("fro", "nuc")  # the two norms the studies iterate over (E2); att_svm accepts more:
ALL_NORMS = norms_lib.EXAMPLES  # examples of every form att_svm accepts (see norms_lib.parse_norm)
parse_norm = norms_lib.parse_norm
DEFAULT_SOLVER = {"fro": "nnls", "nuc": "nuc_ipm"}
# Tolerance on (margin - 1) under which a constraint counts as active (support).
SUPPORT_TOL = {"nnls": 1e-8, "CLARABEL": 1e-5, "SCS": 1e-5, "scs_direct": 1e-5, "clarabel_dual": 1e-5, "nuc_auto": 1e-5,
               "nuc_ipm": 1e-5,
               "clarabel_reduced": 1e-5}
NUCLEAR_DIRECT = ("scs_direct", "clarabel_dual", "nuc_auto", "nuc_ipm")   # nuclear-norm solvers without cvxpy


@dataclasses.dataclass
class SVMResult:
  """Solution of one attention SVM.

  W:        (d, d) solution, None unless status == "optimal"
  status:   "optimal" | "infeasible" | "failed"
  support:  (n, T) bool, the active constraints (support tokens); all False unless optimal
  margins:  (n, T) (x_{i,alpha_i} - x_it)^T W z_i, NaN at t = alpha_i (None unless optimal)
  dual:     (n, T) constraint multipliers (0 at t = alpha_i), None if the solver gave none;
            fro: W = sum_it dual_it (x_{i,alpha_i} - x_it) z_i^T (the multipliers of 1/2 ||W||^2);
            nuc and the norms of svmattn.svm.norms: the multipliers of ||W||, summing to the
            objective, with ||sum_it dual_it (x_{i,alpha_i} - x_it) z_i^T||_dual <= 1
  objective: ||W|| in the problem's norm (NaN unless optimal)
  norm:     the canonical norm name (norms_lib.parse_norm(name).name: "fro", "l2", "l1.75", ...)
  """
  status: str
  W: np.ndarray | None
  support: np.ndarray
  margins: np.ndarray | None
  dual: np.ndarray | None
  objective: float
  norm: str
  solver: str
  message: str = ""

  @property
  def ok(self) -> bool:
    return self.status == "optimal"


# ----------------------------------------------------------------------------
# Constraint matrices
# ----------------------------------------------------------------------------

def _check_inputs(X, Z, alpha):
  X = np.asarray(X, dtype=np.float64)
  Z = np.asarray(Z, dtype=np.float64)
  alpha = np.asarray(alpha)
  if X.ndim != 3:
    raise ValueError(f"att_svm: X must have shape (n, T, d), got {X.shape}")
  n, T, d = X.shape
  if Z.shape != (n, d):
    raise ValueError(f"att_svm: Z must have shape (n, d) = {(n, d)}, got {Z.shape}")
  if alpha.shape != (n,):
    raise ValueError(f"att_svm: alpha must have shape (n,) = {(n,)}, got {alpha.shape}")
  if alpha.dtype.kind not in "iu" and not np.all(alpha == np.round(alpha)):
    raise ValueError(f"att_svm: alpha must hold integer token indices, got {alpha}")
  alpha = alpha.astype(np.int64)
  if np.any(alpha < 0) or np.any(alpha >= T):
    raise ValueError(f"att_svm: alpha entries must be in [0, T={T}), got {alpha.tolist()}")
  if not (np.all(np.isfinite(X)) and np.all(np.isfinite(Z))):
    raise ValueError("att_svm: X and Z must be finite (found NaN or inf)")
  return X, Z, alpha


def margin_matrix(X: np.ndarray, Z: np.ndarray, alpha: np.ndarray,
                  mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Rows vec((x_{i,alpha_i} - x_it) z_i^T) of the constraints A w >= 1.

  mask: optional (n, T) bool of the tokens t that get a constraint (default: all
  t != alpha_i; alpha_i itself is always excluded).
  Returns (A (N, d*d), keep (n, T) bool) with rows in the order of keep's True entries.
  """
  n, T, d = X.shape
  diff = X[np.arange(n), alpha][:, None, :] - X              # (n, T, d)
  keep = np.ones((n, T), bool) if mask is None else np.asarray(mask, bool).copy()
  keep[np.arange(n), alpha] = False
  rows = np.einsum("ntd,ne->ntde", diff, Z)[keep]            # (N, d, d)
  return rows.reshape(rows.shape[0], d * d), keep


# ----------------------------------------------------------------------------
# Solvers of  min ||W|| s.t. A vec(W) >= 1
# ----------------------------------------------------------------------------

def least_distance(A: np.ndarray, b: np.ndarray | None = None):
  """min ||w||_2 s.t. A w >= b (b >= 0; default all ones) by Lawson & Hanson's reduction to
  NNLS: with E = [A^T; b^T], f = e_last, u = argmin_{u >= 0} ||E u - f|| and r = E u - f, the
  constraints cannot all hold when r = 0, else w = -r[:-1] / r[-1] = A^T lambda with the
  multipliers lambda = u / -r[-1]. Returns (status, w, lambda, message); exact up to rounding."""
  N, D = A.shape
  if N == 0 or (b is not None and not np.any(np.asarray(b) > 0)):
    return "optimal", np.zeros(D), np.zeros(N), "no constraints"
  E = np.vstack([A.T, np.ones((1, N)) if b is None else np.asarray(b, np.float64)[None, :]])
  f = np.zeros(D + 1)
  f[-1] = 1.0
  import scipy.optimize        # (here: 0.5 s that a binary spends beside its compiling, run_experiment.import_in_background)
  try:
    u, _ = scipy.optimize.nnls(E, f, maxiter=50 * (N + D + 1))
  except Exception as e:  # noqa: BLE001 - a solver failure is an outcome
    return "failed", None, None, f"nnls: {type(e).__name__}: {e}"
  r = E @ u - f
  if not np.all(np.isfinite(r)):
    return "failed", None, None, "nnls returned non-finite values"
  if np.linalg.norm(r) <= 1e-10 or -r[-1] <= 1e-12:
    return "infeasible", None, None, f"nnls residual {np.linalg.norm(r):.2e}: constraints cannot all hold"
  scale = -r[-1]
  return "optimal", r[:-1] / scale, u / scale, ""  # w = -r[:-1] / r[-1] = A^T lambda


def _solve_nnls(A: np.ndarray, d: int):
  """Frobenius SVM by NNLS (``least_distance`` with b = 1). Returns (status, w, dual, message)."""
  del d
  return least_distance(A)


@functools.lru_cache(maxsize=64)
def _cvxpy_problem(N: int, d: int, norm: str, thread: int | None = None):
  """One DPP problem per shape (and thread: a problem holds its parameter values and solver
  state, so the threads of att_svm_many each get their own): the parameter is the constraint matrix A."""
  import cvxpy as cp
  A = cp.Parameter((N, d * d), name="A")
  W = cp.Variable((d, d), name="W")
  objective = cp.normNuc(W) if norm == "nuc" else cp.sum_squares(W)
  constraint = A @ cp.vec(W, order="C") >= 1
  return cp.Problem(cp.Minimize(objective), [constraint]), A, W, constraint


def _solve_cvxpy(A: np.ndarray, d: int, norm: str, solver: str):
  N = A.shape[0]
  if N == 0:
    return "optimal", np.zeros(d * d), np.zeros(0), "no constraints"
  prob, A_par, W, constraint = _cvxpy_problem(N, d, norm, threading.get_ident())
  # cold starts: a solution depends on its own data set only, not on what this process solved before
  # (for CLARABEL cvxpy would otherwise update the previous solver object in place)
  kwargs = {"eps": 1e-9, "max_iters": 200_000, "warm_start": False} if solver == "SCS" else {"warm_start": False}
  status, w, dual, msg = norms_lib.solve_problem(prob, A_par, W, constraint, A, solver, kwargs)
  if dual is not None and norm == "fro":
    dual = dual / 2  # cvxpy minimizes ||W||^2, not ||W||^2 / 2: report lambda with W = A^T lambda
  return status, w, dual, msg


def _solve_nuclear_direct(A: np.ndarray, d: int, solver: str):
  """The nuclear SVM without cvxpy: "scs_direct" (the primal SDP by SCS), "clarabel_dual"
  (the dual by Clarabel's interior-point method) or "nuc_auto" (the faster of the two for the
  problem's size); see svmattn.svm.nuclear. The solution is
  rescaled so that its smallest margin is exactly 1."""
  if A.shape[0] == 0:
    return "optimal", np.zeros(d * d), np.zeros(0), "no constraints"
  solve = {"scs_direct": svm_nuclear.solve, "clarabel_dual": svm_nuclear.solve_dual, "nuc_auto": svm_nuclear.solve_auto,
           "nuc_ipm": svm_nuclear.solve_ipm}
  return svm_nuclear.unit_margin(solve[solver](A, d), A, solver)


def solve_margin_program(A: np.ndarray, d: int, norm: str = "fro", solver: str | None = None):
  """min ||W|| s.t. A vec(W) >= 1. Returns (status, W (d,d) or None, dual (N,) or None, message).
  norm: any name of norms_lib.parse_norm ("l2" is solved as "fro")."""
  nm = norms_lib.parse_norm(norm)
  norm = nm.kind if nm.kind in NORMS else nm.name
  solver = solver or default_solver(norm)
  if nm.kind not in NORMS:
    if solver in ("nnls",) + NUCLEAR_DIRECT:
      raise ValueError(f"the {solver} solver does not solve the {nm.name!r} SVM; use CLARABEL or SCS")
    status, w, dual, msg = norms_lib.solve(A, d, nm, solver)
  elif solver == "nnls":
    if norm != "fro":
      raise ValueError("the nnls solver solves the Frobenius SVM only; use CLARABEL or SCS for 'nuc'")
    status, w, dual, msg = _solve_nnls(A, d)
  elif solver in NUCLEAR_DIRECT:
    if norm != "nuc":
      raise ValueError(f"the {solver} solver solves the nuclear SVM only; use nnls for 'fro'")
    status, w, dual, msg = _solve_nuclear_direct(A, d, solver)
  else:
    status, w, dual, msg = _solve_cvxpy(A, d, norm, solver.upper())
  return _checked(status, w, dual, msg, A, d, solver)


def _checked(status, w, dual, msg, A, d, solver):
  """A solver's (status, w, dual, message) with W as (d, d); "failed" where the margins fall short of 1."""
  if status == "optimal":
    margins = A @ w
    if A.shape[0] and np.min(margins) < 1 - 1e-6:
      return "failed", None, None, f"{solver}: constraints violated by {1 - np.min(margins):.2e}"
  return status, (None if w is None else w.reshape(d, d)), dual, msg


def default_solver(norm) -> str:
  """The solver att_svm uses for a norm: nnls (fro, l2), nuc_ipm (nuc), else CLARABEL."""
  kind = norms_lib.parse_norm(norm).kind
  return DEFAULT_SOLVER.get(kind, norms_lib.DEFAULT_SOLVER)


def _result(status, W, dual, msg, A, keep, norm, solver, support_tol, kept_margins=None):
  """The SVMResult of a solver's outcome; ``kept_margins``: A @ vec(W) where the caller has it."""
  n, T = keep.shape
  support = np.zeros((n, T), bool)
  if status != "optimal":
    return SVMResult(status, None, support, None, None, float("nan"), norm, solver, msg)
  margins = np.full((n, T), np.nan)
  margins[keep] = A @ W.reshape(-1) if kept_margins is None else kept_margins
  support[keep] = margins[keep] - 1 <= support_tol
  full_dual = None
  if dual is not None:
    full_dual = np.zeros((n, T))
    full_dual[keep] = dual
  objective = norms_lib.norm_value(W, norm)
  return SVMResult(status, W, support, margins, full_dual, objective, norm, solver, msg)


def att_svm(X, Z, alpha, norm: str = "fro", solver: str | None = None,
            mask: np.ndarray | None = None, support_tol: float | None = None) -> SVMResult:
  """Att-SVM(alpha) of one data set: X (n,T,d), Z (n,d), alpha (n,) token indices.

  norm: "fro" (Frobenius, W-parameterization) or "nuc" (nuclear, (K,Q)), or "l2" (= fro),
    "spectral", "l1", "linf", "l<p>" for a real p > 1 (entrywise norms of vec(W); see
    svmattn.svm.norms). ValueError for anything else.
  solver: "nnls" (fro only, default for fro), "nuc_ipm" (nuc only, default for nuc), "scs_direct",
    "clarabel_dual" or "nuc_auto" (nuc only),
    or through cvxpy "SCS" or "CLARABEL" (any norm; CLARABEL is the default for the others).
  mask: optional (n,T) bool, the tokens that get a constraint (causal masks).
  support_tol: a constraint is active when margin - 1 <= support_tol
    (default 1e-8 for nnls, 1e-5 for the conic solvers).
  Returns an SVMResult (.W, .status, .support, .margins, .dual, .objective).
  """
  X, Z, alpha = _check_inputs(X, Z, alpha)
  nm = norms_lib.parse_norm(norm)
  solver = solver or default_solver(nm)
  A, keep = margin_matrix(X, Z, alpha, mask)
  tol = SUPPORT_TOL.get(solver if solver in SUPPORT_TOL else solver.upper(), 1e-5) if support_tol is None else support_tol
  try:
    status, W, dual, msg = solve_margin_program(A, X.shape[-1], nm, solver)
    return _result(status, W, dual, msg, A, keep, nm.name, solver, tol)
  except (np.linalg.LinAlgError, ArithmeticError) as e:   # an SVD or a solve that did not converge: an outcome
    return _result("failed", None, None, f"{solver}: {type(e).__name__}: {e}", A, keep, nm.name, solver, tol)


# Threads for batches of solves. The solvers (SCS, SciPy's NNLS) release the GIL, so threads
# run solves in parallel; each solve is independent and deterministic, so the results do not
# depend on the number of threads. The sweep's worker processes set it to 1.
THREADS = svmattn.usable_cores()


def at_selections(X, Z, selections, norms) -> dict:
  """Att-SVM of every data set b of X (B,n,T,d), Z (B,n,d) at each of the token selections
  ``selections`` ((B,n) arrays, e.g. every training stage's ``selected``) in every norm of
  ``norms``, each distinct (b, selection, norm) solved once (``att_svm_many``):
  {(b, selection.tobytes() as int64, norm): SVMResult}; look one up with ``selection_key``."""
  keys = {}
  for sel in selections:
    for b in range(len(X)):
      for norm in norms:
        keys.setdefault(selection_key(b, sel[b], norm), None)
  jobs = [(X[b], Z[b], np.frombuffer(sel, np.int64), norm) for b, sel, norm in keys]
  return dict(zip(keys, att_svm_many(jobs)))


def selection_key(b: int, selection, norm: str) -> tuple:
  """The key of ``at_selections``'s result for data set b at ``selection`` (n,) in ``norm``."""
  return (b, np.asarray(selection, np.int64).tobytes(), norm)


def att_svm_many(jobs: Sequence[tuple], threads: int | None = None,
                 progress: Callable[[int], None] | None = None) -> list[SVMResult]:
  """``att_svm(*job)`` for every job, in order, on ``threads`` threads (default THREADS)."""
  threads = THREADS if threads is None else threads
  # The calling thread solves the NNLS jobs (~0.1 ms each) and a share of the nuc_ipm ones (stacked by
  # shape: _nuc_ipm_many; the pool's threads take the other shares, whose stacks of NumPy linear
  # algebra release the GIL), or every job with one thread; the pool runs the other conic ones meanwhile.
  solver = lambda job: (job[4] if len(job) > 4 else None) or default_solver(job[3] if len(job) > 3 else "fro")  # noqa: E731
  stacked = [i for i, job in enumerate(jobs) if solver(job) == "nuc_ipm"
             and norms_lib.parse_norm(job[3] if len(job) > 3 else "fro").kind == "nuc"]
  here = [threads <= 1 or solver(job) == "nnls" for job in jobs]
  for i in stacked:
    here[i] = None
  out = [None] * len(jobs)
  ways = max(threads, 1) if len(stacked) >= 2 * threads else 1     # (each share then holds 2 or more)
  shares = [stacked[k::ways] for k in range(ways)]
  with concurrent.futures.ThreadPoolExecutor(max(threads, 1)) as pool:
    futures = {pool.submit(att_svm, *job): i for i, job in enumerate(jobs) if here[i] is False}
    others = [(share, pool.submit(_nuc_ipm_many, [jobs[i] for i in share])) for share in shares[1:]]

    def take(share, results):
      for i, result in zip(share, results):
        out[i] = result
        if progress is not None:
          progress(1)
    if shares[0]:
      take(shares[0], _nuc_ipm_many([jobs[i] for i in shares[0]]))
    fro = {}                         # Frobenius NNLS jobs by shape: _fro_nnls_stack
    for i, job in enumerate(jobs):
      if here[i] is True and _fro_stackable(job):
        fro.setdefault((np.shape(job[0]), np.shape(job[1]), np.shape(job[2])), []).append(i)
    for group in fro.values():
      n, T, d = np.shape(jobs[group[0]][0])
      per = max(1, min(256, (1 << 25) // max(1, 8 * n * T * d * d)))   # (at most 32 MiB of constraint rows at once)
      for at in range(0, len(group), per):
        share = group[at:at + per]
        for i, result in zip(share, _fro_nnls_stack([jobs[i] for i in share])):
          out[i] = result
          if progress is not None:
            progress(1)
    for i, job in enumerate(jobs):
      if here[i] is True and out[i] is None:
        out[i] = att_svm(*job)
        if progress is not None:
          progress(1)
    for share, future in others:
      take(share, future.result())
    for future in concurrent.futures.as_completed(futures):
      out[futures[future]] = future.result()
      if progress is not None:
        progress(1)
  return out


def _fro_stackable(job: tuple) -> bool:
  """Is ``att_svm(*job)`` a Frobenius NNLS solve of tokens X (n, T, d) on every token with the default
  support tolerance (what ``_fro_nnls_stack`` computes)? (Any other X gets ``att_svm``'s own error.)"""
  return (np.ndim(job[0]) == 3 and (job[3] if len(job) > 3 else "fro") == "fro"
          and (job[4] if len(job) > 4 else None) in (None, "nnls") and all(x is None for x in job[5:7]))


def _fro_nnls_stack(jobs: Sequence[tuple]) -> list[SVMResult]:
  """``att_svm(*job)`` for Frobenius NNLS jobs (``_fro_stackable``), each result the one ``att_svm``
  gives the job alone, bit for bit. Jobs of one shape are checked and get their constraint rows at
  once (element-wise operations: the same values as one job's), then one NNLS each; the margins of
  a solution are computed once (``att_svm`` computed A w twice: to check it and for the result).
  Anything not of one shape, or failing a check, goes through ``att_svm`` itself (its errors)."""
  try:
    X = np.stack([np.asarray(job[0], np.float64) for job in jobs])
    Z = np.stack([np.asarray(job[1], np.float64) for job in jobs])
    alpha = np.stack([np.asarray(job[2]) for job in jobs])
  except ValueError:                   # shapes differ
    return [att_svm(*job) for job in jobs]
  if (X.ndim != 4 or Z.shape != (len(X),) + X.shape[1:2] + X.shape[3:] or alpha.shape != X.shape[:2]
      or alpha.dtype.kind not in "iu" or np.any(alpha < 0) or np.any(alpha >= X.shape[2])
      or not (np.all(np.isfinite(X)) and np.all(np.isfinite(Z)))):
    return [att_svm(*job) for job in jobs]
  B, n, T, d = X.shape
  alpha = alpha.astype(np.int64)
  sets, seqs = np.arange(B)[:, None], np.arange(n)[None, :]
  diff = X[sets, seqs, alpha][:, :, None, :] - X                          # (B, n, T, d), as margin_matrix
  keep = np.ones((B, n, T), bool)
  keep[sets, seqs, alpha] = False
  rows = np.einsum("bntd,bne->bntde", diff, Z)                             # (B, n, T, d, d)
  tol = SUPPORT_TOL["nnls"]
  out = []
  for b in range(B):
    A = rows[b][keep[b]].reshape(-1, d * d)
    try:
      status, w, dual, msg = least_distance(A)
      margins = None
      if status == "optimal":                                             # _checked
        margins = A @ w
        if A.shape[0] and np.min(margins) < 1 - 1e-6:
          status, w, dual, msg = "failed", None, None, f"nnls: constraints violated by {1 - np.min(margins):.2e}"
      out.append(_result(status, None if w is None else w.reshape(d, d), dual, msg, A, keep[b], "fro", "nnls", tol,
                         margins))
    except (np.linalg.LinAlgError, ArithmeticError) as e:
      out.append(_result("failed", None, None, f"nnls: {type(e).__name__}: {e}", A, keep[b], "fro", "nnls", tol))
  return out


def _nuc_ipm_many(jobs: Sequence[tuple]) -> list[SVMResult]:
  """``att_svm(*job)`` for nuclear-norm jobs of the nuc_ipm solver, their problems stacked by shape
  (``nuclear.solve_ipm_many``): each result is the one ``att_svm`` gives the job alone, bit for bit."""
  prepared = []
  for job in jobs:
    X, Z, alpha = _check_inputs(*job[:3])
    mask = job[5] if len(job) > 5 else None
    tol = SUPPORT_TOL["nuc_ipm"] if len(job) < 7 or job[6] is None else job[6]
    A, keep = margin_matrix(X, Z, alpha, mask)
    prepared.append((A, keep, X.shape[-1], tol))
  solved = svm_nuclear.solve_ipm_many([(A, d) for A, _, d, _ in prepared])
  out = []
  for (A, keep, d, tol), result in zip(prepared, solved):
    status, W, dual, msg = _checked(*svm_nuclear.unit_margin(result, A, "nuc_ipm"), A, d, "nuc_ipm")
    out.append(_result(status, W, dual, msg, A, keep, "nuc", "nuc_ipm", tol))
  return out


def att_svm_batch(X, Z, alpha, norm: str = "fro", solver: str | None = None,
                  progress: Callable[[int], None] | None = None, threads: int | None = None) -> list[SVMResult]:
  """``att_svm`` for each of B data sets: X (B,n,T,d), Z (B,n,d), alpha (B,n) (see att_svm_many)."""
  return att_svm_many([(X[b], Z[b], alpha[b], norm, solver) for b in range(len(X))], threads, progress)


def stack(results: Sequence[SVMResult], d: int) -> dict[str, np.ndarray]:
  """Arrays of a list of results: W (B,d,d) (NaN where not optimal), status (B,) str,
  support (B,n,T), objective (B,)."""
  W = np.full((len(results), d, d), np.nan)
  for b, r in enumerate(results):
    if r.ok:
      W[b] = r.W
  return {"W": W,
          "status": np.array([r.status for r in results]),
          "support": np.stack([r.support for r in results]) if results else np.zeros((0,), bool),
          "objective": np.array([r.objective for r in results])}
