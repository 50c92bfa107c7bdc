"""svmattn: experiments on the implicit bias of attention (arXiv 2308.16898).

Importing the package changes no setting of JAX. The engine's programs (the ``svmattn`` command, the
``python -m experiments.NAME`` binaries, ``reproduce``, the SVM workers) call ``configure()`` first,
and a library user calls it once at the top of a script or notebook:

    import svmattn
    svmattn.configure()          # float64, one CPU device per core, reproducible GPU compiles

Float64 work without it is refused in one line that says so (``require_x64``). Every function keeps
the dtype of its inputs, so float32 runs pass float32 arrays.

The package's layout is described once, in BUILD.md ("Layout"); README.md lists the public
functions a user reaches for.
"""
import logging
import os


class ConfigurationError(RuntimeError):
  """JAX is not set up for what was asked (float64 without ``svmattn.configure()``)."""


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


def configure(x64: bool = True, devices: int | None = None) -> None:
  """Set JAX up as the engine's programs run it. Call it once, before any JAX computation.

  x64: float64 on (``jax_enable_x64``), the engine's default precision (docs/science.md).
  devices: CPU devices to ask JAX for; default SVMATTN_CPU_DEVICES, else one per usable core.
    ``train.train`` splits the data sets over them, bit for bit the results of one device. An
    explicit ``--xla_force_host_platform_device_count`` in XLA_FLAGS, or a ``jax_num_cpu_devices``
    already set, is left alone, and once JAX has started its CPU backend the count cannot change.
  It also sets XLA's GPU autotuning to level 0 unless XLA_FLAGS names a level: with autotuning, two
  compilations of one program may pick kernels that round differently, so a replay or a resume
  compiled afresh would not be bit-identical to its run (seen on an H200). It quiets JAX's INFO lines
  about backends it probes and does not find. A CPU ignores the GPU flag.
  """
  import jax       # (here, not at the top: a program installs its interrupt handler before JAX loads)
  jax.config.update("jax_enable_x64", bool(x64))
  logging.getLogger("jax").setLevel(logging.WARNING)
  if "xla_gpu_autotune_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_autotune_level=0").strip()
  if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", "") and \
      jax.config.jax_num_cpu_devices == -1:
    try:
      jax.config.update("jax_num_cpu_devices", devices if devices is not None else cpu_devices())
    except RuntimeError:   # the CPU backend already exists: keep its devices
      pass


def require_x64(dtype) -> None:
  """Refuse float64 work while JAX's x64 mode is off (JAX would silently compute in float32)."""
  import jax
  import numpy as np
  if np.dtype(dtype) == np.float64 and not jax.config.jax_enable_x64:
    raise ConfigurationError("float64 needs JAX's x64 mode: call svmattn.configure() first (or "
                             "jax.config.update('jax_enable_x64', True)), or pass float32 data")


__version__ = "0.1.0"
# The engine's numerics version: bumped when a change moves results at the rounding level (history:
# CHANGELOG.md). Every summary records it, and it is part of a run's identity, so --resume never
# continues a run that another version started.
NUMERICS_VERSION = "22"
