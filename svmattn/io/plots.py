"""Figure helpers (matplotlib, Agg backend): mean +- std bands and PNG output."""
from __future__ import annotations

import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from svmattn.io import results  # noqa: E402

COLORS = {"W": "tab:blue", "KQ": "tab:red"}


def band(ax, x, curves, color, label, linestyle="-"):
  """Mean +- std over the leading axis of curves (R, S), NaN-aware (an all-NaN column, e.g.
  no SVM solved, leaves a gap)."""
  curves = np.asarray(curves, np.float64)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    mean, std = np.nanmean(curves, 0), np.nanstd(curves, 0)
  ax.plot(x, mean, color=color, linestyle=linestyle, label=label, lw=2)
  ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.2, lw=0)


def figure(ncols=1, width=5.0, height=3.8):
  fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
  return fig, list(axes[0])


def save(fig, path):
  results.save_figure(fig, path)
  plt.close(fig)
