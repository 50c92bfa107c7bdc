r"""E1: the 2-D picture of global convergence (docs/science.md section 8, the paper's Figure 1).

n=2 sequences of T=3 tokens in d=2, labels Y=+1; tokens 0.3 N(0,1) shifted by
(-1,0) for sequence 1 and (+1,0) for sequence 2 (``svmattn.studies.paths_2d.two_clusters``);
queries z_i and head v unit Gaussian. Normalized GD (lr 0.1, 2000 steps) from W(0)=0, and
for (K,Q) from Q(0)=0, K(0)=0.1 N(0,1) (init scheme "zero"). Writes to --out:
  runs/         every data set's per-run arrays (one file for the study's one cell)
  results.npz   data (X, Y, Z, v), optimal tokens, SVM solutions, W(k) and K(k)Q(k)^T
                at every snapshot, final correlations
  summary.json  final correlations with the SVMs of the optimal tokens, checks, timings
  paths.png     tokens (stars: optimal tokens), the normalized paths W(k) z_i / ||W(k)||_F,
                the rays W^mm z_i (solid) and W^mm_* z_i (dashed); left W, right (K,Q)

    python -m experiments.paths_2d --out=results/e1
    python -m experiments.paths_2d --out=/tmp/e1 --steps=500      # quick
    python -m experiments.paths_2d --out=results/e1 --resume      # after an interruption
"""
from __future__ import annotations

from absl import app
from absl import flags
from absl import logging
import numpy as np

from . import common
from svmattn.io import plots
from svmattn.io import results
from svmattn.studies import paths_2d as e1

FLAGS = flags.FLAGS
common.define_common_flags(runs=16)
common.define_pipeline_flags(batch_size=1000)
common.define_numerics_flag()
flags.DEFINE_integer("n", 2, "Sequences per data set (cluster centres spread evenly over [-1, 1] x {0}).",
                     lower_bound=1)
flags.DEFINE_integer("T", 3, "Tokens per sequence.", lower_bound=2)
flags.DEFINE_integer("d", 2, "Embedding dimension (the picture needs d = 2).", lower_bound=1)
flags.DEFINE_integer("steps", 2000, "Normalized GD steps.", lower_bound=0)
flags.DEFINE_float("lr", 0.1, "Learning rate (step size eta).")
flags.DEFINE_integer("snapshot_every", 1, "Record W every this many steps (the drawn path).", lower_bound=1)
flags.DEFINE_integer("draw_run", -1, "Index (into the data sets) of the data set drawn in paths.png; -1: the "
                     "first whose picture can separate the predictions (see pick_drawn), else data set 0.",
                     lower_bound=-1)
common.positive_float("lr")
flags.register_multi_flags_validator(["draw_run", "runs", "data"],
                                     lambda v: v["data"] is not None or v["draw_run"] < v["runs"],
                                     message="--draw_run must be -1 (auto) or below --runs")


def main(argv):
  del argv
  timer = common.Timer()
  fl, study = common.start_study(e1)
  B = study.cells[0].runs
  if not -1 <= FLAGS.draw_run < B:
    common.fail(f"--draw_run must be -1 (auto) or in [0, {B}), got {FLAGS.draw_run}")
  logging.info("E1: %d data sets, n=%d T=%d d=%d, %d steps", B, FLAGS.n, FLAGS.T, FLAGS.d, FLAGS.steps)

  def write(output):
    arrays, summary = e1.reduce(fl, output.cells)
    d = arrays["X"].shape[-1]
    with timer("write"):
      results.write_npz(f"{FLAGS.out}/results.npz", arrays)
      if d == 2:
        draw(arrays, summary["drawn_data_set"], FLAGS.out)
      else:
        logging.warning("d=%d: paths.png needs d = 2 and is not drawn", d)
    summary = common.write_summary(summary, fl, output, timer)
    report(summary)

  common.run_study(study, write)


