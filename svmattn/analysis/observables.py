"""Per-snapshot quantities a user chooses (``--observe=NAME,...``; docs/science.md section 22).

Each is a pure function of one run's snapshots and its data set, computed on the host after
training, so observing never changes a trajectory:

    fn(W, data) -> array (S, ...)
      W     (S, d, d): the snapshots of W (K Q^T for (K,Q))
      data  {"X" (n,T,d), "Z" (n,d), "Y" (n,), "v" (d,), "selected" (n,): the final selection,
             "loss" (S,): the training loss, "steps" (S,): the snapshot steps}

Built in: ``singular_values`` (S, d), ``stable_rank`` ||W||_F^2 / sigma_1^2, ``rank`` (singular
values above RANK_RTOL sigma_1), ``norm`` (Frobenius), ``attention_entropy`` (the mean over
sequences of the entropy of softmax(X_i W z_i), in nats), ``margin`` (the Att-SVM margin of the
current direction at the final selection: min over i and t != alpha_i of
(x_{i alpha_i} - x_it)^T (W / ||W||_F) z_i; NaN at W = 0), ``plateau_exit_rank`` (NaN except at the
snapshots where the loss leaves a plateau, ``plateau_exits``' stated rule: there the rank of W).
A user adds their own, in a few lines:

    from svmattn.analysis import observables
    observables.register("trace", lambda W, data: np.trace(W, axis1=-2, axis2=-1))

and names it in ``--observe`` (a config file's ``observe``) of the same process. Each NAME of
parameterization P becomes ``NAME_P`` (B, S, ...) in results.npz and a column of
``results.load_curves`` where it is one number per snapshot.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from svmattn.analysis import metrics
from svmattn.svm import att_svm as svm_lib

RANK_RTOL = 1e-4     # ``rank``: singular values above this times the largest (as ``metrics.numerical_rank``)


def _singular_values(W, data):
  return metrics.singular_values(W)


def _stable_rank(W, data):
  s = metrics.singular_values(W)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(s[:, 0] > 0, np.sum(s * s, axis=-1) / np.where(s[:, 0] > 0, s[:, 0] ** 2, 1), np.nan)


def _rank(W, data):
  return metrics.numerical_rank(W, RANK_RTOL)


def _norm(W, data):
  return np.sqrt(np.sum(W * W, axis=(-2, -1)))


def _attention_entropy(W, data):
  X, Z = data["X"], data["Z"]
  logits = np.einsum("ntd,sde,ne->snt", X, W, Z)
  logits -= logits.max(axis=-1, keepdims=True)
  p = np.exp(logits)
  p /= p.sum(axis=-1, keepdims=True)
  with np.errstate(divide="ignore", invalid="ignore"):
    h = -np.sum(np.where(p > 0, p * np.log(p), 0.0), axis=-1)
  return h.mean(axis=-1)


def _margin(W, data):
  A, _ = svm_lib.margin_matrix(data["X"], data["Z"], np.asarray(data["selected"], np.int64))
  norm = _norm(W, data)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(norm > 0, np.min(W.reshape(len(W), -1) @ A.T, axis=-1) / np.where(norm > 0, norm, 1), np.nan)


PLATEAU_RATE = 1e-5   # a snapshot is on a plateau where the loss fell by less than this, relative, per step
PLATEAU_MIN = 5       # snapshots in a row that make a plateau


def plateau_exits(loss: np.ndarray, steps: np.ndarray, rate: float = PLATEAU_RATE, least: int = PLATEAU_MIN) -> np.ndarray:
  """(S,) bool: the snapshots at which the loss leaves a plateau. The rule: the loss's relative
  decrease per step since the snapshot before, (L_{k-1} - L_k) / (L_{k-1} (t_k - t_{k-1})), is below
  ``rate`` for at least ``least`` snapshots in a row, and at snapshot k it is at least ``rate``."""
  loss, steps = np.asarray(loss, np.float64), np.asarray(steps, np.float64)
  out = np.zeros(len(loss), bool)
  if len(loss) < 2:
    return out
  with np.errstate(invalid="ignore", divide="ignore"):
    fall = (loss[:-1] - loss[1:]) / (np.abs(loss[:-1]) * np.diff(steps))
  flat = 0
  for k, r in enumerate(fall, start=1):
    if np.isfinite(r) and r < rate:
      flat += 1
      continue
    if flat >= least and np.isfinite(r):
      out[k] = True
    flat = 0
  return out


def _plateau_exit_rank(W, data):
  """NaN, except where the loss leaves a plateau (``plateau_exits``): the rank of W there."""
  exits = plateau_exits(data["loss"], data["steps"])
  return np.where(exits, metrics.numerical_rank(W, RANK_RTOL).astype(np.float64), np.nan)


REGISTRY: dict[str, Callable] = {"singular_values": _singular_values, "stable_rank": _stable_rank, "rank": _rank,
                                 "norm": _norm, "attention_entropy": _attention_entropy, "margin": _margin,
                                 "plateau_exit_rank": _plateau_exit_rank}
BUILT_IN = tuple(REGISTRY)


class ObservableError(ValueError):
  """An unknown observable, or one whose function failed or returned no per-snapshot array."""


def register(name: str, fn: Callable) -> None:
  """Make ``fn(W, data) -> (S, ...)`` observable as ``name`` (letters, digits and _; not a built-in)."""
  if not (isinstance(name, str) and name.replace("_", "").isalnum() and name[0].isalpha()):
    raise ObservableError(f"observables.register: the name must be letters, digits and _, got {name!r}")
  if name in BUILT_IN:
    raise ObservableError(f"observables.register: {name!r} is built in")
  if not callable(fn):
    raise ObservableError(f"observables.register: {name!r} needs a function fn(W, data), got {type(fn).__name__}")
  REGISTRY[name] = fn


def check(names) -> str | None:
  """None, or the problem with ``names`` (for a settings field)."""
  unknown = [n for n in names if n not in REGISTRY]
  if unknown:
    return f"unknown observable(s) {unknown}; known: {', '.join(REGISTRY)}"
  if len(set(names)) != len(list(names)):
    return "names an observable twice"
  return None


def compute(names, W: np.ndarray, data: dict, selected: np.ndarray, loss: np.ndarray | None = None,
            steps: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """{name: (B, S, ...)} of every name for the snapshots W (B, S, d, d) of a batch's runs, on
  its data (X (B,n,T,d), Z (B,n,d), Y, v), final selections (B, n), and the loss (B, S) and
  snapshot steps (S,) of the training (``data["loss"]``, ``data["steps"]`` of each run's)."""
  problem = check(names)
  if problem:
    raise ObservableError(problem)
  W = np.asarray(W, np.float64)
  out = {}
  for name in names:
    rows = []
    for b in range(W.shape[0]):
      one = {"X": np.asarray(data["X"][b], np.float64), "Z": np.asarray(data["Z"][b], np.float64),
             "Y": np.asarray(data["Y"][b], np.float64), "v": np.asarray(data["v"][b], np.float64),
             "selected": np.asarray(selected[b]),
             "loss": None if loss is None else np.asarray(loss[b], np.float64),
             "steps": None if steps is None else np.asarray(steps)}
      try:
        value = np.asarray(REGISTRY[name](W[b], one))
      except Exception as e:  # noqa: BLE001 - a user's function: named, in one line
        raise ObservableError(f"observable {name!r} failed: {type(e).__name__}: {e}") from None
      if value.ndim < 1 or value.shape[0] != W.shape[1]:
        raise ObservableError(f"observable {name!r} must return one value (or array) per snapshot, shape "
                              f"({W.shape[1]}, ...), got {value.shape}")
      rows.append(value)
    out[name] = np.stack(rows)
  return out
