r"""Reproduce every experiment of the paper and assemble a report.

    python -m experiments.reproduce --out=results            # the paper's run counts
    python -m experiments.reproduce --out=results --quick    # small counts, < 10 min on 2 cores
    python -m experiments.reproduce --out=results --only=E2,E5

Each experiment runs as its own process (`python -m experiments.NAME --out=OUT/NAME ...`),
so one failing experiment is recorded in the report instead of stopping the others.
Writes OUT/report.md and OUT/report.html (every figure, the key numbers against the
paper's expectations, wall time per experiment, software versions) and OUT/reproduce.json.
"""
from __future__ import annotations

import base64
import dataclasses
import glob
import html
import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags

from . import common
from svmattn.io import results

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "results", "Output directory: one subdirectory per experiment plus the report.")
flags.DEFINE_bool("quick", False, "Small run counts (minutes instead of the paper's counts).")
flags.DEFINE_list("only", [], "Run only these experiments (ids like E2 or names like local_convergence).")
flags.DEFINE_integer("seed", 0, "Seed passed to every experiment.")


@dataclasses.dataclass(frozen=True)
class Experiment:
  id: str
  module: str
  title: str
  quick: tuple[str, ...] = ()
  paper: tuple[str, ...] = ()
  variant: str = ""                 # e.g. "authors": the same experiment with --numerics=authors
  args: tuple[str, ...] = ()        # flags of the variant
  beyond: bool = False              # a question after the paper (its own part of the report)

  @property
  def key(self) -> str:
    return self.id + (f"-{self.variant}" if self.variant else "")

  @property
  def dir(self) -> str:
    return self.module + (f"_{self.variant}" if self.variant else "")


EXPERIMENTS = (
    Experiment("E1", "paths_2d", "2-D picture of global convergence"),
    Experiment("E2", "local_convergence", "Local convergence of normalized GD (W and (K,Q))",
               quick=("--runs=30",)),
    Experiment("E2", "local_convergence", "Local convergence, the authors' numerics (g / (||g|| + eps), X^T s)",
               quick=("--runs=30",), variant="authors", args=("--numerics=authors",)),
    Experiment("E3", "svm_rank", "Rank of Frobenius vs nuclear SVM solutions",
               quick=("--runs=10", "--ds=1,2,5,10", "--shapes=5:5,10:5")),
    Experiment("E4", "overparam", "Over-parameterization: global / local / not-local convergence",
               quick=("--runs=100", "--n_values=5", "--d_max=8")),
    Experiment("E5", "multi_token", "Multi-token selection with a ReLU head (Gen-SVM)",
               quick=("--runs=20", "--batch_size=500")),
    Experiment("E5", "multi_token", "Multi-token selection, the authors' numerics (g / (||g|| + eps), X^T s)",
               quick=("--runs=20", "--batch_size=500"), variant="authors", args=("--numerics=authors",)),
    Experiment("E6", "lambda_head", "Lambda head: tokens selected vs lambda",
               quick=("--runs=20", "--lams=0,0.1,0.2,0.4,0.75,1.5")),
    Experiment("E7", "reg_path", "Regularization paths RP-W and RP-KQ", quick=("--runs=20", "--num_r=16")),
    Experiment("E8", "seq_causal", "Sequence-to-sequence and causal attention", quick=("--runs=20",)),
    Experiment("E9", "feasibility", "Feasibility of Att-SVM vs d",
               quick=("--runs=200", "--shapes=5:5,10:5", "--d_max=11")),
    Experiment("E10", "optimizer_geometry", "Optimizer geometry: each optimizer against the Att-SVM of every norm",
               quick=("--runs=20", "--steps=1000"), beyond=True),
    Experiment("E11", "joint_training", "Joint training of head and attention (E2's sizes)",
               quick=("--runs=20",), beyond=True),
    Experiment("E11", "joint_training", "Joint training, the public code's setting (n=3, T=2, d=2, prompt attention)",
               variant="toy", args=("--setting=toy",), beyond=True),
    Experiment("E12", "next_token", "Next-token prediction and its graph SVM (global setting)",
               quick=("--runs=20",), beyond=True),
    Experiment("E12", "next_token", "Next-token prediction, local setting (vocabulary readout, squared loss)",
               quick=("--runs=20",), variant="local", args=("--setting=local",), beyond=True),
    Experiment("E13", "real_data", "Real data: digits 0 vs 1 as patch-token sequences, across n",
               quick=("--runs=5", "--n_values=2,8,32,128"), beyond=True),
    Experiment("E14", "multi_head", "Multi-head attention (2 heads): per-head selections and SVMs",
               quick=("--runs=20",), beyond=True),
    Experiment("E15", "two_layer", "Two-layer attention: per-layer selections and SVMs", quick=("--runs=20",),
               beyond=True),
)


