"""reproduce's experiments as forks of a process that has imported the engine once.

Every experiment of ``reproduce`` used to start a fresh ``python -m svmattn NAME``, which spends
2-4 s importing JAX, SciPy, matplotlib and the engine before it computes anything: about a sixth
of the E1-E9 run's summed stage time. ``preload`` imports them once in reproduce's process,
before JAX starts a backend (so no XLA thread exists yet and forking is safe), and ``start``
runs an experiment's command line in a fork of it: the same code on the same arguments and
environment, as ``python -m svmattn`` would run it, with its output in the given files. A
fork's results are the fresh process's bit for bit (tests/test_reproduce_forked.py).

Only commands ``[sys.executable, "-m", "svmattn", ...]`` are forked, and only on Linux after a
``preload`` that worked; reproduce runs anything else as its own process (``subprocess``), as it
does everywhere with ``reproduce --nofork``.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time

from svmattn import registry
from svmattn.io import plots


# What the experiments import before they compute (the flag-defining experiment modules are not
# here: each fork defines its own binary's flags, as a fresh process does).
PRELOAD = ("jax", "jax.numpy", "numpy", "scipy.linalg", "scipy.optimize", "svmattn.cli", "svmattn.registry",
           "svmattn.config.flags_front", "svmattn.execution.pipeline", "svmattn.execution.run_experiment", "svmattn.execution.workers",
           "svmattn.svm.att_svm", "svmattn.svm.nuclear_ipm", "svmattn.train.loop", "svmattn.io.checkpoint",
           "svmattn.io.plots")

_state: dict = {}


def _flag_names() -> set:
  from absl import flags
  return set(flags.FLAGS)


def preload(fork: bool = True) -> str | None:
  """Import what the experiments use, once (with every study and figure module of the registry).
  None when forking is on, else why not (``fork`` False: reproduce --nofork; not Linux, a JAX backend
  already started, an import that failed, or an import that defined command-line flags)."""
  if "why" in _state:
    return _state["why"]
  why = None
  if not fork:
    why = "--nofork"
  elif not sys.platform.startswith("linux") or not hasattr(os, "fork"):
    why = f"not on Linux ({sys.platform})"
  else:
    before = _flag_names()
    try:
      for name in PRELOAD:
        importlib.import_module(name)
      for experiment in registry.experiments():
        for module in (f"svmattn.studies.{experiment.name}", f"svmattn.figures.{experiment.name}"):
          if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)
      plots.warm_up()                      # matplotlib with the Agg backend, as every binary sets it, and
                                           # its one-time work (fonts, mathtext), once for every fork
      if backend_started():
        why = "a JAX backend started while importing (forking it is unsafe)"
      elif _flag_names() != before:
        why = f"importing defined flags {sorted(_flag_names() - before)}"
    except Exception as e:   # noqa: BLE001  (any failure: run fresh processes instead)
      why = f"preloading failed: {e!r}"
  _state["why"] = why
  return why


def backend_started() -> bool:
  """Whether JAX has started a backend in this process. JAX refuses to change ``jax_num_cpu_devices``
  once it has (a RuntimeError), so the setting is changed and put back."""
  import jax
  current = jax.config.jax_num_cpu_devices
  try:
    jax.config.update("jax_num_cpu_devices", 1 if current != 1 else 2)
  except RuntimeError:
    return True
  jax.config.update("jax_num_cpu_devices", current)
  return False


def _status(code) -> int:
  """The exit status ``sys.exit(code)`` gives, printing a message ``code`` to stderr as it does."""
  if code is None:
    return 0
  if isinstance(code, int):
    return code
  sys.stderr.write(f"{code}\n")
  return 1


def forkable(cmd: list) -> bool:
  """True for a ``python -m svmattn ...`` command, after a ``preload`` that worked."""
  return list(cmd[:3]) == [sys.executable, "-m", "svmattn"] and preload() is None


class Forked:
  """A forked experiment, with the part of ``subprocess.Popen``'s interface that reproduce uses."""

  def __init__(self, cmd: list, stdout, stderr, env: dict):
    self.args, self.returncode = cmd, None
    for f in (sys.stdout, sys.stderr, stdout, stderr):
      f.flush()
    self.pid = os.fork()
    if self.pid == 0:                      # the child: never returns
      _child(cmd, stdout.fileno(), stderr.fileno(), env)

  def poll(self) -> int | None:
    if self.returncode is None:
      pid, status = os.waitpid(self.pid, os.WNOHANG)
      if pid:
        self.returncode = os.waitstatus_to_exitcode(status)
    return self.returncode

  def wait(self, timeout: float | None = None) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    while self.poll() is None:
      if deadline is not None and time.monotonic() > deadline:
        raise subprocess.TimeoutExpired(self.args, timeout)
      time.sleep(0.02)
    return self.returncode

  def send_signal(self, sig: int) -> None:
    if self.poll() is None:
      os.kill(self.pid, sig)

  def terminate(self) -> None:
    self.send_signal(signal.SIGTERM)

  def kill(self) -> None:
    self.send_signal(signal.SIGKILL)


def start(cmd: list, stdout, stderr, env: dict):
  """``cmd`` running with its output in ``stdout`` and ``stderr`` (files) and environment ``env``: a
  fork (``Forked``) where ``forkable``, else its own process (``subprocess.Popen``)."""
  if forkable(cmd):
    return Forked(cmd, stdout, stderr, env)
  return subprocess.Popen(cmd, stdout=stdout, stderr=stderr, text=True, env=env)


def _reset_flags() -> None:
  """The parent binary's command-line flags (those the engine defined) undefined and the rest
  unparsed: the fork defines and parses its own binary's flags as a fresh process does (absl's
  own flags stay, as they would be there)."""
  from absl import flags
  for module, defined in flags.FLAGS.flags_by_module_dict().items():
    if module.split(".")[0] in ("svmattn", "experiments", "__main__"):
      for flag in list(defined):
        for name in {flag.name, flag.short_name} - {None}:
          if name in flags.FLAGS:
            delattr(flags.FLAGS, name)
  flags.FLAGS.unparse_flags()


def _child(cmd: list, out_fd: int, err_fd: int, env: dict) -> None:
  """Run ``python -m svmattn ARGS`` (cmd) in this fork, then leave with its exit code."""
  code = 1
  try:
    signal.signal(signal.SIGINT, signal.default_int_handler)   # a fresh interpreter's handlers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.environ.clear()
    os.environ.update(env)
    _reset_flags()
    import runpy
    sys.argv = ["svmattn", *cmd[3:]]
    try:
      runpy.run_module("svmattn", run_name="__main__", alter_sys=True)
      code = 0
    except SystemExit as e:                # sys.exit(code) as the interpreter reads it
      code = _status(e.code)
    except BaseException:                  # noqa: BLE001  (a traceback, as the interpreter prints it)
      import traceback
      traceback.print_exc()
      code = 1
    logging.shutdown()                     # (a fork never runs its parent's exit: it ends below)
  finally:
    try:
      sys.stdout.flush()
      sys.stderr.flush()
    finally:
      os._exit(code)
