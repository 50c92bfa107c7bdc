"""Several hosts (``jax.distributed``): start, join every process's results, wait for each other.

Process p of P runs the p-th contiguous share of every cell's runs (``pipeline.share``);
``gather`` gives every process the whole cells in run order; process 0 writes the results.
"""
from __future__ import annotations

import numpy as np

from svmattn.execution import pipeline


class HostsError(RuntimeError):
  """The processes of a several-host run could not join, with the reason."""


def initialize(coordinator_address: str, num_processes: int, process_id: int, timeout: int = 300) -> None:
  """Join the ``num_processes`` processes (before anything starts a JAX backend). When they have
  not all joined within ``timeout`` seconds the process ends with one line naming the missing
  ones, exit status 1 (jax's own deadline aborts the interpreter with a C++ stack trace, so a
  watchdog ends it first)."""
  import os
  import sys
  import threading
  import jax
  jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives; no effect on GPU/TPU
  others = [p for p in range(num_processes) if p != process_id]

  def give_up():
    sys.stderr.write(f"error: process {process_id} of {num_processes}: the other processes {others} did not all "
                     f"join {coordinator_address} within {timeout} s (--hosts_timeout); start each with its "
                     "--process_id and the same --coordinator_address and --num_processes\n")
    sys.stderr.flush()
    os._exit(1)

  watchdog = threading.Timer(timeout, give_up)
  watchdog.daemon = True
  watchdog.start()
  try:
    jax.distributed.initialize(coordinator_address, num_processes, process_id, initialization_timeout=timeout + 60)
  except Exception as e:  # noqa: BLE001 - jax raises its runtime's errors (UNAVAILABLE, bad address, ...)
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    raise HostsError(f"process {process_id} of {num_processes}: cannot join {coordinator_address}: "
                     f"{type(e).__name__}: {first}") from None
  finally:
    watchdog.cancel()


def sync(name: str) -> None:
  from jax.experimental import multihost_utils
  multihost_utils.sync_global_devices(name)


def max_over_processes(values: dict) -> dict:
  from jax.experimental import multihost_utils
  return {k: float(np.max(multihost_utils.process_allgather(np.array([v])))) for k, v in values.items()}


def sum_over_processes(values: dict) -> dict:
  from jax.experimental import multihost_utils
  return {k: int(np.sum(multihost_utils.process_allgather(np.array([v])))) for k, v in values.items()}


def gather_arrays(arrays: dict, runs: int, process_index: int, process_count: int) -> dict:
  """Every process's per-run arrays of one cell (``runs`` data sets), concatenated in run order.

  Uses jax's collectives (process_allgather); string arrays travel as their code points."""
  if process_count == 1:
    return arrays
  from jax.experimental import multihost_utils
  per = -(-runs // process_count)
  lo, hi = pipeline.share(runs, process_index, process_count)
  counts = [pipeline.share(runs, p, process_count)[1] - pipeline.share(runs, p, process_count)[0]
            for p in range(process_count)]
  # every process must take part with every key, even one whose share is empty
  keys = sorted(arrays)
  out = {}
  for key in keys:
    a = np.asarray(arrays[key])
    kind = a.dtype.kind
    if kind == "U":
      width = max(int(multihost_utils.process_allgather(np.array([a.dtype.itemsize // 4]), tiled=True).max()), 1)
      a = a.astype(f"<U{width}").view(np.uint32).reshape(len(a), width)
    elif kind == "b":
      a = a.astype(np.uint8)
    padded = np.zeros((per,) + a.shape[1:], a.dtype)
    padded[:hi - lo] = a
    full = np.asarray(multihost_utils.process_allgather(padded, tiled=True))
    full = np.concatenate([full[p * per:p * per + c] for p, c in enumerate(counts)])
    if kind == "U":
      full = full.astype(np.uint32).reshape(-1).view(f"<U{width}").reshape(len(full))
    elif kind == "b":
      full = full.astype(bool)
    out[key] = full
  return out


def gather(output: pipeline.Output, study: pipeline.Study, process_index: int, process_count: int):
  """The whole cells of ``study`` on every process (``output``: this process's share)."""
  if process_count == 1:
    return output
  cells = [gather_arrays(a, cell.runs, process_index, process_count) for a, cell in zip(output.cells, study.cells)]
  per_cell = [{**max_over_processes({k: c[k] for k in pipeline.CELL_TIMINGS}),
               **sum_over_processes({k: c[k] for k in pipeline.CELL_COUNTS})} for c in output.per_cell]
  return pipeline.Output(cells, max_over_processes(output.timings), sum_over_processes(output.work), per_cell)
