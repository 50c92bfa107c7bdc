"""Checkpoints of a training batch (orbax-checkpoint), with clear errors.

    ckpt = Checkpoints(directory, meta={"flags": ..., "batch": 3, "shapes": ...}, every_s=10.0)
    if ckpt.due():                        # after a chunk: at least every_s since the last save
      ckpt.save(step, tree)               # keeps the last ``keep``
    found = ckpt.restore_latest(template)  # (step, tree) or None

``meta`` identifies the run: restoring a checkpoint whose meta differs (other flags,
other shapes, another batch) raises CheckpointError naming the differing fields,
instead of silently continuing another run. A step that cannot be read (a save
killed half-way that left files behind, corrupt files) is skipped with a warning
and the previous complete step is used; orbax itself only exposes steps whose
save finished (it writes to a temporary name and renames).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
  """A checkpoint that cannot be used for this run, with the reason."""


def _normalize(meta):
  return json.loads(json.dumps(meta, sort_keys=True, default=lambda x: np.asarray(x).tolist()))


def _differences(saved, wanted, names=("checkpoint", "this run"), prefix=""):
  out = []
  for key in sorted(set(saved) | set(wanted)):
    a, b = saved.get(key, "<missing>"), wanted.get(key, "<missing>")
    if isinstance(a, dict) and isinstance(b, dict):
      out += _differences(a, b, names, f"{prefix}{key}.")
    elif a != b:
      out.append(f"{prefix}{key}: {names[0]} has {a!r}, {names[1]} has {b!r}")
  return out


class Checkpoints:
  """The checkpoints of one run in ``directory`` (created if missing). ``every_s``: the training
  loop saves after a chunk only when at least this many seconds have passed since the last save
  (or since this object was made), so that saving (about 0.1 s each with orbax) stays a small share
  of the run; 0 saves after every chunk. Which chunks were saved never changes a result: a run
  resumed from any chunk ends bit for bit as an uninterrupted one."""

  def __init__(self, directory: str, meta: dict, keep: int = 3, every_s: float = 0.0):
    self.directory = os.path.abspath(directory)
    self.meta = _normalize(meta)
    self.keep = keep
    self.every_s = float(every_s)
    self._last = time.monotonic()
    self._mgr = None     # the orbax manager, opened on first use (importing orbax takes ~0.4 s)
    try:
      os.makedirs(self.directory, exist_ok=True)
    except OSError as e:
      raise CheckpointError(f"{self.directory}: cannot open checkpoints ({type(e).__name__}: {e})") from e

  @property
  def _manager(self):
    if self._mgr is None:
      import orbax.checkpoint as ocp
      self._ocp = ocp
      options = ocp.CheckpointManagerOptions(max_to_keep=self.keep, create=True, enable_async_checkpointing=False)
      try:
        self._mgr = ocp.CheckpointManager(self.directory, options=options)
      except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"{self.directory}: cannot open checkpoints ({type(e).__name__}: {e})") from e
    return self._mgr

  def steps(self) -> list[int]:
    if self._mgr is None and not any(name.isdigit() for name in os.listdir(self.directory)):
      return []            # nothing saved yet: no need to open orbax
    return sorted(self._manager.all_steps())

  def due(self) -> bool:
    """Whether at least ``every_s`` seconds have passed since the last save (or since this object
    was made)."""
    return time.monotonic() - self._last >= self.every_s

  def save(self, step: int, tree: Any) -> None:
    """Save ``tree`` as ``step``, replacing a checkpoint of that step that could not be read
    (a save killed half-way, corrupt files): training that went back to an older step
    writes it again."""
    manager, ocp = self._manager, self._ocp
    where = os.path.join(self.directory, str(int(step)))
    if int(step) in manager.all_steps():
      log.warning("checkpoint %s: replacing an unreadable checkpoint of the same step", where)
      manager.delete(int(step))
    if os.path.exists(where):
      log.warning("checkpoint %s: replacing an unfinished save", where)
      shutil.rmtree(where)
      manager.reload()
    manager.save(int(step), args=ocp.args.Composite(state=ocp.args.StandardSave(tree),
                                                 meta=ocp.args.JsonSave(self.meta)), force=True)
    manager.wait_until_finished()
    self._last = time.monotonic()

  def _read_meta(self, step):
    path = os.path.join(self.directory, str(step), "meta", "metadata")
    with open(path) as f:
      return json.load(f)

  def restore_latest(self, template: Any):
    """(step, tree) of the newest readable checkpoint, or None when there is none.

    Raises CheckpointError if the newest readable checkpoint belongs to another run."""
    for step in reversed(self.steps()):
      ocp = self._ocp
      where = os.path.join(self.directory, str(step))
      try:
        saved = self._read_meta(step)
      except (OSError, ValueError) as e:
        log.warning("checkpoint %s: unreadable metadata (%s); trying an older step", where, e)
        continue
      diff = _differences(saved, self.meta)
      if diff:
        raise CheckpointError(f"checkpoint {where} belongs to another run: " + "; ".join(diff[:6])
                              + ". Use another --out, or remove it to start afresh.")
      try:
        restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(template)))
      except Exception as e:  # noqa: BLE001 - corrupt or partial files
        log.warning("checkpoint %s is unreadable (%s: %s); trying an older step", where, type(e).__name__,
                    str(e)[:200])
        continue
      return step, restored["state"]
    return None

  def restore(self, step: int):
    """The tree saved at ``step`` (a chunk index), as saved (no template), after checking
    that it belongs to this run."""
    where = os.path.join(self.directory, str(step))
    if step not in self.steps():
      raise CheckpointError(f"no checkpoint {where}; steps present: {self.steps()}")
    try:
      diff = _differences(self._read_meta(step), self.meta)
    except (OSError, ValueError) as e:
      raise CheckpointError(f"checkpoint {where}: unreadable metadata ({e})") from e
    if diff:
      raise CheckpointError(f"checkpoint {where} belongs to another run: " + "; ".join(diff[:6]))
    try:
      ocp = self._ocp
      return self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
    except Exception as e:  # noqa: BLE001
      raise CheckpointError(f"checkpoint {where} is unreadable ({type(e).__name__}: {str(e)[:200]})") from e

  def remove(self) -> None:
    """Delete every checkpoint of this run (after its results are safely written)."""
    self.close()
    shutil.rmtree(self.directory, ignore_errors=True)

  def close(self) -> None:
    if self._mgr is not None:
      self._mgr.close()
