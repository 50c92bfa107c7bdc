"""Gradient descent against the attention SVMs, for a batch of runs (host side, NumPy).

``compare_with_svms`` solves the Frobenius and the nuclear Att-SVM at the tokens each
parameterization selected (each distinct (data set, selection, norm) once) and
returns, as NumPy arrays with a leading axis B:

  svm_{norm}_{P}            (B,d,d) solution, NaN where not optimal
  svm_{norm}_{P}_status     (B,) "optimal" / "infeasible" / "failed"
  svm_{norm}_{P}_support    (B,n,T) support tokens
  corr_{P}_{norm}           (B,S) corr of each snapshot with that solution
  convergence_type_{P}      (B,) global / local / not-local / tie (Frobenius SVM, docs/science.md section 5),
                            or the run's health label (diverged / stalled / unsaturated)
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from svmattn.analysis import metrics
from svmattn.svm import att_svm as svm_lib


def compare_with_svms(X: np.ndarray, Z: np.ndarray, gamma: np.ndarray, snapshots: dict[str, np.ndarray],
                      selected: dict[str, np.ndarray], norms=svm_lib.NORMS,
                      progress: Callable[[int], None] | None = None,
                      health: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
  """X (B,n,T,d), Z (B,n,d), gamma (B,n,T) token scores; per parameterization P:
  snapshots[P] (B,S,d,d) W or K Q^T, selected[P] (B,n) the selected tokens, and optionally
  health[P] (B,) the runs' ``analysis.health`` labels (an unhealthy run's convergence type is
  its label)."""
  X = np.asarray(X, np.float64)
  Z = np.asarray(Z, np.float64)
  B, d = X.shape[0], X.shape[-1]
  keys = {}                      # each distinct (data set, selection, norm) once, in order
  for p, sel in selected.items():
    for b in range(B):
      for norm in norms:
        keys.setdefault((b, np.asarray(sel[b], np.int64).tobytes(), norm), None)
  jobs = [(X[b], Z[b], np.frombuffer(sel, np.int64), norm) for b, sel, norm in keys]
  solved = dict(zip(keys, svm_lib.att_svm_many(jobs, progress=progress)))   # threaded (svm.THREADS)
  out = {}
  for p, sel in selected.items():
    per_norm = {}
    for norm in norms:
      res = [solved[(b, np.asarray(sel[b], np.int64).tobytes(), norm)] for b in range(B)]
      per_norm[norm] = res
      stacked = svm_lib.stack(res, d)
      out[f"svm_{norm}_{p}"] = stacked["W"]
      out[f"svm_{norm}_{p}_status"] = stacked["status"]
      out[f"svm_{norm}_{p}_support"] = stacked["support"]
      out[f"corr_{p}_{norm}"] = metrics.corr(np.asarray(snapshots[p], np.float64), stacked["W"][:, None])
    if "fro" in per_norm:
      out[f"convergence_type_{p}"] = np.array(
          [metrics.convergence_type(gamma[b], sel[b], per_norm["fro"][b],
                                    "ok" if health is None else health[p][b]) for b in range(B)])
  return out


def summarize_corr(final: np.ndarray) -> dict:
  """mean / std / min of final correlations over the runs where the SVM was solved."""
  ok = np.isfinite(final)
  if not np.any(ok):
    return {"mean": None, "std": None, "min": None, "solved": 0}
  return {"mean": float(np.mean(final[ok])), "std": float(np.std(final[ok])), "min": float(np.min(final[ok])),
          "solved": int(np.sum(ok))}
