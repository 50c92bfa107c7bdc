"""Rates of implicit bias: margin gaps per snapshot, log-log slopes with confidence intervals, and
the length of the oscillating phase of large steps (docs/science.md section 19).

  att_margins(W, X, Z, alpha)         (S,) min_{i, t != alpha_i} (x_{i,alpha_i} - x_it)^T W_s z_i
  margin_gap(margins, W, norm, gamma) (S,) gamma* - margin(W_s) / ||W_s||   (the normalized-margin gap)
  slope(steps, y, lo, hi)             least-squares slope of log y against log t on lo <= t <= hi
  slope_ci(slopes)                    mean slope over data sets and its 95% Student-t interval
  oscillation_end(steps, loss)        the step after which the loss never rises again

The gap of a trajectory in the norm N is gamma*_N - min_i margin_i(W_t) / ||W_t||_N, where
gamma*_N = 1 / ||W^mm_N|| is the largest normalized margin any W reaches: it is >= 0 for every
W, 0 exactly in the direction of W^mm_N, and above gamma*_N while some constraint is still
violated (a token other than alpha_i still wins). Convergence at the rate t^-a is a slope of -a.
"""
from __future__ import annotations

import numpy as np

from svmattn.analysis import metrics


def att_margins(W: np.ndarray, X: np.ndarray, Z: np.ndarray, alpha: np.ndarray) -> np.ndarray:
  """(S,) the Att-SVM margins min over i and t != alpha_i of (x_{i,alpha_i} - x_it)^T W_s z_i, for
  the snapshots W (S, d, d) of one data set X (n, T, d), Z (n, d) at the token selection alpha (n,)."""
  W = np.asarray(W, np.float64)
  X, Z = np.asarray(X, np.float64), np.asarray(Z, np.float64)
  alpha = np.asarray(alpha, np.int64)
  n, T, _ = X.shape
  scores = np.einsum("ntd,sde,ne->snt", X, W, Z)               # x_it^T W_s z_i
  chosen = scores[:, np.arange(n), alpha]                        # (S, n)
  diff = chosen[:, :, None] - scores                             # (S, n, T)
  diff[:, np.arange(n), alpha] = np.inf
  return np.min(diff.reshape(len(W), -1), axis=1)


def margin_gap(margins: np.ndarray, W: np.ndarray, norm: str, gamma_star: float) -> np.ndarray:
  """(S,) gamma* - margins / ||W_s|| in ``norm`` (NaN where W_s = 0 or is not finite)."""
  W = np.asarray(W, np.float64)
  nv = metrics.norm_value(W, norm) if W.ndim == 3 else _vector_norms(W, norm)
  with np.errstate(divide="ignore", invalid="ignore"):
    out = gamma_star - np.asarray(margins, np.float64) / nv
  return np.where(np.isfinite(out) & (nv > 0), out, np.nan)


def _vector_norms(w: np.ndarray, norm: str) -> np.ndarray:
  """(S,) ||w_s|| of vectors w (S, d) in an entrywise norm."""
  p = {"l2": 2, "fro": 2, "l1": 1, "linf": np.inf}.get(norm)
  if p is None:
    p = float(norm[1:])
  return np.linalg.norm(w, ord=p, axis=-1)


def slope(steps: np.ndarray, y: np.ndarray, lo: float, hi: float) -> float:
  """The least-squares slope of log y against log t over the snapshots with lo <= t <= hi and
  y > 0 (NaN with fewer than 3 such points, or when y reached 0: no rate to measure)."""
  steps = np.asarray(steps, np.float64)
  y = np.asarray(y, np.float64)
  window = (steps >= lo) & (steps <= hi) & (steps > 0)
  if np.sum(window) < 3 or not np.all(np.isfinite(y[window])) or np.any(y[window] <= 0):
    return float("nan")
  return float(np.polyfit(np.log(steps[window]), np.log(y[window]), 1)[0])


def slope_ci(slopes: np.ndarray, level: float = 0.95) -> dict:
  """{"mean", "lo", "hi", "runs"}: the mean of the finite slopes over data sets and its Student-t
  interval (None where fewer than 2 slopes are finite)."""
  s = np.asarray(slopes, np.float64)
  s = s[np.isfinite(s)]
  if s.size < 2:
    return {"mean": float(s[0]) if s.size else None, "lo": None, "hi": None, "runs": int(s.size)}
  import scipy.stats   # here, not at the top: 0.9 s of every process that imports the registry
  half = scipy.stats.t.ppf(0.5 + level / 2, s.size - 1) * np.std(s, ddof=1) / np.sqrt(s.size)
  m = float(np.mean(s))
  return {"mean": m, "lo": m - float(half), "hi": m + float(half), "runs": int(s.size)}


def oscillation_end(steps: np.ndarray, loss: np.ndarray) -> tuple[int, bool]:
  """(end, ended) of one run: ``end`` is the step of the last snapshot at which the loss is
  higher than at the snapshot before (0 when it never rises: no oscillating phase); ``ended`` is
  False when that rise falls in the last tenth of the run (the loss still oscillates when
  training stops) or the loss is not finite. Measured at the snapshot resolution.""" 
  loss = np.asarray(loss, np.float64)
  steps = np.asarray(steps)
  if not np.all(np.isfinite(loss)):
    return int(steps[-1]), False
  rises = np.flatnonzero(loss[1:] > loss[:-1])
  if rises.size == 0:
    return 0, True
  k = int(rises[-1]) + 1
  return int(steps[k]), bool(steps[k] < 0.9 * steps[-1])
