"""--overwrite: a new run written beside the finished one in --out, which it replaces only once complete.

    stage = overwrite.staging(out)     # OUT's sibling .NAME.overwrite: where the new run writes
    ...                                # (killed here: OUT is the old run, whole; --overwrite --resume continues)
    overwrite.swap(out, stage)         # OUT replaced whole (stale replays, figures and sweep cells included)
    overwrite.recover(out)             # on the next run into OUT: a swap killed between its renames completed

The swap is two renames (OUT -> .NAME.replaced, the stage -> OUT) and a delete; a kill between the
renames leaves no OUT but both directories whole, and ``recover`` finishes the swap.
"""
from __future__ import annotations

import logging
import os
import shutil

log = logging.getLogger(__name__)


def _sibling(out: str, suffix: str) -> str:
  parent, name = os.path.split(os.path.abspath(out).rstrip(os.sep))
  return os.path.join(parent, f".{name}.{suffix}")


def staging(out: str) -> str:
  """Where an --overwrite run of ``out`` writes until it is complete."""
  return _sibling(out, "overwrite")


def finished(directory: str) -> bool:
  """Whether ``directory`` holds a finished run: its summary written, its work directory removed."""
  return os.path.isfile(os.path.join(directory, "summary.json")) and \
      not os.path.isdir(os.path.join(directory, "work"))


def swap(out: str, stage: str) -> None:
  """Replace ``out`` whole by the finished run in ``stage``."""
  old = _sibling(out, "replaced")
  shutil.rmtree(old, ignore_errors=True)
  if os.path.exists(out):
    os.replace(out, old)
  os.replace(stage, out)
  shutil.rmtree(old, ignore_errors=True)


def recover(out: str) -> None:
  """Complete a swap that a kill interrupted: a finished stage and no ``out`` (the stage moved
  into place), and a replaced run left beside ``out`` (deleted)."""
  stage, old = staging(out), _sibling(out, "replaced")
  if not os.path.exists(out) and os.path.isdir(stage) and finished(stage):
    log.warning("%s: completing the replacement of the old run by the --overwrite run that finished in %s",
                out, stage)
    os.replace(stage, out)
  if os.path.exists(out) and os.path.isdir(old):
    shutil.rmtree(old, ignore_errors=True)
