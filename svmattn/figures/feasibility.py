"""E9's figure: the fraction of feasible Att-SVM(alpha) against d, one panel per shape (n, T)."""
from __future__ import annotations

from svmattn.io import plots

ALPHA_STYLE = {"opt": "-", "random": "--"}


def draw(arrays, summary, out, flags, extras=None):
  """OUT/feasibility.png: fraction feasible vs d, one panel per (n, T); opt solid, random dashed; a
  vertical line at d = max(T-1, n)."""
  shapes = [(int(n), int(T)) for n, T in zip(arrays["ns"], arrays["Ts"])]
  fractions(arrays["fraction"], shapes, [str(a) for a in arrays["alphas"]], arrays["ds"], out)


def fractions(fraction, shapes, alphas, ds, out):
  fig, axes = plots.figure(ncols=len(shapes), width=3.6, height=3.2)
  for si, ((n, T), ax) in enumerate(zip(shapes, axes)):
    for ai, a in enumerate(alphas):
      ax.plot(ds, 100 * fraction[si, ai], ALPHA_STYLE[a], marker="o", ms=3, color="tab:blue" if a == "opt"
              else "tab:orange", label=r"$\alpha$ = opt" if a == "opt" else r"random $\alpha$")
    ax.axvline(max(T - 1, n), color="gray", ls=":", lw=1.5, label="d = max(T-1, n)")
    ax.set(xlabel="d", title=f"n={n}, T={T}", ylim=(-3, 103))
    if si == 0:
      ax.set_ylabel("feasible data sets (%)")
      ax.legend(loc="lower right", fontsize=8)
  plots.save(fig, f"{out}/feasibility.png")
