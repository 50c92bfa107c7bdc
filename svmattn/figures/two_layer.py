"""E15's figure: per layer, corr with the Att-SVM at the layer's selection against the iteration, and
the sparsity of each layer's softmax at the end (layers.png)."""
from __future__ import annotations

from svmattn.io import plots


def draw(arrays, summary, out, flags, extras=None):
  """OUT/layers.png."""
  steps = arrays["steps"]
  names = list(summary["params"])
  fig, axes = plots.figure(ncols=2, width=5.0)
  for k, p in enumerate(names):
    for j, layer in enumerate(("layer1", "layer2")):
      plots.band(axes[0], steps, arrays[f"{p}_{layer}_corr"], f"C{2 * k + j}", f"{p} {layer}", "-" if j else "--")
  axes[0].set(xlabel="iteration", ylabel="corr with the Att-SVM at the layer's selection", ylim=(0, 1.02),
              title="two-layer attention")
  axes[0].legend(loc="lower right")
  labels, values = [], []
  for p in names:
    for layer in ("layer1", "layer2"):
      labels.append(f"{p}\n{layer}")
      values.append(summary["params"][p][layer]["max_prob"]["mean"])
  axes[1].bar(range(len(values)), values, color=[f"C{i}" for i in range(len(values))])
  axes[1].set(xticks=range(len(values)), xticklabels=labels, ylabel="mean largest attention probability",
              ylim=(0, 1.05), title="sparsity at the end")
  plots.save(fig, f"{out}/layers.png")
