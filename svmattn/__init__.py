"""svmattn: experiments on the implicit bias of attention (arXiv 2308.16898).

Importing the package turns on JAX float64 (``jax_enable_x64``); every function
keeps the dtype of its inputs, so float32 runs pass float32 arrays.

It also gives JAX one CPU device per usable core (``cpu_devices()``; the environment
variable SVMATTN_CPU_DEVICES=N overrides it, and an explicit
``--xla_force_host_platform_device_count`` in XLA_FLAGS or ``jax_num_cpu_devices`` is
left alone): ``train.train`` splits the data sets over the devices, so training uses
every core of a CPU, with results bit for bit those of one device. It has no effect
once JAX has created its CPU backend, and none on GPU/TPU devices.

The package's layout is described once, in BUILD.md ("Layout"); README.md lists the public
functions a user reaches for.
"""
import logging
import os

import jax

jax.config.update("jax_enable_x64", True)
# JAX probes for TPU/GPU backends and logs each failure at INFO ("Unable to initialize backend
# 'tpu' ... libtpu.so"), which absl prints on a CPU machine: a run's terminal shows progress and
# results, not that. (--verbosity / python logging can turn it back on.)
logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)


def usable_cores() -> int:
  """The CPU cores this process may use."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# Set by `svmattn reproduce` for the experiments it runs side by side: the cores each of them may
# count on (the usable cores divided among the experiments running at once).
CORE_SHARE_ENV = "SVMATTN_CORE_SHARE"


def core_share() -> int:
  """The cores this process's work may count on: SVMATTN_CORE_SHARE (at most ``usable_cores()``)
  where a parent that runs several of them at once set it, else ``usable_cores()``."""
  value = os.environ.get(CORE_SHARE_ENV, "").strip()
  if value.isdigit() and int(value) >= 1:
    return min(int(value), usable_cores())
  return usable_cores()


def cpu_devices() -> int:
  """CPU devices to ask JAX for: SVMATTN_CPU_DEVICES, else ``usable_cores()``."""
  value = os.environ.get("SVMATTN_CPU_DEVICES", "").strip()
  if value:
    if not value.isdigit() or int(value) < 1:
      raise ValueError(f"SVMATTN_CPU_DEVICES must be a positive integer, got {value!r}")
    return int(value)
  return usable_cores()


if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", "") and \
    jax.config.jax_num_cpu_devices == -1:
  try:
    jax.config.update("jax_num_cpu_devices", cpu_devices())
  except RuntimeError:   # the CPU backend already exists: keep its devices
    pass

# On a GPU, XLA times candidate kernels when it compiles a program (autotuning) and keeps the fastest,
# so two compilations of one program can pick different kernels that round differently: a replay or
# a resumed run compiled afresh would then not be bit-identical to the run it repeats (seen on an
# H200: 12 of E2's 38 result arrays differed between two processes with empty compilation caches).
# Level 0 takes XLA's default kernels: bit-identical across processes there, training 2-5% slower.
# An explicit --xla_gpu_autotune_level in XLA_FLAGS is left alone; a CPU ignores the flag. Like the
# device count, it has no effect once JAX has created its backends.
if "xla_gpu_autotune_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_autotune_level=0").strip()

__version__ = "0.1.0"
# The engine's numerics version: bumped when a change moves results at the rounding level (history:
# docs/results.md). Every summary records it, and it is part of a run's identity, so --resume never
# continues a run that another version started.
NUMERICS_VERSION = "21"
