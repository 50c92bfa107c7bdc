"""The persistent XLA compilation cache, with one compiled program shared by the CPU devices.

``train.loop`` runs the one-device program on every device (``PerDevice``: bit for bit the
results of one device whatever the number of devices). XLA binds an executable to its device,
so with N CPU devices every training program was compiled N times: the same code, N times the
compile time (half of E4's wall time on 2 cores). JAX's persistent cache already solves this
for GPUs: its cache key leaves out the device assignment there, and an entry compiled for one
device is loaded for another with that device's options. ``enable`` turns on the cache and does
the same on CPU, so device 1 loads device 0's program from the cache (milliseconds) instead of
compiling it again. The loaded program is the same machine code, so results do not change.
"""
from __future__ import annotations

import os

import jax

_SHARED = False


def enable(path: str) -> None:
  """Persistent XLA compilation cache in ``path`` (every program, however fast it compiled),
  shared by the CPU devices (see the module docstring)."""
  os.makedirs(path, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  share_across_devices()


def share_across_devices() -> bool:
  """Make the cache key of a program independent of its device assignment on every platform
  (JAX does so on GPU only). Returns False, changing nothing, where this JAX version has no
  such hook: programs are then compiled once per device, as before."""
  global _SHARED
  if _SHARED:
    return True
  try:
    from jax._src import cache_key
    original = cache_key._hash_serialized_compile_options
  except (ImportError, AttributeError):
    return False

  def strip_devices(hash_obj, compile_options, strip_device_assignment=False):
    del strip_device_assignment
    return original(hash_obj, compile_options, strip_device_assignment=True)

  cache_key._hash_serialized_compile_options = strip_devices
  _SHARED = True
  return True
