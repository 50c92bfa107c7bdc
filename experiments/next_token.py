r"""E12: next-token prediction with self-attention and its graph SVM (docs/science.md section 12).

A vocabulary of K tokens with unit-norm embeddings, sequences of T distinct tokens whose last
token queries all T positions; GD on the key-query weights converges in direction to the graph
SVM built from the strongly connected components of each query token's token graph, plus a
finite part W^fin inside the components (Li, Huang, Ildiz, Rawat, Oymak, AISTATS 2024).

  --setting=global  mass-on-label readout, loss -log mass, normalized GD, lr 0.01, 4000 steps
  --setting=local   vocabulary readout softmax(E X^T s), loss (1 - p_y)^2, lr 0.1, 2000 steps;
                    compared with the graph SVM of the tokens GD selected (and of the labels)

Data: the public code's generator (K=6, d=8, n=6, T=4), or --data=FILE.npz with E (B,K,d),
tokens (B,n,T) int and labels (B,n) int (each label a token of its sequence).
Writes to --out:
  results.npz   W_final_<p> (B,d,d), W_svm_<p>, W_fin_<p>, corr_<p> (B,S), resid_<p> (B,S) =
                ||W - c W^svm - W^fin|| / ||W||, fin_gap_<p> (B,S) = ||P_fin W - W^fin||,
                (local) corr_local_<p>, E, tokens, labels, steps (S,)
  summary.json  final corr statistics beside the public code's printed numbers, checks
  corr.png      corr(W, W^svm) against iteration (local: also with the local SVM)
  residual.png  the residual and the finite-part gap against iteration
  graph.png     the token graph of one query token of data set 0, its SCCs colored and ranked

    python -m experiments.next_token --out=results/e12
    python -m experiments.next_token --out=results/e12_local --setting=local
"""
from __future__ import annotations

from absl import app
from absl import flags
import numpy as np

from . import common
from svmattn.io import plots
from svmattn.studies import next_token as e12

FLAGS = flags.FLAGS
flags.DEFINE_integer("runs", 100, "Number of random data sets (ignored with --data).", lower_bound=1)
flags.DEFINE_integer("seed", 0, "Seed; data set r is drawn from fold_in(PRNGKey(seed), r).")
flags.DEFINE_string("out", None, "Results directory (created; files in it are replaced atomically).")
flags.DEFINE_string("data", None, "Run on the data sets of this .npz (E (B,K,d), tokens (B,n,T) int, labels "
                    "(B,n) int) instead of generated ones.")
flags.DEFINE_bool("progress", True, "Show progress bars / log lines on stderr.")
flags.DEFINE_bool("compilation_cache", True, "Keep compiled XLA programs on disk.")
flags.DEFINE_string("compilation_cache_dir", common.DEFAULT_CACHE_DIR, "Directory of the persistent compilation cache.")
flags.mark_flag_as_required("out")
flags.register_validator("data", lambda v: v is None or __import__("os").path.isfile(v), message="no such file")
flags.register_multi_flags_validator(["compilation_cache", "compilation_cache_dir"], common._enable_cache)
common.define_pipeline_flags(batch_size=1000)
common.define_numerics_flag()
common.figure_format_flag()
flags.DEFINE_enum("setting", "global", sorted(e12.SETTINGS), "global or local (the public code's two notebooks).")
flags.DEFINE_integer("K", 6, "Vocabulary size.", lower_bound=2)
flags.DEFINE_integer("d", 8, "Embedding dimension.", lower_bound=1)
flags.DEFINE_integer("n", 6, "Sequences per data set.", lower_bound=1)
flags.DEFINE_integer("T", 4, "Tokens per sequence (distinct; T <= K).", lower_bound=2)
flags.DEFINE_bool("require_cycle", True, "Redraw a data set until some token graph has a cycle (the public code).")
flags.DEFINE_list("params", ["W"], "Parameterizations: W (Frobenius graph SVM), KQ (nuclear).")
flags.DEFINE_float("lr", None, "Step size (default 0.01 global, 0.1 local).")
flags.DEFINE_integer("steps", None, "Steps (default 4000 global, 2000 local).", lower_bound=0)
flags.DEFINE_string("optimizer", "normalized_gd", "Optimizer (svmattn.optim.optimizers.get_optimizer names).")
flags.DEFINE_enum("init", "uniform", ["uniform", "normal", "zero"], "Initialization (uniform: +-1/sqrt(d)).")
flags.DEFINE_integer("snapshot_every", 10, "Record W every this many steps.", lower_bound=1)
flags.DEFINE_integer("chunk_steps", 1000, "Steps per jitted chunk; a checkpoint is saved after each.", lower_bound=1)
flags.DEFINE_integer("block_size", 64, "Data sets per vectorized block.", lower_bound=1)
flags.register_validator("lr", lambda v: v is None or (np.isfinite(v) and v > 0), message="must be positive")
flags.register_multi_flags_validator(["K", "T"], lambda v: v["T"] <= v["K"],
                                     message="T distinct tokens per sequence need T <= K")
