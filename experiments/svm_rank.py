r"""E3: numerical rank of the Frobenius and the nuclear Att-SVM solutions (docs/science.md section 8).

alpha = opt (the tokens of largest score gamma_it = Y_i v^T x_it, linear head).
For each shape (n, T) and each d, data sets are drawn in order (run 0, 1, 2, ...)
until --runs of them have a feasible Att-SVM(opt) (``svmattn.svm.feasibility.check``);
the infeasible draws are counted, and a cell stops after --max_draws_factor * --runs
draws (d = 1 with many constraints is almost never feasible) and is reported as
incomplete. On the kept data sets it solves Att-SVM(opt) in the Frobenius norm
(NNLS, exact) and in the nuclear norm (--nuc_solver, default nuc_auto), and takes numerical ranks with
relative tolerance --rtol (singular values above rtol * the largest; the SDP is
accurate to about 1e-6, so rtol sits well above that). Prediction: the nuclear
solution has lower rank than the Frobenius one, whose rank is min(n, d).
Everything is host-side float64 (--precision does not apply).
Writes to --out:
  results.npz   per cell: ranks (cells, runs) fro/nuc (-1 where not solved), statuses,
                draws and infeasible counts, singular values (cells, runs, d_max)
  summary.json  flags, per-cell mean ranks and draw counts, checks, timings
  rank.png      mean rank vs d; left: n varies (T=5), right: T varies (n=5);
                Frobenius solid, nuclear dashed, min(n, d) dotted
  runs/         every drawn data set's per-run arrays, one file per cell (n, T, d) (replay compares
                with them)

    python -m experiments.svm_rank --out=results/e3
    python -m experiments.svm_rank --out=/tmp/e3 --runs=10 --ds=1,2,5,10 --shapes=5:5,10:5
    python -m experiments.svm_rank --out=results/e3 --resume      # after an interruption

Each (n, T, d) cell is part of every data set's identity; the data sets are drawn and checked in
batches of --batch_size, and a cell stops after the first batch that completes it: --resume
skips finished batches and cells.
"""
from __future__ import annotations

from absl import app
from absl import flags
from absl import logging

from . import common
from svmattn.io import plots
from svmattn.io import results
from svmattn.studies import svm_rank as e3

FLAGS = flags.FLAGS
common.define_common_flags(runs=100)
# A cell stops early once it holds --runs feasible data sets: one process. Small batches: the
# feasible data sets of a cell's last batch beyond the --runs-th are solved too (and left out).
common.define_pipeline_flags(batch_size=50, hosts=False)
flags.DEFINE_alias("batch", "batch_size")
flags.DEFINE_list("shapes", ["5:5", "10:5", "15:5", "5:10", "5:15"],
                  "Shapes n:T. The paper: n in {5,10,15} with T=5 and T in {5,10,15} with n=5.")
flags.DEFINE_list("ds", ["1", "2", "3", "4", "5", "10", "15", "20"], "Embedding dimensions d.")
flags.DEFINE_float("rtol", 1e-4, "Numerical rank: singular values > rtol * the largest.")
flags.DEFINE_integer("max_draws_factor", 100, "Stop a cell after this many times --runs draws.", lower_bound=1)
flags.DEFINE_enum("nuc_solver", e3.DEFAULT_NUC_SOLVER, list(e3.NUC_SOLVERS),
                  "Solver of the nuclear-norm SVM: nuc_auto (Clarabel on the dual for small problems, SCS on "
                  "the primal otherwise), clarabel_dual, scs_direct, or SCS / CLARABEL through cvxpy.")
common.int_list("ds", minimum=1)
common.positive_float("rtol")


def _shapes_ok(values) -> bool:
  try:
    e3.parse_shapes(values)
  except ValueError:
    return False
  return True


flags.register_validator("shapes", _shapes_ok, message="must be a non-empty list of n:T with n >= 1 and T >= 2, "
                         "such as 5:5,10:5")
flags.register_validator("data", lambda v: v is None, message="is not supported by E3: it sweeps shapes and d")

NORMS = e3.NORMS
NORM_NAMES = e3.NORM_NAMES


def main(argv):
  del argv
  timer = common.Timer()
  fl, study = common.start_study(e3)
  shapes, ds, cells = e3.grid(fl)
  logging.info("E3: %d cells, %d feasible data sets each, rtol %g", len(cells), FLAGS.runs, FLAGS.rtol)

  def write(output):
    arrays, summary = e3.reduce(fl, output.cells)
    with timer("write"):
      results.write_npz(f"{FLAGS.out}/results.npz", arrays)
      draw(summary["cells"], shapes, ds, FLAGS.out)
    summary = common.write_summary(summary, fl, output, timer, {"data_s": "data", "svm_s": "svm", "wall_s": "pipeline_wall"})
    report(summary)

  common.run_study(study, write)


def draw(cells, shapes, ds, out):
  vary_n = [s for s in shapes if s[1] == 5]
  vary_T = [s for s in shapes if s[0] == 5]
  if len(vary_n) >= 2 and len(vary_T) >= 2:
    groups = [("n varies, T = 5", vary_n), ("T varies, n = 5", vary_T)]
  else:
    groups = [("(n, T)", shapes)]
  colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
  fig, axes = plots.figure(ncols=len(groups), width=4.8, height=3.8)
  for ax, (title, group) in zip(axes, groups):
    for j, (n, T) in enumerate(group):
      rows = [x for x in cells if (x["n"], x["T"]) == (n, T)]
      x_d = [x["d"] for x in rows]
      color = colors[j % len(colors)]
      ax.plot(x_d, [x["mean_rank_fro"] for x in rows], "-", marker="o", ms=3, color=color, label=f"n={n}, T={T}")
      ax.plot(x_d, [x["mean_rank_nuc"] for x in rows], "--", marker="s", ms=3, color=color)
      ax.plot(x_d, [min(n, d) for d in x_d], ":", color=color, lw=1)
    ax.plot([], [], "k-", label="Frobenius")
    ax.plot([], [], "k--", label="nuclear")
    ax.plot([], [], "k:", lw=1, label="min(n, d)")
    ax.set(xlabel="d", ylabel="mean numerical rank", title=title)
    ax.legend(fontsize=8)
  plots.save(fig, f"{out}/rank.png")


def report(summary):
  lines = [f"E3 SVM rank (rtol {summary['rank_rtol']:g}):"]
  lines.append("      n   T   d  kept draws  rank_fro rank_nuc")
  for x in summary["cells"]:
    lines.append(f"    {x['n']:3d} {x['T']:3d} {x['d']:3d} {x['feasible_kept']:5d} {x['draws']:5d}  "
                 f"{x['mean_rank_fro']:8.2f} {x['mean_rank_nuc']:8.2f}")
  common.print_report(lines, summary)


common.distinct_lists()   # a repeated list entry would compute the same thing twice

if __name__ == "__main__":
  app.run(main)
