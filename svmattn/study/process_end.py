"""Ending a binary's process without the interpreter's teardown.

    process_end.run_main(main)        # absl's app.run(main), then the process ends as below

A finished run has written every file (atomically, closed) and shut its SVM workers down. What the
interpreter still does after that (freeing the 1,500 modules of JAX, SciPy and matplotlib, XLA's
client, collecting garbage) took 0.5 s of E2's 4.3 s from a cold start on a 2-core host and serves
no purpose. ``end`` does everything a normal exit does that has an effect outside the process, in
the same order: it waits for the threads that are not daemons and runs the callbacks that
``concurrent.futures`` registers for them (``threading._shutdown``), then the ``atexit`` callbacks
(logging's flush, multiprocessing's finalizers, the engine's own joins), then flushes stdout and
stderr, and ends the process with its exit status (``os._exit``). Where any of that fails, it
falls back to a normal exit.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading


def status_of(code) -> int:
  """The exit status ``sys.exit(code)`` gives (printing a message code to stderr, as it does)."""
  if code is None:
    return 0
  if isinstance(code, int):
    return code
  sys.stderr.write(f"{code}\n")
  return 1


def exit_steps() -> None:
  """What a normal exit does that has effects outside the process (module docstring), in its order."""
  try:
    threading._shutdown()       # noqa: SLF001 (the interpreter's own step at exit)
  except Exception:             # noqa: BLE001 - as at a normal exit, the atexit callbacks run still
    pass
  atexit._run_exitfuncs()       # noqa: SLF001
  sys.stdout.flush()
  sys.stderr.flush()


def end(code=None) -> None:
  """End the process with ``sys.exit(code)``'s status after a normal exit's effects (module
  docstring), skipping the interpreter's teardown."""
  status = status_of(code)
  try:
    exit_steps()
  except BaseException:    # noqa: BLE001 - a normal exit then does what is left
    raise SystemExit(status) from None
  os._exit(status)


def run_main(main, gc_paused: bool = False, **kwargs) -> None:
  """``absl.app.run(main, **kwargs)``, then ``end`` with its exit status. Only a program's own entry
  point calls this: it never returns. The garbage collector is on from here (``startup_gc``), or
  with ``gc_paused`` once ``execute.prepare_process`` has imported what the run needs."""
  from absl import app
  from svmattn import startup_gc
  if not gc_paused:
    startup_gc.resume()
  try:
    app.run(main, **kwargs)
  except SystemExit as e:
    end(e.code)
  end(0)
