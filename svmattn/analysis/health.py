"""Training health, per run (host side, NumPy): is a run's final state a result at all?

A run's token selection and its correlation with an SVM are results only where training
went on long enough and kept moving. Each run gets one label:

  "diverged"     W or the loss is not finite at the end (as ``Trajectory.finite``);
  "stalled"      from some snapshot on, W and the loss did not change by one bit: the
                 gradient is exactly zero (a softmax saturated to exactly 1 in the working
                 precision) or every update is below the rounding of W. ``stalled_step``
                 is that snapshot's step: training stood still from there (at the latest;
                 snapshots are ``snapshot_every`` steps apart), -1 if it never did;
  "unsaturated"  the final mean largest softmax probability (1/n) sum_i max_t s_it is below
                 ``threshold`` (default ``SATURATION``): the softmax has not yet picked a token
                 per sequence, so the selected tokens are a snapshot of a run in progress;
  "ok"           otherwise.

The labels are checked in this order (a diverged run is not also called stalled). Studies
count the three unhealthy labels apart from the convergence types global / local / not-local
(``analysis.metrics.convergence_type``), as they count ties.
"""
from __future__ import annotations

import numpy as np

LABELS = ("ok", "diverged", "stalled", "unsaturated")
UNHEALTHY = LABELS[1:]
# A run whose final mean largest probability is below this is "unsaturated". On E2's defaults
# every run ends at 1.0 (to 4 digits); at lr 0.01 and d = 4 the median is 0.876.
SATURATION = 0.9


def stalled_step(W: np.ndarray, loss: np.ndarray, steps: np.ndarray) -> np.ndarray:
  """(B,) the step of the first snapshot from which W (B,S,...) and the loss (B,S) stay bit
  for bit the same to the end, -1 where the last two snapshots differ (or S < 2).

  NaN snapshots never count as equal (a diverged run is not stalled)."""
  W = np.asarray(W)
  loss = np.asarray(loss)
  B, S = loss.shape
  out = np.full(B, -1, np.int64)
  if S < 2:
    return out
  flat = W.reshape(B, S, -1)
  # same[:, k]: snapshot k+1 equals snapshot k (NaN != NaN, so a diverged run never matches)
  same = np.all(flat[:, 1:] == flat[:, :-1], axis=-1) & (loss[:, 1:] == loss[:, :-1])
  for b in range(B):
    if not same[b, -1]:
      continue
    moving = np.flatnonzero(~same[b])
    first = 0 if moving.size == 0 else int(moving[-1]) + 1
    out[b] = int(steps[first])
  return out


def labels(finite: np.ndarray, stalled: np.ndarray, max_prob_final: np.ndarray,
           threshold: float = SATURATION) -> np.ndarray:
  """(B,) one of ``LABELS`` per run from ``finite`` (B,), ``stalled`` (B,) (``stalled_step``)
  and the final mean largest probability (B,)."""
  if not (np.isfinite(threshold) and 0.0 <= threshold <= 1.0):
    raise ValueError(f"health: the saturation threshold must be in [0, 1] (0: none is unsaturated), "
                     f"got {threshold!r}")
  finite = np.asarray(finite, bool)
  out = np.full(finite.shape, "ok", dtype="<U11")
  out[np.asarray(max_prob_final) < threshold] = "unsaturated"
  out[np.asarray(stalled) >= 0] = "stalled"
  out[~finite] = "diverged"
  return out


def of_trajectory(t: dict, threshold: float = SATURATION) -> np.ndarray:
  """``labels`` of a training stage's arrays (``study.stages.Train``: finite, stalled_step, max_prob)."""
  return labels(t["finite"], t["stalled_step"], np.asarray(t["max_prob"])[:, -1], threshold)


def counts(labels_: np.ndarray) -> dict[str, int]:
  """{label: number of runs} over ``LABELS``."""
  labels_ = np.asarray(labels_)
  return {k: int(np.sum(labels_ == k)) for k in LABELS}


def summary(arrays: dict) -> dict[str, dict[str, int]]:
  """{name: counts} for every ``health_<name>`` array of a study's results."""
  return {k[len("health_"):]: counts(v) for k, v in arrays.items() if k.startswith("health_")}


def add(out: dict, name: str, t: dict, threshold: float = SATURATION) -> np.ndarray:
  """Store ``health_<name>`` and ``stalled_step_<name>`` of training arrays ``t`` in ``out``;
  returns the labels."""
  lab = of_trajectory(t, threshold)
  out[f"health_{name}"] = lab
  out[f"stalled_step_{name}"] = np.asarray(t["stalled_step"])
  return lab
