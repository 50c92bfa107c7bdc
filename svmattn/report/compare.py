r"""Runs side by side: ``svmattn compare DIR1 DIR2 ...``.

One column per run directory (a sweep's directory: one column per cell), one row per key number
(the experiment's registry entry read from the run's summary.json), then the checks as expected,
the numerics version and the wall time:

    svmattn compare results/local_convergence results/local_convergence_authors
    svmattn compare sweep_out                 # its cells, one column each

A directory without a readable summary.json is one line "error: DIR: no summary.json" (exit 1).
"""
from __future__ import annotations

import os
import sys

from svmattn import registry
from svmattn.analysis import checks as checks_lib
from svmattn.report import records as records_lib

USAGE = "usage: svmattn compare DIR1 [DIR2 ...]   (key numbers, checks, numerics version, wall time side by side)"


class CompareError(ValueError):
  pass


def _checks(checks) -> str:
  if isinstance(checks, dict):          # a sweep cell's {"ok", "total", "failing"}
    return f"{checks.get('ok', 0)}/{checks.get('total', 0)}"
  checks = checks or []
  if not isinstance(checks, list) or not all(isinstance(c, dict) for c in checks):
    raise CompareError("corrupt summary.json (its checks are not a list of mappings)")
  t = checks_lib.tally(checks)
  return f"{t['ok']}/{t['total']}" + (f" ({len(t['not_evaluated'])} not evaluated)" if t["not_evaluated"] else "")


def _wall(summary) -> float | None:
  timings = summary.get("timings_s")
  value = timings.get("total") if isinstance(timings, dict) else None
  return float(value) if isinstance(value, (int, float)) else None


def _key_numbers(summary, experiment) -> list[tuple[str, object]]:
  if experiment is None:
    return []
  try:
    return registry.key_numbers(summary, experiment)
  except (KeyError, TypeError, ValueError, AttributeError, IndexError):
    return []


def columns(directory: str) -> list[dict]:
  """The columns of one run directory: {name, experiment, keys [(label, value)], checks, numerics, wall}."""
  summary = records_lib.read_summary(directory)
  if summary is None:
    why = "no summary.json" if not os.path.isfile(os.path.join(directory, "summary.json")) else \
        "unreadable summary.json"
    raise CompareError(f"{directory}: {why}" if os.path.isdir(directory) else f"{directory}: no such directory")
  if os.path.isdir(os.path.join(directory, "work")):
    raise CompareError(f"{directory}: an unfinished run (its work/ directory is still there; its summary.json "
                       "may be an earlier run's): finish it with --resume")
  try:
    return _columns(directory, summary)
  except CompareError as e:
    raise CompareError(f"{directory}: {e}") from None


def _columns(directory: str, summary: dict) -> list[dict]:
  experiment = registry.of_summary(summary)
  label = experiment.id if experiment is not None else str(summary.get("experiment", "?"))
  numerics = summary.get("numerics_version")
  if "sweep" in summary:
    if not isinstance(summary.get("cells"), list) or not all(isinstance(c, dict) for c in summary["cells"]):
      raise CompareError("corrupt summary.json (a sweep's cells must be a list of mappings)")
    out = []
    for cell in summary["cells"]:
      settings = cell.get("settings") or {}
      if not isinstance(settings, dict):
        raise CompareError("corrupt summary.json (a sweep cell's settings are not a mapping)")
      cell_summary = records_lib.read_summary(os.path.join(directory, cell.get("dir", ""))) or {}
      keys = cell.get("key_numbers")
      keys = list(keys.items()) if isinstance(keys, dict) else (keys or _key_numbers(cell_summary, experiment))
      name = ", ".join(f"{k}={records_lib.fmt(v)}" for k, v in settings.items()) or cell.get("dir", "?")
      out.append({"name": f"{directory} [{name}]", "experiment": label, "keys": list(keys),
                  "checks": _checks(cell.get("checks")),
                  "numerics": cell_summary.get("numerics_version", numerics), "wall": _wall(cell_summary)})
    return out
  return [{"name": directory, "experiment": label, "keys": _key_numbers(summary, experiment),
           "checks": _checks(summary.get("checks")), "numerics": numerics, "wall": _wall(summary)}]


def table(cols: list[dict]) -> str:
  """The text table: a row per key number (in order of first appearance), then the checks, the
  numerics version and the wall time; '-' where a column has no value."""
  labels = list(dict.fromkeys(label for c in cols for label, _ in c["keys"]))
  rows = [["", *[c["name"] for c in cols]], ["experiment", *[c["experiment"] for c in cols]]]
  for label in labels:
    cells = []
    for c in cols:
      value = dict(c["keys"]).get(label)
      cells.append("-" if value is None else records_lib.fmt(value))
    rows.append([label, *cells])
  rows.append(["checks as expected", *[c["checks"] for c in cols]])
  rows.append(["numerics version", *["-" if c["numerics"] is None else str(c["numerics"]) for c in cols]])
  rows.append(["wall time (s)", *["-" if c["wall"] is None else f"{c['wall']:.1f}" for c in cols]])
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)


def main(argv=None) -> int:
  """``svmattn compare DIR1 DIR2 ...``: ``argv`` is the arguments after the command (the directories)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or any(a in ("-h", "--help") for a in argv):
    print(USAGE)
    return 0 if argv else 1
  bad = [a for a in argv if a.startswith("-")]
  if bad:
    print(f"error: unknown option {bad[0]}\n{USAGE}", file=sys.stderr)
    return 1
  cols, errors = [], []
  for directory in argv:
    try:
      cols += columns(directory)
    except CompareError as e:
      errors.append(str(e))
  if errors:
    for e in errors:
      print(f"error: {e}", file=sys.stderr)
    return 1
  print(table(cols))
  return 0


if __name__ == "__main__":
  sys.exit(main())
