"""Metrics (host side, NumPy): correlations, token optimality, convergence types, ranks.

Token scores gamma (n,T) come from ``svmattn.models.heads.token_scores`` (device side);
here everything is NumPy. Batched functions say so and take a leading axis B.
"""
from __future__ import annotations

import numpy as np

from svmattn.svm import att_svm as svm_lib

# The last three are training-health labels (``analysis.health``): such a run has no converged
# selection to classify, and is counted apart, as ties are.
CONVERGENCE_TYPES = ("global", "local", "not-local", "tie", "diverged", "stalled", "unsaturated")
# Token scores within this relative distance of a sequence's largest count as tied with it.
TIE_RTOL = 1e-12


def corr(A: np.ndarray, B: np.ndarray) -> np.ndarray:
  """<A,B> / (||A||_F ||B||_F) over the last two axes (broadcasting the rest).

  NaN where either matrix is zero or not finite (e.g. an SVM that was not solved). Matrices
  whose squares overflow or underflow (a run that blew up to 1e200) are scaled by their largest
  entry first; every other value is computed as written."""
  A = np.asarray(A, np.float64)
  B = np.asarray(B, np.float64)
  with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
    out = _corr(A, B)
    finite = np.all(np.isfinite(A), axis=(-2, -1)) & np.all(np.isfinite(B), axis=(-2, -1))
    lost = finite & np.isnan(out) & np.any(A != 0, axis=(-2, -1)) & np.any(B != 0, axis=(-2, -1))
    if np.any(lost):
      scale = lambda M: M / np.maximum(np.max(np.abs(M), axis=(-2, -1), keepdims=True), np.finfo(M.dtype).tiny)  # noqa: E731
      out = np.where(lost, _corr(scale(A), scale(B)), out)
  return out


def _corr(A: np.ndarray, B: np.ndarray) -> np.ndarray:
  num = np.sum(A * B, axis=(-2, -1))
  den = np.sqrt(np.sum(A * A, axis=(-2, -1)) * np.sum(B * B, axis=(-2, -1)))
  return np.where((den > 0) & np.isfinite(den), num / np.where(den > 0, den, 1), np.nan)


def corr_per_run(A: np.ndarray, B: np.ndarray) -> np.ndarray:
  """``corr(A, B[:, None])`` (R, S) of trajectories A (R, S, m, m) against one matrix per run B
  (R, m, m), computed for the runs whose B is finite only: any other run's correlations are NaN
  (as ``corr`` gives them), and most runs of a study that solves its SVMs for the kept runs alone
  have no B (E5 keeps about 4% of its draws)."""
  A = np.asarray(A, np.float64)
  B = np.asarray(B, np.float64)
  out = np.full(A.shape[:2], np.nan)
  rows = np.flatnonzero(np.all(np.isfinite(B), axis=(-2, -1)))
  if rows.size:
    out[rows] = corr(A[rows], B[rows][:, None])
  return out


def average_ranks(x: np.ndarray) -> np.ndarray:
  """Ranks 1..m of the 1-D x, tied values sharing the mean of their ranks (``scipy.stats.rankdata``'s
  "average")."""
  x = np.asarray(x)
  order = np.argsort(x, kind="mergesort")
  sorted_x = x[order]
  starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])       # first index of each run of ties
  ends = np.r_[starts[1:], len(x)]
  mean_rank = (starts + ends + 1) / 2.0                                       # mean of ranks starts+1 .. ends
  ranks = np.empty(len(x))
  ranks[order] = np.repeat(mean_rank, ends - starts)
  return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
  """Spearman's rank correlation of the 1-D x and y: the Pearson correlation of their average ranks
  (``scipy.stats.spearmanr``'s statistic, without importing scipy.stats: about 1 s of a core); NaN
  where either is constant."""
  rx, ry = average_ranks(x), average_ranks(y)
  rx, ry = rx - rx.mean(), ry - ry.mean()
  den = np.sqrt(np.sum(rx * rx) * np.sum(ry * ry))
  return float(np.sum(rx * ry) / den) if den > 0 else float("nan")


