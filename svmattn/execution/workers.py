"""Host worker processes that never outlive the process that started them.

``pool(n)`` is a ``concurrent.futures.ProcessPoolExecutor`` of ``n`` spawned processes
(no JAX state is forked). Each worker runs one SVM solve at a time (its own threads would
only compete with the other workers) and never outlives its parent: on Linux the kernel
kills it when the parent dies, even by SIGKILL (prctl PR_SET_PDEATHSIG), whatever it is
computing; elsewhere (and as a second guard) a thread notices the re-parenting within
``WATCH_SECONDS`` and exits, which needs the GIL: a solver holding the GIL for minutes
(seen: scipy's NNLS on a 7680 x 4225 problem) would delay it.
"""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import threading
import time

import svmattn
from svmattn.svm import att_svm as svm_lib


WATCH_SECONDS = 0.25


def _watch_parent(parent: int) -> None:
  while True:
    if os.getppid() != parent:
      os._exit(1)   # the parent is gone: leave at once, without running any cleanup of its state
    time.sleep(WATCH_SECONDS)


def _die_with_parent() -> bool:
  """Ask the Linux kernel to SIGKILL this process when its parent dies (True if it took)."""
  import ctypes
  import signal
  import sys
  if not sys.platform.startswith("linux"):
    return False
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0      # 1 = PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    return False


def _one_blas_thread() -> None:
  """One thread in every BLAS library of this worker (NumPy's and SciPy's OpenBLAS start one per
  core): workers run in parallel already, and on 2 cores two workers' BLAS threads spinning
  beside each other made E3's solves 3x slower in all (measured: 175 s of solves against 71 s)."""
  try:
    import numpy  # noqa: F401  (load the BLAS libraries, then limit them)
    import scipy.linalg  # noqa: F401
    import threadpoolctl
  except ImportError:
    return
  threadpoolctl.threadpool_limits(1)


# A process started with this variable set to its parent's pid dies with that parent (``die_with_parent``):
# reproduce sets it for the experiments it runs, and ``python -m svmattn`` honours it.
PARENT_ENV = "SVMATTN_DIE_WITH_PARENT"


def die_with_parent(parent: int) -> None:
  """End this process when ``parent`` dies, even by SIGKILL: the kernel's PR_SET_PDEATHSIG on
  Linux, and a watch thread that notices the re-parenting elsewhere (and as a second guard)."""
  _die_with_parent()
  threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="watch-parent").start()
  if os.getppid() != parent:   # died before the watch began
    os._exit(1)


def die_with_parent_from_env() -> None:
  """``die_with_parent`` of the pid in PARENT_ENV, when it is set (a process started by reproduce)."""
  value = os.environ.pop(PARENT_ENV, "")
  if value.isdigit():
    die_with_parent(int(value))


def _start_worker(parent: int) -> None:
  import signal
  svmattn.configure()                # as the parent: float64 for what the analysis computes with JAX
  signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C reaches the whole group: the parent decides (terminate)
  svm_lib.THREADS = 1   # the workers already run in parallel
  _one_blas_thread()
  die_with_parent(parent)


def pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
  """``workers`` spawned worker processes that exit by themselves when this process dies."""
  return concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                                initializer=_start_worker, initargs=(os.getpid(),))


def _ready(*_) -> int:
  return os.getpid()


def start(pool: concurrent.futures.ProcessPoolExecutor, workers: int, *preload) -> None:
  """Start ``pool``'s ``workers`` processes now instead of at the first job (a process pool spawns
  a worker only when a job arrives and none is idle): each imports Python, NumPy, SciPy, the
  engine and the modules of ``preload`` (objects pickled by reference, e.g. a study's ``analyze``),
  about 1.5 s, beside the first batch's data and training instead of after them. The start jobs
  compute nothing, so results are the same."""
  for _ in range(workers):
    pool.submit(_ready, *preload)


def terminate(pool: concurrent.futures.ProcessPoolExecutor) -> None:
  """Stop ``pool``'s workers now (an interrupted run): queued jobs are cancelled and running ones
  killed instead of waited for."""
  processes = list((getattr(pool, "_processes", None) or {}).values())
  pool.shutdown(wait=False, cancel_futures=True)
  for p in processes:
    if p.is_alive():
      p.terminate()
  for p in processes:
    p.join(5)
