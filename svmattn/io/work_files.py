"""The pipeline's work files (OUT/work/*.arrays): a batch's data, a stage's arrays, an analyzed batch.

    work_files.write(path, {"W": W, "loss": loss})    # atomically (results.atomic_path)
    work_files.read(path)                             # {name: array}, as written
    work_files.read(path, ["loss"])                   # only those
    work_files.names(path)                            # the names, reading no array
    work_files.check(path)                            # the index and the file's size agree, or WorkFileError

They live only while a run does (deleted once its results are written), so they hold the arrays'
bytes as they are, after an index: no zip container and no CRC. A .npz costs both on writing and on
reading: E5 wrote and read back about 1.3 GB of work files per run (every draw's W at every
snapshot), 28.8 ms to write and 9.3 ms to read 16.8 MB as .npz against 4-7 ms and 1.6 ms raw on a
2-core host. A file is written under a temporary name and renamed, so a kill never leaves a partial
file under the final name; a damaged one (overwritten, truncated) fails ``check``.

Layout: MAGIC, the index's length (8 bytes, little-endian), the index (JSON: per array its name,
dtype (``dtype.str``), shape, memory order, offset and size in bytes), then each array's bytes at
a 64-byte aligned offset; the file ends with the last array. An array keeps its memory order as
.npy keeps it: Fortran where it is Fortran- but not C-contiguous, else C (the order decides the
order of a reduction's sums; ``study.pipeline._as_loaded`` gives the same). Arrays of objects are
refused, as ``results.write_npz`` refuses them.
"""
from __future__ import annotations

import json
import os
import struct
from typing import Any, Sequence

import numpy as np

from svmattn.io import atomic_files as results_io

MAGIC = b"SVMATTN-ARRAYS-1"
ALIGN = 64


class WorkFileError(ValueError):
  """A work file that is not one, or is damaged: one line naming the file."""


def _order(a: np.ndarray) -> str:
  return "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"


def _c_view(a: np.ndarray, order: str) -> np.ndarray:
  """The array's bytes in ``order`` as a C-contiguous array (a view where they already are)."""
  return np.ascontiguousarray(a.T if order == "F" else a)


def write(path, arrays: dict[str, Any]) -> None:
  """``arrays`` (name -> array-like) as a work file at ``path``, atomically."""
  entries, blobs, offset = [], [], 0
  for name, value in arrays.items():
    a = np.asarray(value)
    if a.dtype.hasobject:
      raise TypeError(f"work_files.write: array {name!r} has dtype object; work files hold no pickles")
    order = _order(a)
    blob = _c_view(a, order)
    offset = -(-offset // ALIGN) * ALIGN
    entries.append({"name": str(name), "dtype": a.dtype.str, "shape": list(a.shape), "order": order,
                    "offset": offset, "nbytes": int(blob.nbytes)})
    blobs.append(blob)
    offset += blob.nbytes
  index = json.dumps(entries).encode()
  start = -(-(len(MAGIC) + 8 + len(index)) // ALIGN) * ALIGN
  with results_io.atomic_path(path, ".arrays") as tmp:
    with open(tmp, "wb") as f:
      head = MAGIC + struct.pack("<Q", len(index)) + index
      f.write(head + b"\0" * (start - len(head)))
      at = start
      for entry, blob in zip(entries, blobs):
        gap = start + entry["offset"] - at
        if gap:
          f.write(b"\0" * gap)
        if blob.nbytes:
          f.write(memoryview(blob.reshape(-1).view(np.uint8)))
        at = start + entry["offset"] + blob.nbytes


def _index(f, path) -> tuple[list, int]:
  """(entries, where the data starts) of an open work file; WorkFileError if it is not a whole one."""
  head = f.read(len(MAGIC) + 8)
  if len(head) < len(MAGIC) + 8 or head[:len(MAGIC)] != MAGIC:
    raise WorkFileError(f"{path}: not a work file (no {MAGIC.decode()} header)")
  (length,) = struct.unpack("<Q", head[len(MAGIC):])
  try:
    entries = json.loads(f.read(length))
    start = -(-(len(MAGIC) + 8 + length) // ALIGN) * ALIGN
    end = max([start + e["offset"] + e["nbytes"] for e in entries], default=start)
    for e in entries:
      if np.dtype(e["dtype"]).itemsize * int(np.prod(e["shape"], dtype=np.int64)) != e["nbytes"]:
        raise ValueError(f"array {e['name']!r}: {e['nbytes']} bytes for {e['dtype']} {e['shape']}")
  except (ValueError, KeyError, TypeError) as e:
    raise WorkFileError(f"{path}: damaged index ({e})") from None
  size = os.fstat(f.fileno()).st_size
  if size != end:
    raise WorkFileError(f"{path}: {size} bytes, its index says {end} (truncated or damaged)")
  return entries, start


def check(path) -> None:
  """Raises WorkFileError unless ``path`` is a whole work file (its header, index and size)."""
  with open(path, "rb") as f:
    _index(f, path)


def names(path) -> list[str]:
  with open(path, "rb") as f:
    return [e["name"] for e in _index(f, path)[0]]


def read(path, only: Sequence[str] | None = None) -> dict[str, np.ndarray]:
  """{name: array} of the work file (``only``: those names; KeyError for one it lacks): writable
  arrays of the dtype, shape and memory order written."""
  out = {}
  with open(path, "rb") as f:
    entries, start = _index(f, path)
    by_name = {e["name"]: e for e in entries}
    for name in (by_name if only is None else only):
      e = by_name[name]
      a = np.empty(e["shape"], np.dtype(e["dtype"]), order=e["order"])
      if e["nbytes"]:
        f.seek(start + e["offset"])
        view = _c_view(a, e["order"]).reshape(-1).view(np.uint8)       # a's own memory
        if f.readinto(memoryview(view)) != e["nbytes"]:
          raise WorkFileError(f"{path}: array {name!r} is cut short")
      out[name] = a
  return out
