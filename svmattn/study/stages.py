"""Device work of a study: what runs on every batch of data sets before the host analysis.

A stage has a ``name`` (its arrays are stored as OUT/work/<unit>_<name>.npz), a number of
``steps`` (for the progress display) and

    stage.run(batch, runs, seed, progress, checkpoints) -> (arrays, compile_seconds)

where ``batch`` holds the host arrays of the batch's data file (X, Y, Z, v, ...), ``runs``
the run indices (B,), ``progress(k)`` reports k steps done and ``checkpoints`` is an
``io.checkpoint.Checkpoints`` to save after each chunk and resume from (or None). Every
returned array has the leading axis B. A stage must give bit for bit the same arrays for a
data set whatever the batch it runs in (``train.loop`` does, through fixed-size blocks).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from svmattn.data import datasets as data_lib
from svmattn.train import loop as train_lib


@dataclasses.dataclass(frozen=True)
class Train:
  """Train ``config`` on every data set from ``train.loop.init_keys(seed, runs)``.

  ``dtype``: cast the data to it before training (None: as stored). Stores the snapshots
  W (B,S,d,d) (K Q^T for (K,Q)), max_prob (B,S), loss (B,S), the final attention (B,n,T),
  the selected tokens (B,n), finite (B,) and the snapshot steps (S,) (same for every run)."""
  name: str
  config: train_lib.TrainConfig
  dtype: object = None

  @property
  def steps(self) -> int:
    return self.config.steps

  def dataset(self, batch: dict) -> data_lib.Dataset:
    fields = [np.asarray(batch[f]) for f in data_lib.Dataset._fields]
    if self.dtype is not None:
      fields = [a.astype(self.dtype) for a in fields]
    return data_lib.Dataset(*fields)

  def run(self, batch: dict, runs: np.ndarray, seed: int, progress: Callable[[int], None], checkpoints):
    traj = train_lib.train(self.config, self.dataset(batch), train_lib.init_keys(seed, runs), progress,
                           checkpoints)
    arrays = {"W": traj.W, "max_prob": traj.max_prob, "loss": traj.loss, "attention": traj.attention,
              "selected": traj.selected, "finite": traj.finite, "steps": traj.steps}
    return arrays, traj.compile_seconds
