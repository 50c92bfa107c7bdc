r"""Runs side by side: ``svmattn compare DIR1 DIR2 ...``.

One column per run directory (a sweep's directory: one column per cell). First the settings that
differ between the columns (operational flags such as --out and --progress left out; a --data or
--init file by its name), then one row per key number (the experiment's registry entry read from
the run's summary.json), the checks as expected, the numerics version and the time: a run's wall
time, a sweep cell's own seconds of work (its loads, training and analyses, summary.json
``timings_s.cell_total``; the sweep's wall is in the sweep's own summary.json).

    svmattn compare results/local_convergence results/local_convergence_authors
    svmattn compare sweep_out                 # its cells, one column each
    svmattn compare sweep_a sweep_b --layout=rows

With more than ``WIDE`` columns, or ``--layout=rows``, the table is transposed: one row per
column, the key numbers numbered [1], [2], ... with their names below (``--layout=columns``
keeps one column per run). A directory without a readable summary.json is one line
"error: DIR: no summary.json" (exit 1).
"""
from __future__ import annotations

import os
import sys

from svmattn import registry
from svmattn.analysis import checks as checks_lib
from svmattn.report import records as records_lib

USAGE = ("usage: svmattn compare DIR1 [DIR2 ...] [--layout=auto|columns|rows]   (the settings that differ, key "
         "numbers, checks, numerics version and time side by side)")
WIDE = 4          # more columns than this: one row per column (--layout=auto)
LAYOUTS = ("auto", "columns", "rows")


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
  """A run's wall time (timings_s.total); a sweep cell's own seconds (timings_s.cell_total)."""
  timings = summary.get("timings_s")
  if not isinstance(timings, dict):
    return None
  value = timings.get("cell_total", timings.get("total")) if summary.get("sweep_settings") is not None else \
      timings.get("total")
  return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _settings(summary, experiment) -> dict:
  """The settings of a run (its summary's flags) without the operational ones; a file by its name."""
  flags = summary.get("flags")
  if flags is None:
    return {}
  if not isinstance(flags, dict):
    raise CompareError(f"corrupt summary.json (its flags are a {type(flags).__name__}, not a mapping)")
  skip = {f.name for f in experiment.settings.fields if f.operational} if experiment is not None else {"out"}
  out = {}
  for k, v in flags.items():
    if k in skip or k in ("out", "sweep"):
      continue
    if isinstance(v, str) and ("/" in v or os.sep in v):
      v = os.path.basename(v.rstrip("/"))
    out[k] = v
  return out


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
      if not isinstance(cell.get("dir"), str) or not isinstance(cell.get("settings"), dict):
        raise CompareError("corrupt summary.json (a sweep cell needs its settings and dir)")
      cell_summary = records_lib.read_summary(os.path.join(directory, cell["dir"]))
      if cell_summary is None:
        raise CompareError(f"its cell {cell['dir']} has no readable summary.json")
      keys = cell.get("key_numbers")
      keys = list(keys.items()) if isinstance(keys, dict) else (keys or _key_numbers(cell_summary, experiment))
      name = ", ".join(f"{k}={records_lib.fmt(v)}" for k, v in settings.items()) or cell.get("dir", "?")
      keys = [(k, v) for k, v in keys if v is not None]
      settings_all = _settings(cell_summary, experiment) or {**_settings(summary, experiment), **settings}
      out.append({"name": f"{directory} [{name}]", "experiment": label, "keys": list(keys),
                  "checks": _checks(cell.get("checks")), "settings": settings_all, "cell": True,
                  "numerics": cell_summary.get("numerics_version", numerics), "wall": _wall(cell_summary)})
    return out
  return [{"name": directory, "experiment": label, "keys": _key_numbers(summary, experiment),
           "checks": _checks(summary.get("checks")), "numerics": numerics, "wall": _wall(summary),
           "settings": _settings(summary, experiment)}]


def differing(cols: list[dict]) -> list[str]:
  """The settings whose values are not the same in every column (in order of first appearance)."""
  names = list(dict.fromkeys(k for c in cols for k in c.get("settings", {})))
  return [n for n in names
          if len({records_lib.fmt(c["settings"][n]) if n in c.get("settings", {}) else "-" for c in cols}) > 1]


