"""OUT/report.md: the report as markdown (figures linked relative to OUT)."""
from __future__ import annotations

import os
import re

from svmattn.io import atomic_files as results_io
from svmattn.report import numerics
from svmattn.report import records as records_lib
from svmattn.report import stages
from svmattn.report import text


def md(value) -> str:
  """Text for a markdown table cell or paragraph: |, *, _, ` and \\ escaped."""
  return re.sub(r"([\\|*_`])", r"\\\1", str(value))


def _checks(record) -> list[str]:
  lines = ["| check | value | expected | as expected |", "|---|---|---|---|"]
  for c in record.get("checks") or []:
    lines.append(f"| {md(c['name'])} | {md(records_lib.fmt(c['value']))} | {md(records_lib.expected(c))} | "
                 f"{'not evaluated' if c.get('ok') is None else 'yes' if c.get('ok') else '**no**'} |")
  return lines


def _record(record, level, lead, out=None, numerics_ids=()) -> list[str]:
  hashes = "#" * level
  _, words = records_lib.verdict(record)
  lines = [f'<a id="{records_lib.anchor(record)}"></a>', "", f"{hashes} {md(record['id'] + ': ' + records_lib.title(record))}", ""]
  for fig in record.get("figures") or []:
    lines += [f"![{md(fig)}]({fig})", ""]
  if lead:
    claim, beyond = records_lib.claim_text(record)
    if claim:
      lines += [f"**{'The question' if beyond else 'The paper claims'}.** {md(claim)}", ""]
  if records_lib.failed(record):
    where = f" Its full output: [{md(record['dir'])}/log.txt]({record['dir']}/log.txt)." if record.get("dir") else ""
    lines += [f"**Failed to run.**{where}", "", "```", record.get("error") or "(no error output)", "```", ""]
  elif record.get("checks"):
    lines += [f"**Against the numbers: {words}.**", ""] + _checks(record) + [""]
  else:
    lines += [f"**Reported** (no checks: no theorem predicts the outcome). Found: {md(records_lib.key_number(record, out))}; "
              "every number is in the program output below.", ""]
  lines += [f"Wall time {record.get('wall_s', 0.0):.1f} s{stages.stage_words(record)}. Command:", "", "```",
            text.command(record), "```", ""]
  if record.get("stdout"):
    show = " open" if not record.get("checks") else ""
    lines += [f"<details{show}><summary>Program output</summary>", "", "```", record["stdout"], "```", "",
              "</details>", ""]
  if lead and records_lib.base_id(record) in numerics_ids:
    lines += ["Exact against the authors' numerics, side by side: [Numerics](#numerics).", ""]
  return lines


def _summary_table(lines_, paper) -> list[str]:
  head = "claim" if paper else "question"
  rows = [f"| exp. | {head} | verdict | key number |", "|---|---|---|---|"]
  for s in lines_:
    v = md(s["verdict"])
    if s["css"] in ("partial", "fail"):
      v = f"**{v}**"
    if s["missed"]:
      v += f" ({md(records_lib.missed(s['missed']))})"
    v += "".join(f"; {md(label)} ({md(vid)}): {md(short)}" for label, vid, short, _ in s["variants"])
    rows.append(f"| [{s['id']}](#{s['anchor']}) | {md(s['claim'])} | {v} | {md(s['key'])} |")
  return rows


def _toc(groups) -> list[str]:
  lines = []
  for g in groups:
    lines.append(f"  - [{md(g[0]['id'])}: {md(records_lib.title(g[0]))}](#{records_lib.anchor(g[0])})")
    lines += [f"    - [{md(r['id'])}: {md(records_lib.title(r))}](#{records_lib.anchor(r)})" for r in g[1:]]
  return lines


def markdown(records, meta, out=None) -> str:
  """The report as markdown (figures linked relative to OUT)."""
  groups = records_lib.group(records)
  paper = [g for g in groups if not records_lib.beyond(g[0])]
  beyond = [g for g in groups if records_lib.beyond(g[0])]
  summ = records_lib.summary_lines(records, out)
  rows = numerics.rows(records)
  numerics_ids = numerics.ids(records) if rows else []
  lines = [f"# {text.TITLE}", "", f"{text.PAPER}. {text.mode(meta)}", "", '<a id="summary"></a>', "", "## Summary", "",
           ] + [f"- **{md(line)}**" for line in records_lib.overall(records)] + [""]
  if paper:
    lines += ["Claims of the paper:", ""] + _summary_table([s for s in summ if not s["beyond"]], True) + [""]
  if beyond:
    lines += ["Beyond the paper:", ""] + _summary_table([s for s in summ if s["beyond"]], False) + [""]
  missing = records_lib.not_run(records)
  if missing:
    lines += [f"Not run this time: {', '.join(missing)}.", ""]
  lines += ['<a id="contents"></a>', "", "## Contents", ""]
  if paper:
    lines += ["- [The paper](#paper)"] + _toc(paper)
    if rows:
      lines.append(f"  - [{md(numerics.heading(records))}](#numerics)")
  if beyond:
    lines += ["- [Beyond the paper](#beyond)"] + _toc(beyond)
  lines += ["- [Environment and command line](#environment)", ""]
  if paper:
    lines += ['<a id="paper"></a>', "", "# The paper", ""]
    for g in paper:
      for i, r in enumerate(g):
        lines += _record(r, 2 if i == 0 else 3, lead=i == 0, out=out, numerics_ids=numerics_ids)
    if rows:
      lines += ['<a id="numerics"></a>', "", f"## {md(numerics.heading(records))}", "",
                md(numerics.NUMERICS_NOTE), "", "| statistic | exact | authors |", "|---|---|---|"]
      lines += [f"| {md(a)} | {md(b)} | {md(c)} |" for a, b, c in rows] + [""]
  if beyond:
    lines += ['<a id="beyond"></a>', "", "# Beyond the paper", "", md(text.BEYOND_NOTE), ""]
    for g in beyond:
      for i, r in enumerate(g):
        lines += _record(r, 2 if i == 0 else 3, lead=i == 0, out=out, numerics_ids=numerics_ids)
  lines += ['<a id="environment"></a>', "", "# Environment and command line", "", "Command line:", "", "```",
            meta.get("command") or "(not recorded)", "```", "", "| component | version |", "|---|---|"]
  lines += [f"| {md(k)} | {md(v)} |" for k, v in text.environment_rows(meta)]
  return "\n".join(lines) + "\n"


def write_markdown(path, records, meta, out=None):
  content = markdown(records, meta, out if out is not None else os.path.dirname(os.path.abspath(path)))
  with results_io.atomic_path(path) as tmp:
    with open(tmp, "w") as f:
      f.write(content)
