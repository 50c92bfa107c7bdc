r"""E4: over-parameterization: global / local / not-local convergence of GD versus d (docs/science.md section 8).

For each n in --n_values and each d from --d_min to --d_max, trains the W
attention with normalized GD (--steps steps, step --lr, uniform initialization)
on --runs data sets (the paper's unit-Gaussian generator, T tokens, linear head,
cross-attention), reads the selected tokens alpha_hat_i = argmax_t s_it, solves the
Frobenius Att-SVM(alpha_hat) (NNLS) and classifies each run
(``metrics.convergence_type``): global (alpha_hat = opt), local (alpha_hat locally
optimal, not opt) or not-local (otherwise, an infeasible SVM included).
Prediction: the global share grows with d, and not-local vanishes once the SVM is
always feasible (d >= max(T-1, n)). Runs that diverge to NaN are counted and left
out of the shares. Writes to --out:
  runs/           every run's per-run arrays, one file per cell (n, d) (replay compares with them)
  results.npz     types (len(n_values), D, runs) str, corr(W_GD, W^mm_alpha_hat), SVM statuses,
                  feasibility of Att-SVM(opt), selected / optimal tokens per n
  summary.json    flags, shares per (n, d), checks, timings
  overparam.png   stacked bars of the shares vs d, one panel per n, d = max(T-1, n) marked

    python -m experiments.overparam --out=results/e4
    python -m experiments.overparam --out=/tmp/e4 --runs=50 --n_values=5 --d_max=8 --steps=500
    python -m experiments.overparam --out=results/e4 --runs=10000 --batch_size=2000 --resume

Each (n, d) cell is part of every data set's identity: --resume skips finished cells and
batches, and several processes (--num_processes) share every cell.
"""
from __future__ import annotations

from absl import app
from absl import flags
from absl import logging
import numpy as np

from . import common
from svmattn.io import plots
from svmattn.io import results
from svmattn.studies import overparam as e4

FLAGS = flags.FLAGS
common.define_common_flags(runs=500)
common.define_pipeline_flags(batch_size=1000)
common.define_numerics_flag()
flags.DEFINE_list("n_values", ["5", "10"], "Numbers of sequences n (one panel each).")
flags.DEFINE_integer("T", 5, "Tokens per sequence.", lower_bound=2)
flags.DEFINE_integer("d_min", 2, "Smallest embedding dimension d.", lower_bound=1)
flags.DEFINE_integer("d_max", 20, "Largest embedding dimension d.", lower_bound=1)
flags.DEFINE_integer("steps", 2000, "Normalized GD steps.", lower_bound=0)
flags.DEFINE_float("lr", 0.1, "Learning rate (step size eta).")
flags.DEFINE_integer("chunk_steps", 500, "Steps per jitted chunk (one snapshot and checkpoint each; only the "
                     "final W is used).", lower_bound=1)
common.int_list("n_values", minimum=1)
common.positive_float("lr")
flags.register_multi_flags_validator(["d_min", "d_max"], lambda v: v["d_min"] <= v["d_max"],
                                     message="need --d_min <= --d_max")
flags.register_validator("data", lambda v: v is None, message="is not supported by E4: it sweeps n and d")

TYPES = e4.TYPES
TYPE_COLORS = {"global": "tab:green", "local": "tab:blue", "not-local": "tab:red", "tie": "tab:gray",
               "diverged": "black", "stalled": "tab:purple", "unsaturated": "tab:olive"}


def main(argv):
  del argv
  timer = common.Timer()
  fl, study = common.start_study(e4)
  n_values, ds = e4.grid(fl)
  logging.info("E4: n %s, T=%d, d %d..%d, %d runs per cell, %d steps", n_values, FLAGS.T, ds[0], ds[-1],
               FLAGS.runs, FLAGS.steps)

  def write(output):
    arrays, summary, shares = e4.reduce(fl, output.cells)
    with timer("write"):
      results.write_npz(f"{FLAGS.out}/results.npz", arrays)
      draw(shares, n_values, ds, FLAGS.T, FLAGS.out)
    summary = common.write_summary(summary, fl, output, timer)
    report(summary)

  common.run_study(study, write)


def draw(shares, n_values, ds, T, out):
  fig, axes = plots.figure(ncols=len(n_values), width=5.0, height=3.6)
  for ni, (n, ax) in enumerate(zip(n_values, axes)):
    bottom = np.zeros(len(ds))
    for t in TYPES:
      h = 100 * np.nan_to_num(shares[t][ni])
      ax.bar(ds, h, bottom=bottom, color=TYPE_COLORS[t], label=t, width=0.8)
      bottom += h
    ax.axvline(max(T - 1, n) - 0.5, color="k", ls=":", lw=1.5, label="d = max(T-1, n)")
    ax.set(xlabel="d", ylabel="runs (%)", title=f"n={n}, T={T}", ylim=(0, 100))
    ax.set_xticks(ds[::2] if len(ds) > 10 else ds)
    if ni == len(n_values) - 1:
      ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)
  plots.save(fig, f"{out}/overparam.png")


def report(summary):
  lines = [f"E4 over-parameterization: {summary['runs_per_cell']} runs per cell, T={summary['T']}"]
  lines.append("      n   d  global  local  not-local  tie  infeasible  corr")
  for x in summary["cells"]:
    corr = f"{x['corr_mean']:.4f}" if x["corr_mean"] is not None else "  -  "
    lines.append(f"    {x['n']:3d} {x['d']:3d}  {100 * x['share_global']:5.1f}% {100 * x['share_local']:5.1f}% "
                 f"{100 * x['share_not-local']:6.1f}% {100 * x['share_tie']:4.1f}% {x['svm_infeasible']:6d}     {corr}")
  common.print_report(lines, summary)


common.distinct_lists()   # a repeated list entry would compute the same thing twice

if __name__ == "__main__":
  app.run(main)
