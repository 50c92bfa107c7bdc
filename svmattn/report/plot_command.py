r"""``svmattn plot DIR [DIR ...] [--x=FIELD] [--y=METRIC] [--hue=FIELD,...] [--col=FIELD,...] [--out=FILE]``

A metric across a sweep's cells or several runs (``svmattn.results.plot``): the median over data
sets with their 25th..75th percentile as a band, one line per --hue value, one panel per --col
value. FIELD is a column of ``results.load`` (a swept setting, ``param``, ``source``: the
directory) or a setting of the runs' summary.json (``lr``, ``steps``); ``--x=step`` plots the
per-snapshot curves. A sweep alone needs no flag (its default figure). Prints the figure's path
and the table behind it.

    svmattn plot runs/sweep                                     # the sweep's default figure
    svmattn plot runs/sweep --x=lr --y=final_corr_fro --hue=d --col=param
    svmattn plot runs/a runs/b --x=step --y=corr_fro            # two runs' curves, one line each
"""
from __future__ import annotations

import sys

from svmattn import results
from svmattn.report import arguments

USAGE = ("usage: svmattn plot DIR [DIR ...] [--x=FIELD] [--y=METRIC] [--hue=FIELD,...] [--col=FIELD,...] "
         "[--out=FILE.png] [--title=TEXT]")


def _fields(text):
  return [f for f in (text or "").split(",") if f]


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if arguments.help_requested(argv, __doc__):
    return 0
  try:
    dirs, o = arguments.parse(argv, {"x": None, "y": None, "hue": None, "col": None, "out": None, "title": None},
                              )
    if not dirs:
      raise arguments.ArgumentError("no results directory given")
    path, summary = results.plot(dirs, o["x"], o["y"], _fields(o["hue"]), _fields(o["col"]), o["out"], o["title"])
  except (arguments.ArgumentError, results.ResultsError) as e:
    print(f"error: {e}\n{USAGE}", file=sys.stderr)
    return 1
  except OSError as e:
    print(f"error: cannot write the figure: {e.strerror or e} ({e.filename or ''})", file=sys.stderr)
    return 1
  print(summary.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
  print(f"wrote {path}")
  return 0