def draw(arrays, b, out):
  """Tokens, normalized paths W(k) z_i / ||W(k)||_F and the SVM rays, W left, (K,Q) right."""
  X, Z, opt = arrays["X"][b], arrays["Z"][b], arrays["optimal_tokens"][b]
  n = X.shape[0]
  seq_colors = ["tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange"]
  token_colors = ["c", "y", "lightgreen", "plum", "wheat"]
  markers = ["d", "o", "s", "^", "v"]
  fig, axes = plots.figure(ncols=2, width=5.2, height=5.0)
  lim = 1.15 * max(1.0, float(np.max(np.abs(X))))
  for ax, p, title in zip(axes, ("W", "KQ"), ("W-parameterization", "(K,Q)-parameterization")):
    for i in range(n):
      c, mk = seq_colors[i % 5], markers[i % 5]
      for t in range(X.shape[1]):
        star = t == opt[i]
        ax.scatter(X[i, t, 0], X[i, t, 1], marker="*" if star else mk, s=260 if star else 90,
                   color=token_colors[i % 5], edgecolors="black", linewidths=1.2, zorder=3)
      for norm, style in (("fro", "-"), ("nuc", "--")):
        Wm = arrays[f"svm_{norm}"][b]
        if np.all(np.isfinite(Wm)):
          ray = Wm @ Z[i]
          ray = 2 * lim * ray / max(np.linalg.norm(ray), 1e-300)
          ax.plot([0, ray[0]], [0, ray[1]], color=c, linestyle=style, lw=1.5, zorder=1)
      Ws = arrays[f"W_{p}"][b]                                   # (S, d, d)
      norms = np.linalg.norm(Ws, axis=(1, 2))
      keep = norms > 0
      path = np.einsum("sde,e->sd", Ws[keep], Z[i]) / norms[keep, None]
      ax.plot(path[:, 0], path[:, 1], color=c, lw=2.5, alpha=0.8, zorder=2)
      ax.scatter(path[-1, 0], path[-1, 1], color=c, marker="x", s=60, zorder=4)
    ax.axhline(0, color="0.85", lw=0.8, zorder=0)
    ax.axvline(0, color="0.85", lw=0.8, zorder=0)
    ax.set(xlim=(-lim, lim), ylim=(-lim, lim), aspect="equal", title=title, xlabel="coordinate 1",
           ylabel="coordinate 2")
  # one entry per sequence: its tokens' marker on its path's line
  handles = [plots.plt.Line2D([], [], color=seq_colors[i % 5], lw=2.5, marker=markers[i % 5], markersize=9,
                              markerfacecolor=token_colors[i % 5], markeredgecolor="black",
                              label=rf"sequence {i + 1}: tokens $x_{{{i + 1}t}}$, path $W(k)z_{i + 1}/\|W(k)\|_F$")
             for i in range(n)]
  handles += [plots.plt.Line2D([], [], color="k", lw=1.5, label=r"ray $W^{mm}z_i$ (Frobenius)"),
              plots.plt.Line2D([], [], color="k", lw=1.5, ls="--", label=r"ray $W^{mm}_\star z_i$ (nuclear)"),
              plots.plt.Line2D([], [], color="w", marker="*", markerfacecolor="0.6", markeredgecolor="k",
                               markersize=13, label="optimal token"),
              plots.plt.Line2D([], [], color="k", marker="x", lw=0, label="final step")]
  fig.legend(handles=handles, loc="upper center", ncol=2, fontsize=9, bbox_to_anchor=(0.5, 0.0))
  plots.save(fig, f"{out}/paths.png")


def report(summary):
  lines = [f"E1 2-D paths: {summary['data_sets']} data set(s)"]
  for key, v in summary["final_corr"].items():
    if v["mean"] is not None:
      lines.append(f"  final corr {key:<10} {v['mean']:.5f} (min {v['min']:.5f})")
  common.print_report(lines, summary)


common.distinct_lists()   # a repeated list entry would compute the same thing twice

if __name__ == "__main__":
  app.run(main)
