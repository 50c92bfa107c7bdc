"""The GD kernel of ``train.block_kernel`` as a native CPU custom call (``native/gd_block.cc``).

XLA:CPU runs the block kernel's contractions of tiny matrices at a few GFLOP/s; the native kernel
runs a whole training chunk (every step, and the observation after each snapshot's steps) for a
group of data sets at once (8 with AVX-512, or with AVX2 in two registers a value; else 4), one per
lane, with their data in the core's first-level cache. It computes the same gradient and step
(docs/science.md section 20) with its own rounding, and every lane does the same operations in
the same order, so a data set's trajectory depends on nothing else in its block.

The source is compiled once per source, compiler and CPU (``g++ -O3 -march=native``, no
fast-math, no contraction: its fused multiply-adds are written in the source) by
``svmattn.native_build`` into ``native/_build`` inside the package (or, where that is read-only,
the user's cache directory), under a file lock so that parallel processes build it once. Where no C++
compiler is found, or on another platform than the CPU, training runs the XLA block kernel;
``kernel_name()`` says which one ran and every summary records it.
"""
from __future__ import annotations

import ctypes
import subprocess
import threading
from pathlib import Path

import jax
import numpy as np

from svmattn import native_build
from svmattn.models import heads

SOURCE = Path(__file__).with_name("native") / "gd_block.cc"
LOSSES = {"logistic": 0, "exponential": 1, "correlation": 2}
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno", "-ffp-contract=off", "-w")
# (-ffp-contract=off: GCC fuses a * b + c by default, where and when it chooses; the kernel's fused
# multiply-adds are its own ``fmadd``, so that the rounding depends on the source alone)
# SVMATTN_NATIVE_KERNEL=0 turns the native kernel off (training then runs the XLA block kernel).
ENV = "SVMATTN_NATIVE_KERNEL"
# False: the XLA block kernel for every configuration (the benchmark's side-by-side rows; programs
# compiled while it was True stay cached in train.loop._JIT_CACHE: clear it when changing this).
ENABLED = True

_lock = threading.Lock()
_state: dict = {}


_compiler = native_build.compiler


def _host_entry(lib):
  """The kernel's C entry point without XLA (``SvmattnGdChunk``), typed for ctypes (a plain
  ``CDLL`` function: the GIL is released during the call, so threads run parts concurrently)."""
  fn = lib.SvmattnGdChunk
  ptrs = ctypes.POINTER(ctypes.c_void_p)
  i64s = ctypes.POINTER(ctypes.c_int64)
  fn.argtypes = [ctypes.c_int64, i64s, ctypes.c_double, ctypes.c_double, ctypes.c_double, i64s, ptrs, i64s, ptrs,
                 i64s]
  fn.restype = ctypes.c_int
  return fn


