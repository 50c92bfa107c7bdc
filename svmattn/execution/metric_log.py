"""Per-snapshot scalars of a run for TensorBoard or wandb (``--log=tensorboard`` / ``--log=wandb``).

    log = metric_log.open_log("tensorboard", out, study, names)   # names: one per study cell
    log.batch(cell, batch, path)      # the pipeline calls it after each batch's host analysis
    log.close()

After the host analysis of each batch, the batch's analyzed per-run arrays are read once and, for
every per-snapshot array (data sets x snapshots: ``corr_W_fro``, ``loss_adam``, ...; the array's
name carries the parameterization or optimizer), the median over the batch's data sets at each
snapshot step is written as the scalar of that tag at that step; every per-run float value
(``dist_fro``, ``test_acc_W``, ...) as its median at the last step, under ``final/``. Nothing is
logged from inside the jitted training loop, so logging changes no result.

TensorBoard: one TensorBoard run per cell, OUT/tensorboard/CELL (a cell of several batches: one
run per batch, CELL/batch_K, each the median over its own data sets), written with tensorboardX
(pinned in requirements.txt) and read by ``tensorboard --logdir OUT/tensorboard``. wandb: one
offline run (``mode="offline"``, OUT/wandb; ``wandb sync`` uploads it), tags CELL/TAG against the
x-axis ``snapshot_step``; it needs wandb installed (it is not a dependency).

A resumed run logs the batches it analyzes and those analyzed before the kill that were not
logged yet (OUT/tensorboard/logged.json lists the logged batches); a batch analyzed and logged
just before a kill, before that list was saved, is logged twice.
"""
from __future__ import annotations

import json
import os

import numpy as np

from svmattn.execution import pipeline
from svmattn.io import atomic_files as results_io
from svmattn.io import record_names
from svmattn.train import loop as train_lib

KINDS = ("none", "tensorboard", "wandb")
CELL_STEPS = record_names.CELL_STEPS


class LogError(RuntimeError):
  """A metric log that cannot be started (one-line message)."""


def snapshot_steps(settings: dict) -> np.ndarray | None:
  """The snapshot steps of a cell with these settings (steps, snapshot_every, chunk_steps), or None."""
  try:
    plan = train_lib.schedule(int(settings["steps"]), int(settings["snapshot_every"]), int(settings["chunk_steps"]))
    return np.asarray(train_lib.snapshot_steps(plan))
  except (KeyError, TypeError, ValueError):
    return None


def scalars(arrays: dict, steps: np.ndarray | None) -> list[tuple[str, int, float]]:
  """[(tag, step, value)]: each per-snapshot array's median over data sets at each snapshot step,
  each per-run float array's median at the last step (tag ``final/NAME``); non-finite values left
  out of the medians, a step with none finite left out."""
  out = []
  last = int(steps[-1]) if steps is not None and len(steps) else 0
  for name in sorted(arrays):
    a = np.asarray(arrays[name])
    if name == CELL_STEPS or a.dtype.kind != "f" or name.endswith(results_io.DIGEST_SUFFIX) or record_names.PER_ITEM.search(name):
      continue
    if a.ndim == 2 and steps is not None and a.shape[1] == len(steps):
      for j, step in enumerate(steps):
        column = a[:, j][np.isfinite(a[:, j])]
        if column.size:
          out.append((name, int(step), float(np.median(column))))
    elif a.ndim == 1:
      finite = a[np.isfinite(a)]
      if finite.size:
        out.append((f"final/{name}", last, float(np.median(finite))))
  return out


class _Log:
  def __init__(self, root: str, study: pipeline.Study, names: list[str]):
    self.root, self.study, self.names = root, study, names
    os.makedirs(root, exist_ok=True)
    self.batches = [len(pipeline.batch_starts(study, 0, c.runs)) for c in study.cells]
    self.steps = [snapshot_steps({**study.identity, **c.label}) for c in study.cells]
    self.logged_path = os.path.join(self.root, "logged.json")
    try:
      with open(self.logged_path) as f:
        self.logged = set(json.load(f))
    except (OSError, ValueError, TypeError):
      self.logged = set()

  def run_name(self, cell: int, batch: int) -> str:
    name = self.names[cell]
    return name if self.batches[cell] <= 1 else f"{name}/batch_{batch:04d}"

  def batch(self, cell: int, batch: int, path: str) -> None:
    key = f"{cell}:{batch}"
    if key in self.logged:
      return
    arrays = pipeline.load_arrays(path)
    steps = arrays.get(CELL_STEPS)
    values = scalars(arrays, np.asarray(steps) if steps is not None and np.ndim(steps) == 1 else self.steps[cell])
    self.write(self.run_name(cell, batch), values)
    self.logged.add(key)
    results_io.write_json(self.logged_path, sorted(self.logged))

  def close(self) -> None:
    pass


class TensorBoard(_Log):
  def __init__(self, out, study, names):
    super().__init__(os.path.join(out, "tensorboard"), study, names)

  def write(self, run: str, values) -> None:
    from tensorboardX import SummaryWriter
    writer = SummaryWriter(logdir=os.path.join(self.root, run), flush_secs=3600)
    try:
      for tag, step, value in values:
        writer.add_scalar(tag, value, global_step=step)
    finally:
      writer.close()


class Wandb(_Log):
  def __init__(self, out, study, names):
    try:
      import wandb
    except ImportError:
      raise LogError("--log=wandb: wandb is not installed (pip install wandb); or use --log=tensorboard") from None
    super().__init__(os.path.join(out, "wandb"), study, names)
    self.wandb = wandb
    self.run = wandb.init(project="svmattn", name=study.name, dir=self.root, mode="offline",
                          config={k: v for k, v in study.identity.items() if isinstance(v, (int, float, str, bool))})
    self.run.define_metric("snapshot_step")
    self.run.define_metric("*", step_metric="snapshot_step")

  def write(self, run: str, values) -> None:
    by_step: dict[int, dict] = {}
    for tag, step, value in values:
      by_step.setdefault(step, {})[f"{run}/{tag}"] = value
    for step in sorted(by_step):
      self.run.log({"snapshot_step": step, **by_step[step]})

  def close(self) -> None:
    self.run.finish()


def open_log(kind: str, out: str, study: pipeline.Study, names: list[str]):
  """The metric log of ``kind`` (KINDS) for ``study`` in ``out``; None for "none"."""
  if kind in (None, "none"):
    return None
  if kind == "tensorboard":
    return TensorBoard(out, study, names)
  if kind == "wandb":
    return Wandb(out, study, names)
  raise LogError(f"--log={kind}: must be one of {', '.join(KINDS)}")
