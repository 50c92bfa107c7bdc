"""E10's figures: the optimizer x norm table of mean final corr, and corr with the predicted norm's SVM against the iteration."""
from __future__ import annotations

import numpy as np

from svmattn.io import plots


def draw(arrays, summary, out, flags, extras=None):
  """OUT/geometry.png (the mean final corr table as a heatmap, each optimizer's predicted norm boxed) and
  OUT/curves.png (corr with the predicted norm's Att-SVM against iteration)."""
  names = list(summary["tables"]["corr"])
  norms = summary["norms"]
  table = np.array([[np.nan if summary["tables"]["corr"][o][n] is None else summary["tables"]["corr"][o][n]
                     for n in norms] for o in names])
  fig, (ax,) = plots.figure(width=1.0 + 0.9 * len(norms), height=1.0 + 0.45 * len(names))
  im = ax.imshow(table, cmap="viridis", aspect="auto")
  ax.set_xticks(range(len(norms)), norms)
  ax.set_yticks(range(len(names)), names)
  for i, o in enumerate(names):
    for j, n in enumerate(norms):
      if np.isfinite(table[i, j]):
        ax.text(j, i, f"{table[i, j]:.3f}", ha="center", va="center", fontsize=8,
                color="w" if table[i, j] < np.nanmean(table) else "k")
    pred = summary["nearest"][o]["predicted"]
    if pred in norms:
      j = norms.index(pred)
      ax.add_patch(plots.plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", lw=2))
  ax.set(xlabel="Att-SVM norm", title="mean final corr(W, Att-SVM); red: predicted norm")
  fig.colorbar(im, ax=ax)
  plots.save(fig, f"{out}/geometry.png")

  fig, (ax,) = plots.figure(width=6.5)
  steps = arrays["steps"]
  for k, o in enumerate(names):
    pred = summary["nearest"][o]["predicted"] or "fro"
    if pred in norms:
      plots.band(ax, steps, arrays[f"corr_{o}_{pred}"], f"C{k % 10}", f"{o} vs {pred}")
  ax.set(xlabel="iteration", ylabel="corr with the predicted norm's Att-SVM", ylim=(0, 1.02))
  ax.legend(loc="lower right")
  plots.save(fig, f"{out}/curves.png")
