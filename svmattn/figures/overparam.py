"""E4's figure: the shares of the convergence types against d, one panel per n."""
from __future__ import annotations

import numpy as np

from svmattn.analysis import metrics
from svmattn.io import plots

TYPES = metrics.CONVERGENCE_TYPES
TYPE_COLORS = {"global": "tab:green", "local": "tab:blue", "not-local": "tab:red", "tie": "tab:gray",
               "diverged": "black", "stalled": "tab:purple", "unsaturated": "tab:olive"}


def draw(arrays, summary, out, flags, extras=None):
  """OUT/overparam.png: stacked bars of the shares vs d, one panel per n, d = max(T-1, n) marked.
  ``extras``: the shares per type (len(n_values), D) that ``studies.overparam.reduce`` returns
  (else read from the results' share_* arrays)."""
  shares = extras if extras is not None else {t: arrays[f"share_{t.replace('-', '_')}"] for t in TYPES}
  n_values = [int(n) for n in arrays["n_values"]]
  stacked(shares, n_values, arrays["ds"], summary["T"], out)


def stacked(shares, n_values, ds, T, out):
  fig, axes = plots.figure(ncols=len(n_values), width=5.0, height=3.6)
  for ni, (n, ax) in enumerate(zip(n_values, axes)):
    bottom = np.zeros(len(ds))
    for t in TYPES:
      h = 100 * np.nan_to_num(shares[t][ni])
      ax.bar(ds, h, bottom=bottom, color=TYPE_COLORS[t], label=t, width=0.8)
      bottom += h
    ax.axvline(max(T - 1, n) - 0.5, color="k", ls=":", lw=1.5, label="d = max(T-1, n)")
    ax.set(xlabel="d", ylabel="runs (%)", title=f"n={n}, T={T}", ylim=(0, 100))
    ax.set_xticks(ds[::2] if len(ds) > 10 else ds)
    if ni == len(n_values) - 1:
      ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)
  plots.save(fig, f"{out}/overparam.png")
