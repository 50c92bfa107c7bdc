"""Max-margin linear classifiers in a norm (host side: NumPy, cvxpy), the targets of the
linear-classifier control (docs/science.md, "Linear-classifier control").

  binary:     min ||w||  s.t.  y_i w^T x_i >= 1                       w in R^d
  multiclass: min ||W||  s.t.  (W_{y_i} - W_c)^T x_i >= 1  (c != y_i)  W in R^{k x d}

Norms (names of ``svm.norms.parse_norm``): binary "l2" (= "fro"), "l1", "linf", "l<p>";
multiclass also "fro", "linf" (entrywise max-norm, sign descent's geometry), "spectral"
(largest singular value, an SDP), "nuc", "l1", "l<p>". gamma* = 1 / ||w*|| is the optimal
normalized margin: max over ||w|| <= 1 of min_i margin_i(w).

Like ``svm.att_svm`` the solvers never raise on data: status "optimal", "infeasible"
(non-separable data) or "failed" (a solver error, or a returned point violating the constraints
by more than 1e-6), with the reason in ``message``.

``normalized_margin(w, X, y, norm)``: min_i margin_i(w / ||w||), so gamma* - normalized_margin(w_t)
tracks the margin gap of a trajectory (binary when w is a vector, multiclass when a matrix).
"""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from svmattn.svm import norms as norms_lib

STATUSES = ("optimal", "infeasible", "failed")
FEAS_TOL = 1e-6


@dataclasses.dataclass(frozen=True)
class MarginResult:
  """status: "optimal" | "infeasible" | "failed"; w: (d,) or (k, d) solution (None unless optimal);
  objective: ||w*|| (NaN unless optimal); gamma: 1 / ||w*|| (NaN unless optimal);
  margins: the constraint values at w* ((n,) binary, (n, k) multiclass with NaN at c = y_i);
  norm: canonical norm name; message: why not optimal."""
  status: str
  w: np.ndarray | None
  objective: float
  gamma: float
  margins: np.ndarray | None
  norm: str
  message: str = ""


def binary_margins(w, X, y) -> np.ndarray:
  """y_i w^T x_i, (n,)."""
  return np.asarray(y, np.float64) * (np.asarray(X, np.float64) @ np.asarray(w, np.float64))


def multiclass_margins(W, X, y) -> np.ndarray:
  """(W_{y_i} - W_c)^T x_i, (n, k), NaN at c = y_i."""
  S = np.asarray(X, np.float64) @ np.asarray(W, np.float64).T   # (n, k)
  y = np.asarray(y)
  M = S[np.arange(len(y)), y][:, None] - S
  M[np.arange(len(y)), y] = np.nan
  return M


def normalized_margin(w, X, y, norm) -> float:
  """min_i margin_i(w / ||w||): binary if w is a vector (y in +-1), multiclass if a (k, d) matrix
  (y in 0..k-1). NaN for w = 0."""
  w = np.asarray(w, np.float64)
  nv = _norm(w, norm)
  if not nv > 0:
    return float("nan")
  m = binary_margins(w, X, y) if w.ndim == 1 else multiclass_margins(w, X, y)
  return float(np.nanmin(m) / nv)


def _norm(w: np.ndarray, norm) -> float:
  """||w|| in the named norm; a vector is a 1 x d matrix for the spectral and nuclear norms."""
  nm = norms_lib.parse_norm(norm)
  return norms_lib.norm_value(w[None, :] if w.ndim == 1 and not nm.entrywise else w, nm)


def _objective(cp, var, nm):
  if nm.kind == "fro":
    return cp.norm(cp.vec(var, order="C"), 2)
  if nm.kind == "l1":
    return cp.norm(cp.vec(var, order="C"), 1)
  if nm.kind == "linf":
    return cp.norm(cp.vec(var, order="C"), "inf")
  if nm.kind == "lp":
    return cp.pnorm(cp.vec(var, order="C"), nm.p)
  if nm.kind == "spectral":
    return cp.sigma_max(var)
  if nm.kind == "nuc":
    return cp.normNuc(var)
  raise ValueError(nm)


