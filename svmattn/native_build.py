"""Compiling the engine's C++ sources into shared libraries, once per source, flags, compiler and CPU.

Used by the native GD kernel (``train/native_kernel.py``: ``train/native/gd_block.cc``). A library is compiled with the
given flags (the callers pass ``-O3 -march=native``, no fast-math, no contraction) into a
``_build`` folder beside its source (or, where that is read-only, the user's cache directory),
under a file lock so that parallel processes build it once, and written whole or not at all. Its
file name carries a hash of everything that decides its code: the source and the headers beside it,
the flags, the compiler's version, the CPU's model and flags and the jax version.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax

try:                       # POSIX file locks; where there are none (Windows) nothing native is built
  import fcntl
except ImportError:        # pragma: no cover (POSIX here)
  fcntl = None

# The processors the native sources are written for (SSE's control register for flushing subnormals,
# AVX2 and AVX-512 lanes). Elsewhere (ARM: Apple Silicon, Graviton) the engine runs its JAX path.
MACHINES = ("x86_64", "amd64", "i386", "i686")


# The host libraries' flags (-ffp-contract=off: the compiler fuses no multiply-add of its own, so the
# rounding is the source's; no fast-math)
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno", "-ffp-contract=off", "-w")


def compiler() -> str | None:
  """The C++ compiler: $CXX, else g++ or c++ on the PATH (None: none found)."""
  return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def why_off(env: str, cxx: str | None) -> str | None:
  """Why a native library is not to be used (``env`` set to 0, or no compiler), or None."""
  if os.environ.get(env, "1") == "0":
    return f"{env}=0"
  return why_unbuildable(cxx)


def why_unbuildable(cxx: str | None) -> str | None:
  """Why this machine builds no native library (not x86-64, no file locks, no compiler), or None."""
  machine = platform.machine().lower()
  if machine not in MACHINES:
    return f"the native code is written for x86-64; this machine is {machine or 'unknown'}"
  if fcntl is None:
    return "no POSIX file locks (fcntl) on this platform to build the native code safely"
  if cxx is None:
    return "no C++ compiler (g++) found"
  return None


def load(source: Path, flags: tuple[str, ...], cxx: str) -> tuple[ctypes.CDLL, str]:
  """(the loaded library of ``source``, built now unless a process already did, and its key).
  OSError, RuntimeError or subprocess.SubprocessError where it cannot be built or loaded."""
  name_key = key(source, flags, cxx)
  return ctypes.cdll.LoadLibrary(str(build(source, flags, cxx, name_key))), name_key


def open_library(source: Path, flags: tuple[str, ...], env: str):
  """(the loaded library of ``source``, None) where it is to be used and could be built and loaded,
  else (None, why): ``env`` set to 0, no compiler, or the compiler's or loader's error."""
  cxx = compiler()
  why = why_off(env, cxx)
  if why is not None:
    return None, why
  try:
    return load(source, flags, cxx)[0], None
  except (OSError, RuntimeError, subprocess.SubprocessError) as e:
    return None, str(e)


def entry_point(state: dict, lock, source: Path, flags: tuple[str, ...], env: str, symbol: str, argtypes, restype):
  """The C function ``symbol`` of ``source``'s library with its ctypes signature, built and loaded
  once per process and kept in ``state`` (under ``lock``), or None (``state["why"]`` says why)."""
  with lock:
    if "fn" not in state:
      lib, why = open_library(source, flags, env)
      fn = None
      if lib is not None:
        fn = getattr(lib, symbol)
        fn.argtypes, fn.restype = argtypes, restype
      state["fn"], state["why"] = fn, why
    return state["fn"]


def report(state: dict, env: str, key: str, native: str, fallback: str) -> dict:
  """What a summary records of a native library: {key: native} where it is (or would be) used,
  {key: fallback, key + "_why": why} where the fallback runs. A process that did not load it
  itself (its workers do) only asks whether it would."""
  why = state["why"] if "fn" in state else why_off(env, compiler())
  return {key: native} if why is None else {key: fallback, f"{key}_why": why}


def _cpu_id() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      lines = [line for line in f if line.startswith(("model name", "flags"))]
    return "".join(sorted(set(lines)))
  except OSError:
    return platform.processor() + platform.machine()


def _version(cxx: str) -> str:
  try:
    return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
  except (OSError, subprocess.SubprocessError):
    return ""


def key(source: Path, flags: tuple[str, ...], cxx: str) -> str:
  """The hash that names a library of ``source`` built with ``flags`` by ``cxx`` on this CPU (the
  headers beside the source count as part of it)."""
  h = hashlib.sha256()
  headers = [path.read_bytes() for path in sorted(source.parent.glob("*.h"))]   # (what it may include)
  for part in (source.read_bytes(), *headers, " ".join(flags).encode(), _version(cxx).encode(),
               _cpu_id().encode(), jax.__version__.encode()):
    h.update(part)
    h.update(b"\0")
  return h.hexdigest()[:16]


# A folder to build in instead of the defaults (the tests set it; None: beside the source, else the
# user's cache directory)
BUILD_DIR: str | None = None


def _build_dirs(source: Path):
  if BUILD_DIR:
    yield Path(BUILD_DIR)
    return
  yield source.parent / "_build"
  base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
  yield base / "svmattn" / "native"


def build(source: Path, flags: tuple[str, ...], cxx: str, name_key: str) -> Path:
  """The shared library of ``source`` (named ``STEM-name_key.so``), compiled now unless a process
  already did. RuntimeError when the compiler fails or no folder is writable."""
  errors = []
  for folder in _build_dirs(source):
    try:
      folder.mkdir(parents=True, exist_ok=True)
      lib = folder / f"{source.stem}-{name_key}.so"
      with open(folder / f"{source.stem}-{name_key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not lib.exists():
          with tempfile.TemporaryDirectory(dir=folder) as tmp:
            out = Path(tmp) / lib.name
            proc = subprocess.run([cxx, *flags, "-I", jax.ffi.include_dir(), str(source), "-o", str(out)],
                                  capture_output=True, text=True, timeout=600)
            if proc.returncode:
              raise RuntimeError(f"{cxx} failed on {source.name}: {proc.stderr.strip()[-2000:]}")
            os.replace(out, lib)               # whole or absent: never a half-written library
      return lib
    except OSError as e:
      errors.append(f"{folder}: {e}")
  raise RuntimeError(f"no writable folder for the native library {source.name}: " + "; ".join(errors))
