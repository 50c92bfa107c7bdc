r"""``svmattn table DIR [DIR ...] --out=FILE [--format=csv|parquet] [--curves] [--metrics=a,b]``

Every data set's per-run numbers of one or several runs or sweeps as one file
(``svmattn.results.export``): the table of ``results.load`` (one row per cell, data set and
parameterization; a first column ``source`` names the directory), or with ``--curves`` the long
table of ``results.load_curves`` (one row per snapshot too; ``--metrics`` keeps only those).
The format is --format, else FILE's extension. Written atomically: a failed write leaves no
half-written file.

    svmattn table runs/sweep --out=sweep.csv
    svmattn table runs/sweep_a runs/sweep_b --curves --metrics=corr_fro --out=curves.parquet
"""
from __future__ import annotations

import sys

from svmattn import results
from svmattn.report import arguments

USAGE = "usage: svmattn table DIR [DIR ...] --out=FILE [--format=csv|parquet] [--curves] [--metrics=a,b]"


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if arguments.help_requested(argv, __doc__):
    return 0
  try:
    dirs, o = arguments.parse(argv, {"out": None, "format": None, "metrics": None}, switches=("curves",))
    if not dirs:
      raise arguments.ArgumentError("no results directory given")
    if not o["out"]:
      raise arguments.ArgumentError("--out=FILE is required (FILE.csv or FILE.parquet)")
    if o["format"] is not None and o["format"] not in results.EXPORT_FORMATS:
      raise arguments.ArgumentError(f"--format={o['format']}: must be one of {', '.join(results.EXPORT_FORMATS)}")
    if o["metrics"] and not o["curves"]:
      raise arguments.ArgumentError("--metrics chooses curves: pass it with --curves")
    metrics = [m for m in (o["metrics"] or "").split(",") if m] or None
    df = results.export(dirs, o["out"], o["format"], o["curves"], metrics)
  except (arguments.ArgumentError, results.ResultsError) as e:
    print(f"error: {e}\n{USAGE}", file=sys.stderr)
    return 1
  except ImportError as e:
    print(f"error: --format=parquet needs pyarrow ({e}); pip install -r requirements.txt", file=sys.stderr)
    return 1
  except OSError as e:
    print(f"error: cannot write {o['out']}: {e.strerror or e}", file=sys.stderr)
    return 1
  print(f"wrote {o['out']}: {len(df)} rows, {len(df.columns)} columns")
  return 0
