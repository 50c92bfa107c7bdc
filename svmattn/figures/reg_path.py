"""E7's figure: the correlation of the regularization paths with both Att-SVMs against the radius R."""
from __future__ import annotations

import numpy as np

from svmattn.io import plots
from svmattn.models import attention as model_lib
from svmattn.svm import att_svm as svm_lib

OWN_NORM = {name: p.svm_norm for name, p in model_lib.PARAMETERIZATIONS.items()}
NORM_NAME = {"fro": "Frobenius", "nuc": "nuclear"}
LABEL = {"W": r"$W_R$", "KQ": r"$K_RQ_R^\top$"}


def draw(arrays, summary, out, flags, extras=None):
  """OUT/correlation.png: corr vs R (mean +- std); right, 1 - corr on log-log axes (median, 10-90%)."""
  R = arrays["R"]
  fig, (ax, ax_log) = plots.figure(ncols=2)
  for p in flags["params"]:
    for norm in svm_lib.NORMS:
      corr = arrays[f"corr_{p}_{norm}"]
      ok = np.all(np.isfinite(corr), axis=1)
      if not ok.any():
        continue
      own = OWN_NORM[p] == norm
      label = f"{LABEL[p]} vs {NORM_NAME[norm]} SVM"
      plots.band(ax, R, corr[ok], plots.COLORS[p], label, "-" if own else "--")
      if own:  # log scale: median and the 10-90% band (mean - std would go below 0)
        gap = np.maximum(1.0 - corr[ok], 1e-16)
        lo, mid, hi = np.quantile(gap, [0.1, 0.5, 0.9], axis=0)
        ax_log.plot(R, mid, color=plots.COLORS[p], lw=2, label=label + " (median)")
        ax_log.fill_between(R, lo, hi, color=plots.COLORS[p], alpha=0.2, lw=0)
  ax.set(xscale="log", xlabel="R", ylabel="correlation coefficient", ylim=(0, 1.02),
         title="Regularization path vs SVM (alpha = opt)")
  ax.legend(loc="lower right")
  ax_log.set(xscale="log", yscale="log", xlabel="R", ylabel="1 - corr (median, 10-90% band)",
             title="Distance to the SVM direction")
  ax_log.legend(loc="lower left")
  plots.save(fig, f"{out}/correlation.png")
