r"""Reproduce every experiment of the paper and assemble a report.

    python -m experiments.reproduce --out=results            # the paper's run counts
    python -m experiments.reproduce --out=results --quick    # small counts, < 10 min on 2 cores
    python -m experiments.reproduce --out=results --only=E2,E5

Each experiment runs as its own process (`python -m experiments.NAME --out=OUT/NAME ...`),
so one failing experiment is recorded in the report instead of stopping the others.
Writes OUT/report.md and OUT/report.html (experiments/report.py: a summary of which claims
hold, then per experiment its figures, its checks against the paper, wall time and command;
software versions) and OUT/reproduce.json (`python -m experiments.report OUT` re-renders the
report from it).
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags

from . import common
from . import report
from svmattn.io import results

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "results", "Output directory: one subdirectory per experiment plus the report.")
flags.DEFINE_bool("quick", False, "Small run counts (minutes instead of the paper's counts).")
flags.DEFINE_list("only", [], "Run only these experiments (ids like E2 or names like local_convergence).")
flags.DEFINE_integer("seed", 0, "Seed passed to every experiment.")
flags.DEFINE_bool("keep_runs", True, "Keep every experiment's per-run records (OUT/*/runs/, what replay compares "
                  "with); --nokeep_runs writes only the results, figures and report.")
flags.DEFINE_list("figure_format", ["png"], "Figure formats passed to every experiment (png, pdf, svg); png is "
                  "always written too, for the report.")


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


def run_one(exp: Experiment, out: str) -> dict:
  target = os.path.join(out, exp.dir)
  extra = (exp.quick if FLAGS.quick else exp.paper) + exp.args
  formats = ",".join(dict.fromkeys(["png", *FLAGS.figure_format]))      # the report embeds the PNGs
  cmd = [sys.executable, "-m", f"{__package__}.{exp.module}", f"--out={target}", f"--seed={FLAGS.seed}",
         "--noprogress", f"--figure_format={formats}", *(() if FLAGS.keep_runs else ("--nokeep_runs",)), *extra]
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
  record["stages_s"] = report.stages(record["timings_s"], wall)
  record["work"] = summary.get("work", {})
  record["figures"] = sorted(os.path.relpath(p, out) for p in glob.glob(os.path.join(target, "*.png")))
  record["stdout"] = proc.stdout.strip()[-3000:]
  ok = sum(bool(c.get("ok")) for c in record["checks"])
  print(f"[{exp.key}] done in {wall:.1f}s: {ok}/{len(record['checks'])} checks as expected", flush=True)
  return record


def main(argv):
  del argv
  common.quiet_logs()
  experiments = selected()
  out = FLAGS.out
  os.makedirs(out, exist_ok=True)
  t0 = time.perf_counter()
  records = [run_one(e, out) for e in experiments]
  paper = [r for r in records if not r.get("beyond")]
  meta = {"quick": FLAGS.quick, "seed": FLAGS.seed, "total_s": time.perf_counter() - t0,
          "paper_s": sum(r["wall_s"] for r in paper), "beyond_s": sum(r["wall_s"] for r in records if r.get("beyond")),
          "environment": common.environment(), "command": report.command_line(package=__package__)}
  results.write_json(os.path.join(out, "reproduce.json"), {"meta": meta, "experiments": records})
  report.write(out, records, meta)
  failed = [r["id"] for r in records if r["returncode"] != 0]
  unexpected = [f"{r['id']}:{c['name']}" for r in records for c in r.get("checks", []) if not c.get("ok")]
  print("\nseconds per stage (reproduce.json: stages_s of each experiment)\n" + report.stage_table(records))
  print(f"\nreport: {out}/report.md and {out}/report.html ({meta['total_s']:.0f} s)")
  if failed:
    print(f"failed experiments: {', '.join(failed)}")
  if unexpected:
    print(f"checks not as expected: {', '.join(unexpected)}")
  return 1 if failed else 0


common.seed_flag()
common.out_flag()
flags.register_validator("figure_format", lambda v: bool(v) and all(f in ("png", "pdf", "svg") for f in v),
                         message="must list formats among png, pdf, svg")
common.distinct_lists()   # a repeated list entry would compute the same thing twice

if __name__ == "__main__":
  app.run(main)
