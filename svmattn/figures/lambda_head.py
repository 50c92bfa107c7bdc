"""E6's figures: tokens selected per sequence against lambda (measured and predicted), and the
final 1 - corr with the Gen-SVM objects against lambda."""
from __future__ import annotations

import numpy as np

from svmattn.io import plots

OBJECTS = ("svmeq", "mm", "1token")
LABELS = {"svmeq": r"$W^{SVMeq}$", "mm": r"$W^{mm}$", "1token": r"$W^{1token}$"}
COLORS = {"svmeq": "tab:blue", "mm": "tab:green", "1token": "tab:red"}


def draw(arrays, summary, out, flags, extras=None):
  """OUT/tokens.png (|O_i| vs lambda) and OUT/correlation.png (final 1 - corr vs lambda); ``extras``:
  the per-lambda arrays that ``studies.lambda_head.reduce`` returns third."""
  per = extras
  x = np.array([float(v) for v in flags["lams"]])
  fig, (ax,) = plots.figure()
  sizes = [p["selected"].sum(-1).reshape(-1) for p in per]
  kept_sizes = [p["selected"][p["kept"]].sum(-1).reshape(-1) for p in per]
  pred = [p["predicted"].sum(-1).reshape(-1) for p in per]
  q = np.array([np.percentile(s, [25, 75]) for s in sizes])
  ax.plot(x, [s.mean() for s in sizes], "o-", color="tab:blue", lw=2, label=r"GD: $|O_i|$, all runs (mean)")
  ax.fill_between(x, q[:, 0], q[:, 1], color="tab:blue", alpha=0.15, lw=0)
  ax.plot(x, [s.mean() if s.size else np.nan for s in kept_sizes], "s:", color="tab:green",
          label=r"GD: $|O_i|$, evaluated runs (mean)")
  ax.plot(x, [s.mean() for s in pred], "k--", label=r"support of $\arg\max_s h$ (mean)")
  ax.set(xlabel=r"$\lambda$", ylabel="tokens selected per sequence",
         title=r"$h(r) = v^\top r - \lambda \|r\|^2$, orthonormal tokens")
  ax.grid(alpha=0.3)
  ax.legend(loc="lower right")
  plots.save(fig, f"{out}/tokens.png")

  fig, (ax,) = plots.figure()
  evaluated = False
  for obj in OBJECTS:
    vals = [np.maximum(p[f"final_{obj}"][p["kept"]], 1e-16) for p in per]
    med = np.array([np.median(v) if v.size else np.nan for v in vals])
    lo = np.array([np.percentile(v, 25) if v.size else np.nan for v in vals])
    hi = np.array([np.percentile(v, 75) if v.size else np.nan for v in vals])
    evaluated |= bool(np.any(np.isfinite(med)))
    ax.plot(x, med, "o-", color=COLORS[obj], lw=2, label=LABELS[obj])
    ax.fill_between(x, lo, hi, color=COLORS[obj], alpha=0.15, lw=0)
  ax.set(xlabel=r"$\lambda$", ylabel=r"final 1 - corr$(W_{GD}, \cdot)$ (median, quartiles)",
         title="Gen-SVM predictivity (evaluated runs)" if evaluated else "no evaluated runs")
  if evaluated:   # (a log axis without a positive value cannot be drawn)
    ax.set_yscale("log")
  ax.grid(alpha=0.3)
  ax.legend()
  plots.save(fig, f"{out}/correlation.png")