def _rows(cols: list[dict]) -> tuple[list[str], list[list[str]]]:
  """(row labels, one list of cell texts per column): the differing settings, key numbers, checks,
  numerics version and time."""
  diff = differing(cols)
  labels = list(dict.fromkeys(label for c in cols for label, _ in c["keys"]))
  any_cell = any(c.get("cell") for c in cols)
  time_label = "time (s): a run's wall, a cell's own work" if any_cell else "wall time (s)"
  names = [f"setting {n}" for n in diff] + labels + ["checks as expected", "numerics version", time_label]
  values = []
  for c in cols:
    own, keys = c.get("settings", {}), dict(c["keys"])
    row = [records_lib.fmt(own[n]) if n in own else "-" for n in diff]
    row += ["-" if keys.get(label) is None else records_lib.fmt(keys[label]) for label in labels]
    row += [c["checks"], "-" if c["numerics"] is None else str(c["numerics"]),
            "-" if c["wall"] is None else f"{c['wall']:.1f}"]
    values.append(row)
  return names, values


def _render(rows: list[list[str]]) -> str:
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)


def table(cols: list[dict], layout: str = "auto") -> str:
  """The text table. ``columns``: a row per setting that differs, per key number (in order of first
  appearance), then the checks, the numerics version and the time, one column per run; ``rows``:
  transposed, one row per run with the key numbers numbered and named below; ``auto``: ``rows``
  with more than ``WIDE`` columns. '-' where a column has no value."""
  names, values = _rows(cols)
  experiments = sorted({c["experiment"] for c in cols})
  if layout == "columns" or (layout == "auto" and len(cols) <= WIDE):
    rows = [["", *[c["name"] for c in cols]], ["experiment", *[c["experiment"] for c in cols]]]
    rows += [[name, *[v[i] for v in values]] for i, name in enumerate(names)]
    return _render(rows)
  diff = [n for n in names if n.startswith("setting ")]
  keys = names[len(diff):-3]
  head = ["run", *[n[len("setting "):] for n in diff], *[f"[{i + 1}]" for i in range(len(keys))],
          "checks", "numerics", "time (s)"]
  if any(c.get("cell") for c in cols):
    head[-1] = "own time (s)" if all(c.get("cell") for c in cols) else "time (s)"
  if len(experiments) > 1:
    head.insert(1, "experiment")
  rows = [head]
  for c, v in zip(cols, values):
    rows.append([c["name"], *([c["experiment"]] if len(experiments) > 1 else []), *v])
  legend = [f"[{i + 1}] {k}" for i, k in enumerate(keys)]
  title = f"{', '.join(experiments)}: {len(cols)} columns" + (
      f"; settings that differ: {', '.join(n[len('setting '):] for n in diff)}" if diff else "; the same settings")
  return "\n".join([title, _render(rows), *legend])


def main(argv=None) -> int:
  """``svmattn compare DIR1 DIR2 ...``: ``argv`` is the arguments after the command (the directories)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv:
    print(f"error: no run directory given\n{USAGE}", file=sys.stderr)
    return 1
  if any(a in ("-h", "--help") for a in argv):
    print(USAGE)
    return 0
  layout = "auto"
  for a in [a for a in argv if a.startswith("--layout=")]:
    layout = a.split("=", 1)[1]
    if layout not in LAYOUTS:
      print(f"error: --layout={layout!r}: must be one of {', '.join(LAYOUTS)}", file=sys.stderr)
      return 1
  argv = [a for a in argv if not a.startswith("--layout=")]
  bad = [a for a in argv if a.startswith("-")]
  if bad:
    print(f"error: unknown option {bad[0]}\n{USAGE}", file=sys.stderr)
    return 1
  if not argv:
    print(f"error: no run directory given\n{USAGE}", file=sys.stderr)
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
  print(table(cols, layout))
  return 0


if __name__ == "__main__":
  sys.exit(main())
