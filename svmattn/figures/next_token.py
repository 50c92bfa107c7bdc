"""E12's figures: corr with the graph SVM, the residual of the predicted decomposition, and one token graph."""
from __future__ import annotations

import numpy as np

from svmattn.data import token_graph
from svmattn.io import plots


def draw(arrays, summary, out, flags, extras=None):
  """OUT/corr.png (corr(W, W^svm) against iteration; local: also with the local SVM), OUT/residual.png
  (the residual and the finite-part gap) and OUT/graph.png (a token graph of data set 0)."""
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
