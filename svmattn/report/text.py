"""The report's fixed texts, and the command lines and run mode it shows."""
from __future__ import annotations

import shlex
import struct
import sys

TITLE = "svmattn: reproduction of \u201cTransformers as Support Vector Machines\u201d"
PAPER = "Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898"

BEYOND_NOTE = ("Questions the paper leaves open, on the same engine (docs/science.md sections 10-14). Where the "
               "literature predicts an outcome, the checks state that prediction and a check not as expected "
               "is a finding; where no theorem exists the experiment has no checks and its numbers are reported.")


def command_line(argv=None, package=None) -> str:
  """How this process was started, as a shell command (python -m PACKAGE.reproduce ..., or svmattn reproduce ...)."""
  argv = list(sys.argv if argv is None else argv)
  if package is None:
    first = (argv[0] if argv else "").replace("\\", "/")
    package = "experiments" if first.endswith("experiments/reproduce.py") else "svmattn.report"
  head = argv[0] if argv and argv[0].startswith("svmattn ") else f"python -m {package}.reproduce"
  return " ".join([head] + [shlex.quote(a) for a in argv[1:]])


def command(record) -> str:
  """A record's command as a user types it ("-m svmattn E2 ..." -> "python -m svmattn E2 ...")."""
  cmd = record.get("command", "")
  return f"python {cmd}" if cmd.startswith("-m ") else cmd


def mode(meta) -> str:
  return (f"Mode: {'quick (small run counts)' if meta.get('quick') else 'the paper run counts'}; "
          f"seed {meta.get('seed', 0)}; total wall time {meta.get('total_s', 0.0):.1f} s"
          + (f", {meta['jobs']} experiments at once (each one's wall time includes the time it shared the machine)."
             if meta.get("jobs", 1) > 1 else "."))


def environment_rows(meta) -> list[tuple[str, str]]:
  return [(str(k), ", ".join(map(str, v)) if isinstance(v, list) else str(v))
          for k, v in (meta.get("environment") or {}).items()]


def png_width(path) -> int:
  try:
    with open(path, "rb") as f:
      head = f.read(24)
    return struct.unpack(">I", head[16:20])[0] if head[:8] == b"\x89PNG\r\n\x1a\n" else 0
  except (OSError, struct.error):
    return 0
