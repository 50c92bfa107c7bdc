"""The ``svmattn`` command.

    svmattn list                                  # every experiment of the registry
    svmattn E2 --out=DIR [--flag=value ...]       # an experiment by id or name (local_convergence)
    svmattn run --config=FILE.py --out=DIR        # an experiment or a sweep from a config file
    svmattn reproduce --out=results [--quick]     # every experiment and the report
    svmattn report OUT                            # re-render OUT's report
    svmattn compare DIR1 DIR2 ...                 # the settings that differ, key numbers side by side
    svmattn plot DIR [--x=FIELD --y=METRIC ...]   # a metric across a sweep's cells or several runs
    svmattn table DIR ... --out=FILE.csv          # every data set's numbers as CSV or Parquet
    svmattn replay --out=DIR --run=I              # one data set alone, against the run's record
    python -m svmattn ...                         # the same without the installed script

The experiments come from ``svmattn.registry`` (a study module with an ``EXPERIMENT``); the
commands below are the tools around them.
"""
from __future__ import annotations

import importlib
import os
import sys

import svmattn
from svmattn import registry
from svmattn.config import flags_front

# command -> (module, its entry point taking the arguments after the command, or None: absl main run())
COMMANDS = {
    "run": ("svmattn.config.config_file", "main", "an experiment or a sweep from a config file"),
    "reproduce": ("svmattn.report.reproduce", "run", "every experiment of the paper and after it, and the report"),
    "report": ("svmattn.report", "main", "re-render a reproduce run's report (OUT/report.md, report.html)"),
    "compare": ("svmattn.report.compare", "main", "the settings that differ and key numbers of runs side by side"),
    "plot": ("svmattn.report.plot_command", "main", "a metric across a sweep's cells or several runs (a figure)"),
    "table": ("svmattn.report.table_command", "main", "every data set's numbers of runs as one CSV or Parquet file"),
    "replay": ("svmattn.execution.replay_command", "run", "one data set of a run alone, against the run's record"),
}


def usage() -> str:
  lines = ["usage: svmattn COMMAND [--flag=value ...]   (svmattn COMMAND --help: its flags)", "", "commands:"]
  lines += [f"  {name:<20} {help_}" for name, (_, _, help_) in COMMANDS.items()]
  lines += ["  list                 this list", "", "experiments (svmattn ID or svmattn NAME):"]
  for e in registry.experiments():
    lines.append(f"  {e.id:<4} {e.name:<20} {e.title}" + ("  [beyond the paper]" if e.beyond else ""))
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
  """The command's entry point: JAX set up as every engine program runs it (``svmattn.configure``).
  A reader that closes the pipe (``svmattn compare DIR | head -3``) ends the command quietly."""
  try:
    _main(argv)
    sys.stdout.flush()
  except BrokenPipeError:
    _quiet_closed_pipe()


def _quiet_closed_pipe() -> None:
  """The reader of stdout has gone: no more output, no traceback, exit status 0 (what was asked
  for has been read as far as the reader wanted)."""
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, sys.stdout.fileno())     # (the interpreter's own flush at exit would raise again)
  sys.exit(0)


def _main(argv: list[str] | None) -> None:
  svmattn.configure()
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help", "list"):
    print(usage())
    return
  command = argv[1]
  if command in COMMANDS:
    module, entry, _ = COMMANDS[command]
    fn = getattr(importlib.import_module(module), entry)
    if entry == "run":          # an absl main: it parses sys.argv
      sys.argv = [f"svmattn {command}"] + argv[2:]
      fn()
    else:
      result = fn(argv[2:])
      if isinstance(result, int) and result:
        sys.exit(result)
    return
  try:
    experiment = registry.get(command)
  except registry.UnknownExperiment:
    sys.exit(f"error: unknown command {command!r}\n\n{usage()}")
  sys.argv = [f"svmattn {experiment.name}"] + argv[2:]
  flags_front.define(experiment.name)           # (after argv: its flags are the program's key flags)
  flags_front.main(experiment.name)


if __name__ == "__main__":
  main()
