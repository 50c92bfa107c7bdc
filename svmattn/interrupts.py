"""Ctrl-C and SIGTERM in the engine's programs: one line on stderr and exit status 1, at any moment.

A KeyboardInterrupt is not always deliverable: raised inside JAX's garbage-collection callback it
is printed as "Exception ignored" and lost (the run then went on and exited 0), and raised in the
middle of importing JAX it leaves half-imported modules behind (an ImportError, a SIGABRT or a
segfault followed). The programs (``svmattn``, ``python -m svmattn``, ``python -m experiments.NAME``)
therefore install ``stop`` before they import anything heavy: it raises nothing and ends the
process at once. Nothing is lost by that: every file the engine writes is written atomically, and
the processes it starts end with it. During a run, ``execution.run_experiment.stop_on_signals``
says the same with the command that continues it.

The limit: Python runs a signal handler between bytecodes of the main thread, so an interrupt during
one long call into C (an XLA compilation, a large solve) ends the process when that call returns.
"""
import functools
import os
import signal
import sys


def stop(signum, frame, hint: str = "") -> None:
  """End the process now with one line naming the signal (and ``hint``), exit status 1."""
  name = signal.Signals(signum).name + (" (Ctrl-C)" if signum == signal.SIGINT else "")
  try:
    sys.stderr.write(f"\nerror: stopped by {name}{'; ' + hint if hint else ''}\n")
    sys.stderr.flush()
  except (OSError, ValueError):   # stderr closed: the exit status still says it
    pass
  os._exit(1)


def install(hint: str = "") -> None:
  """``stop`` (saying ``hint``) for SIGINT and SIGTERM, unless a handler other than Python's
  defaults, or ours, is there (an ignored SIGINT, as in a background job, stays ignored)."""
  for sig in (signal.SIGINT, signal.SIGTERM):
    now = signal.getsignal(sig)
    if now in (signal.default_int_handler, signal.SIG_DFL) or getattr(now, "func", now) is stop:
      signal.signal(sig, functools.partial(stop, hint=hint) if hint else stop)
