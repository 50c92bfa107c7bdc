"""The max-margin problems of joint training of head and attention (docs/science.md section 11;
Tarzanagh, Li, Zhang, Oymak 2023, arXiv 2306.13596). Host side: NumPy, SciPy, cvxpy.

With alpha the selected tokens of one data set (X (n,T,d), labels Y (n,)):

  v^mm = argmin ||v||_2  s.t.  Y_i v^T x_{i,alpha_i} >= 1 for all i      (``max_margin_head``)
    S = its support vectors: the sequences whose margin is 1 (the multiplier is positive);
  relaxed Att-SVM = argmin ||W||  s.t.  (x_{i,alpha_i} - x_it)^T W z_i >= 1 for i in S,
                                                                       >= 0 for i not in S
    (``relaxed_att_svm``; ``relaxed_prompt_svm`` for prompt attention softmax(X p), whose rows
    are x_{i,alpha_i} - x_it).

Every problem is min ||w|| s.t. A w >= b with b in {0, 1}: the Frobenius / l2 ones are
least-distance programs solved exactly by NNLS (Lawson & Hanson), which also gives the
multipliers (w = A^T lambda, lambda >= 0, lambda (A w - b) = 0: the KKT conditions); the
nuclear one goes through cvxpy (CLARABEL). Outcomes are statuses, never exceptions.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from svmattn.svm import att_svm as svm_lib

# margin - 1 below this: a support vector (the NNLS solution is exact up to rounding)
SUPPORT_TOL = 1e-7


@dataclasses.dataclass
class MarginResult:
  """status ("optimal" | "infeasible" | "failed"), w (the solution, None unless optimal), the
  margins A w, the multipliers lambda (w = A^T lambda for l2 problems), support (rows whose
  margin equals their bound b = 1), message."""
  status: str
  w: np.ndarray | None
  margins: np.ndarray | None
  dual: np.ndarray | None
  support: np.ndarray
  message: str = ""

  @property
  def ok(self) -> bool:
    return self.status == "optimal"


def least_distance(A, b):
  """min ||w||_2 s.t. A w >= b: ``svm.att_svm.least_distance`` (NNLS, exact, with the multipliers)."""
  return svm_lib.least_distance(np.asarray(A, np.float64), np.asarray(b, np.float64))


def _result(status, w, dual, msg, A, b):
  if status != "optimal":
    return MarginResult(status, None, None, None, np.zeros(len(b), bool), msg)
  margins = A @ w
  if len(b) and np.min(margins - b) < -1e-6:
    return MarginResult("failed", None, None, None, np.zeros(len(b), bool),
                        f"constraints violated by {-np.min(margins - b):.2e}")
  support = (b > 0) & (margins - b <= SUPPORT_TOL * max(1.0, float(np.max(np.abs(margins), initial=1.0))))
  return MarginResult(status, w, margins, dual, support, msg)


def check_inputs(X, alpha, where: str = "joint"):
  """(X (n,T,d) float64, alpha (n,) int64) or ValueError naming the problem."""
  X = np.asarray(X, np.float64)
  alpha = np.asarray(alpha)
  if X.ndim != 3:
    raise ValueError(f"{where}: X must have shape (n, T, d), got {X.shape}")
  if alpha.shape != (X.shape[0],):
    raise ValueError(f"{where}: alpha must have shape (n,) = ({X.shape[0]},), got {alpha.shape}")
  if alpha.dtype.kind not in "iu" and not np.all(alpha == np.round(alpha)):
    raise ValueError(f"{where}: alpha must hold integer token indices, got {alpha.tolist()}")
  alpha = alpha.astype(np.int64)
  if np.any(alpha < 0) or np.any(alpha >= X.shape[1]):
    raise ValueError(f"{where}: alpha entries must be in [0, T={X.shape[1]}), got {alpha.tolist()}")
  if not np.all(np.isfinite(X)):
    raise ValueError(f"{where}: X must be finite (found NaN or inf)")
  return X, alpha


def selected_tokens(X, alpha) -> np.ndarray:
  """x_{i,alpha_i} (n,d)."""
  X, alpha = check_inputs(X, alpha)
  return X[np.arange(X.shape[0]), alpha]


def max_margin_head(X, Y, alpha) -> MarginResult:
  """v^mm of the selected tokens: min ||v|| s.t. Y_i v^T x_{i,alpha_i} >= 1. ``.support`` (n,)
  marks the support vectors S (margin 1); infeasible when the selected tokens are not linearly
  separable through the origin."""
  return max_margin_classifier(selected_tokens(X, alpha), Y)


def max_margin_classifier(R, Y) -> MarginResult:
  """min ||v|| s.t. Y_i v^T r_i >= 1 for points R (n,d) (e.g. the pooled tokens X_i^T s_i)."""
  R = np.asarray(R, np.float64)
  Y = np.asarray(Y, np.float64)
  if R.ndim != 2 or Y.shape != (R.shape[0],):
    raise ValueError(f"max_margin_head: Y must have shape (n,) = ({R.shape[0]},), got {Y.shape}")
  if not np.all(np.isfinite(R)):
    raise ValueError("max_margin_head: the points must be finite (found NaN or inf)")
  A = Y[:, None] * R
  b = np.ones(len(Y))
  return _result(*least_distance(A, b), A, b)


def margin_rows(X, Z, alpha, prompt: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """(A (n*(T-1), D), seq (n*(T-1),) the sequence of each row): rows vec((x_{i,alpha_i} - x_it) z_i^T)
  (D = d*d), or x_{i,alpha_i} - x_it for prompt attention (D = d), for every t != alpha_i."""
  X, alpha = check_inputs(X, alpha)
  n, T, d = X.shape
  diff = X[np.arange(n), alpha][:, None, :] - X                      # (n,T,d)
  keep = np.ones((n, T), bool)
  keep[np.arange(n), alpha] = False
  rows = diff if prompt else np.einsum("ntd,ne->ntde", diff, np.asarray(Z, np.float64)).reshape(n, T, d * d)
  seq = np.broadcast_to(np.arange(n)[:, None], (n, T))
  return rows[keep], seq[keep]


def relaxed_att_svm(X, Z, alpha, support_seqs, norm: str = "fro", prompt: bool = False) -> MarginResult:
  """The relaxed Att-SVM: bound 1 for the sequences of ``support_seqs`` ((n,) bool), 0 for the
  others. ``.w`` is vec(W) (d*d,) (reshape to (d,d)), or p (d,) with ``prompt``. norm: "fro"
  (NNLS, exact) or "nuc" (cvxpy CLARABEL; not for prompt). With every sequence in S this is
  Att-SVM(alpha) itself."""
  A, seq = margin_rows(X, Z, alpha, prompt)
  support_seqs = np.asarray(support_seqs, bool)
  b = support_seqs[seq].astype(np.float64)
  if norm == "fro":
    return _result(*least_distance(A, b), A, b)
  if norm != "nuc" or prompt:
    raise ValueError(f"relaxed_att_svm: norm must be 'fro' (or 'nuc' for W), got {norm!r}")
  return _result(*_nuclear(A, b, np.asarray(X).shape[-1]), A, b)


def _nuclear(A, b, d):
  import warnings

  import cvxpy as cp
  if not np.any(b > 0):
    return "optimal", np.zeros(d * d), np.zeros(len(b)), "no active bound"
  W = cp.Variable((d, d))
  margin = A @ cp.vec(W, order="C") >= b
  prob = cp.Problem(cp.Minimize(cp.normNuc(W)), [margin])
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      prob.solve(solver="CLARABEL")
  except Exception as e:  # noqa: BLE001
    return "failed", None, None, f"CLARABEL: {type(e).__name__}: {e}"
  if prob.status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
    return "infeasible", None, None, f"CLARABEL: {prob.status}"
  if prob.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) or W.value is None:
    return "failed", None, None, f"CLARABEL: {prob.status}"
  w = np.asarray(W.value, np.float64).reshape(-1)
  dual = None if margin.dual_value is None else np.asarray(margin.dual_value, np.float64).reshape(-1)
  return "optimal", w, dual, "" if prob.status == cp.OPTIMAL else prob.status