def linear_token_scores(v: np.ndarray, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
  """gamma_bit = Y_bi <v_b, x_bit>, the linear head's token scores of a batch of data sets,
  on the host: v (B, d), X (B, n, T, d), Y (B, n) -> (B, n, T), in the arrays' dtype.

  The dot product is summed one coordinate at a time, in order (plain IEEE products and sums,
  no BLAS), so a data set's scores do not depend on the batch it is in, and no program is
  compiled per shape (docs/science.md section 20)."""
  X, Y, v = np.asarray(X), np.asarray(Y), np.asarray(v)
  acc = X[..., 0] * v[:, None, None, 0]
  for k in range(1, X.shape[-1]):
    acc = acc + X[..., k] * v[:, None, None, k]
  return Y[..., None] * acc


def optimal_tokens(gamma: np.ndarray) -> np.ndarray:
  """opt_i = argmax_t gamma_it: (..., n, T) -> (..., n)."""
  return np.argmax(gamma, axis=-1)


def has_tie(gamma: np.ndarray, allowed: np.ndarray | None = None) -> np.ndarray:
  """Does some sequence have more than one optimal token? (..., n, T) -> (...,) bool.

  Tied: within TIE_RTOL * max(1, |top|) of the sequence's largest score (duplicated tokens,
  all tokens identical). ``allowed``: optional (..., T) or broadcastable mask of the tokens
  that compete (causal attention); a sequence with one allowed token has no tie."""
  gamma = np.asarray(gamma, np.float64)
  if allowed is not None:
    gamma = np.where(allowed, gamma, -np.inf)
  top = np.max(gamma, axis=-1, keepdims=True)
  near = gamma >= top - TIE_RTOL * np.maximum(1.0, np.abs(top))
  return np.any(np.sum(near, axis=-1) > 1, axis=-1)


def selected_tokens(s: np.ndarray) -> np.ndarray:
  """alpha_hat_i = argmax_t s_it: (..., n, T) -> (..., n)."""
  return np.argmax(s, axis=-1)


def is_locally_optimal(gamma: np.ndarray, alpha: np.ndarray, result: svm_lib.SVMResult) -> bool:
  """alpha is locally optimal: Att-SVM(alpha) is feasible and, for every sequence i,
  gamma_{i,alpha_i} > gamma_it for every support token t of Att-SVM(alpha).

  gamma (n,T) token scores; alpha (n,); result the Frobenius Att-SVM(alpha)."""
  if not result.ok:
    return False
  n = gamma.shape[0]
  top = gamma[np.arange(n), alpha][:, None]
  return bool(np.all((gamma < top) | ~result.support))


def convergence_type(gamma: np.ndarray, alpha_hat: np.ndarray, result: svm_lib.SVMResult,
                     health: str = "ok") -> str:
  """"tie" when some sequence's optimal token is not unique (``has_tie``: then there is no
  opt to converge to, and Att-SVM(opt) is infeasible); else the run's ``health`` label
  (``analysis.health``: "diverged", "stalled", "unsaturated") when it is not "ok": its
  selection is not a converged one; else "global" when alpha_hat = opt, "local" when alpha_hat is
  locally optimal but not opt, "not-local" otherwise (an infeasible SVM included).
  result: Att-SVM(alpha_hat), fro."""
  if has_tie(gamma):      # a property of the data: no training can give a converged type
    return "tie"
  if health != "ok":
    return str(health)
  if np.array_equal(alpha_hat, optimal_tokens(gamma)):
    return "global"
  return "local" if is_locally_optimal(gamma, alpha_hat, result) else "not-local"


def convergence_types(gamma: np.ndarray, alpha_hat: np.ndarray, results, health) -> np.ndarray:
  """``convergence_type`` of every data set of a batch: gamma (B,n,T), alpha_hat (B,n), results the
  B Frobenius Att-SVM(alpha_hat) results, health (B,) labels -> (B,) types. A tie comes first (a
  property of the data: no training can give a converged type), then an unhealthy run's label,
  then global, local (``is_locally_optimal``, batched) or not-local."""
  gamma, alpha_hat = np.asarray(gamma, np.float64), np.asarray(alpha_hat)
  B, n, T = gamma.shape
  health = np.asarray(health).astype(str)
  support = np.stack([r.support if r.ok else np.zeros((n, T), bool) for r in results]) if B else np.zeros((0, n, T), bool)
  ok = np.array([r.ok for r in results], bool)
  top = np.take_along_axis(gamma, alpha_hat[..., None].astype(np.int64), -1)          # (B, n, 1)
  local = ok & np.all((gamma < top) | ~support, axis=(-2, -1))
  types = np.where(np.all(alpha_hat == optimal_tokens(gamma), axis=-1), "global",
                   np.where(local, "local", "not-local")).astype("<U11")
  types = np.where(health != "ok", health, types)
  return np.where(has_tie(gamma), "tie", types).astype("<U11")


def type_fractions(types) -> dict[str, float]:
  """Share of each convergence type in a list of types."""
  types = list(types)
  total = max(len(types), 1)
  return {t: sum(x == t for x in types) / total for t in CONVERGENCE_TYPES}


def numerical_rank(W: np.ndarray, rtol: float = 1e-4) -> np.ndarray:
  """Number of singular values above rtol * the largest, over the last two axes.

  State rtol with any reported rank: SCS/Clarabel solutions are accurate to ~1e-6
  relative, so rtol should sit well above that (default 1e-4)."""
  s = singular_values(W)
  return np.sum(s > rtol * s[..., :1], axis=-1)


def singular_values(W: np.ndarray) -> np.ndarray:
  """The singular values over the last two axes, largest first; NaN for a matrix that is not finite
  (a diverged run) or whose SVD does not converge, instead of an exception for the whole batch."""
  W = np.asarray(W, np.float64)
  finite = np.all(np.isfinite(W), axis=(-2, -1))
  if np.all(finite):
    try:
      return np.linalg.svd(W, compute_uv=False)
    except np.linalg.LinAlgError:
      pass
  out = np.full(W.shape[:-2] + (min(W.shape[-2:]),), np.nan)
  for index in zip(*np.nonzero(finite)) if W.ndim > 2 else ([()] if finite else []):
    try:
      out[index] = np.linalg.svd(W[index], compute_uv=False)
    except np.linalg.LinAlgError:
      pass
  return out


def mean_std(x: np.ndarray, axis=0) -> tuple[np.ndarray, np.ndarray]:
  """nanmean and nanstd along ``axis``."""
  return np.nanmean(x, axis=axis), np.nanstd(x, axis=axis)


def quantile_stats(x) -> dict:
  """count, median, quartiles and mean of the finite entries of x (None where there are none)."""
  x = np.asarray(x, np.float64)
  x = x[np.isfinite(x)]
  if not x.size:
    return {"count": 0, "median": None, "q25": None, "q75": None, "mean": None}
  q25, med, q75 = np.percentile(x, [25, 50, 75])
  return {"count": int(x.size), "median": float(med), "q25": float(q25), "q75": float(q75), "mean": float(x.mean())}


# ----------------------------------------------------------------------------
# Geometry of other norms (docs/science.md section 10)
# ----------------------------------------------------------------------------


def norm_value(W: np.ndarray, norm: str) -> np.ndarray:
  """||W|| over the last two axes: "fro"/"l2", "nuc", "spectral", "l1", "linf", "l<p>" (entrywise)."""
  W = np.asarray(W, np.float64)
  if norm in ("fro", "l2"):
    with np.errstate(over="ignore", under="ignore"):
      out = np.sqrt(np.sum(W * W, axis=(-2, -1)))
      lost = ~np.isfinite(out) & np.all(np.isfinite(W), axis=(-2, -1))   # squares overflowed: scale first
      if np.any(lost):
        m = np.max(np.abs(W), axis=(-2, -1))
        out = np.where(lost, m * np.sqrt(np.sum((W / np.where(m > 0, m, 1)[..., None, None]) ** 2, axis=(-2, -1))), out)
    return out
  if norm in ("nuc", "spectral"):
    s = singular_values(W)
    return s.sum(-1) if norm == "nuc" else s[..., 0]
  if norm == "l1":
    return np.sum(np.abs(W), axis=(-2, -1))
  if norm == "linf":
    return np.max(np.abs(W), axis=(-2, -1))
  if norm.startswith("l"):
    p = float(norm[1:])
    with np.errstate(over="ignore", under="ignore"):
      return np.sum(np.abs(W) ** p, axis=(-2, -1)) ** (1.0 / p)
  raise ValueError(f"unknown norm {norm!r}")


def norm_distance(W: np.ndarray, W_svm: np.ndarray, norm: str) -> np.ndarray:
  """|| W/||W|| - W_svm/||W_svm|| || with every norm the given one (broadcast over leading axes);
  NaN where either is zero or NaN."""
  W, W_svm = np.asarray(W, np.float64), np.asarray(W_svm, np.float64)
  with np.errstate(invalid="ignore", divide="ignore"):
    a = W / norm_value(W, norm)[..., None, None]
    b = W_svm / norm_value(W_svm, norm)[..., None, None]
    return norm_value(a - b, norm)


def bregman_lp(A: np.ndarray, B: np.ndarray, p: float) -> np.ndarray:
  """D_psi(A, B) = psi(A) - psi(B) - <grad psi(B), A - B>, psi(W) = (1/p) sum |W_ij|^p, with A and B
  first scaled to unit entrywise l_p norm (the l_p mirror-descent paper's metric: A the SVM
  solution, B the iterate)."""
  A, B = np.asarray(A, np.float64), np.asarray(B, np.float64)
  with np.errstate(invalid="ignore", divide="ignore"):
    A = A / norm_value(A, f"l{p}")[..., None, None]
    B = B / norm_value(B, f"l{p}")[..., None, None]
    psi = lambda M: np.sum(np.abs(M) ** p, axis=(-2, -1)) / p  # noqa: E731
    grad = np.sign(B) * np.abs(B) ** (p - 1)
    return psi(A) - psi(B) - np.sum(grad * (A - B), axis=(-2, -1))


def finite_stats(x) -> dict | None:
  """{mean, median, min, max, count} of the finite entries of x (NaN: not solved, diverged), or
  None when there are none."""
  x = np.asarray(x, np.float64).reshape(-1)
  x = x[np.isfinite(x)]
  if not x.size:
    return None
  return {"mean": float(x.mean()), "median": float(np.median(x)), "min": float(x.min()), "max": float(x.max()),
          "count": int(x.size)}
