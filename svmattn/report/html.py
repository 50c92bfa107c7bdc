"""OUT/report.html: the report as one self-contained page (figures embedded as base64 data URIs,
the CSS inline, nothing loaded from elsewhere)."""
from __future__ import annotations

import base64
import html
import os

from svmattn.io import atomic_files as results_io
from svmattn.report import numerics
from svmattn.report import records as records_lib
from svmattn.report import stages
from svmattn.report import text

CSS = """
:root{--line:#d0d7de;--muted:#57606a;--bg:#f6f8fa}
*{box-sizing:border-box}
body{font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:#1f2328;
 max-width:1000px;margin:0 auto;padding:1.5em 1.25em 4em}
h1{font-size:1.75em;line-height:1.25;margin:.4em 0 .2em}
h1.part{font-size:1.6em;margin-top:2.2em;padding-bottom:.2em;border-bottom:3px solid #1f2328}
h2{font-size:1.3em;margin:2.2em 0 .5em;padding-bottom:.2em;border-bottom:1px solid var(--line)}
h3{font-size:1.1em;margin:1.8em 0 .4em}
p.meta{color:var(--muted);margin-top:0}
a{color:#0969da;text-decoration:none} a:hover{text-decoration:underline}
table{border-collapse:collapse;width:100%;font-size:14px;margin:.6em 0 1em}
th,td{border:1px solid var(--line);padding:5px 8px;text-align:left;vertical-align:top}
th{background:var(--bg);font-weight:600;white-space:nowrap}
tbody tr:nth-child(even) td{background:#fbfcfd}
td.num{font-variant-numeric:tabular-nums}
td.nowrap{white-space:nowrap}
tbody tr.miss td{background:#fff1f0}
td.idc{white-space:nowrap;font-weight:600}
td.yes{color:#1a7f37;font-weight:600} td.no{color:#cf222e;font-weight:700} p.no{color:#a40e26}
.badge{display:inline-block;padding:1px 9px;border-radius:10px;font-size:13px;font-weight:600;white-space:nowrap}
.ok{background:#dafbe1;color:#116329}.partial{background:#fff8c5;color:#7d4e00}
.fail{background:#ffebe9;color:#a40e26}.info{background:#ddf4ff;color:#0550ae}
ul.overall{font-weight:600;margin:.8em 0;padding-left:1.2em}
.variants{display:block;font-size:12.5px;color:var(--muted);margin-top:3px}
table.summary td:nth-child(2){width:42%} table.summary td:nth-child(4){width:27%}
.claim{border-left:4px solid #0969da;background:var(--bg);padding:.55em .9em;margin:1em 0}
.claim.question{border-left-color:#8250df}
.figs{display:flex;flex-wrap:wrap;gap:12px;margin:.8em 0}
figure{margin:0;flex:0 1 100%;max-width:100%}
figure.half{flex:0 1 calc(50% - 6px)}
.missed{display:block;font-size:12.5px;color:#a40e26;margin-top:3px}
img{display:block;width:100%;height:auto;border:1px solid #eaeef2}
figcaption{font-size:12.5px;color:var(--muted);text-align:center;margin-top:2px}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:13px}
pre{background:var(--bg);padding:.6em .8em;overflow-x:auto;border-radius:6px;margin:.4em 0 .8em}
pre.cmd{white-space:pre-wrap;overflow-wrap:anywhere}
p.run{color:var(--muted);font-size:14px;margin-bottom:.2em}
details{margin:.4em 0 1em}
summary{cursor:pointer;color:var(--muted);font-size:14px}
nav.toc ul{margin:.2em 0;padding-left:1.3em} nav.toc li{margin:.1em 0}
section.variant{margin-left:0;padding-left:1em;border-left:3px solid #eaeef2}
"""


HALF_MAX_PX = 640   # figures up to this natural width sit two to a row


def _badge(css, words) -> str:
  return f"<span class='badge {css}'>{html.escape(words)}</span>"


