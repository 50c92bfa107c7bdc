"""Starting points from a file: one row of parameters per data set (run).

An init file is a .npz holding, for the parameterization a training starts,

  W (R, d, d)            the W-parameterization's W,
  K (R, d, m), Q (R, d, m)  the (K,Q)-parameterization's K and Q (m = d unless set),
  p (R, d)               prompt attention's prompt,

where row r is the start of run r (so run r starts at the same place whatever the batch
it runs in, and replaying it alone gives the same result). Extra arrays are allowed: one
file may hold W, K and Q for both parameterizations. E.g. N(0,1) entries, as the l_p
mirror-descent paper's code starts, let runs be compared one by one with that code.

    check(path, {"train_W": "W", "train_KQ": "KQ"}, runs, d, m, dtype)   # before any work
    rows(path, "KQ", runs, dtype) -> {"K": (B,d,m), "Q": (B,d,m)}       # per batch

``check`` raises ``svmattn.data.datasets.DataError`` with one sentence naming the problem.
The file is read once per process and modification (``_read`` caches it per path, mtime
and size), so batches do not re-read it.
"""
from __future__ import annotations

import os
import threading

import numpy as np

from svmattn.data.datasets import DataError, npz_arrays

# The arrays each parameterization starts from.
NAMES = {"W": ("W",), "KQ": ("K", "Q"), "p": ("p",)}

_LOCK = threading.Lock()
_CACHE: dict = {}          # abspath -> ((mtime_ns, size), {name: array as stored})


def _names(param: str) -> tuple[str, ...]:
  if param not in NAMES:
    raise ValueError(f"init file: the parameterization {param!r} cannot start from a file; "
                     f"known: {sorted(NAMES)}")
  return NAMES[param]


def _read(path) -> dict[str, np.ndarray]:
  """Every array of the .npz at ``path`` as stored (read-only), cached per (path, mtime, size)."""
  path = os.fspath(path)
  try:
    st = os.stat(path)
  except OSError:
    raise DataError(f"{path}: no such file of starting points (init file)") from None
  if not os.path.isfile(path):
    raise DataError(f"{path}: the init file is not a file")
  key, stamp = os.path.abspath(path), (st.st_mtime_ns, st.st_size)
  with _LOCK:
    hit = _CACHE.get(key)
    if hit is not None and hit[0] == stamp:
      return hit[1]
  try:
    with open(path, "rb") as fh:
      loaded = np.load(fh, allow_pickle=False)
      if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise DataError(f"{path}: the init file must be an .npz archive of named arrays (np.savez), "
                        f"not a single .npy array")
      with loaded:
        arrays = npz_arrays(loaded, loaded.files, path)
  except DataError:
    raise
  except Exception as e:   # BadZipFile, a pickle, a truncated or corrupt member (zlib, CRC), ...
    raise DataError(f"{path}: not a readable .npz file of starting points ({type(e).__name__}: {e})") from e
  for a in arrays.values():
    a.flags.writeable = False
  with _LOCK:
    _CACHE[key] = (stamp, arrays)
  return arrays


def load(path, dtype) -> dict[str, np.ndarray]:
  """The arrays of the .npz at ``path``: the real numeric ones cast to ``dtype``, others as
  stored. Raises DataError for a missing or unreadable file."""
  dtype = np.dtype(dtype)
  return {k: (a.astype(dtype) if a.dtype.kind in "fiu" else a.copy()) for k, a in _read(path).items()}


def _words(names) -> str:
  return " and ".join(names)


def check(path, params: dict[str, str], runs: int, d: int, m: int | None, dtype) -> None:
  """DataError (one sentence) unless the file at ``path`` can start ``runs`` runs (rows
  0..runs-1) of every stage in ``params`` ({stage name: parameterization "W", "KQ" or "p"})
  with tokens of dimension ``d``, (K,Q) width ``m`` (None: d), in ``dtype``: a readable
  .npz, the parameterization's arrays present, real numeric, of shape (rows, d, d) / (rows,
  d, m) / (rows, d), at least ``runs`` rows, finite in the file and once cast to ``dtype``."""
  path = os.fspath(path)
  arrays = _read(path)
  dtype = np.dtype(dtype)
  m = d if m is None else m
  shapes = {"W": (d, d), "K": (d, m), "Q": (d, m), "p": (d,)}
  axes = {"W": "(rows, d, d)", "K": "(rows, d, m)", "Q": "(rows, d, m)", "p": "(rows, d)"}
  by_param: dict[str, list[str]] = {}
  for stage, param in params.items():
    by_param.setdefault(param, []).append(stage)
  for param, stages in by_param.items():
    names = _names(param)
    which = f"the {param} parameterization (stage {', '.join(repr(s) for s in stages)})"
    missing = [k for k in names if k not in arrays]
    if missing:
      raise DataError(f"{path} has no {_words(missing)}, which {which} starts from; "
                      f"it holds {sorted(arrays) or 'no arrays'}")
    for k in names:
      a = arrays[k]
      if a.dtype.kind not in "fiu":
        raise DataError(f"{path}: {k} must hold real numbers (float), got dtype {a.dtype}")
      want = shapes[k]
      if a.shape[1:] != want or a.ndim != len(want) + 1:
        raise DataError(f"{path}: {k} must have shape {axes[k]} = (rows,) + {want} for d={d}"
                        f"{f', m={m}' if k in 'KQ' else ''}, got {a.shape}")
      if a.shape[0] < runs:
        raise DataError(f"{path}: {k} has {a.shape[0]} rows but {runs} runs need one each (row r starts run r)")
      used = a[:runs]
      finite = np.isfinite(used)
      if not np.all(finite):
        raise DataError(f"{path}: {k} has {int(finite.size - np.count_nonzero(finite))} non-finite values "
                        f"(NaN or inf) in its first {runs} rows")
      with np.errstate(over="ignore"):
        overflows = dtype.kind == "f" and not np.all(np.isfinite(used.astype(dtype)))
      if overflows:
        raise DataError(f"{path}: {k} holds values too large for {dtype.name} (they overflow to inf)")


def rows(path, param: str, runs: np.ndarray, dtype) -> dict[str, np.ndarray]:
  """{name: (B, ...)} the starting parameters of the runs ``runs`` (B,) of the
  parameterization ``param`` ("W": {"W"}, "KQ": {"K", "Q"}, "p": {"p"}): row runs[b] of
  each array, cast to ``dtype``; what ``train.loop.start_state`` takes. Raises DataError
  for a missing array or a run beyond the file's rows (``check`` names every problem)."""
  path = os.fspath(path)
  arrays = _read(path)
  runs = np.asarray(runs, dtype=np.int64).reshape(-1)
  dtype = np.dtype(dtype)
  names = _names(param)
  missing = [k for k in names if k not in arrays]
  if missing:
    raise DataError(f"{path} has no {_words(missing)}, which the {param} parameterization starts from; "
                    f"it holds {sorted(arrays) or 'no arrays'}")
  out = {}
  for k in names:
    a = arrays[k]
    if a.dtype.kind not in "fiu" or a.ndim < 1:
      raise DataError(f"{path}: {k} must hold one row of real numbers per run, got dtype {a.dtype}, shape {a.shape}")
    if runs.size and (runs.min() < 0 or runs.max() >= a.shape[0]):
      raise DataError(f"{path}: {k} has {a.shape[0]} rows but run {int(runs.max())} needs row {int(runs.max())} "
                      f"(row r starts run r)")
    out[k] = a[runs].astype(dtype)
  return out
