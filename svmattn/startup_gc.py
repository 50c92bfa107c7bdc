"""Python's cyclic garbage collector while the ``svmattn`` command starts.

The command imports JAX, SciPy, matplotlib and the engine (about a million objects, none of them
garbage) as it starts. The collector ran about 480 times meanwhile, 3 of them over every object,
and took 0.25-0.40 s of E2's 3.2 s from a cold start on a 2-core host, all of it on the run's path.
So ``python -m svmattn``, ``python -m experiments.NAME`` and the ``svmattn`` script
(``started_by_command``) start with it off (``pause``, from the package's import), and ``resume``
turns it on once their imports are done:
every object alive then goes to the permanent generation (``gc.freeze``: later collections do not
walk them; E2: 0.02 s of collections in all). Reference counting frees everything as before; only
the timing of cyclic collections changes.

Who resumes: the import thread of ``study.execute.prepare_process`` (every experiment's run), an
SVM worker's start (``study.workers``; its imports: 0.22 s of collections each before),
``study.process_end.run_main`` (the tools: reproduce, replay, a config file's run), ``report.main``
and ``cli.main`` (a tool's module imported; and on returning, without freezing). Any other import
of the package (a test, a notebook, a script) leaves the collector alone.
"""
from __future__ import annotations

import gc
import os
import sys
import threading

_LOCK = threading.Lock()
_paused: list = []


def started_by_command() -> bool:
  """Is this process ``python -m svmattn ...``, ``python -m experiments.NAME ...``, the ``svmattn``
  script or an SVM worker of one of them, importing the package?"""
  main = sys.modules.get("__main__")
  name = getattr(getattr(main, "__spec__", None), "name", None) or ""    # python -m NAME, running NAME
  if sys.argv[:1] == ["-m"]:       # python -m NAME, importing NAME's packages first: NAME from the command line
    argv = getattr(sys, "orig_argv", [])
    name = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
  if name in ("svmattn", "svmattn.__main__") or name.startswith("experiments."):
    return True
  argv0 = sys.argv[0] if sys.argv else ""
  if "--multiprocessing-fork" in getattr(sys, "orig_argv", []):    # a spawned SVM worker: its parent's argv
    return (os.path.basename(argv0) == "svmattn" or argv0.startswith("svmattn ")   # (cli.main: "svmattn NAME")
            or os.path.basename(os.path.dirname(argv0)) == "experiments")
  return os.path.basename(argv0) == "svmattn" and getattr(main, "__file__", None) == argv0


def pause() -> None:
  """Turn the collector off until ``resume`` (if it is on; else nothing)."""
  with _LOCK:
    if gc.isenabled() and not _paused:
      gc.disable()
      _paused.append(True)


def resume(freeze: bool = True) -> None:
  """After ``pause``: (``freeze``) move what is alive now to the permanent generation, and turn the
  collector on again; without a ``pause`` before it, nothing."""
  with _LOCK:
    if _paused:
      _paused.clear()
      if freeze:
        gc.freeze()
      gc.enable()
