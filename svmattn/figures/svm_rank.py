"""E3's figure: mean numerical rank of the Frobenius and the nuclear Att-SVM against d."""
from __future__ import annotations

from svmattn.io import plots


def draw(arrays, summary, out, flags, extras=None):
  """OUT/rank.png: mean rank vs d; left: n varies (T=5), right: T varies (n=5) (one panel when the
  shapes hold no such pair of rows); Frobenius solid, nuclear dashed, min(n, d) dotted."""
  cells = summary["cells"]
  shapes = list(dict.fromkeys((x["n"], x["T"]) for x in cells))    # --shapes, in order (cells: shape-major)
  rank(cells, shapes, f"{out}/rank.png")


def rank(cells, shapes, path):
  vary_n = [s for s in shapes if s[1] == 5]
  vary_T = [s for s in shapes if s[0] == 5]
  if len(vary_n) >= 2 and len(vary_T) >= 2:
    groups = [("n varies, T = 5", vary_n), ("T varies, n = 5", vary_T)]
  else:
    groups = [("(n, T)", shapes)]
  colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
  fig, axes = plots.figure(ncols=len(groups), width=4.8, height=3.8)
  for ax, (title, group) in zip(axes, groups):
    for j, (n, T) in enumerate(group):
      rows = [x for x in cells if (x["n"], x["T"]) == (n, T)]
      x_d = [x["d"] for x in rows]
      color = colors[j % len(colors)]
      ax.plot(x_d, [x["mean_rank_fro"] for x in rows], "-", marker="o", ms=3, color=color, label=f"n={n}, T={T}")
      ax.plot(x_d, [x["mean_rank_nuc"] for x in rows], "--", marker="s", ms=3, color=color)
      ax.plot(x_d, [min(n, d) for d in x_d], ":", color=color, lw=1)
    ax.plot([], [], "k-", label="Frobenius")
    ax.plot([], [], "k--", label="nuclear")
    ax.plot([], [], "k:", lw=1, label="min(n, d)")
    ax.set(xlabel="d", ylabel="mean numerical rank", title=title)
    ax.legend(fontsize=8)
  plots.save(fig, path)
