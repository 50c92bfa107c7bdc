"""E19's figures: the loss of each label-frequency bucket against the step per optimizer, and the
time to halve each bucket's loss against 1/pi (log-log, with the predicted slopes)."""
from __future__ import annotations

import warnings

import numpy as np

from svmattn.io import plots


def plt_ticker():
  import matplotlib.ticker
  return matplotlib.ticker


def draw(arrays, summary, out, flags, extras=None):
  """OUT/buckets.png (median loss per bucket over data sets, one panel per optimizer) and
  OUT/fit_times.png (median time to halve each bucket's loss against 1/pi)."""
  steps, pi = arrays["steps"], np.asarray(summary["bucket_pi"])
  names = list(summary["optimizers"])
  plt = plots.pyplot()
  ncols = min(4, len(names))
  nrows = -(-len(names) // ncols)
  fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.9 * nrows), squeeze=False, sharey=True)
  colors = plt.cm.viridis(np.linspace(0, 0.9, len(pi)))
  for k, o in enumerate(names):
    ax = axes[k // ncols][k % ncols]
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", RuntimeWarning)
      med = np.nanmedian(arrays[f"bucket_loss_{o}"], axis=0)           # (S, NB)
    for j in range(len(pi)):
      ax.plot(steps, med[:, j], color=colors[j], lw=1.5, label=f"1/pi = {1 / pi[j]:.0f}")
    row = summary["optimizers"][o]
    ax.set(title=f"{row['optimizer']} (lr {row['lr']:g})", xlabel="step", yscale="log")
    if k % ncols == 0:
      ax.set_ylabel("loss of the bucket's sequences")
    ax.grid(alpha=0.3)
  for k in range(len(names), nrows * ncols):
    axes[k // ncols][k % ncols].axis("off")
  axes[0][0].legend(title="label bucket (median over data sets)", fontsize=8)
  fig.tight_layout()
  plots.save(fig, f"{out}/buckets.png")

  fig, (ax,) = plots.figure(width=5.6)
  for k, o in enumerate(names):
    t = np.array([np.nan if v is None else v for v in summary["optimizers"][o]["t_half_median"]], float)
    d = summary["optimizers"][o]["decay"]
    ax.plot(1 / pi, t, marker="o", color=f"C{k}", label=f"{o}: slope " + ("-" if d is None else f"{d['median']:.2f}"))
  ref = 1 / pi
  ax.plot(ref, ref / ref[0] * 20, "k--", lw=1, label="slope 1 (GD's prediction)")
  ax.set(xscale="log", yscale="log", xlabel="1/pi of the label bucket",
         ylabel="steps to halve the bucket's loss (median)", title="time to fit rare labels")
  ax.xaxis.set_minor_locator(plt_ticker().NullLocator())
  ax.set_xticks(ref, [f"{v:.0f}" for v in ref])
  ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), title="median decay (slope)")
  plots.save(fig, f"{out}/fit_times.png")
