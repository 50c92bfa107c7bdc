r"""E7: regularization paths RP-W and RP-KQ (docs/science.md sections 4 and 8).

For every data set, on a geometric grid of radii R:
  RP-W:  W_R = argmin_{||W||_F <= R} L(W)
  RP-KQ: (K_R, Q_R) = argmin_{||K||_F^2 + ||Q||_F^2 <= 2R} L(K, Q)
(``svmattn.train.regpath``: accelerated projected gradient, warm-started along R, plus
a second start along the SVM of the optimal tokens at every R, the lower loss
kept), and their correlation with the attention SVM of the optimal tokens
alpha = opt (gamma = Y v^T x): W_R with W^mm (Frobenius), K_R Q_R^T with W^mm_*
(nuclear). Prediction: both correlations rise to 1 as R grows. Writes to --out:
  runs/           every data set's per-run arrays (one file for the study's one cell)
  results.npz     R grid, optimal tokens, SVM solutions, W_R / K_R Q_R^T per R,
                  loss, constraint values, KKT cosines, correlations, where the
                  SVM start won (took_candidate) and by how much (candidate_gain)
  summary.json    flags, correlations at the largest R, checks, timings
  correlation.png corr vs R (mean +- std); right: 1 - corr on log-log axes (median, 10-90%)

    python -m experiments.reg_path --out=results/e7
    python -m experiments.reg_path --out=/tmp/e7 --runs=20 --num_r=16   # quick
    python -m experiments.reg_path --out=results/e7 --resume            # after an interruption

The data sets are solved in batches of --batch_size (one vectorized path solve per batch and
parameterization; finished batches are kept on --resume, a path interrupted half-way is
solved again).
"""
from __future__ import annotations

from absl import app
from absl import flags
from absl import logging
import numpy as np

from . import common
from svmattn.io import plots
from svmattn.io import results
from svmattn.studies import reg_path as e7
from svmattn.svm import att_svm as svm_lib
from svmattn.train import regpath

FLAGS = flags.FLAGS
common.define_common_flags(runs=100)
common.define_pipeline_flags(batch_size=25)
common.define_numerics_flag()
flags.DEFINE_alias("batch", "batch_size")
flags.DEFINE_integer("n", 6, "Sequences per data set.", lower_bound=1)
flags.DEFINE_integer("T", 8, "Tokens per sequence.", lower_bound=2)
flags.DEFINE_integer("d", 10, "Embedding dimension (d >= max(T-1, n): the SVM of opt is feasible).",
                     lower_bound=1)
flags.DEFINE_integer("m", None, "(K,Q) width m (default d).", lower_bound=1)
flags.DEFINE_enum("attention", "cross", ["cross", "self"], "Cross-attention or self-attention.")
flags.DEFINE_enum("loss", "logistic", ["logistic", "exponential", "correlation"], "Loss.")
flags.DEFINE_list("params", ["W", "KQ"], "Paths to compute: W, KQ.")
flags.DEFINE_float("r_min", 0.5, "Smallest radius R.")
flags.DEFINE_float("r_max", 300.0, "Largest radius R (keep the margins R / ||W^mm|| below ~700: "
                   "float64 gradients underflow beyond).")
flags.DEFINE_integer("num_r", 24, "Number of radii (geometric grid).", lower_bound=1)
flags.DEFINE_integer("iters", 400, "Solver iterations per radius.", lower_bound=1)
flags.DEFINE_integer("first_iters", 2000, "Solver iterations at the smallest radius.", lower_bound=1)
flags.DEFINE_bool("candidates", True, "Also start every radius along the SVM of the optimal tokens and keep "
                  "the lower loss (the problem is nonconvex: continuation alone can follow a local branch).")
common.positive_float("r_min")
common.positive_float("r_max")
common.known_params()
flags.register_validator("params", lambda v: len(set(v)) == len(v), message="must not repeat a parameterization")


def _grid_ok(v) -> bool:
  try:
    regpath.geometric_grid(v["r_min"], v["r_max"], v["num_r"])
  except (ValueError, TypeError):
    return False
  return True


flags.register_multi_flags_validator(["r_min", "r_max", "num_r"], _grid_ok,
                                     message="need 0 < --r_min < --r_max (or --num_r=1)")

OWN_NORM = e7.OWN_NORM
LABEL = {"W": r"$W_R$", "KQ": r"$K_RQ_R^\top$"}
NORM_NAME = e7.NORM_NAME


def main(argv):
  del argv
  timer = common.Timer()
  fl, study = common.start_study(e7)
  R = e7.grid(fl)
  logging.info("E7: %d data sets, n=%d T=%d d=%d, %d radii in [%g, %g]", study.cells[0].runs, FLAGS.n, FLAGS.T,
               FLAGS.d, len(R), R[0], R[-1])

  def write(output):
    arrays, summary = e7.reduce(fl, output.cells)
    with timer("write"):
      results.write_npz(f"{FLAGS.out}/results.npz", arrays)
      draw(arrays, R, FLAGS.params, FLAGS.out)
    summary = common.write_summary(summary, fl, output, timer,
                                   {"train_s": "paths", "svm_s": "analysis", "wall_s": "pipeline_wall"})
    report(summary)

  common.run_study(study, write)


def draw(arrays, R, params, out):
  fig, (ax, ax_log) = plots.figure(ncols=2)
  for p in params:
    for norm in svm_lib.NORMS:
      corr = arrays[f"corr_{p}_{norm}"]
      ok = np.all(np.isfinite(corr), axis=1)
      if not ok.any():
        continue
      own = OWN_NORM[p] == norm
      label = f"{LABEL[p]} vs {NORM_NAME[norm]} SVM"
      plots.band(ax, R, corr[ok], plots.COLORS[p], label, "-" if own else "--")
      if own:  # log scale: median and the 10-90% band (mean - std would go below 0)
        gap = np.maximum(1.0 - corr[ok], 1e-16)
        lo, mid, hi = np.quantile(gap, [0.1, 0.5, 0.9], axis=0)
        ax_log.plot(R, mid, color=plots.COLORS[p], lw=2, label=label + " (median)")
        ax_log.fill_between(R, lo, hi, color=plots.COLORS[p], alpha=0.2, lw=0)
  ax.set(xscale="log", xlabel="R", ylabel="correlation coefficient", ylim=(0, 1.02),
         title="Regularization path vs SVM (alpha = opt)")
  ax.legend(loc="lower right")
  ax_log.set(xscale="log", yscale="log", xlabel="R", ylabel="1 - corr (median, 10-90% band)",
             title="Distance to the SVM direction")
  ax_log.legend(loc="lower left")
  plots.save(fig, f"{out}/correlation.png")


def report(summary):
  lines = [f"E7 regularization paths: {summary['data_sets']} data sets, R up to {summary['R'][-1]:g}"]
  for key, v in summary["corr_at_rmax"].items():
    if v["mean"] is not None:
      lines.append(f"  corr at R_max {key:<10} {v['mean']:.5f} +- {v['std']:.5f} (min {v['min']:.5f}, "
                   f"{v['solved']} solved)")
  for p, x in summary["selected_opt_at_rmax"].items():
    wins = summary["candidate_wins"][p]
    lines.append(f"  {p}: selects opt at R_max in {100 * x:.0f}% of data sets; the SVM start won at "
                 f"{wins['radii']} radii of {wins['data_sets']} data sets ({wins['data_sets_other_branch']} "
                 "with a loss gain > 1e-6: continuation was on another branch)")
  common.print_report(lines, summary)


common.distinct_lists()   # a repeated list entry would compute the same thing twice

if __name__ == "__main__":
  app.run(main)