def selected():
  if not FLAGS.only:
    return list(EXPERIMENTS)
  wanted = {w.strip() for w in FLAGS.only}
  known = {e.id for e in EXPERIMENTS} | {e.key for e in EXPERIMENTS} | {e.module for e in EXPERIMENTS}
  unknown = wanted - known
  if unknown:
    raise app.UsageError(f"--only: unknown experiment(s) {sorted(unknown)}; known: "
                         f"{', '.join(e.id + '=' + e.module for e in EXPERIMENTS)}")
  return [e for e in EXPERIMENTS if e.id in wanted or e.key in wanted or e.module in wanted]


NUMERICS_NOTE = (
    "The paper's code normalizes each gradient as g / (||g|| + eps) with eps the float64 machine epsilon, "
    "and pools the tokens as X^T s. That is not normalized GD once ||g|| falls to about eps: every step "
    "then shrinks far below eta, ||W|| stops growing and the run freezes. In E5 a frozen W leaves a dead "
    "Y = -1 sequence (no gradient through its ReLU) with all its tokens above tau_H, which W^SVMeq's "
    "equality constraints describe well; with exact numerics W keeps growing, the other sequences sharpen "
    "that dead sequence onto 2-3 tokens, Gen-SVM predicts it poorly, and the tail of 1 - corr is heavier. "
    "X^T s also loses the gradient to rounding once the softmax saturates (our pooled token does not). "
    "Both columns are shown; `exact` is the default of every binary (--numerics).")


def numerics_rows(records) -> list[list[str]]:
  """[statistic, exact, authors] rows for E2 and E5, from the runs of both numerics."""
  by = {(r["id"].split("-")[0], r.get("variant") or "exact"): r.get("summary", {}) for r in records
        if r.get("returncode") == 0}
  rows = []
  for key, name in (("W_vs_fro", "corr(W, Frobenius SVM)"), ("KQ_vs_nuc", "corr(KQ^T, nuclear SVM)")):
    vals = [by.get(("E2", v), {}).get("final_corr", {}).get(key, {}).get("mean") for v in ("exact", "authors")]
    if any(v is not None for v in vals):
      rows.append([f"E2 mean final {name}"] + [_fmt(v) if v is not None else "-" for v in vals])
  per = {v: by.get(("E5", v), {}).get("per_d", {}) for v in ("exact", "authors")}
  for d in sorted(set(per["exact"]) | set(per["authors"]), key=int):
    for obj, label in (("svmeq", "W^SVMeq"), ("mm", "W^mm"), ("1token", "W^1token")):
      for stat, sname in (("mean", "1 - mean corr"), ("median", "median 1 - corr"), ("q75", "upper quartile")):
        if obj != "svmeq" and stat != "mean":
          continue
        vals = [per[v].get(d, {}).get("final_one_minus_corr", {}).get(obj, {}).get(stat) for v in ("exact", "authors")]
        rows.append([f"E5 d={d}: {label} {sname}"] + [_fmt(v) if v is not None else "-" for v in vals])
    norms = [per[v].get(d, {}).get("final_W_norm") for v in ("exact", "authors")]
    if any(norms):
      rows.append([f"E5 d={d}: final ||W||_F median (10th-90th pct)"] + [
          f"{n['median']:.1f} ({n['p10']:.0f}-{n['p90']:.0f})" if n and n.get("median") is not None else "-"
          for n in norms])
  return rows


