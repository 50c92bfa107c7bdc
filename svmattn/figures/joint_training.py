"""E11's figures: the correlations of joint training against the iteration, and (toy) the trajectories of p and v."""
from __future__ import annotations

import numpy as np

from svmattn.io import plots


def draw(arrays, summary, out, flags, extras=None):
  """OUT/joint.png (corr(v, v^mm), corr(W, relaxed), corr(W, full) against iteration, and the fixed-head
  run) and, in the toy setting, OUT/toy.png."""
  names = [n for n, row in summary["stages"].items() if row["head"] == "trained"]
  steps = arrays["steps"]
  fig, axes = plots.figure(ncols=len(names), width=5.0)
  for ax, name in zip(axes, names):
    plots.band(ax, steps, arrays[f"corr_v_{name}"], "C0", "corr(v, v^mm)")
    plots.band(ax, steps, arrays[f"corr_relaxed_{name}"], "C1", "corr(W, relaxed Att-SVM)")
    plots.band(ax, steps, arrays[f"corr_full_{name}"], "C2", "corr(W, full Att-SVM)")
    if f"corr_full_{name}_fixed" in arrays:
      plots.band(ax, steps, arrays[f"corr_full_{name}_fixed"], "C7", "fixed head: corr(W, Att-SVM)", "--")
    label = {"W": "W", "KQ": "K Q^T", "p": "p"}[name]
    ax.set(xlabel="iteration", ylabel="correlation", title=f"joint training, {label} ({summary['setting']})")
    ax.set_ylim(min(0.5, ax.get_ylim()[0]), 1.02)
    ax.legend(loc="lower right")
  plots.save(fig, f"{out}/joint.png")
  if summary["setting"] == "toy":
    draw_toy(arrays, list(summary["toy"]), out)


def draw_toy(arrays, names, out):
  """Per toy data set: the angle of p(t) and v(t) against iteration, with the SVMs' angles; ``names``:
  the data sets' names, in their order (the keys of the summary's "toy")."""
  angle = lambda u: np.degrees(np.arctan2(u[..., 1], u[..., 0]))  # noqa: E731
  fig, axes = plots.figure(ncols=2, width=4.8, height=3.8)
  steps = arrays["steps"]
  for i, ax in enumerate(axes):
    run = np.flatnonzero(arrays["runs"] == i)[0]
    ax.plot(steps, angle(arrays["p_path_p"][run]), color="C0", label="p(t)")
    ax.plot(steps, angle(arrays["v_path_p"][run]), color="C2", label="v(t)")
    for ref, color, style, label in ((arrays["W_full_p"][run], "C3", ":", "full p^mm"),
                                     (arrays["W_relaxed_p"][run], "C1", "--", "relaxed p^mm"),
                                     (arrays["v_mm_p"][run], "C2", "--", "v^mm")):
      ax.axhline(angle(ref), color=color, ls=style, lw=1, label=label)
    ax.set(xscale="symlog", xlim=(0, steps[-1]), xlabel="iteration", ylabel="direction (degrees)",
           title=f"toy, {names[i]} (n=3, T=2, d=2)")
    ax.legend()
  plots.save(fig, f"{out}/toy.png")
