"""E18's figure: the median stable rank of K Q^T and the median loss against the step, one curve per
init scale, one column per optimizer (rank.png)."""
from __future__ import annotations

import numpy as np

from svmattn.io import plots


def draw(arrays, summary, out, flags, extras=None):
  rows = summary["cells"]
  opts = list(dict.fromkeys(r["optimizer"] for r in rows))
  scales = sorted({r["init_scale"] for r in rows})
  steps = np.asarray(arrays["steps"])
  fig, axes = plots.plt.subplots(2, len(opts), figsize=(4.0 * len(opts), 6.4), squeeze=False)
  cmap = plots.plt.get_cmap("viridis")
  for j, opt in enumerate(opts):
    for r in (r for r in rows if r["optimizer"] == opt):
      c = cmap(scales.index(r["init_scale"]) / max(len(scales) - 1, 1))
      sr = np.asarray([np.nan if v is None else v for v in r["stable_rank_curve"]], np.float64)
      loss = np.asarray([np.nan if v is None else v for v in r["loss_curve"]], np.float64)
      axes[0, j].plot(steps, sr, color=c, label=f"init x {r['init_scale']:g}")
      axes[1, j].plot(steps, loss, color=c, label=f"init x {r['init_scale']:g}")
    axes[0, j].set(title=opt, xlabel="step", ylabel="stable rank of K Q^T (median)")
    axes[1, j].set(xlabel="step", ylabel="training loss (median)")
    axes[0, j].legend(fontsize=8)
  fig.subplots_adjust(hspace=0.3, wspace=0.32)
  plots.save(fig, f"{out}/rank.png")
