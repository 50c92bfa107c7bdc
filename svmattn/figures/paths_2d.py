"""E1's figure: the 2-D picture of the paper's Figure 1 (tokens, normalized paths, SVM rays)."""
from __future__ import annotations

from absl import logging
import numpy as np

from svmattn.io import plots


def draw(arrays, summary, out, flags, extras=None):
  """OUT/paths.png of the data set ``summary["drawn_data_set"]`` (the picture needs d = 2: for
  another d it is not drawn, with a warning)."""
  d = arrays["X"].shape[-1]
  if d != 2:
    logging.warning("d=%d: paths.png needs d = 2 and is not drawn", d)
    return
  paths(arrays, summary["drawn_data_set"], out)


def paths(arrays, b, out):
  """Tokens, normalized paths W(k) z_i / ||W(k)||_F and the SVM rays, W left, (K,Q) right."""
  X, Z, opt = arrays["X"][b], arrays["Z"][b], arrays["optimal_tokens"][b]
  n = X.shape[0]
  seq_colors = ["tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange"]
  token_colors = ["c", "y", "lightgreen", "plum", "wheat"]
  markers = ["d", "o", "s", "^", "v"]
  fig, axes = plots.figure(ncols=2, width=5.2, height=5.0)
  lim = 1.15 * max(1.0, float(np.max(np.abs(X))))
  for ax, p, title in zip(axes, ("W", "KQ"), ("W-parameterization", "(K,Q)-parameterization")):
    for i in range(n):
      c, mk = seq_colors[i % 5], markers[i % 5]
      for t in range(X.shape[1]):
        star = t == opt[i]
        ax.scatter(X[i, t, 0], X[i, t, 1], marker="*" if star else mk, s=260 if star else 90,
                   color=token_colors[i % 5], edgecolors="black", linewidths=1.2, zorder=3)
      for norm, style in (("fro", "-"), ("nuc", "--")):
        Wm = arrays[f"svm_{norm}"][b]
        if np.all(np.isfinite(Wm)):
          ray = Wm @ Z[i]
          ray = 2 * lim * ray / max(np.linalg.norm(ray), 1e-300)
          ax.plot([0, ray[0]], [0, ray[1]], color=c, linestyle=style, lw=1.5, zorder=1)
      Ws = arrays[f"W_{p}"][b]                                   # (S, d, d)
      norms = np.linalg.norm(Ws, axis=(1, 2))
      keep = norms > 0
      path = np.einsum("sde,e->sd", Ws[keep], Z[i]) / norms[keep, None]
      ax.plot(path[:, 0], path[:, 1], color=c, lw=2.5, alpha=0.8, zorder=2)
      ax.scatter(path[-1, 0], path[-1, 1], color=c, marker="x", s=60, zorder=4)
    ax.axhline(0, color="0.85", lw=0.8, zorder=0)
    ax.axvline(0, color="0.85", lw=0.8, zorder=0)
    ax.set(xlim=(-lim, lim), ylim=(-lim, lim), aspect="equal", title=title, xlabel="coordinate 1",
           ylabel="coordinate 2")
  # one entry per sequence: its tokens' marker on its path's line
  handles = [plots.plt.Line2D([], [], color=seq_colors[i % 5], lw=2.5, marker=markers[i % 5], markersize=9,
                              markerfacecolor=token_colors[i % 5], markeredgecolor="black",
                              label=rf"sequence {i + 1}: tokens $x_{{{i + 1}t}}$, path $W(k)z_{i + 1}/\|W(k)\|_F$")
             for i in range(n)]
  handles += [plots.plt.Line2D([], [], color="k", lw=1.5, label=r"ray $W^{mm}z_i$ (Frobenius)"),
              plots.plt.Line2D([], [], color="k", lw=1.5, ls="--", label=r"ray $W^{mm}_\star z_i$ (nuclear)"),
              plots.plt.Line2D([], [], color="w", marker="*", markerfacecolor="0.6", markeredgecolor="k",
                               markersize=13, label="optimal token"),
              plots.plt.Line2D([], [], color="k", marker="x", lw=0, label="final step")]
  fig.legend(handles=handles, loc="upper center", ncol=2, fontsize=9, bbox_to_anchor=(0.5, 0.0))
  plots.save(fig, f"{out}/paths.png")
