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


# XLA programs compiled by this process, and those loaded from the persistent cache instead
_COMPILES = {"programs": 0, "seconds": 0.0, "loaded": 0}
_COUNTING = False
_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"   # a compile or a cache load
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"                  # (inside the former, same thread)


def count_compiles() -> None:
  """Start counting the XLA programs this process compiles (every thread), their compile seconds,
  and the programs it loads from the persistent cache instead (``compile_stats``). Idempotent."""
  global _COUNTING
  if _COUNTING:
    return
  import threading
  from jax import monitoring
  hit = threading.local()

  def on_event(event, **kwargs):
    del kwargs
    if event == _CACHE_HIT_EVENT:
      hit.value = True

  def on_duration(event, duration, **kwargs):
    del kwargs
    if event == _BACKEND_COMPILE_EVENT:
      if getattr(hit, "value", False):
        hit.value = False
        _COMPILES["loaded"] += 1
      else:
        _COMPILES["programs"] += 1
        _COMPILES["seconds"] += float(duration)

  monitoring.register_event_listener(on_event)
  monitoring.register_event_duration_secs_listener(on_duration)
  _COUNTING = True


def compile_stats() -> dict:
  """{"xla_programs_compiled": n, "xla_compile_s": seconds, "xla_programs_loaded": from the
  persistent cache} since ``count_compiles``."""
  return {"xla_programs_compiled": _COMPILES["programs"], "xla_compile_s": round(_COMPILES["seconds"], 3),
          "xla_programs_loaded": _COMPILES["loaded"]}
