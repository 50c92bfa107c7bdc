"""Per-attention analysis of models with several attentions (heads, layers; docs/science.md section 13).

For one attention of a batch of trained models: its selected tokens, how sparse its softmax is,
the Att-SVM at its selection and the correlation of its key-query matrix with that SVM at every
snapshot; and whether several heads select the same tokens.
"""
from __future__ import annotations

import numpy as np

from svmattn.analysis import metrics
from svmattn.svm import att_svm as svm_lib
from svmattn.svm import seq2seq as s2s

STATUS_DTYPE = "<U10"


def attention_stats(s: np.ndarray, tau_H: float = 1e-3) -> dict:
  """s (B, ..., T): the selection (argmax), the mean largest probability (B,) and the mean number
  of tokens at or above tau_H (B,)."""
  s = np.asarray(s, np.float64)
  axes = tuple(range(1, s.ndim - 1))
  return {"selected": np.argmax(s, axis=-1), "max_prob": s.max(axis=-1).mean(axis=axes),
          "above_tau": (s >= tau_H).sum(axis=-1).mean(axis=axes)}


def svm_and_corr(X: np.ndarray, Z: np.ndarray, selected: np.ndarray, W: np.ndarray, norm: str,
                 finite: np.ndarray | None = None) -> dict:
  """Att-SVM at ``selected`` for each data set and corr with the snapshots W (B,S,d,d).

  X (B,n,T,d), Z (B,n,d) with selected (B,n): the single-query SVM (``svm.att_svm``); Z None with
  selected (B,n,T): the sequence-to-sequence SVM of self-attention (``svm.seq2seq.svm``).
  Returns status (B,), W_svm (B,d,d) (NaN unless solved), corr (B,S)."""
  B, d = X.shape[0], X.shape[-1]
  finite = np.ones(B, bool) if finite is None else np.asarray(finite, bool)
  W_svm = np.full((B, d, d), np.nan)
  status = []
  solve = [b for b in range(B) if finite[b] and np.all(np.isfinite(X[b]))]
  if Z is None:
    solved = [s2s.svm(X[b], selected[b], norm) for b in solve]
  else:   # stacked: the nuclear solver solves the problems of one shape together, each as alone
    solved = svm_lib.att_svm_many([(X[b], Z[b], selected[b], norm) for b in solve], threads=1)
  results = dict(zip(solve, solved))
  for b in range(B):
    r = results.get(b)
    if r is None:
      status.append("diverged")
      continue
    status.append(r.status)
    if r.ok:
      W_svm[b] = r.W
  return {"status": np.array(status, dtype=STATUS_DTYPE), "W_svm": W_svm,
          "corr": metrics.corr(np.asarray(W, np.float64), W_svm[:, None])}


def agreement(selections: list) -> dict:
  """Heads' selections [(B,n), ...]: the share of sequences where every head selects the same
  token (B,), and where all heads select different tokens (B,)."""
  S = np.stack(selections)                                   # (H, B, n)
  same = np.all(S == S[:1], axis=0).mean(axis=-1)
  H = S.shape[0]
  distinct = np.array([[len(set(S[:, b, i].tolist())) == H for i in range(S.shape[2])] for b in range(S.shape[1])])
  return {"all_same": same, "all_different": distinct.mean(axis=-1)}


def summed_selection(X: np.ndarray, Z: np.ndarray, W: np.ndarray) -> np.ndarray:
  """(B,n) argmax_t x_it^T W z_i of the final matrices W (B,d,d) (e.g. sum_h K_h Q_h^T)."""
  return np.argmax(np.einsum("bntd,bnd->bnt", X, np.einsum("bde,bne->bnd", W, Z)), axis=-1)


def store(out: dict, prefix: str, stats: dict, res: dict, W_final) -> None:
  """out[<prefix>_selected, _max_prob, _above_tau, _svm_status, _corr, _W_final] of one attention."""
  out[f"{prefix}_selected"] = stats["selected"]
  out[f"{prefix}_max_prob"] = stats["max_prob"]
  out[f"{prefix}_above_tau"] = stats["above_tau"]
  out[f"{prefix}_svm_status"] = res["status"]
  out[f"{prefix}_corr"] = res["corr"]
  out[f"{prefix}_W_final"] = np.asarray(W_final)


def summary_row(arrays: dict, prefix: str) -> dict:
  """The summary of one attention from the arrays ``store`` wrote: sparsity, SVM outcomes, final corr."""
  status = arrays[f"{prefix}_svm_status"]
  return {"max_prob": metrics.finite_stats(arrays[f"{prefix}_max_prob"]),
          "tokens_above_tau": metrics.finite_stats(arrays[f"{prefix}_above_tau"]),
          "svm_solved": int(np.sum(status == "optimal")), "svm_infeasible": int(np.sum(status == "infeasible")),
          "corr_final": metrics.finite_stats(arrays[f"{prefix}_corr"][:, -1])}
