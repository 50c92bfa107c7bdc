"""``regpath``'s solver in C (``train/native/reg_path.cc``), for the paths it covers.

The XLA solver vmaps a program of tiny matrix products (d = 10 on E7) over data sets, and spends
most of its time around them: E7's paths took 25-30 s of the two cores. The C source runs the same
method (the same steps, step sizes, power iterations, restarts, warm starts and candidate
selection; ``regpath``'s docstring) with its gradient and Hessian-vector products written out,
one data set per lane of a vector (``native/lanes.h``), so that a data set's path is the same bits
whatever batch it is in. Its rounding is its own: a path agrees with the XLA one to the solver's
accuracy, not bit for bit (tests/test_regpath.py).

It covers the global paths (no cone) of the linear head on the single-query model with the
engine's numerics in float64, for W and (K,Q) and every loss; other configurations, a machine
without a C++ compiler, or SVMATTN_NATIVE_PATHS=0 run the XLA solver, and every summary records
which one ran (``report``).
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import jax
import numpy as np

from svmattn import native_build

SOURCE = Path(__file__).parent / "native" / "reg_path.cc"
FLAGS = native_build.FLAGS
ENV = "SVMATTN_NATIVE_PATHS"        # 0: the XLA solver computes every path
LOSSES = {"logistic": 0, "exponential": 1, "correlation": 2}    # (lanes.h's enum Loss)

_lock = threading.Lock()
_state: dict = {}


def _load():
  """The C entry point (built and loaded once per process), or None (and why, in _state)."""
  i64, ptr = ctypes.c_int64, ctypes.c_void_p
  return native_build.entry_point(_state, _lock, SOURCE, FLAGS, ENV, "SvmattnRegPath",
                                  [i64] * 7 + [ptr] * 7 + [i64, ptr] + [i64] * 4 + [ptr] * 8, ctypes.c_int)


def available() -> bool:
  """True when JAX's default backend is the CPU and the C solver is built and loaded: on a GPU or
  TPU the paths are solved there, by the XLA solver."""
  return jax.default_backend() == "cpu" and _load() is not None


def covers(config, dtype) -> bool:
  """True where the C solver computes the paths of ``config`` (a ``regpath.PathConfig``) in ``dtype``."""
  return (config.param in ("W", "KQ") and config.head == "linear" and config.model == "single_query"
          and config.numerics == "exact" and config.cone_delta is None and config.loss in LOSSES
          and np.dtype(dtype) == np.float64)


def _c(a) -> np.ndarray:
  return np.ascontiguousarray(a, np.float64)


def paths(config, X, Z, Y, v, R, x0, along, v0) -> dict:
  """The paths of B data sets: X (B,n,T,d), Z (B,n,d), Y (B,n), v (B,d) on the grid R (G,), from the
  starts x0 (B,P), with the candidate directions ``along`` (B,P) at radius 1 or None, and the power
  iteration's first vector v0 (P,). P = d*d for W, 2*d*m for (K,Q) (K then Q). Returns the arrays
  W (B,G,d,d), loss, constraint, kkt_cos, grad_norm, took_candidate (bool), candidate_gain (B,G) and
  last (B,P), the parameters at the largest radius. MemoryError where the C side ran out of memory."""
  fn = _load()
  X, Z, Y, v, R, x0, v0 = (_c(a) for a in (X, Z, Y, v, R, x0, v0))
  along = None if along is None else _c(along)
  B, n, T, d = X.shape
  G, P = R.shape[0], x0.shape[1]
  kq = config.param == "KQ"
  m = (config.m or d) if kq else d
  shapes = {"Z": (Z, (B, n, d)), "Y": (Y, (B, n)), "v": (v, (B, d)), "R": (R, (G,)),
            "x0": (x0, (B, 2 * d * m if kq else d * d)), "v0": (v0, (P,))}
  if along is not None:
    shapes["along"] = (along, (B, P))
  for name, (a, shape) in shapes.items():
    if a.shape != shape:     # (the C side reads the arrays by these shapes)
      raise ValueError(f"regpath_native.paths: {name} must have shape {shape}, got {a.shape}")
  W = np.empty((B, G, d, d))
  fields = [np.empty((B, G)) for _ in range(6)]
  last = np.empty((B, P))
  code = fn(B, n, T, d, m, int(kq), LOSSES[config.loss], X.ctypes.data, Z.ctypes.data, Y.ctypes.data,
            v.ctypes.data, x0.ctypes.data, None if along is None else along.ctypes.data, v0.ctypes.data,
            G, R.ctypes.data, config.iters, config.first_iters, config.refresh, config.power_iters,
            W.ctypes.data, *(f.ctypes.data for f in fields), last.ctypes.data)
  if code != 0:
    raise MemoryError(f"the C regularization path solver ran out of memory (B={B}, P={P})")
  loss, constraint, kkt, grad_norm, took, gain = fields
  return {"W": W, "loss": loss, "constraint": constraint, "kkt_cos": kkt, "grad_norm": grad_norm,
          "took_candidate": took != 0, "candidate_gain": gain, "last": last}


def report() -> dict:
  """What a summary records: {"reg_paths": "native-cpu"} where the C solver computes the paths it
  covers, {"reg_paths": "xla", "reg_paths_why": why} where the XLA one computes every path."""
  if jax.default_backend() != "cpu":
    return {"reg_paths": "xla", "reg_paths_why": f"backend {jax.default_backend()}"}
  return native_build.report(_state, ENV, "reg_paths", "native-cpu", "xla")
