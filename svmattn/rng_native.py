"""The uniforms and normals of ``rng``'s flat float64 draws, its threefry hash of keys and counters,
and the unit rows of the generated data sets, computed on the host by ``native/draws.cc``.

XLA:CPU runs the draw program's threefry and index arithmetic at 20-50 ns a value; the native
loop computes the same integers and the same fused multiply-add at 2-5 ns, so every uniform is
the program's bit for bit (tests/test_rng.py). A normal is sqrt(2) erfinv of that uniform: the C
source repeats the operations of XLA's erfinv program (its polynomials, its fused multiply-adds,
its log1p and the C library's log that it calls) at about half its time a value, with no program
to compile or load, the same bits (tests/test_rng.py). Built once per source, compiler and CPU by
``native_build``; without a compiler, or with SVMATTN_NATIVE_DRAWS=0, ``rng`` runs its XLA
programs, with the same values.
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np

from svmattn import native_build

SOURCE = Path(__file__).with_name("native") / "draws.cc"
FLAGS = native_build.FLAGS
ENV = "SVMATTN_NATIVE_DRAWS"       # 0: the XLA program draws every value

_lock = threading.Lock()
_state: dict = {}


def _load():
  """The C entry point (built and loaded once per process), or None (and why, in _state)."""
  with _lock:
    if "fn" in _state:
      return _state["fn"]
    lib, why = native_build.open_library(SOURCE, FLAGS, ENV)
    fn = None
    if lib is not None:
      fn = lib.SvmattnUniforms
      fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_double,
                     ctypes.c_double, ctypes.c_void_p]
      fn.restype = None
      rows = lib.SvmattnUnitRows
      rows.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p]
      rows.restype = None
      _state["unit_rows"] = rows
      hash_fn = lib.SvmattnThreefry
      hash_fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p]
      hash_fn.restype = None
      _state["threefry"] = hash_fn
      normals = lib.SvmattnNormals
      normals.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_double, ctypes.c_void_p]
      normals.restype = None
      _state["normals"] = normals
    _state["fn"], _state["why"] = fn, why
    return fn


def available() -> bool:
  """True when the native uniforms are built and loaded."""
  return _load() is not None


def why_not() -> str | None:
  """Why the native uniforms are not used (None when they are)."""
  _load()
  return _state.get("why")


def uniforms(keys: np.ndarray, size: int, lo: float, hi: float, out: np.ndarray | None = None) -> np.ndarray:
  """(B, size) float64: the uniform on [lo, hi) of positions 0..size-1 of every key (B, 2) uint32,
  as ``rng``'s draw program computes it (written into ``out``, a contiguous float64 array of B * size
  values, where given)."""
  fn = _load()
  keys = np.ascontiguousarray(keys, np.uint32).reshape(-1, 2)
  if out is None:
    out = np.empty((len(keys), size), np.float64)
  elif out.dtype != np.float64 or not out.flags.c_contiguous or out.size != len(keys) * size:
    raise ValueError(f"uniforms: out must be a contiguous float64 array of {len(keys) * size} values")
  if out.size:
    fn(keys.ctypes.data, 0, size, out.size, float(lo), float(hi), out.ctypes.data)
  return out


def threefry2x32(k1, k2, x1, x2) -> tuple[np.ndarray, np.ndarray]:
  """``rng.threefry2x32`` of uint32 arrays (broadcast together) in one pass on the host: the same
  integers."""
  _load()
  parts = [np.ascontiguousarray(a, np.uint32) for a in np.broadcast_arrays(k1, k2, x1, x2)]
  a, b = np.empty(parts[0].shape, np.uint32), np.empty(parts[0].shape, np.uint32)
  if a.size:
    _state["threefry"](*(p.ctypes.data for p in parts), a.size, a.ctypes.data, b.ctypes.data)
  return a, b


def normals_of_uniforms(flat: np.ndarray, c: float) -> None:
  """flat (N,) contiguous float64 uniforms on (-1, 1) -> c * erfinv(flat), in place, as ``rng``'s
  erfinv program computes it (XLA's erfinv and log1p, the C library's log), the same bits."""
  _load()
  if flat.dtype != np.float64 or not flat.flags.c_contiguous or flat.ndim != 1:
    raise ValueError("normals_of_uniforms: flat must be a contiguous 1-D float64 array")
  if flat.size:
    _state["normals"](flat.ctypes.data, flat.size, float(c), flat.ctypes.data)


def unit_rows(a: np.ndarray) -> np.ndarray:
  """Rows of the float64 array ``a`` (last axis) scaled to unit norm: ``datasets.unit_rows_host``'s
  values bit for bit (the same IEEE operations in the same order), in one pass on the host."""
  _load()
  a = np.ascontiguousarray(a, np.float64)
  out = np.empty_like(a)
  if a.size:
    _state["unit_rows"](a.ctypes.data, a.size // a.shape[-1], a.shape[-1], out.ctypes.data)
  return out


def report() -> dict:
  """What a summary records: {"draws": "native-cpu"} where the uniforms and normals were computed
  here, {"draws": "xla", "draws_why": why} where the XLA programs drew them, {"draws": "not loaded"}
  where nothing was drawn in float64 (the values are the same either way)."""
  if "fn" not in _state:
    return {"draws": "not loaded"}
  if _state["fn"] is not None:
    return {"draws": "native-cpu"}
  return {"draws": "xla", "draws_why": _state["why"]}
