"""The chunks of a training run, written once for every kernel: the schedule of snapshots and
calls, the loop over chunks with its checkpoints, resume and progress, and the result.

``train.loop.train`` decides which kernel trains (the XLA programs, or the native CPU kernel of
``train.native_train``) and gives ``run_chunks`` that kernel's step: a function that advances the
state by one chunk and writes its snapshots. Where and how often a run is checkpointed, where a
resumed run starts and what progress reports are the same whatever the kernel.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import numpy as np


def config_snapshot_steps(config: Any) -> np.ndarray:
  """(S,) the step of every snapshot ``train`` records for ``config`` from step 0."""
  return snapshot_steps(config_schedule(config, config.steps))


def config_schedule(config: Any, steps: int) -> list[tuple[int, int]]:
  """The calls that advance ``steps`` steps of ``config``: ``schedule``'s, or with ``chunk_every``
  (a replay observing every step of a run) the chunks of a run snapshotting every ``chunk_every``
  steps, each cut into snapshots of ``snapshot_every`` steps (which must divide it). The native
  kernel's anchored step (numerics version 14) depends on where the calls begin, so a replay keeps
  its run's chunk boundaries."""
  if not config.chunk_every or config.chunk_every == config.snapshot_every:
    return schedule(steps, config.snapshot_every, config.chunk_steps)
  plan = []
  for every, k in schedule(steps, config.chunk_every, config.chunk_steps):
    if (every * k) % config.snapshot_every:
      raise ValueError(f"TrainConfig: snapshot_every {config.snapshot_every} does not divide a chunk of "
                       f"{every * k} steps of the schedule of chunk_every {config.chunk_every}")
    plan.append((config.snapshot_every, every * k // config.snapshot_every))
  return plan


class State(NamedTuple):
  params: Any
  opt_state: Any


class Trajectory(NamedTuple):
  """Host (NumPy) result of ``train`` for a batch of B data sets."""
  steps: np.ndarray       # (S,) step of each snapshot
  W: np.ndarray           # (B, S, d, d) W or K Q^T at each snapshot
  max_prob: np.ndarray    # (B, S) (1/n) sum_i max_t s_it
  loss: np.ndarray        # (B, S)
  attention: np.ndarray   # (B, n, T) final softmax ((B, n, T, T) for seq2seq models)
  params: Any             # final parameters, leaves (B, ...)
  compile_seconds: float
  run_seconds: float
  V: np.ndarray | None = None   # (B, S, ...) the trained head at each snapshot (train_head), else None
  sown: dict | None = None      # flax models: {name: (B, S, d, d)} each sown "kq" at each snapshot, and
                                # {name: (B, ...)} every other sown value (attention, ...) at the end

  @property
  def W_final(self) -> np.ndarray:
    return self.W[:, -1]

  @property
  def selected(self) -> np.ndarray:
    """alpha_hat (B, n) (or (B, n, T) for seq2seq): the token of largest final attention."""
    return np.argmax(self.attention, axis=-1)

  @property
  def finite(self) -> np.ndarray:
    """(B,) False for runs that diverged to NaN/inf."""
    return np.all(np.isfinite(self.W_final.reshape(len(self.W_final), -1)), axis=1) & np.isfinite(self.loss[:, -1])


def restore_chunk(checkpoints, shapes, snaps: dict):
  """(chunks done, State, snapshots) of the newest checkpoint in ``checkpoints`` (None: none, or
  no checkpoints); ``shapes`` gives the state's structure, ``snaps`` the snapshots' shapes."""
  if checkpoints is None:
    return None
  treedef = jax.tree_util.tree_structure(shapes)
  template = {"state": {str(i): np.zeros(x.shape, x.dtype) for i, x in enumerate(jax.tree_util.tree_leaves(shapes))},
              "snapshots": snaps, "chunk": np.zeros((), np.int64)}
  found = checkpoints.restore_latest(template)
  if found is None:
    return None
  _, tree = found
  state = jax.tree_util.tree_unflatten(treedef, [np.asarray(tree["state"][str(i)]) for i in range(treedef.num_leaves)])
  return int(tree["chunk"]), state, {k: np.array(v) for k, v in tree["snapshots"].items()}


def save_chunk(checkpoints, chunk: int, state, snaps: dict) -> None:
  """Checkpoint the state (host arrays) and the snapshots after ``chunk`` chunks, when a save is
  due (``Checkpoints.due``: --checkpoint_every_s since the last)."""
  if not checkpoints.due():
    return
  leaves = jax.tree_util.tree_leaves(state)
  checkpoints.save(chunk, {"state": {str(i): x for i, x in enumerate(leaves)}, "snapshots": snaps,
                           "chunk": np.asarray(chunk, np.int64)})


def schedule(steps: int, every: int, chunk_steps: int) -> list[tuple[int, int]]:
  """The (every, snapshots) calls that advance ``steps`` steps, snapshot each ``every``."""
  per_chunk = max(1, chunk_steps // every)
  plan, done = [], 0
  while done < steps:
    full = (steps - done) // every
    if full >= 1:
      k = min(per_chunk, full)
      plan.append((every, k))
      done += k * every
    else:
      plan.append((steps - done, 1))
      done = steps
  return plan


def snapshot_steps(plan: list[tuple[int, int]]) -> np.ndarray:
  """(S,) the step of every snapshot of a schedule, 0 included."""
  steps = [0]
  for every, snaps in plan:
    steps.extend(steps[-1] + every * np.arange(1, snaps + 1))
  return np.asarray(steps)


def plan_from(config, start) -> tuple[int, list[tuple[int, int]], np.ndarray]:
  """(first step, the calls left, the snapshot steps) of a run of ``config`` from ``start`` ((step,
  State) or None: step 0); ValueError for a start step outside [0, config.steps]."""
  first_step = 0 if start is None else int(start[0])
  if not 0 <= first_step <= config.steps:
    raise ValueError(f"train: start step {first_step} outside [0, {config.steps}]")
  plan = config_schedule(config, config.steps - first_step)
  return first_step, plan, first_step + snapshot_steps(plan)


def run_chunks(plan: list[tuple[int, int]], begin: int, snaps: dict, step: Callable, state_now: Callable,
               checkpoints=None, progress: Callable[[int], None] | None = None) -> None:
  """Chunks ``begin``.. of ``plan`` (no step to take: one chunk of no snapshot, which observes the
  start). ``step(chunk, every, k, pos, observe_start)`` advances the state by the chunk's k
  snapshots of ``every`` steps and writes snapshots pos..pos+k-1 of ``snaps`` (and snapshot 0, the
  starting state's, where ``observe_start``). After each chunk but the last, a checkpoint of
  ``state_now()`` (host arrays) and the snapshots is saved where one is due; ``progress`` is told
  the steps done (those of a resumed run's finished chunks first)."""
  runs = plan or [(1, 0)]
  if progress is not None and begin:
    progress(sum(every * k for every, k in plan[:begin]))
  pos = 1 + sum(k for _, k in plan[:begin])
  for chunk in range(begin, len(runs)):
    every, k = runs[chunk]
    step(chunk, every, k, pos, chunk == begin and pos == 1)
    pos += k
    if checkpoints is not None and chunk + 1 < len(plan):   # (after the last chunk the caller saves results)
      save_chunk(checkpoints, chunk + 1, state_now(), snaps)
    if progress is not None and k:
      progress(every * k)
