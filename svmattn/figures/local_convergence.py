"""E2's figures: softmax saturation and 1 - corr with the SVM solutions against the iteration."""
from __future__ import annotations

import numpy as np

from svmattn.config import allowed
from svmattn.io import plots
from svmattn.svm import att_svm as svm_lib

NORM_NAMES = {"fro": "Frobenius", "nuc": "nuclear"}


def draw(arrays, summary, out, flags, extras=None):
  """OUT/softmax.png (mean +- std of (1/n) sum_i max_t s_it) and OUT/correlation.png (1 - corr, log axis)."""
  params = flags["params"]
  steps = arrays["steps"]
  fig, (ax,) = plots.figure()
  for p in params:
    plots.band(ax, steps, arrays[f"max_prob_{p}"], plots.COLORS[p], {"W": "W", "KQ": "(K,Q)"}[p])
  ax.set(xlabel="iteration", ylabel=r"softmax probability $\frac{1}{n}\sum_i \max_t s_{it}$",
         title="Attention saturates")
  ax.legend(title=plots.BAND_MEAN_STD)
  plots.save(fig, f"{out}/softmax.png")

  # 1 - corr on a log axis: the regime that matters (1 - corr near 1e-3) is invisible on a 0..1
  # axis; median and 10..90th percentile (a mean +- std band leaves a log axis). Floor: float64
  # rounding of a correlation (1e-15), so an exact match stays on the plot.
  fig, (ax,) = plots.figure()
  own = allowed.own_norms()
  for p in params:
    for norm in [m for m in svm_lib.NORMS if f"corr_{p}_{m}" in arrays]:
      style = "-" if own[p] == norm else "--"
      label = f"{'W' if p == 'W' else '(K,Q)'} vs {NORM_NAMES[norm]} SVM"
      gap = np.maximum(1.0 - np.asarray(arrays[f"corr_{p}_{norm}"], np.float64), 1e-15)
      plots.quantile_band(ax, steps, gap, plots.COLORS[p], label, style)
  drawn = [np.asarray(arrays[f"corr_{p}_{m}"]) for p in params for m in svm_lib.NORMS if f"corr_{p}_{m}" in arrays]
  if any(np.isfinite(c).any() for c in drawn):      # (no solved SVM at all, e.g. all ties: nothing to log)
    ax.set_yscale("log")
  ax.set(xlabel="iteration", ylabel="1 - correlation coefficient",
         title="GD direction vs max-margin SVM")
  ax.legend(loc="lower left", title=plots.quantile_band_caption())
  plots.save(fig, f"{out}/correlation.png")
