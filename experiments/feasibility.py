r"""E9: feasibility of Att-SVM(alpha) versus d around max(T-1, n) (docs/science.md sections 3, 8).

For each shape (n, T) and each d, draws --runs data sets (the paper's unit-Gaussian
generator, linear head) and asks whether Att-SVM(alpha) is feasible
(``svmattn.svm.feasibility.check``) for alpha = opt (the tokens of largest score
gamma_it = Y_i v^T x_it) and for a uniformly random alpha (drawn from the run's
initialization key). Prediction: 100% feasible for every d >= max(T-1, n),
below that possibly infeasible. Everything is host-side float64 (--precision does not apply). Writes to --out:
  results.npz     feasible (shapes, alphas, ds, runs) bool, fraction (shapes, alphas, ds),
                  method (how each was decided), ns, Ts, ds, runs
  summary.json    flags, per-cell fractions, checks, timings
  feasibility.png fraction feasible vs d, one panel per (n, T); opt solid, random dashed;
                  a vertical line at d = max(T-1, n)
  runs/           every data set's per-run arrays, one file per cell (n, T, d) (replay compares
                  with them)

    python -m experiments.feasibility --out=results/e9
    python -m experiments.feasibility --out=/tmp/e9 --runs=200 --shapes=5:5,10:5 --d_max=11
    python -m experiments.feasibility --out=results/e9 --resume      # after an interruption

Each (n, T, d) cell is part of every data set's identity: --resume skips finished cells and
batches of --batch_size data sets, and several processes (--num_processes) share every cell.
"""
from __future__ import annotations

from absl import app
from absl import flags
from absl import logging

from . import common
from svmattn.io import plots
from svmattn.io import results
from svmattn.studies import feasibility as e9

FLAGS = flags.FLAGS
common.define_common_flags(runs=1000)
common.define_pipeline_flags(batch_size=1000)
flags.DEFINE_alias("batch", "batch_size")
flags.DEFINE_list("shapes", ["5:5", "10:5", "5:10"], "Shapes n:T (sequences:tokens).")
flags.DEFINE_integer("d_min", 1, "Smallest embedding dimension d.", lower_bound=1)
flags.DEFINE_integer("d_max", 14, "Largest embedding dimension d (include some d >= max(T-1, n)).", lower_bound=1)
flags.DEFINE_list("alphas", ["opt", "random"], "Token choices: opt (largest score) and/or random.")
flags.register_multi_flags_validator(["d_min", "d_max"], lambda v: v["d_min"] <= v["d_max"],
                                     message="need --d_min <= --d_max")
flags.register_validator("alphas", lambda v: bool(v) and all(a in e9.ALPHAS for a in v),
                         message="must list opt and/or random")


def _shapes_ok(values) -> bool:
  try:
    e9.parse_shapes(values)
  except ValueError:
    return False
  return True


flags.register_validator("shapes", _shapes_ok, message="must be a non-empty list of n:T with n >= 1 and T >= 2, "
                         "such as 5:5,10:5")
flags.register_validator("data", lambda v: v is None,
                         message="is not supported by E9: it sweeps d, a data file has one d")

ALPHA_STYLE = {"opt": "-", "random": "--"}


def main(argv):
  del argv
  timer = common.Timer()
  fl, study = common.start_study(e9)
  shapes, ds, alphas = e9.grid(fl)
  logging.info("E9: shapes %s, d %d..%d, %d runs per cell, alphas %s", shapes, ds[0], ds[-1], FLAGS.runs, alphas)

  def write(output):
    arrays, summary = e9.reduce(fl, output.cells)
    with timer("write"):
      results.write_npz(f"{FLAGS.out}/results.npz", arrays)
      draw(arrays["fraction"], shapes, alphas, ds, FLAGS.out)
    summary = common.write_summary(summary, fl, output, timer, {"data_s": "data", "svm_s": "feasibility", "wall_s": "pipeline_wall"})
    report(summary)

  common.run_study(study, write)


def draw(fraction, shapes, alphas, ds, out):
  fig, axes = plots.figure(ncols=len(shapes), width=3.6, height=3.2)
  for si, ((n, T), ax) in enumerate(zip(shapes, axes)):
    for ai, a in enumerate(alphas):
      ax.plot(ds, 100 * fraction[si, ai], ALPHA_STYLE[a], marker="o", ms=3, color="tab:blue" if a == "opt"
              else "tab:orange", label=r"$\alpha$ = opt" if a == "opt" else r"random $\alpha$")
    ax.axvline(max(T - 1, n), color="gray", ls=":", lw=1.5, label="d = max(T-1, n)")
    ax.set(xlabel="d", title=f"n={n}, T={T}", ylim=(-3, 103))
    if si == 0:
      ax.set_ylabel("feasible data sets (%)")
      ax.legend(loc="lower right", fontsize=8)
  plots.save(fig, f"{out}/feasibility.png")


def report(summary):
  lines = [f"E9 feasibility: {summary['runs_per_cell']} data sets per cell"]
  for key, d in summary["smallest_d_feasible_from_then_on"].items():
    lines.append(f"  {key:<28} 100% feasible from d={d}")
  common.print_report(lines, summary)


common.distinct_lists()   # a repeated list entry would compute the same thing twice

if __name__ == "__main__":
  app.run(main)