def _load():
  """Build, load and register the kernel once per process: the target names, or None (and why)."""
  with _lock:
    if "targets" in _state:
      return _state["targets"]
    targets, compiler = None, _compiler()
    why = native_build.why_off(ENV, compiler)
    if why is None:
      try:
        lib, key = native_build.load(SOURCE, FLAGS, compiler)
        targets = {"host": _host_entry(lib)}
        for name, symbol in (("W", "SvmattnGdBlockW"), ("KQ", "SvmattnGdBlockKQ"), ("W_relu", "SvmattnGdBlockWRelu"),
                             ("W_lambda", "SvmattnGdBlockWLambda")):
          # the source's hash is in the target's name: a program compiled for another source
          # (the persistent compilation cache) never calls this one
          targets[name] = f"svmattn_gd_block_{name}_{key}"
          jax.ffi.register_ffi_target(targets[name], jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
      except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        targets, why = None, str(e)
    _state["targets"], _state["why"] = targets, why
    return targets


def available() -> bool:
  """True when the native kernel is built and registered (on the CPU)."""
  return ENABLED and jax.default_backend() == "cpu" and _load() is not None


def kernel_name() -> str:
  """The GD kernel that ``train.block_kernel`` runs in this process: "native-cpu" or "xla"."""
  return "native-cpu" if available() else "xla"


def why_not() -> str | None:
  """Why the native kernel is not available (None when it is)."""
  if not ENABLED:
    return "turned off (native_kernel.ENABLED)"
  if jax.default_backend() != "cpu":
    return f"backend {jax.default_backend()}"
  _load()
  return _state.get("why")


def report() -> dict:
  """What a summary records: {"gd_kernel": "native-cpu", "xla" (and "gd_kernel_why": why not) or
  "not loaded" (this process trained nothing with the closed-form kernel)}."""
  if "targets" not in _state:
    return {"gd_kernel": "not loaded"}
  if available():
    return {"gd_kernel": "native-cpu"}
  return {"gd_kernel": "xla", "gd_kernel_why": why_not()}


def head_kind(head: str) -> tuple[str, float]:
  """(kind, lam) of a head name: "linear", "relu" or "lambda" (a lambda head's name carries its
  lam: "lambda:0.5"; lam is 0 for the others)."""
  lam = heads.lambda_of(head)
  if lam is not None:
    return "lambda", lam
  if head not in ("linear", "relu"):
    raise ValueError(f"native kernel: no head {head!r} (linear, relu or lambda:LAM)")
  return head, 0.0


def run_chunk(params: dict, X, Z, Y, h, *, param: str, lr: float, ridge: float, every: int, snapshots: int,
              start: bool, loss: str, normalized: bool, head: str = "linear",
              authors: bool = False) -> tuple[dict, dict]:
  """One training chunk of the kernel for one block (block axis last in every array), as an
  XLA custom call: ``snapshots`` times ``every`` steps then an observation, after an observation
  of the starting parameters when ``start``. head "linear": h is the head's v (d,b) (the kernel
  computes X v); head "relu" (W only): h is the head's V (d,d,b); a lambda head "lambda:LAM"
  (W only): h is the head's v (d,b). authors (ReLU head only): the
  authors' numerics, the pooled token X^T s and g / (||g||_F + eps) (docs/science.md section 20). Returns (params, observations) with the observations
  {"W": (S,d,d,b), "f": (S,n,b) predictions, "max_prob": (S,b), "ridge_sum": (S,b),
  "attention": (n,T,b) the final attention}, S = snapshots (+ 1 with ``start``)."""
  targets = _load()
  n, T, d, b = X.shape
  S = snapshots + (1 if start else 0)
  kind, head_lam = head_kind(head)
  attrs = dict(lr=np.float64(lr), ridge=np.float64(ridge), every=np.int64(every), snapshots=np.int64(snapshots),
               start=np.int64(1 if start else 0), loss=np.int64(LOSSES[loss]), normalized=np.int64(1 if normalized else 0),
               authors=np.int64(1 if authors else 0), head_lam=np.float64(head_lam))
  f64 = lambda *shape: jax.ShapeDtypeStruct(shape, X.dtype)  # noqa: E731
  obs = (f64(S, d, d, b), f64(S, n, b), f64(S, b), f64(S, b), f64(n, T, b))
  if param == "W" or kind != "linear":
    W = params["W"]
    target = targets["W" if kind == "linear" else f"W_{kind}"]
    out = jax.ffi.ffi_call(target, (f64(*W.shape),) + obs)(W, X, Z, Y, h, **attrs)
    new = {"W": out[0]}
    rest = out[1:]
  else:
    K, Q = params["K"], params["Q"]
    out = jax.ffi.ffi_call(targets["KQ"], (f64(*K.shape), f64(*Q.shape)) + obs)(K, Q, X, Z, Y, h, **attrs)
    new = {"K": out[0], "Q": out[1]}
    rest = out[2:]
  return new, dict(zip(("W", "f", "max_prob", "ridge_sum", "attention"), rest))


def run_steps(params: dict, X, Z, Y, h, *, param: str, lr: float, ridge: float, steps: int, loss: str,
              normalized: bool, head: str = "linear", authors: bool = False) -> dict:
  """``steps`` steps of the kernel for one block (``run_chunk`` with one snapshot): the parameters."""
  return run_chunk(params, X, Z, Y, h, param=param, lr=lr, ridge=ridge, every=steps, snapshots=1, start=False,
                   loss=loss, normalized=normalized, head=head, authors=authors)[0]


def _view(a: np.ndarray, name: str, observed: bool, write: bool) -> tuple[int, tuple[int, int, int]]:
  """(address, (element, data set, observation) strides in doubles) of a float64 NumPy view with the
  data sets on its first axis (then, when ``observed``, the observations), each data set's (and
  observation's) elements in C order: what the kernel's C entry point reads or writes in place."""
  lead = 2 if observed else 1
  if a.dtype != np.float64 or (write and not a.flags.writeable):
    raise ValueError(f"native kernel: {name} must be a{' writable' if write else ''} float64 array")
  expected, size = [], 1
  for extent in reversed(a.shape[lead:]):
    expected.insert(0, size * 8)
    size *= extent
  if any(st != ex for st, ex, extent in zip(a.strides[lead:], expected, a.shape[lead:]) if extent > 1):
    raise ValueError(f"native kernel: {name}'s elements are not contiguous (strides {a.strides})")
  return a.ctypes.data, (1, a.strides[0] // 8, a.strides[1] // 8 if observed else 0)


def run_chunk_rows(params: list[np.ndarray], X: np.ndarray, Z: np.ndarray, Y: np.ndarray, h: np.ndarray,
                   out_params: list[np.ndarray], obs: dict, *, param: str, lr: float, ridge: float, every: int,
                   snapshots: int, start: bool, loss: str, normalized: bool, head: str = "linear",
                   authors: bool = False, causal: int = 0) -> None:
  """``run_chunk`` through the kernel's C entry point on NumPy views with the data sets first (b, ...),
  as the engine holds them, without XLA and without transposes: the same computation, bit for
  bit, with nothing to compile. ``params`` ([W] or [K, Q]) are read and ``out_params`` written (they
  may be the same arrays); the observations are written into ``obs``: "W" (b,S,d,d), "f" (b,S,n),
  "max_prob" (b,S), "ridge_sum" (b,S) and "attention" (b,n,T), S = snapshots (+ 1 with ``start``), each
  a view into a larger array if need be (its rows and observations strided, its elements in C order).
  causal K > 0 (the linear head): the n sequences are the queries of a causal seq2seq data set, K per
  sequence of tokens, and sequence i (query k = i mod K) sees the tokens t <= k only (weight exactly 0
  for the others); K divides n and is at most T."""
  fn = _load()["host"]
  b, n, T, d = X.shape
  kind, head_lam = head_kind(head)
  kq = param != "W" and kind == "linear"
  names = ("K", "Q") if kq else ("W",)
  m = params[0].shape[-1] if kq else 1
  S = snapshots + (1 if start else 0)
  want = {"Z": (Z.shape, (b, n, d)), "Y": (Y.shape, (b, n)),
          "head": (h.shape, (b, d, d) if head == "relu" else (b, d)),
          **{k: (a.shape, (b, d, m if kq else d)) for k, a in zip(names, params)},
          **{f"new {k}": (a.shape, (b, d, m if kq else d)) for k, a in zip(names, out_params)},
          "W per observation": (obs["W"].shape, (b, S, d, d)), "f": (obs["f"].shape, (b, S, n)),
          "max_prob": (obs["max_prob"].shape, (b, S)), "ridge_sum": (obs["ridge_sum"].shape, (b, S)),
          "attention": (obs["attention"].shape, (b, n, T))}
  for name, (got, expected) in want.items():       # the kernel reads and writes by these sizes
    if got != expected:
      raise ValueError(f"native kernel: {name} has shape {got}, expected {expected} for X of shape {X.shape}")
  ins = [_view(a, k, False, False) for k, a in zip(names, params)]
  ins += [(0, (0, 0, 0))] * (2 - len(ins))
  ins += [_view(a, k, False, False) for k, a in (("X", X), ("Z", Z), ("Y", Y), ("head", h))]
  outs = [_view(a, f"new {k}", False, True) for k, a in zip(names, out_params)]
  outs += [(0, (0, 0, 0))] * (2 - len(outs))
  outs += [_view(obs[k], k, k != "attention", True) for k in ("W", "f", "max_prob", "ridge_sum", "attention")]
  code = 2 if kq else {"linear": 0, "relu": 1, "lambda": 3}[kind]
  sizes = (ctypes.c_int64 * 5)(n, T, d, m, b)
  if causal and (kind != "linear" or n % causal or causal > T):
    raise ValueError(f"native kernel: causal={causal} needs the linear head, K dividing n={n} and K <= T={T}")
  counts = (ctypes.c_int64 * 7)(every, snapshots, 1 if start else 0, LOSSES[loss], 1 if normalized else 0,
                                1 if authors else 0, causal)
  addr = lambda views: (ctypes.c_void_p * len(views))(*(a for a, _ in views))  # noqa: E731
  strides = lambda views: (ctypes.c_int64 * (3 * len(views)))(*(x for _, st in views for x in st))  # noqa: E731
  if b == 0:
    return
  rc = fn(code, sizes, float(lr), float(ridge), float(head_lam), counts, addr(ins), strides(ins), addr(outs),
          strides(outs))
  if rc == 2:
    raise MemoryError(f"native kernel: out of memory for a block of n={n} T={T} d={d}")
  if rc:
    raise ValueError(f"native kernel: bad sizes or options (n={n} T={T} d={d} m={m} b={b}, every={every}, "
                     f"snapshots={snapshots}, head={head}, authors={authors})")
