"""E17's figures: test accuracy against the signal norm beside the fit of the (noisy) training labels,
one curve per n, with the max-margin interpolator's test accuracy (vs_signal.png); the final attention
of a clean and of a flipped training sequence at the largest and the smallest signal norm
(attention.png); test accuracy during training at every signal norm (curves.png); the selected
token of every sequence in the signal directions, train and test, at three signal norms: Sakamoto &
Sato's Figure 1 (selection.png)."""
from __future__ import annotations

import numpy as np

from svmattn.io import plots


def _by_n(summary):
  out = {}
  for r in summary["cells"]:
    out.setdefault(r["n"], []).append(r)
  return out


def _v(rows, key):
  return np.asarray([np.nan if r[key] is None else r[key] for r in rows], np.float64)


def draw(arrays, summary, out, flags, extras=None):
  if not flags.get("data"):                 # (a --data file is one cell: no axis of signal norms)
    _vs_signal(summary, out)
  _attention(arrays, summary, out)
  _curves(summary, out)
  _projection(arrays, summary, out)


def _vs_signal(summary, out):
  groups = _by_n(summary)
  fig, axes = plots.figure(ncols=3, width=4.0, height=3.4)
  for k, (n, rows) in enumerate(groups.items()):
    s, c = _v(rows, "signal"), f"C{k}"
    axes[0].plot(s, _v(rows, "test_acc"), "o-", color=c, label=f"n={n}: GD test")
    axes[0].plot(s, _v(rows, "svm_test_acc"), "x:", color=c, label=f"n={n}: max-margin test")
    axes[1].plot(s, _v(rows, "train_acc"), "o-", color=c, label=f"n={n}: train (noisy labels)")
    axes[1].plot(s, _v(rows, "fitted_flipped"), "s--", color=c, label=f"n={n}: flipped fitted")
    axes[2].plot(s, _v(rows, "selects_relevant_clean"), "o-", color=c, label=f"n={n}: clean")
    axes[2].plot(s, _v(rows, "selects_relevant_flipped"), "s--", color=c, label=f"n={n}: flipped")
  titles = ("test accuracy (clean labels)", "fit of the training labels", "share attending most to the relevant token")
  for ax, title in zip(axes, titles):
    ax.set(xscale="log", xlabel="signal norm s", title=title, ylim=(-0.03, 1.03))
    ax.legend(fontsize=8)
  plots.save(fig, f"{out}/vs_signal.png")


def _projection(arrays, summary, out):
  """Sakamoto & Sato's Figure 1 from this run: each sequence's selected token (largest final
  attention) in the (mu_-1, mu_+1) coordinates, training (top: squares, the labels training saw)
  and test (bottom: circles), at the smallest, a middle and the largest signal norm (middle n)."""
  ns = sorted({r["n"] for r in summary["cells"]})
  n = ns[len(ns) // 2]
  rows = [r for r in summary["cells"] if r["n"] == n]
  picks = sorted({0, len(rows) // 2, len(rows) - 1})
  fig, axes = plots.plt.subplots(2, len(picks), figsize=(3.6 * len(picks), 6.4), squeeze=False)
  for j, k in enumerate(picks):
    r = rows[k]
    tag = f"s{r['signal']:g}_n{r['n']}"
    train, test = arrays.get(f"selected_projection_{tag}"), arrays.get(f"test_projection_{tag}")
    Y, yt = arrays.get(f"train_labels_{tag}"), arrays.get(f"test_labels_shown_{tag}")
    if train is None or test is None:
      continue
    for ax, pts, lab, marker in ((axes[0, j], train, Y, "s"), (axes[1, j], test, yt, "o")):
      for y, c in ((1, "C0"), (-1, "C1")):
        sel = lab == y if lab is not None else np.ones(pts.shape[:2], bool)
        style = {"facecolors": "none", "edgecolors": c} if marker == "o" else {"color": c}
        ax.scatter(pts[..., 0][sel], pts[..., 1][sel], s=10, marker=marker, label=f"Y = {y:+d}", **style)
      lim = [min(np.nanmin(pts), -2), max(np.nanmax(pts), 2)]
      ax.plot(lim, lim, "k:", lw=0.8)
      ax.set(xlabel="mu_-1 direction", ylabel="mu_+1 direction")
      ax.legend(fontsize=8)
    axes[0, j].set_title(f"train, s={r['signal']:g} (test acc {r['test_acc']:.2f})")
    axes[1, j].set_title(f"test, s={r['signal']:g}")
  fig.subplots_adjust(hspace=0.4)
  plots.save(fig, f"{out}/selection.png")


def _attention(arrays, summary, out):
  """Run 0's final attention over the T tokens, of its first clean and first flipped sequence."""
  rows = summary["cells"]
  n = max(r["n"] for r in rows)
  picks = [r for r in rows if r["n"] == n]
  picks = [picks[0], picks[-1]] if len(picks) > 1 else picks
  fig, axes = plots.figure(ncols=len(picks), width=4.0, height=3.2)
  axes = np.atleast_1d(axes)
  for ax, r in zip(axes, picks):
    a = arrays.get(f"attention_examples_s{r['signal']:g}_n{r['n']}")
    if a is None or not len(a):
      continue
    T = a.shape[-1]
    ax.bar(np.arange(T) - 0.2, a[0, 0], width=0.4, label="a clean sequence")
    ax.bar(np.arange(T) + 0.2, a[0, 1], width=0.4, label="a flipped sequence")
    ax.set(xlabel="token (0: relevant, 1-2: weakly relevant)", ylabel="final attention", ylim=(0, 1.02),
           title=f"s={r['signal']:g}, n={r['n']}")
    ax.set_xticks(np.arange(T))
    ax.legend(fontsize=8)
  plots.save(fig, f"{out}/attention.png")


def _curves(summary, out):
  groups = _by_n(summary)
  fig, axes = plots.figure(ncols=len(groups), width=4.0, height=3.2)
  axes = np.atleast_1d(axes)
  for ax, (n, rows) in zip(axes, groups.items()):
    cmap = plots.plt.get_cmap("viridis")
    for k, r in enumerate(rows):
      color = cmap(k / max(len(rows) - 1, 1))
      steps = np.asarray(r["steps"])
      ax.plot(steps, _v([{"x": x} for x in r["test_acc_curve"]], "x"), "-", color=color, label=f"s={r['signal']:g}")
      ax.plot(steps, _v([{"x": x} for x in r["train_acc_curve"]], "x"), ":", color=color)
    ax.set(xlabel="step", ylabel="accuracy", title=f"n={n}: test (solid), train on noisy labels (dotted)",
           ylim=(-0.03, 1.03))
    if len(rows) <= 8:
      ax.legend(fontsize=8)
  plots.save(fig, f"{out}/curves.png")