def _figures(record, out) -> str:
  figs = []
  for fig in record.get("figures") or []:
    path = os.path.join(out, fig)
    try:
      with open(path, "rb") as f:
        data = base64.b64encode(f.read()).decode()
    except OSError:
      figs.append(f"<p class='no'>figure {html.escape(fig)} is missing</p>")
      continue
    # small figures two to a row; larger ones at their own width, at most the column's (never upscaled)
    width = text.png_width(path)
    attr = " class='half'" if 0 < width <= HALF_MAX_PX else (f" style='max-width:{width}px'" if width else "")
    figs.append(f"<figure{attr}><img alt='{html.escape(fig)}' "
                f"src='data:image/png;base64,{data}'><figcaption>{html.escape(fig)}</figcaption></figure>")
  return f"<div class='figs'>{''.join(figs)}</div>" if figs else ""


def _checks(record) -> str:
  rows = []
  for c in record.get("checks") or []:
    ok = bool(c.get("ok"))
    value = records_lib.fmt(c["value"])
    said = "not evaluated" if c.get("ok") is None else ("yes" if ok else "no")
    rows.append(f"<tr{'' if ok or c.get('ok') is None else ' class=miss'}><td>{html.escape(c['name'])}</td>"
                f"<td class='num{' nowrap' if len(value) <= 36 else ''}'>{html.escape(value)}</td>"
                f"<td>{html.escape(records_lib.expected(c))}</td><td class='{'yes' if ok else 'no'}'>"
                f"{html.escape(said)}</td></tr>")
  return ("<table class='checks'><thead><tr><th>check</th><th>value</th><th>expected</th><th>as expected</th>"
          f"</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _record(record, out, lead, numerics_ids=()) -> str:
  esc = html.escape
  css, words = records_lib.verdict(record)
  if records_lib.beyond(record) and css == "info":
    words = "reported"
  tag = "h2" if lead else "h3"
  title = f"{record['id']}: {records_lib.title(record)}"
  parts = [f"<section id='{records_lib.anchor(record)}'{'' if lead else ' class=variant'}>",
           f"<{tag}>{esc(title)} {_badge(css, words)}</{tag}>", _figures(record, out)]
  if lead:
    claim, beyond = records_lib.claim_text(record)
    if claim and beyond:
      parts.append(f"<p class='claim question'><b>The question.</b> {esc(claim)}</p>")
    elif claim:
      parts.append(f"<p class='claim'><b>The paper claims.</b> {esc(claim)}</p>")
  if records_lib.failed(record):
    log = f"{record['dir']}/log.txt" if record.get("dir") else ""
    where = f" Its full output: <a href='{esc(log)}'>{esc(log)}</a>." if log else ""
    parts.append(f"<p class='no'><b>Failed to run.</b>{where}</p>"
                 f"<pre>{esc(record.get('error') or '(no error output)')}</pre>")
  elif record.get("checks"):
    parts.append(f"<p><b>Against the numbers:</b> {esc(words)}.</p>" + _checks(record))
  else:
    parts.append(f"<p><b>Reported</b> (no checks: no theorem predicts the outcome). Found: "
                 f"{esc(records_lib.key_number(record, out))}; every number is in the program output below.</p>")
  parts.append(f"<p class='run'>Wall time {record.get('wall_s', 0.0):.1f} s{esc(stages.stage_words(record))}. "
               f"Command:</p><pre class='cmd'>{esc(text.command(record))}</pre>")
  if record.get("stdout"):
    # without checks the program output is the result: shown open
    show = " open" if not record.get("checks") else ""
    parts.append(f"<details{show}><summary>Program output</summary><pre>{esc(record['stdout'])}</pre></details>")
  if lead and records_lib.base_id(record) in numerics_ids:
    parts.append("<p class='run'>Exact against the authors' numerics, side by side: "
                 "<a href='#numerics'>Numerics</a>.</p>")
  parts.append("</section>")
  return "".join(parts)


def _summary_table(lines_, paper) -> str:
  esc = html.escape
  rows = []
  for s in lines_:
    var = "".join(f"<span class='variants'>{esc(label)} ({esc(vid)}): {esc(short)}</span>"
                  for label, vid, short, _ in s["variants"])
    missed = f"<span class='missed'>{esc(records_lib.missed(s['missed']))}</span>" if s["missed"] else ""
    rows.append(f"<tr><td class='idc'><a href='#{s['anchor']}'>{esc(s['id'])}</a></td><td>{esc(s['claim'])}</td>"
                f"<td>{_badge(s['css'], s['verdict'])}{missed}{var}</td><td>{esc(s['key'])}</td></tr>")
  head = "claim" if paper else "question"
  return (f"<table class='summary'><thead><tr><th>exp.</th><th>{head}</th><th>verdict</th><th>key number</th>"
          f"</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _toc(groups) -> str:
  esc = html.escape
  items = []
  for g in groups:
    sub = "".join(f"<li><a href='#{records_lib.anchor(r)}'>{esc(r['id'])}: {esc(records_lib.title(r))}</a></li>" for r in g[1:])
    items.append(f"<li><a href='#{records_lib.anchor(g[0])}'>{esc(g[0]['id'])}: {esc(records_lib.title(g[0]))}</a>"
                 + (f"<ul>{sub}</ul>" if sub else "") + "</li>")
  return "".join(items)


def html_report(records, meta, out) -> str:
  """The report as one self-contained HTML page (figures read from OUT and embedded)."""
  esc = html.escape
  groups = records_lib.group(records)
  paper = [g for g in groups if not records_lib.beyond(g[0])]
  beyond = [g for g in groups if records_lib.beyond(g[0])]
  summ = records_lib.summary_lines(records, out)
  rows = numerics.rows(records)
  numerics_ids = numerics.ids(records) if rows else []
  p = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
       "<meta name='viewport' content='width=device-width, initial-scale=1'>",
       f"<title>svmattn report</title><style>{CSS}</style></head><body>",
       f"<header><h1>{esc(text.TITLE)}</h1><p class='meta'>{esc(text.PAPER)}. {esc(text.mode(meta))}</p></header>",
       "<section id='summary'><h2>Summary</h2><ul class='overall'>"
       + "".join(f"<li>{esc(line)}</li>" for line in records_lib.overall(records)) + "</ul>"]
  if paper:
    p.append("<h3>Claims of the paper</h3>" + _summary_table([s for s in summ if not s["beyond"]], True))
  if beyond:
    p.append("<h3>Beyond the paper</h3>" + _summary_table([s for s in summ if s["beyond"]], False))
  missing = records_lib.not_run(records)
  if missing:
    p.append(f"<p class='meta'>Not run this time: {esc(', '.join(missing))}.</p>")
  p.append("</section><nav class='toc' id='contents'><h2>Contents</h2><ul>")
  if paper:
    p.append(f"<li><a href='#paper'>The paper</a><ul>{_toc(paper)}"
             + (f"<li><a href='#numerics'>{esc(numerics.heading(records))}</a></li>" if rows else "")
             + "</ul></li>")
  if beyond:
    p.append(f"<li><a href='#beyond'>Beyond the paper</a><ul>{_toc(beyond)}</ul></li>")
  p.append("<li><a href='#environment'>Environment and command line</a></li></ul></nav>")
  if paper:
    p.append("<h1 class='part' id='paper'>The paper</h1>")
    for g in paper:
      p.append(_record(g[0], out, True, numerics_ids) + "".join(_record(r, out, False) for r in g[1:]))
    if rows:
      p.append(f"<section id='numerics'><h2>{esc(numerics.heading(records))}</h2>"
               f"<p>{esc(numerics.NUMERICS_NOTE)}</p><table><thead><tr><th>statistic</th><th>exact</th>"
               "<th>authors</th></tr></thead><tbody>"
               + "".join(f"<tr><td>{esc(a)}</td><td class='num'>{esc(b)}</td><td class='num'>{esc(c)}</td></tr>"
                         for a, b, c in rows) + "</tbody></table></section>")
  if beyond:
    p.append(f"<h1 class='part' id='beyond'>Beyond the paper</h1><p>{esc(text.BEYOND_NOTE)}</p>")
    for g in beyond:
      p.append(_record(g[0], out, True) + "".join(_record(r, out, False) for r in g[1:]))
  env = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in text.environment_rows(meta))
  p.append("<h1 class='part' id='environment'>Environment and command line</h1><p>Command line:</p>"
           f"<pre class='cmd'>{esc(meta.get('command') or '(not recorded)')}</pre>"
           f"<table class='env'><thead><tr><th>component</th><th>version</th></tr></thead><tbody>{env}</tbody></table>"
           "</body></html>")
  return "\n".join(p) + "\n"


def write_html(path, records, meta, out):
  content = html_report(records, meta, out)
  with results_io.atomic_path(path) as tmp:
    with open(tmp, "w") as f:
      f.write(content)
