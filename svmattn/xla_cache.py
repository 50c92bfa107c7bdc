"""The persistent XLA compilation cache (JAX's own, through its public settings), and a count of the
programs a process compiles and loads from it (every summary's ``work``).

XLA binds an executable to its device, so with N CPU devices a program that runs on every device
is compiled once per device. The native GD kernel compiles nothing, so this costs only the
programs around it and the configurations it does not train.
"""
from __future__ import annotations

import os

import jax

def enable(path: str) -> None:
  """Persistent XLA compilation cache in ``path`` (every program, however fast it compiled),
  shared by the CPU devices (see the module docstring)."""
  os.makedirs(path, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


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