def run_one(exp: Experiment, out: str) -> dict:
  target = os.path.join(out, exp.dir)
  extra = (exp.quick if FLAGS.quick else exp.paper) + exp.args
  cmd = [sys.executable, "-m", f"{__package__}.{exp.module}", f"--out={target}", f"--seed={FLAGS.seed}",
         "--noprogress", *extra]
  print(f"[{exp.key}] {exp.title}: {' '.join(cmd[1:])}", flush=True)
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, capture_output=True, text=True)
  wall = time.perf_counter() - t0
  record = {"id": exp.key, "module": exp.module, "title": exp.title, "command": " ".join(cmd[1:]),
            "wall_s": wall, "returncode": proc.returncode, "dir": exp.dir, "variant": exp.variant,
            "beyond": exp.beyond}
  os.makedirs(target, exist_ok=True)
  with results.atomic_path(os.path.join(target, "log.txt")) as tmp:
    with open(tmp, "w") as f:
      f.write(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
  if proc.returncode != 0:
    record["error"] = proc.stderr.strip()[-2000:]
    print(f"[{exp.key}] FAILED after {wall:.1f}s (see {target}/log.txt)", flush=True)
    return record
  try:
    with open(os.path.join(target, "summary.json")) as f:
      summary = json.load(f)
  except (OSError, ValueError) as e:
    record["returncode"], record["error"] = -1, f"no readable summary.json: {e}"
    return record
  record["checks"] = summary.get("checks", [])
  record["summary"] = {k: summary[k] for k in ("final_corr", "per_d", "numerics") if k in summary}
  record["timings_s"] = summary.get("timings_s", {})
  record["figures"] = sorted(os.path.relpath(p, out) for p in glob.glob(os.path.join(target, "*.png")))
  record["stdout"] = proc.stdout.strip()[-3000:]
  ok = sum(bool(c.get("ok")) for c in record["checks"])
  print(f"[{exp.key}] done in {wall:.1f}s: {ok}/{len(record['checks'])} checks as expected", flush=True)
  return record


def _fmt(value):
  if isinstance(value, float):
    return f"{value:.4g}"
  if isinstance(value, list):
    return ", ".join(_fmt(v) for v in value)
  return str(value)


def write_markdown(path, records, meta):
  lines = ["# svmattn: reproduction of \"Transformers as Support Vector Machines\"", "",
           f"Mode: {'quick' if meta['quick'] else 'paper run counts'}; seed {meta['seed']}; "
           f"total wall time {meta['total_s']:.1f} s.", "",
           "## Key numbers against the paper's expectations", "",
           "| exp. | check | value | expected | as expected |", "|---|---|---|---|---|"]
  for r in records:
    if "error" in r:
      lines.append(f"| {r['id']} | experiment failed | - | - | no |")
    for c in r.get("checks", []):
      lines.append(f"| {r['id']} | {c['name']} | {_fmt(c['value'])} | {c['expected']} | "
                   f"{'yes' if c.get('ok') else '**no**'} |")
  rows = numerics_rows(records)
  if rows:
    lines += ["", "## Numerics: exact against the authors' (E2, E5)", "", NUMERICS_NOTE, "",
              "| statistic | exact | authors |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
  lines += ["", "## Wall time per experiment", "", "| exp. | title | wall (s) | status |", "|---|---|---|---|"]
  for r in records:
    lines.append(f"| {r['id']} | {r['title']} | {r['wall_s']:.1f} | "
                 f"{'ok' if r['returncode'] == 0 else 'failed'} |")
  beyond_started = False
  for r in records:
    if r.get("beyond") and not beyond_started:
      beyond_started = True
      lines += ["", "# Beyond the paper", "", "Questions the paper leaves open, on the same engine (SCIENCE.md "
                "sections 10-14); their checks state the predictions from the literature, and a failed one is a "
                "finding."]
    lines += ["", f"## {r['id']}: {r['title']}", "", f"`python -m {r['command']}`", ""]
    if "error" in r:
      lines += ["Failed:", "", "```", r["error"], "```"]
      continue
    if r.get("stdout"):
      lines += ["```", r["stdout"], "```", ""]
    for fig in r.get("figures", []):
      lines += [f"![{fig}]({fig})", ""]
  lines += ["", "## Software", "", "```", json.dumps(meta["environment"], indent=2), "```", ""]
  with results.atomic_path(path) as tmp:
    with open(tmp, "w") as f:
      f.write("\n".join(lines))


def write_html(path, records, meta, out):
  esc = html.escape
  parts = ["<!doctype html><html><head><meta charset='utf-8'><title>svmattn report</title>",
           "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
           "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px}"
           ".no{color:#b00;font-weight:bold}.yes{color:#070}img{max-width:100%;margin:.5em 0}"
           "pre{background:#f6f6f6;padding:.5em;overflow-x:auto}</style></head><body>",
           "<h1>svmattn: reproduction of &ldquo;Transformers as Support Vector Machines&rdquo;</h1>",
           f"<p>Mode: {'quick' if meta['quick'] else 'paper run counts'}; seed {meta['seed']}; "
           f"total wall time {meta['total_s']:.1f} s.</p>",
           "<h2>Key numbers against the paper's expectations</h2><table>"
           "<tr><th>exp.</th><th>check</th><th>value</th><th>expected</th><th>as expected</th></tr>"]
  for r in records:
    if "error" in r:
      parts.append(f"<tr><td>{r['id']}</td><td>experiment failed</td><td>-</td><td>-</td>"
                   "<td class='no'>no</td></tr>")
    for c in r.get("checks", []):
      ok = bool(c.get("ok"))
      parts.append(f"<tr><td>{r['id']}</td><td>{esc(c['name'])}</td><td>{esc(_fmt(c['value']))}</td>"
                   f"<td>{esc(str(c['expected']))}</td><td class='{'yes' if ok else 'no'}'>"
                   f"{'yes' if ok else 'no'}</td></tr>")
  rows = numerics_rows(records)
  if rows:
    parts.append("</table><h2>Numerics: exact against the authors' (E2, E5)</h2>"
                 f"<p>{esc(NUMERICS_NOTE)}</p><table><tr><th>statistic</th><th>exact</th><th>authors</th></tr>"
                 + "".join(f"<tr><td>{esc(a)}</td><td>{esc(b)}</td><td>{esc(c)}</td></tr>" for a, b, c in rows))
  parts.append("</table><h2>Wall time per experiment</h2><table><tr><th>exp.</th><th>title</th>"
               "<th>wall (s)</th><th>status</th></tr>")
  for r in records:
    parts.append(f"<tr><td>{r['id']}</td><td>{esc(r['title'])}</td><td>{r['wall_s']:.1f}</td>"
                 f"<td>{'ok' if r['returncode'] == 0 else 'failed'}</td></tr>")
  parts.append("</table>")
  beyond_started = False
  for r in records:
    if r.get("beyond") and not beyond_started:
      beyond_started = True
      parts.append("<h1>Beyond the paper</h1><p>Questions the paper leaves open, on the same engine (SCIENCE.md "
                   "sections 10-14); their checks state the predictions from the literature, and a failed one is a "
                   "finding.</p>")
    parts.append(f"<h2>{r['id']}: {esc(r['title'])}</h2><p><code>python -m {esc(r['command'])}</code></p>")
    if "error" in r:
      parts.append(f"<p class='no'>Failed:</p><pre>{esc(r['error'])}</pre>")
      continue
    if r.get("stdout"):
      parts.append(f"<pre>{esc(r['stdout'])}</pre>")
    for fig in r.get("figures", []):
      with open(os.path.join(out, fig), "rb") as f:
        data = base64.b64encode(f.read()).decode()
      parts.append(f"<figure><img alt='{esc(fig)}' src='data:image/png;base64,{data}'>"
                   f"<figcaption>{esc(fig)}</figcaption></figure>")
  parts.append(f"<h2>Software</h2><pre>{esc(json.dumps(meta['environment'], indent=2))}</pre></body></html>")
  with results.atomic_path(path) as tmp:
    with open(tmp, "w") as f:
      f.write("\n".join(parts))


def main(argv):
  del argv
  common.quiet_logs()
  experiments = selected()
  out = FLAGS.out
  os.makedirs(out, exist_ok=True)
  t0 = time.perf_counter()
  records = [run_one(e, out) for e in experiments]
  meta = {"quick": FLAGS.quick, "seed": FLAGS.seed, "total_s": time.perf_counter() - t0,
          "environment": common.environment()}
  results.write_json(os.path.join(out, "reproduce.json"), {"meta": meta, "experiments": records})
  write_markdown(os.path.join(out, "report.md"), records, meta)
  write_html(os.path.join(out, "report.html"), records, meta, out)
  failed = [r["id"] for r in records if r["returncode"] != 0]
  unexpected = [f"{r['id']}:{c['name']}" for r in records for c in r.get("checks", []) if not c.get("ok")]
  print(f"\nreport: {out}/report.md and {out}/report.html ({meta['total_s']:.0f} s)")
  if failed:
    print(f"failed experiments: {', '.join(failed)}")
  if unexpected:
    print(f"checks not as expected: {', '.join(unexpected)}")
  return 1 if failed else 0


if __name__ == "__main__":
  app.run(main)
