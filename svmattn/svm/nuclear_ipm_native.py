"""``nuclear_ipm``'s interior point for one problem at a time in C (``native/nuclear_ipm.cc``).

The NumPy iteration works on stacks of tiny matrices (k = p + q up to 35 on E3, N up to 150), where
every batched Cholesky, inverse, eigenvalue and solve call costs more in its per-matrix overhead
than in arithmetic. The C source runs the same iteration (the same directions, step rule,
tolerances and stopping rule) with its own linear algebra, one problem per call with the GIL
released, so threads solve problems side by side. Its rounding differs from LAPACK's: a solution
agrees with the NumPy one to the method's accuracy (a relative duality gap of 1e-10), not bit for
bit, and every problem's result is the same bits whatever else is solved (tests/test_svm_nuclear_ipm.py).
Built once per source, compiler and CPU by ``native_build``; without a compiler, or with
SVMATTN_NATIVE_IPM=0, ``nuclear_ipm`` runs its NumPy iteration, and every summary records which one
ran (``report``).
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np

from svmattn import native_build

SOURCE = Path(__file__).parent.parent / "native" / "nuclear_ipm.cc"
FLAGS = native_build.FLAGS
ENV = "SVMATTN_NATIVE_IPM"          # 0: the NumPy iteration solves every problem

_lock = threading.Lock()
_state: dict = {}


def _load():
  """The C entry point (built and loaded once per process), or None (and why, in _state)."""
  i64, ptr = ctypes.c_int64, ctypes.c_void_p
  return native_build.entry_point(_state, _lock, SOURCE, FLAGS, ENV, "SvmattnNucIpm",
                                  [i64, i64, i64, ptr, ptr, i64, ctypes.c_double, ctypes.c_double,
                                   ctypes.c_double, ptr, ptr, ctypes.POINTER(i64)], ctypes.c_int)


def available() -> bool:
  """True when the C interior point is built and loaded."""
  return _load() is not None


def solve(a: np.ndarray, b: np.ndarray, max_iter: int, tol_gap: float, tol_feas: float, step: float):
  """The problem of the rank-one factors a (p, N) and b (q, N): (status "optimal", w (p*q,),
  multipliers y (N,), message), or None where it does not finish (``nuclear_ipm.solve``'s contract)."""
  fn = _load()
  a = np.ascontiguousarray(a, np.float64)
  b = np.ascontiguousarray(b, np.float64)
  (p, N), q = a.shape, b.shape[0]
  w, y, it = np.empty(p * q), np.empty(N), ctypes.c_int64(0)
  code = fn(N, p, q, a.ctypes.data, b.ctypes.data, int(max_iter), float(tol_gap), float(tol_feas), float(step),
            w.ctypes.data, y.ctypes.data, ctypes.byref(it))
  if code != 0:
    return None
  return "optimal", w, y, f"nuc_ipm: {it.value} iterations"


def report() -> dict:
  """What a summary records: {"nuc_ipm": "native-cpu"} where the C iteration solves the nuclear
  problems, {"nuc_ipm": "numpy", "nuc_ipm_why": why} where the NumPy one does. (The SVM workers
  load the library; this process only asks whether it would, unless it loaded it itself.)"""
  return native_build.report(_state, ENV, "nuc_ipm", "native-cpu", "numpy")
