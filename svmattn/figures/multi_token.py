"""E5's figures: 1 - corr with the Gen-SVM objects against the iteration per d, and the final
1 - corr(W_GD, W^SVMeq) against the largest masked softmax probability."""
from __future__ import annotations

import numpy as np

from svmattn.io import plots

OBJECTS = ("svmeq", "mm", "1token")
LABELS = {"svmeq": r"$W^{SVMeq}$", "mm": r"$W^{mm}$", "1token": r"$W^{1token}$"}
STYLES = {"svmeq": "-", "mm": ":", "1token": "--"}
COLORS = ["tab:blue", "tab:green", "tab:red", "tab:cyan", "tab:purple", "tab:orange"]


def quartile_band(ax, x, curves, color, label, linestyle):
  """Median and 25-75% band over the leading axis of curves (R, S), NaN-aware."""
  curves = np.asarray(curves, np.float64)
  if not len(curves):
    return
  q25, med, q75 = np.nanpercentile(curves, [25, 50, 75], axis=0)
  ax.plot(x, med, color=color, linestyle=linestyle, label=label, lw=2)
  ax.fill_between(x, q25, q75, color=color, alpha=0.15, lw=0)


def draw(arrays, summary, out, flags, extras=None):
  """OUT/correlation.png (1 - corr vs iteration per d) and OUT/scatter.png (max masked s vs final 1 - corr)."""
  ds = summary["shape"]["ds"]
  steps = arrays["steps"]
  floor = 1e-16
  fig, axes = plots.figure(ncols=len(ds), width=4.2, height=3.6)
  for ax, d, color in zip(axes, ds, COLORS * 4):
    for obj in OBJECTS:
      quartile_band(ax, steps, np.maximum(1 - arrays[f"corr_{obj}_d{d}"], floor), color, LABELS[obj], STYLES[obj])
    if len(arrays[f"runs_d{d}"]):
      ax.set_yscale("log")
      ax.legend(loc="upper right")
    ax.set(xlabel="iteration", title=f"d={d} ({len(arrays[f'runs_d{d}'])} runs)")
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("1 - correlation coefficient (median, quartiles)")
  plots.save(fig, f"{out}/correlation.png")

  fig, axes = plots.figure(ncols=len(ds), width=4.2, height=3.6)
  for ax, d, color in zip(axes, ds, COLORS * 4):
    x = arrays[f"max_masked_d{d}"]
    y = np.maximum(1 - arrays[f"corr_svmeq_d{d}"][:, -1], floor) if len(x) else x
    dead = np.any(arrays[f"dead_d{d}"], axis=1) if len(x) else np.zeros(0, bool)
    ax.scatter(np.maximum(x[~dead], 1e-300), y[~dead], s=12, color=color, alpha=0.7, label="every sequence live")
    ax.scatter(np.maximum(x[dead], 1e-300), y[dead], s=12, color="k", marker="x", alpha=0.6,
               label="a dead sequence (ReLU all off)")
    if len(x):
      ax.set(xscale="log", yscale="log")
    ax.set(title=f"d={d}", xlabel=r"$\max_{i,\tau \notin O_i} s_{i\tau}$")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
  axes[0].set_ylabel(r"final 1 - corr$(W_{GD}, W^{SVMeq})$")
  plots.save(fig, f"{out}/scatter.png")
