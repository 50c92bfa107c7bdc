r"""The report of a reproduce run: OUT/report.md and OUT/report.html.

Layout (both files):
  1. a summary: one line per experiment of the paper (its registry entry's claim, its verdict: all
     checks as expected / n of m as expected / failed to run, its key numbers); then one line per
     question beyond the paper ("reported" where the experiment has no checks); the share of checks
     that came out as expected;
  2. a table of contents;
  3. the paper: one section per experiment (figures, the claim, its checks against the numbers,
     wall time, the exact command), its variants (E2-authors, E5-authors) inside it, then the
     numerics comparison (exact against the authors' normalization);
  4. beyond the paper, in the same layout;
  5. the environment (versions) and the command line of the run.

The experiments, their order, claims or questions, titles, variants and key numbers come from
``svmattn.registry``. report.html stands alone: figures are embedded as base64 data URIs, the CSS
is inline, nothing is loaded from elsewhere. Both files are written atomically.

    svmattn reproduce --out=OUT [--quick]       # runs the experiments, then writes the report
    svmattn report OUT                          # re-renders it from OUT/reproduce.json
    svmattn compare DIR1 DIR2 ...               # key numbers of runs side by side

Modules: records (a run's records, verdicts, key numbers), markdown, html, numerics (exact
against the authors'), stages (wall time per stage), text (fixed texts, command lines),
reproduce (the absl binary), compare.
"""
from __future__ import annotations

import os
import sys

from svmattn.report.html import html_report
from svmattn.report.html import write_html
from svmattn.report.markdown import markdown
from svmattn.report.markdown import write_markdown
from svmattn.report.numerics import rows as numerics_rows
from svmattn.report.records import anchor
from svmattn.report.records import key_number
from svmattn.report.records import load
from svmattn.report.records import summary_lines
from svmattn.report.records import verdict
from svmattn.report.stages import stage_floors
from svmattn.report.stages import stage_table
from svmattn.report.stages import stage_words
from svmattn.report.stages import stages
from svmattn.report.text import command_line

USAGE = ("usage: svmattn report OUT   (re-renders OUT/report.md and OUT/report.html from OUT/reproduce.json)")


def write(out, records, meta):
  """OUT/report.md and OUT/report.html."""
  write_markdown(os.path.join(out, "report.md"), records, meta, out)
  write_html(os.path.join(out, "report.html"), records, meta, out)


def main(argv=None) -> int:
  """``svmattn report OUT``: ``argv`` is the arguments after the command ([OUT])."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if len(argv) != 1 or argv[0].startswith("-"):
    sys.exit(USAGE)
  out = argv[0]
  try:
    records, meta = load(out)
  except (OSError, ValueError, KeyError) as e:
    sys.exit(f"error: {out}: no readable reproduce.json ({e})")
  write(out, records, meta)
  print(f"report: {out}/report.md and {out}/report.html")
  return 0


__all__ = ["write", "main", "markdown", "html_report", "write_markdown", "write_html", "numerics_rows", "anchor",
           "key_number", "load", "summary_lines", "verdict", "stage_floors", "stage_table", "stage_words", "stages",
           "command_line"]