common.known_params()
common.known_optimizer()


def main(argv):
  del argv
  common.run_one_cell(e12, draw, report)


def draw(arrays, summary, out):
  steps = arrays["steps"]
  names = list(summary["params"])
  fig, (ax,) = plots.figure(width=6.0)
  for k, p in enumerate(names):
    plots.band(ax, steps, arrays[f"corr_{p}"], f"C{2 * k}", f"{p}: corr(W, W^svm of the labels)")
    if f"corr_local_{p}" in arrays:
      plots.band(ax, steps, arrays[f"corr_local_{p}"], f"C{2 * k + 1}", f"{p}: corr(W, W^svm of the selected tokens)")
  ax.set(xlabel="iteration", ylabel="correlation", title=f"next-token prediction ({summary['setting']})", ylim=(0, 1.02))
  ax.legend(loc="lower right")
  plots.save(fig, f"{out}/corr.png")

  fig, axes = plots.figure(ncols=2, width=4.8)
  for k, p in enumerate(names):
    plots.quantile_band(axes[0], steps[1:], arrays[f"resid_{p}"][:, 1:], f"C{k}", p)   # log axes: quantiles
    plots.quantile_band(axes[1], steps[1:], arrays[f"fin_gap_{p}"][:, 1:], f"C{k}", p)
  axes[0].set(xscale="log", yscale="log", xlabel="iteration", ylabel="||W - c W^svm - W^fin|| / ||W||",
              title="distance from the predicted decomposition")
  axes[1].set(xscale="log", yscale="log", xlabel="iteration", ylabel="||P_fin W - W^fin||",
              title="finite part: W's component in S_fin vs W^fin")
  for ax in axes:
    ax.legend(title=plots.quantile_band_caption())
  plots.save(fig, f"{out}/residual.png")
  draw_graph(arrays, out)


def draw_graph(arrays, out):
  """The token graph of the query token of data set 0 with the largest SCC."""
  from svmattn.data import token_graph
  tokens, labels = arrays["tokens"][0], arrays["labels"][0]
  graphs = token_graph.graphs(tokens, labels)
  k, g = max(graphs.items(), key=lambda kv: (max(len(c) for c in kv[1].components), len(kv[1].nodes)))
  m = len(g.nodes)
  angle = 2 * np.pi * np.arange(m) / m
  pos = np.stack([np.cos(angle), np.sin(angle)], 1)
  fig, (ax,) = plots.figure(width=4.8, height=4.6)
  for a, b in zip(*np.nonzero(g.edges)):
    ax.annotate("", xy=pos[b] * 0.88 + pos[a] * 0.12, xytext=pos[a] * 0.88 + pos[b] * 0.12,
                arrowprops={"arrowstyle": "-|>", "color": "0.4", "lw": 1.2,
                            "connectionstyle": "arc3,rad=0.12"})
  for a in range(m):
    c = g.component[a]
    ax.scatter(*pos[a], s=700, color=f"C{c % 10}", zorder=3, edgecolor="k")
    ax.text(*pos[a], f"{g.nodes[a]}", ha="center", va="center", fontsize=11, zorder=4, color="w")
    ax.text(*(pos[a] * 1.42), f"SCC {c}, rank {g.rank[c]}", ha="center", va="center", fontsize=8)
  ax.set(xlim=(-1.6, 1.6), ylim=(-1.6, 1.6), aspect="equal",
         title=f"data set 0, query token {k}: edges label -> other token\n"
               "same color: one SCC (equality constraints); rank 0 outranks higher ranks")
  ax.axis("off")
  plots.save(fig, f"{out}/graph.png")


def report(summary):
  pub = summary["public"]
  lines = [f"E12 next-token prediction ({summary['setting']}): {summary['data_sets']} data sets"]
  for p, row in summary["params"].items():
    f = lambda d: "-" if d is None else f"mean {d['mean']:.4f} [{d['min']:.4f}, {d['max']:.4f}]"  # noqa: E731
    lines.append(f"  {p}: final corr(W, W^svm) {f(row['corr_final'])}; residual {f(row['resid_final'])}; "
                 f"finite-part gap {f(row['fin_gap_final'])}")
    if "corr_local_final" in row:
      lines.append(f"  {p}: final corr(W, local W^svm) {f(row['corr_local_final'])}")
  for k, v in pub.items():
    if k != "source":
      lines.append(f"  public code ({pub['source']}): {k} " + ", ".join(f"{a} {b}" for a, b in v.items()))
  common.print_report(lines, summary)


common.seed_flag()
common.out_flag()
common.block_fits_batch()
common.distinct_lists()   # a repeated list entry would compute the same thing twice

if __name__ == "__main__":
  app.run(main)
