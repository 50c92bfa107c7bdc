"""E13's figures: the Att-SVM's feasibility, the correlations, the sparsity and the accuracies against n
(vs_n.png), and the final attention of trained models drawn over their images (attention.png)."""
from __future__ import annotations

import numpy as np

from svmattn.config import fields as F
from svmattn.data import images as images_lib
from svmattn.io import plots


def _series(summary, p, *keys):
  out = []
  for n in summary["per_n"]:
    v = summary["per_n"][n][p]
    for k in keys:
      v = None if v is None else v.get(k)
    out.append(np.nan if v is None else v)
  return np.asarray(out, np.float64)


def draw(arrays, summary, out, flags, extras=None):
  """OUT/vs_n.png and OUT/attention.png; ``flags``: the settings, with the patch size the run used
  (the data set's default where --patch was unset) from the summary."""
  fl = F.Values({**flags, "patch": summary["patch"]})
  ns = np.asarray([int(n) for n in summary["per_n"]])
  bound = summary["transition"][fl.params[0]]["n_at_counting_bound"]
  fig, axes = plots.figure(ncols=4, width=3.8, height=3.4)
  for k, p in enumerate(fl.params):
    c = f"C{k}"
    axes[0].plot(ns, _series(summary, p, "feasible_fraction"), "o-", color=c, label=f"at GD's selection ({p})")
    if k == 0:
      axes[0].plot(ns, _series(summary, p, "opt_feasible_fraction"), "s--", color="C3", label="at the optimal tokens")
      axes[0].plot(ns, _series(summary, p, "random_feasible_fraction"), "^:", color="C4", label="at random tokens")
    axes[1].plot(ns, _series(summary, p, "corr_svm_final", "mean"), "o-", color=c, label=f"{p} vs Att-SVM")
    if p == "W":
      axes[1].plot(ns, _series(summary, p, "corr_svmeq_final", "mean"), "s--", color="C3", label="W vs W^SVMeq")
    axes[2].plot(ns, _series(summary, p, "max_prob", "mean"), "o-", color=c, label=f"{p}: mean max prob")
    axes[2].plot(ns, _series(summary, p, "sequences_on_several_tokens", "mean"), "s--", color=c,
                 label=f"{p}: share on >1 token")
    axes[3].plot(ns, _series(summary, p, "train_acc", "mean"), "o-", color=c, label=f"{p} train")
    axes[3].plot(ns, _series(summary, p, "test_acc", "mean"), "s--", color=c, label=f"{p} held-out")
  titles = ("Att-SVM(alpha) feasible", "mean final corr (where solved)", "attention sparsity", "accuracy")
  for ax, title in zip(axes, titles):
    ax.axvline(bound, color="0.5", ls=":", lw=1)
    ax.set(xscale="log", xlabel="n (images per data set)", title=title)
    ax.set_xticks(ns, [str(n) for n in ns])                 # the n values, not 2x10^0 minor labels
    ax.xaxis.set_minor_formatter(plots.plt.NullFormatter())
    ax.legend()
  axes[0].text(bound, 0.5, " n(T-1) = d^2", fontsize=8, color="0.4", transform=axes[0].get_xaxis_transform())
  plots.save(fig, f"{out}/vs_n.png")
  draw_attention(arrays, summary, fl, out)


def draw_attention(arrays, summary, fl, out, columns: int = 6):
  """Rows: three values of n (smallest, middle, largest); columns: images of run 0 with the final
  attention over their patches (red: attention weight; box: the selected patch)."""
  images, _ = images_lib.load_images(fl.dataset, root=fl.data_dir or None)
  H, Wd = images.shape[1:]
  grid = images_lib.patch_grid(H, Wd, fl.patch)
  ns = [int(n) for n in summary["per_n"]]
  rows = sorted({ns[0], ns[len(ns) // 2], ns[-1]})
  p = fl.params[0]
  fig = plots.plt.figure(figsize=(1.6 * columns, 1.8 * len(rows)))
  for r, n in enumerate(rows):
    att = arrays[f"attention_{p}_n{n}"][0]                       # (n, T) of run 0
    img = arrays[f"image_n{n}"][0]
    ys = arrays[f"Y_n{n}"][0]
    offset = att.shape[-1] - len(grid)                           # 1 with a [CLS] token first
    for c in range(min(columns, len(img))):
      ax = fig.add_subplot(len(rows), columns, r * columns + c + 1)
      ax.imshow(images[img[c]], cmap="gray_r", vmin=0, vmax=1)
      heat = np.zeros((H, Wd))
      for t, (y0, x0) in enumerate(grid):
        heat[y0:y0 + fl.patch, x0:x0 + fl.patch] = att[c, offset + t]
      ax.imshow(np.dstack([np.ones_like(heat), np.zeros_like(heat), np.zeros_like(heat), 0.6 * heat]))
      top = int(np.argmax(att[c])) - offset
      if top >= 0:
        y0, x0 = grid[top]
        ax.add_patch(plots.plt.Rectangle((x0 - 0.5, y0 - 0.5), fl.patch, fl.patch, fill=False,
                                         edgecolor="C0", lw=1.5))
      ax.set_xticks([])
      ax.set_yticks([])
      ax.set_title(f"n={n}, y={int(ys[c]):+d}", fontsize=7)
  fig.suptitle(f"{fl.dataset} {fl.classes}: final attention of run 0 (red), selected patch (box)", fontsize=8)
  plots.save(fig, f"{out}/attention.png")
