"""E14's figure: per parameterization, each head's corr with its Att-SVM against the iteration, and
whether the heads select the same tokens or split them (heads.png)."""
from __future__ import annotations

import numpy as np

from svmattn.io import plots


def draw(arrays, summary, out, flags, extras=None):
  """OUT/heads.png."""
  steps = arrays["steps"]
  names = list(summary["params"])
  fig, axes = plots.figure(ncols=len(names) + 1, width=4.6)
  for ax, p in zip(axes, names):
    for k, h in enumerate(summary["params"][p]["heads"]):
      plots.band(ax, steps, arrays[f"{p}_{h}_corr"], f"C{k % 10}", f"{h} vs its Att-SVM")
    plots.band(ax, steps, arrays[f"{p}_sum_corr"], "k", "sum of heads vs the SVM of its selection", "--")
    ax.set(xlabel="iteration", ylabel="correlation", title=f"{p}: {summary['heads']} heads", ylim=(0, 1.02))
    ax.legend(loc="lower right")
  ax = axes[-1]
  width = 0.35
  x = np.arange(len(names))
  same = [summary["params"][p]["all_heads_same_token"]["mean"] for p in names]
  diff = [summary["params"][p]["all_heads_different_tokens"]["mean"] for p in names]
  ax.bar(x - width / 2, same, width, label="every head the same token")
  ax.bar(x + width / 2, diff, width, label="every head a different token")
  ax.set(xticks=x, xticklabels=names, ylabel="share of sequences", title="do the heads split the tokens?", ylim=(0, 1))
  ax.legend()
  plots.save(fig, f"{out}/heads.png")