def _solve(A: np.ndarray, shape, norm, solver: str):
  """min ||W|| s.t. A vec(W) >= 1 (vec row-major), W of ``shape``. Returns (status, W, obj, msg)."""
  import cvxpy as cp
  nm = norms_lib.parse_norm(norm)
  if len(shape) == 1 and nm.kind in ("spectral", "nuc"):
    var = cp.Variable((1, shape[0]))
  else:
    var = cp.Variable(shape)
  cons = [A @ cp.vec(var, order="C") >= 1]
  prob = cp.Problem(cp.Minimize(_objective(cp, var, nm)), cons)
  kwargs = dict(norms_lib.CLARABEL_SETTINGS) if solver == "CLARABEL" else (
      dict(norms_lib.SCS_SETTINGS) if solver == "SCS" else {})
  kwargs.pop("warm_start", None)
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")     # "solution may be inaccurate": the status and message say it
      prob.solve(solver=solver, **kwargs)
  except Exception as e:  # noqa: BLE001 -- never raise on data
    return "failed", None, float("nan"), f"{solver}: {type(e).__name__}: {e}"
  st = prob.status
  if st in ("infeasible", "infeasible_inaccurate"):
    return "infeasible", None, float("nan"), f"{solver}: {st}"
  if st not in ("optimal", "optimal_inaccurate") or var.value is None:
    return "failed", None, float("nan"), f"{solver}: status {st}"
  W = np.asarray(var.value, np.float64).reshape(shape)
  viol = 1 - np.min(A @ W.reshape(-1)) if A.shape[0] else 0.0
  if viol > FEAS_TOL:
    return "failed", None, float("nan"), f"{solver}: constraints violated by {viol:.2e}"
  return "optimal", W, _norm(W, nm), (f"{solver}: {st}" if st != "optimal" else "")


def _result(status, W, obj, msg, margins_fn, nm):
  if status != "optimal":
    return MarginResult(status, None, float("nan"), float("nan"), None, nm.name, msg)
  return MarginResult(status, W, obj, 1.0 / obj, margins_fn(W), nm.name, msg)


def solve_binary(X, y, norm: str = "l2", solver: str = "CLARABEL") -> MarginResult:
  """min ||w|| s.t. y_i w^T x_i >= 1; X (n, d), y (n,) in {-1, +1}."""
  nm = norms_lib.parse_norm(norm)
  X = np.asarray(X, np.float64)
  y = np.asarray(y, np.float64)
  A = y[:, None] * X
  st, w, obj, msg = _solve(A, (X.shape[1],), nm, solver)
  return _result(st, w, obj, msg, lambda w: binary_margins(w, X, y), nm)


def multiclass_constraints(X, y, k: int) -> np.ndarray:
  """Rows a with a . vec(W) = (W_{y_i} - W_c)^T x_i (vec row-major), (n (k-1), k d)."""
  X = np.asarray(X, np.float64)
  n, d = X.shape
  rows = []
  for i in range(n):
    for c in range(k):
      if c == int(y[i]):
        continue
      a = np.zeros((k, d))
      a[int(y[i])] += X[i]
      a[c] -= X[i]
      rows.append(a.reshape(-1))
  return np.asarray(rows).reshape(-1, k * d)


def solve_multiclass(X, y, k: int, norm: str = "fro", solver: str = "CLARABEL") -> MarginResult:
  """min ||W|| s.t. (W_{y_i} - W_c)^T x_i >= 1 for c != y_i; X (n, d), y (n,) in 0..k-1, W (k, d)."""
  nm = norms_lib.parse_norm(norm)
  X = np.asarray(X, np.float64)
  y = np.asarray(y)
  A = multiclass_constraints(X, y, k)
  st, W, obj, msg = _solve(A, (k, X.shape[1]), nm, solver)
  return _result(st, W, obj, msg, lambda W: multiclass_margins(W, X, y), nm)
