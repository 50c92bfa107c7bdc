"""The general SVM equivalence for nonlinear heads (Gen-SVM, docs/science.md section 6).

Host side (NumPy, SciPy); never traces JAX. One data set X (n,T,d), Z (n,d), the
final softmax s (n,T) of a trained model and its final W_GD (d,d):

  selected sets   O_i = {t : s_it >= tau_H}            (tau_L = 1e-6, tau_H = 1e-3)
  discarded when  some s_it lies in (tau_L, tau_H]  ("intermediate"), or
                  no s_it <= tau_L at all            ("finite": W has a finite limit)
  W^fin   = argmin ||W||_F  s.t. (x_it - x_iu)^T W z_i = log(s_it / s_iu),  t, u in O_i
  W^mm    = argmin ||W||_F  s.t. (x_it - x_iu)^T W z_i >= 1,  t in O_i, u not in O_i,
                                 (x_it - x_iu)^T W z_i  = 0,  t, u in O_i
  W^SVMeq = W^fin + C W^mm,  C = argmin_C ||W^fin + C W^mm - W_GD||_F
          = <W_GD - W^fin, W^mm> / ||W^mm||_F^2
  W^1token = Att-SVM(alpha_hat), alpha_hat_i = argmax_t s_it   (svm.att_svm, Frobenius)

Reduction. With the reference token alpha_i = argmax_t s_it (always in O_i), every
pair constraint is a difference of constraints against alpha_i, so the systems are
  equalities   E w = b:  rows vec((x_{i,alpha_i} - x_it) z_i^T), b = log(s_{i,alpha_i}/s_it), t in O_i \ {alpha_i}
  margins      A w >= 1:  rows vec((x_{i,alpha_i} - x_iu) z_i^T), u not in O_i
(w = vec(W) row-major; ``svm.margin_matrix`` with a mask). W^fin is the least-norm
solution of E w = b (``numpy.linalg.lstsq``), "infeasible" when the system is
inconsistent. For W^mm the equalities E w = 0 are eliminated through an orthonormal
basis N of null(E): w = N u, ||w|| = ||u||, and min ||u|| s.t. (A N) u >= 1 is the
least-distance program that Lawson and Hanson's NNLS reduction solves exactly
(``svm._solve_nnls``). KKT: u = (A N)^T lam, lam >= 0, so w = N N^T A^T lam, i.e.
w - A^T lam lies in range(E^T); lam is returned as ``dual_mm``.

A run that cannot be used is an outcome with a reason, never an exception:
status "discarded" (the thresholds rule), "infeasible" or "failed" (a solve).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from svmattn.svm import att_svm as svm_lib

TAU_L = 1e-6
TAU_H = 1e-3
STATUSES = ("optimal", "discarded", "infeasible", "failed")
# Relative tolerances: consistency of E w = b, and rank of E (singular values).
CONSISTENCY_RTOL = 1e-8
RANK_RTOL = 1e-10


@dataclasses.dataclass
class GenSVMResult:
  """Gen-SVM objects of one data set (None where not computed).

  status:    "optimal" | "discarded" | "infeasible" | "failed"
  reason:    '' when optimal; else why (the discard rule, or which solve failed)
  selected:  (n,T) bool, the selected sets O_i
  alpha:     (n,) argmax_t s_it (the reference token, and W^1token's selection)
  W_fin, W_mm, W_svmeq, W_1token: (d,d)
  C:         the least-squares coefficient of W^mm in W^SVMeq
  dual_mm:   (n,T) multipliers of W^mm's margin constraints (0 on O_i)
  fin_residual:  max |(x_it - x_iu)^T W^fin z_i - log(s_it/s_iu)| over t,u in O_i
  mm_min_margin: min (x_it - x_iu)^T W^mm z_i over t in O_i, u not in O_i
  mm_eq_residual: max |(x_it - x_iu)^T W^mm z_i| over t,u in O_i
  max_masked: max_{i, t not in O_i} s_it (NaN when nothing is masked)
  statuses:  {"fin": ..., "mm": ..., "1token": ...}: each solve's own status
  """
  status: str
  reason: str
  selected: np.ndarray
  alpha: np.ndarray
  W_fin: np.ndarray | None = None
  W_mm: np.ndarray | None = None
  W_svmeq: np.ndarray | None = None
  W_1token: np.ndarray | None = None
  C: float = float("nan")
  dual_mm: np.ndarray | None = None
  fin_residual: float = float("nan")
  mm_min_margin: float = float("nan")
  mm_eq_residual: float = float("nan")
  max_masked: float = float("nan")
  statuses: dict = dataclasses.field(default_factory=dict)

  @property
  def ok(self) -> bool:
    return self.status == "optimal"


# ----------------------------------------------------------------------------
# Selection and the discard rule
# ----------------------------------------------------------------------------

def _check(X, Z, s):
  X = np.asarray(X, np.float64)
  Z = np.asarray(Z, np.float64)
  s = np.asarray(s, np.float64)
  if X.ndim != 3:
    raise ValueError(f"gen_svm: X must have shape (n, T, d), got {X.shape}")
  n, T, d = X.shape
  if Z.shape != (n, d):
    raise ValueError(f"gen_svm: Z must have shape (n, d) = {(n, d)}, got {Z.shape}")
  if s.shape != (n, T):
    raise ValueError(f"gen_svm: s must have shape (n, T) = {(n, T)}, got {s.shape}")
  if not (np.all(np.isfinite(X)) and np.all(np.isfinite(Z)) and np.all(np.isfinite(s))):
    raise ValueError("gen_svm: X, Z and s must be finite (found NaN or inf)")
  if np.any(s < 0) or np.any(np.abs(s.sum(-1) - 1) > 1e-6):
    raise ValueError("gen_svm: s must hold softmax rows (nonnegative, summing to 1)")
  return X, Z, s


def _check_taus(tau_L, tau_H):
  if not 0 < tau_L < tau_H < 1:
    raise ValueError(f"gen_svm: need 0 < tau_L < tau_H < 1, got tau_L={tau_L}, tau_H={tau_H}")


def selected_sets(s: np.ndarray, tau_H: float = TAU_H) -> np.ndarray:
  """O_i = {t : s_it >= tau_H}: s (..., n, T) -> bool (..., n, T)."""
  return np.asarray(s) >= tau_H


def discard_reason(s: np.ndarray, tau_L: float = TAU_L, tau_H: float = TAU_H) -> str:
  """Why a run with final softmax s (n,T) is discarded, or '' when it is kept.

  "intermediate: ..." when some s_it lies in (tau_L, tau_H] (the selection is not
  settled); "finite: ..." when no s_it <= tau_L (no token is masked: W has a
  finite limit and no max-margin direction)."""
  _check_taus(tau_L, tau_H)
  s = np.asarray(s, np.float64)
  middle = (s > tau_L) & (s <= tau_H)
  if np.any(middle):
    return (f"intermediate: {int(middle.sum())} probabilities in (tau_L={tau_L:g}, tau_H={tau_H:g}] "
            f"(e.g. {float(s[middle].max()):.3g})")
  if not np.any(s <= tau_L):
    return f"finite: no probability <= tau_L={tau_L:g} (min {float(s.min()):.3g})"
  return ""


def max_masked(s: np.ndarray, tau_H: float = TAU_H) -> np.ndarray:
  """max_{i, t not in O_i} s_it over the last two axes (NaN when nothing is masked)."""
  s = np.asarray(s, np.float64)
  masked = np.where(s < tau_H, s, -np.inf).max(axis=(-2, -1))
  return np.where(np.isfinite(masked), masked, np.nan)


# ----------------------------------------------------------------------------
# Constraint systems
# ----------------------------------------------------------------------------

def equality_system(X, Z, s, selected) -> tuple[np.ndarray, np.ndarray]:
  """E (M, d*d), b (M,): rows vec((x_{i,a_i} - x_it) z_i^T), b = log(s_{i,a_i}/s_it),
  t in O_i \\ {a_i}, a_i = argmax_t s_it (rows ordered by i, then t)."""
  alpha = np.argmax(s, axis=-1)
  E, keep = svm_lib.margin_matrix(X, Z, alpha, mask=selected)
  logs = np.log(np.where(selected, s, 1.0))
  b = (logs[np.arange(len(s)), alpha][:, None] - logs)[keep]
  return E, b


def margin_system(X, Z, s, selected) -> np.ndarray:
  """A (N, d*d): rows vec((x_{i,a_i} - x_iu) z_i^T), u not in O_i (the W^mm margins)."""
  alpha = np.argmax(s, axis=-1)
  A, _ = svm_lib.margin_matrix(X, Z, alpha, mask=~np.asarray(selected, bool))
  return A


def pair_values(W: np.ndarray, X: np.ndarray, Z: np.ndarray) -> np.ndarray:
  """(x_it - x_iu)^T W z_i for all pairs: (n, T, T) (entry [i, t, u])."""
  logits = np.einsum("ntd,nd->nt", X, Z @ W.T)
  return logits[:, :, None] - logits[:, None, :]


def pair_checks(W_fin, W_mm, X, Z, s, selected) -> dict[str, float]:
  """The Gen-SVM constraints in their pairwise form (the definition, not the reduction):
  fin_residual, mm_min_margin, mm_eq_residual (NaN when a set of pairs is empty)."""
  O = np.asarray(selected, bool)
  both = O[:, :, None] & O[:, None, :]                      # t, u in O_i
  cross = O[:, :, None] & ~O[:, None, :]                     # t in O_i, u not in O_i
  logs = np.log(np.where(O, s, 1.0))
  out = {"fin_residual": float("nan"), "mm_min_margin": float("nan"), "mm_eq_residual": float("nan")}
  if W_fin is not None and both.any():
    target = logs[:, :, None] - logs[:, None, :]
    out["fin_residual"] = float(np.max(np.abs(pair_values(W_fin, X, Z) - target)[both]))
  elif W_fin is not None:
    out["fin_residual"] = 0.0
  if W_mm is not None:
    P = pair_values(W_mm, X, Z)
    if cross.any():
      out["mm_min_margin"] = float(np.min(P[cross]))
    out["mm_eq_residual"] = float(np.max(np.abs(P[both]))) if both.any() else 0.0
  return out


# ----------------------------------------------------------------------------
# Solvers
# ----------------------------------------------------------------------------

def least_norm_solution(E: np.ndarray, b: np.ndarray, d: int):
  """W^fin: argmin ||w|| s.t. E w = b. Returns (status, W (d,d) or None, message)."""
  if E.shape[0] == 0:
    return "optimal", np.zeros((d, d)), "no equalities (every |O_i| = 1)"
  try:
    w, *_ = np.linalg.lstsq(E, b, rcond=None)
  except np.linalg.LinAlgError as e:
    return "failed", None, f"lstsq: {e}"
  residual = float(np.max(np.abs(E @ w - b)))
  if not np.isfinite(residual):
    return "failed", None, "lstsq returned non-finite values"
  if residual > CONSISTENCY_RTOL * max(1.0, float(np.max(np.abs(b)))):
    return "infeasible", None, f"equalities inconsistent (least-squares residual {residual:.2e})"
  return "optimal", w.reshape(d, d), ""


def null_space(E: np.ndarray, D: int) -> np.ndarray:
  """Orthonormal basis (D, D - rank) of null(E); the identity when E has no rows."""
  if E.shape[0] == 0:
    return np.eye(D)
  _, sv, Vt = np.linalg.svd(E, full_matrices=True)
  rank = int(np.sum(sv > RANK_RTOL * sv[0])) if sv.size and sv[0] > 0 else 0
  return Vt[rank:].T


def equality_margin_svm(A: np.ndarray, E: np.ndarray, d: int):
  """W^mm: argmin ||w|| s.t. A w >= 1, E w = 0 (null-space reduction + NNLS).

  Returns (status, W (d,d) or None, dual (N,) or None, message)."""
  D = d * d
  try:
    N = null_space(E, D)
  except np.linalg.LinAlgError as e:     # an SVD that did not converge: an outcome
    return "failed", None, None, f"null space (SVD): {e}"
  if A.shape[0] == 0:
    return "optimal", np.zeros((d, d)), np.zeros(0), "no margin constraints"
  status, u, dual, msg = svm_lib._solve_nnls(A @ N, N.shape[1])  # noqa: SLF001 - the shared solver
  if status != "optimal":
    return status, None, None, msg
  w = N @ u
  margins = A @ w
  if np.min(margins) < 1 - 1e-6:
    return "failed", None, None, f"nnls: margins violated by {1 - np.min(margins):.2e}"
  return "optimal", w.reshape(d, d), dual, ""


def least_squares_coefficient(W_fin: np.ndarray, W_mm: np.ndarray, W_gd: np.ndarray) -> float:
  """C = argmin_C ||W_fin + C W_mm - W_gd||_F = <W_gd - W_fin, W_mm> / ||W_mm||_F^2 (0 if W_mm = 0)."""
  den = float(np.sum(W_mm * W_mm))
  return float(np.sum((W_gd - W_fin) * W_mm) / den) if den > 0 else 0.0


def gen_svm(X, Z, s, W_gd, tau_L: float = TAU_L, tau_H: float = TAU_H,
            apply_discard: bool = True) -> GenSVMResult:
  """Gen-SVM of one data set: X (n,T,d), Z (n,d), final softmax s (n,T), final W_GD (d,d).

  apply_discard: when True (default), a run the thresholds rule discards gets
  status "discarded" and its reason, and nothing is solved.
  Returns a GenSVMResult (W_fin, W_mm, W_svmeq, W_1token, C, duals, residuals).
  """
  X, Z, s = _check(X, Z, s)
  _check_taus(tau_L, tau_H)
  n, T, d = X.shape
  W_gd = np.asarray(W_gd, np.float64)
  if W_gd.shape != (d, d):
    raise ValueError(f"gen_svm: W_gd must have shape (d, d) = {(d, d)}, got {W_gd.shape}")
  O = selected_sets(s, tau_H)
  alpha = np.argmax(s, axis=-1)
  result = GenSVMResult("optimal", "", O, alpha, max_masked=float(max_masked(s, tau_H)))
  reason = discard_reason(s, tau_L, tau_H) if apply_discard else ""
  if reason:
    result.status, result.reason = "discarded", reason
    return result
  return _solve(X, Z, s, W_gd, result)


def gen_svm_many(X, Z, s, W_gd, tau_L: float = TAU_L, tau_H: float = TAU_H) -> list[GenSVMResult]:
  """``gen_svm`` of every data set of a batch: X (B,n,T,d), Z (B,n,d), s (B,n,T), W_gd (B,d,d).

  The checks, the selected sets and the discard rule run on the whole batch at once (the same
  values: maxima, minima and counts), and only the runs that are kept are solved one by one, so
  every result is the one ``gen_svm`` gives its data set. ValueError as ``gen_svm``'s."""
  _check_taus(tau_L, tau_H)
  X, Z, s, W_gd = (np.asarray(a, np.float64) for a in (X, Z, s, W_gd))
  if X.ndim != 4:
    raise ValueError(f"gen_svm: X must have shape (B, n, T, d), got {X.shape}")
  B, n, T, d = X.shape
  for name, a, shape in (("Z", Z, (B, n, d)), ("s", s, (B, n, T)), ("W_gd", W_gd, (B, d, d))):
    if a.shape != shape:
      raise ValueError(f"gen_svm: {name} must have shape {shape}, got {a.shape}")
  if not (np.all(np.isfinite(X)) and np.all(np.isfinite(Z)) and np.all(np.isfinite(s))):
    raise ValueError("gen_svm: X, Z and s must be finite (found NaN or inf)")
  if np.any(s < 0) or np.any(np.abs(s.sum(-1) - 1) > 1e-6):
    raise ValueError("gen_svm: s must hold softmax rows (nonnegative, summing to 1)")
  O = selected_sets(s, tau_H)
  alpha = np.argmax(s, axis=-1)
  masked = max_masked(s, tau_H)
  middle = (s > tau_L) & (s <= tau_H)
  count = middle.sum(axis=(1, 2))
  top_middle = np.where(middle, s, -np.inf).max(axis=(1, 2))
  low = np.any(s <= tau_L, axis=(1, 2))
  smallest = s.min(axis=(1, 2))
  out = []
  for b in range(B):
    result = GenSVMResult("optimal", "", O[b], alpha[b], max_masked=float(masked[b]))
    if count[b]:      # discard_reason's words, from the same counts and extremes
      result.status, result.reason = "discarded", (
          f"intermediate: {int(count[b])} probabilities in (tau_L={tau_L:g}, tau_H={tau_H:g}] "
          f"(e.g. {float(top_middle[b]):.3g})")
    elif not low[b]:
      result.status, result.reason = "discarded", (
          f"finite: no probability <= tau_L={tau_L:g} (min {float(smallest[b]):.3g})")
    else:
      result = _solve(X[b], Z[b], s[b], W_gd[b], result)
    out.append(result)
  return out


def _solve(X, Z, s, W_gd, result: GenSVMResult) -> GenSVMResult:
  """The solves of ``gen_svm`` for a run that is kept (``result`` holds its selection)."""
  n, T, d = X.shape
  O, alpha = result.selected, result.alpha
  E, b = equality_system(X, Z, s, O)
  st_fin, W_fin, msg_fin = least_norm_solution(E, b, d)
  A = margin_system(X, Z, s, O)
  st_mm, W_mm, dual, msg_mm = equality_margin_svm(A, E, d)
  one = svm_lib.att_svm(X, Z, alpha, "fro")
  result.statuses = {"fin": st_fin, "mm": st_mm, "1token": one.status}
  result.W_fin, result.W_mm = W_fin, W_mm
  result.W_1token = one.W if one.ok else None
  if dual is not None:
    full = np.zeros((n, T))
    full[~O] = dual
    result.dual_mm = full
  result.__dict__.update(pair_checks(W_fin, W_mm, X, Z, s, O))
  problems = [(k, st, m) for k, st, m in (("fin", st_fin, msg_fin), ("mm", st_mm, msg_mm),
                                          ("1token", one.status, one.message)) if st != "optimal"]
  if problems:
    result.status = "infeasible" if any(st == "infeasible" for _, st, _ in problems) else "failed"
    result.reason = "; ".join(f"W^{k} {st}: {m}" for k, st, m in problems)
    return result
  result.C = least_squares_coefficient(W_fin, W_mm, W_gd)
  result.W_svmeq = W_fin + result.C * W_mm
  return result


def stack(results, d: int) -> dict[str, np.ndarray]:
  """Arrays of a list of GenSVMResults: W_fin, W_mm, W_svmeq, W_1token (B,d,d) (NaN where
  missing), C, max_masked, fin_residual, mm_min_margin (B,), status, reason (B,) str,
  selected (B,n,T)."""
  B = len(results)
  out = {}
  for name in ("W_fin", "W_mm", "W_svmeq", "W_1token"):
    arr = np.full((B, d, d), np.nan)
    for k, r in enumerate(results):
      if getattr(r, name) is not None:
        arr[k] = getattr(r, name)
    out[name] = arr
  for name in ("C", "max_masked", "fin_residual", "mm_min_margin", "mm_eq_residual"):
    out[name] = np.array([getattr(r, name) for r in results], np.float64)
  out["status"] = np.array([r.status for r in results])
  out["reason"] = np.array([r.reason for r in results])
  out["selected"] = np.stack([r.selected for r in results]) if results else np.zeros((0,), bool)
  return out


# ----------------------------------------------------------------------------
# The lambda head's optimal attention (orthonormal tokens)
# ----------------------------------------------------------------------------

def simplex_projection(y: np.ndarray) -> np.ndarray:
  """Euclidean projection of each row of y (..., T) onto the probability simplex:
  argmin_{s >= 0, 1^T s = 1} ||s - y||, s_t = max(y_t - mu, 0) with mu set by 1^T s = 1
  (sort-based, Held-Wolfe-Crowder / Duchi et al.)."""
  y = np.asarray(y, np.float64)
  T = y.shape[-1]
  u = -np.sort(-y, axis=-1)                                   # descending
  css = np.cumsum(u, axis=-1) - 1.0
  k = np.arange(1, T + 1)
  cond = u - css / k > 0
  rho = T - 1 - np.argmax(cond[..., ::-1], axis=-1)           # last index where cond holds
  mu = np.take_along_axis(css, rho[..., None], axis=-1) / (rho[..., None] + 1.0)
  return np.maximum(y - mu, 0.0)


def lambda_head_optimum(X: np.ndarray, v: np.ndarray, lam: float, atol: float = 1e-8) -> np.ndarray:
  """The attention s*_i maximizing the lambda head h(X_i^T s) = v^T X_i^T s - lam ||X_i^T s||^2
  over the simplex, for tokens with orthonormal rows (X_i X_i^T = I): X (n,T,d), v (d,) -> (n,T).

  With a_i = X_i v the objective is a_i^T s - lam ||s||^2, so s*_i = Proj_simplex(a_i / (2 lam))
  for lam > 0, and the vertex argmax_t a_it for lam = 0 (ties: the first). For Y_i = +1 and a
  decreasing loss this is the attention GD drives sequence i to; its support is the predicted
  selected set O_i."""
  X = np.asarray(X, np.float64)
  v = np.asarray(v, np.float64)
  if X.ndim != 3 or v.shape != (X.shape[-1],):
    raise ValueError(f"lambda_head_optimum: need X (n,T,d) and v (d,), got {X.shape} and {v.shape}")
  gram = np.einsum("ntd,nud->ntu", X, X)
  if np.max(np.abs(gram - np.eye(X.shape[1]))) > atol:
    raise ValueError("lambda_head_optimum: the tokens of each sequence must be orthonormal (X_i X_i^T = I)")
  if not np.isfinite(lam) or lam < 0:
    raise ValueError(f"lambda_head_optimum: lam must be a finite number >= 0, got {lam}")
  a = X @ v                                                   # (n, T)
  if lam == 0:
    return np.eye(X.shape[1])[np.argmax(a, axis=-1)]
  return simplex_projection(a / (2.0 * lam))
