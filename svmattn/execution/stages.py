"""Device work of a study: what runs on every batch of data sets before the host analysis.

A stage has a ``name`` (its arrays are stored as OUT/work/<unit>_<name>.arrays), a number of
``steps`` (for the progress display) and

    stage.run(batch, runs, seed, progress, checkpoints) -> (arrays, compile_seconds)

where ``batch`` holds the host arrays of the batch's data file (X, Y, Z, v, ...), ``runs``
the run indices (B,), ``progress(k)`` reports k steps done and ``checkpoints`` is an
``io.checkpoint.Checkpoints`` to save after a chunk (when due) and resume from (or None). Every
returned array has the leading axis B. A stage must give bit for bit the same arrays for a
data set whatever the batch it runs in (``train.loop`` does, through fixed-size blocks).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from svmattn.analysis import health
from svmattn.data import datasets as data_lib
from svmattn.train import init_file as init_lib
from svmattn.train import linear as linear_lib
from svmattn.train import loop as train_lib


@dataclasses.dataclass(frozen=True)
class Train:
  """Train ``config`` on every data set from ``train.loop.init_keys(seed, runs)``.

  ``dtype``: cast the data to it before training (None: as stored). Stores the snapshots
  W (B,S,d,d) (K Q^T for (K,Q)), max_prob (B,S), loss (B,S), the final attention (B,n,T),
  the selected tokens (B,n), finite (B,), stalled_step (B,) (``analysis.health``) and the snapshot
  steps (S,) (same for every run), and
  with a trained head its snapshots V (B,S,...).

  ``start``: ((name, values), ...) parameters every run starts from instead of the random
  initialization (e.g. (("p", (0, -1)), ("v", (-1, 0))) for a paper's hand-set start).

  ``init_file``: a .npz of starting points, one row per run (``train.init_file``): run r
  starts from row r of the parameterization's arrays (W, or K and Q) instead of the random
  initialization, so a data set's result does not depend on its batch. It takes precedence
  over ``start`` for those arrays (``start``'s others, e.g. a head v, still apply); a
  trained head starts at the data set's v as with ``start``. None: the random init."""
  name: str
  config: train_lib.TrainConfig
  dtype: object = None
  start: tuple | None = None
  init_file: str | None = None

  @property
  def steps(self) -> int:
    return self.config.steps

  def dataset(self, batch: dict) -> data_lib.Dataset:
    fields = [np.asarray(batch[f]) for f in data_lib.Dataset._fields]
    if self.dtype is not None:
      fields = [a.astype(self.dtype) for a in fields]
    return data_lib.Dataset(*fields)

  def start_for(self, data: data_lib.Dataset, runs: np.ndarray):
    """``train.loop.train``'s ``start`` of these runs ((step 0, State) from ``start`` and
    ``init_file``), or None for the random initialization."""
    if self.start is None and self.init_file is None:
      return None
    B = len(runs)
    dtype = np.asarray(data.X).dtype
    given = {}
    if self.start is not None:
      given = {k: np.broadcast_to(np.asarray(v, dtype), (B,) + np.shape(v)).copy() for k, v in self.start}
    if self.init_file is not None:
      if self.config.module is not None:
        raise ValueError(f"stage {self.name!r}: init_file starts W or (K,Q) models, not a flax module")
      d = np.shape(data.X)[-1]
      init_lib.check(self.init_file, {self.name: self.config.param}, int(np.max(runs)) + 1 if B else 0,
                     d, self.config.m, dtype)
      given.update(init_lib.rows(self.init_file, self.config.param, runs, dtype))
    if self.config.train_head:
      given.setdefault("v", np.asarray(data.v))      # a trained head starts at the data set's v
    return train_lib.start_state(self.config, given)

  def run(self, batch: dict, runs: np.ndarray, seed: int, progress: Callable[[int], None], checkpoints):
    data = self.dataset(batch)
    start = self.start_for(data, runs)
    traj = train_lib.train(self.config, data, train_lib.init_keys(seed, runs), progress, checkpoints, start=start)
    arrays = {"W": traj.W, "max_prob": traj.max_prob, "loss": traj.loss, "attention": traj.attention,
              "selected": traj.selected, "finite": traj.finite, "steps": traj.steps,
              "stalled_step": health.stalled_step(traj.W, traj.loss, traj.steps)}
    if traj.V is not None:
      arrays["V"] = traj.V
    for k, v in (traj.sown or {}).items():     # a flax model's sown values: sown_<path>_<name>
      arrays[f"sown_{k}"] = v
    return arrays, traj.compile_seconds


@dataclasses.dataclass(frozen=True)
class LinearTrain:
  """Train the linear-classifier control (``train.linear``) on the batch's X (B,n,d) and y (B,n):
  logistic regression on +-1 labels (``classes`` = 0) or softmax regression on ``classes`` classes,
  from w = 0, with any optimizer name; mini-batches are drawn from each run's key
  (``train.loop.init_keys(seed, runs)``). Runs in fixed blocks of ``block_size`` data sets (the
  last padded with copies) so a data set's arrays do not depend on its batch. Stores the snapshots
  W (B,S,1,d) (binary: w as a row) or (B,S,k,d), loss (B,S), finite (B,), stalled_step (B,), the
  snapshot steps (S,), max_prob (B,S) = 1 (no attention: never "unsaturated") and last_rise (B,)
  (``train.linear.LinearRun``: the end of the oscillating phase, checked at every step)."""
  name: str
  optimizer: str
  lr: float
  steps: int
  every: int
  classes: int = 0
  minibatch: int = 0
  sampling: str = "without"
  block_size: int = 64

  def run(self, batch: dict, runs: np.ndarray, seed: int, progress: Callable[[int], None], checkpoints):
    X, y = np.asarray(batch["X"], np.float64), np.asarray(batch["y"])
    B = len(runs)
    keys = np.asarray(train_lib.init_keys(seed, runs))
    blocks = train_lib.pad_to_blocks({"X": X, "y": y, "keys": keys}, self.block_size)
    ws, losses, rises = [], [], []
    for start in range(0, len(blocks["X"]), self.block_size):
      part = {k: v[start:start + self.block_size] for k, v in blocks.items()}
      kw = dict(optimizer=self.optimizer, lr=self.lr, steps=self.steps, every=self.every,
                minibatch=self.minibatch, sampling=self.sampling, keys=part["keys"])
      res = (linear_lib.train_multiclass(part["X"], part["y"], self.classes, **kw) if self.classes
             else linear_lib.train_binary(part["X"], part["y"], **kw))
      ws.append(res.w), losses.append(res.loss), rises.append(res.last_rise)
    w, loss = np.concatenate(ws)[:B], np.concatenate(losses)[:B]
    if not self.classes:
      w = w[:, :, None, :]
    if progress is not None:
      progress(self.steps)
    steps = res.steps
    finite = np.all(np.isfinite(w[:, -1].reshape(B, -1)), axis=1) & np.isfinite(loss[:, -1])
    return ({"W": w, "loss": loss, "steps": steps, "finite": finite, "max_prob": np.ones_like(loss),
             "stalled_step": health.stalled_step(w, loss, steps), "last_rise": np.concatenate(rises)[:B]}, 0.0)
