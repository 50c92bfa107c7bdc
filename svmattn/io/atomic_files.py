"""Writing results: atomic files (write to a temporary name, then rename).

A crash mid-write never leaves a half-written file under the final name, and
an earlier file of that name stays intact until the new one is complete.

What each experiment writes with these functions (every key of results.npz and
every field of summary.json) is documented in docs/results.md.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from typing import Any, Iterator

import numpy as np

# The per-run record's name for the digests of a per-run matrix KEY: KEY__digest (``execution.study_runner.lean``)
DIGEST_SUFFIX = "__digest"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[str]:
  """Yields a temporary path beside ``path``; renamed onto ``path`` on success."""
  path = os.fspath(path)
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp" + suffix, dir=directory)
  os.close(fd)
  try:
    yield tmp
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def file_sha256(path: str) -> str:
  """The sha256 of a file's bytes (hex)."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def write_npz(path, arrays: dict[str, Any], compressed: bool = False) -> None:
  """Arrays as an .npz, uncompressed unless ``compressed`` (no pickled objects: strings become
  unicode arrays; np.load reads either)."""
  arrays = {k: np.asarray(v) for k, v in arrays.items()}
  for k, v in arrays.items():
    if v.dtype == object:
      raise TypeError(f"write_npz: array {k!r} has dtype object; results files hold no pickles")
  with atomic_path(path, ".npz") as tmp:
    with open(tmp, "wb") as f:
      (np.savez_compressed if compressed else np.savez)(f, **arrays)


def _jsonable(x):
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, np.ndarray):
    return _jsonable(x.tolist())
  if isinstance(x, np.generic):
    return x.item()
  if isinstance(x, float) and not np.isfinite(x):
    return None
  return x


def write_json(path, obj: Any) -> None:
  with atomic_path(path, ".json") as tmp:
    with open(tmp, "w") as f:
      json.dump(_jsonable(obj), f, indent=2, sort_keys=False)
      f.write("\n")


def save_figure(fig, path, dpi: int = 120) -> None:
  """A matplotlib figure as PNG, atomically."""
  with atomic_path(path, ".png") as tmp:
    fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format="png")
