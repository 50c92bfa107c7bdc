"""E8's figures: corr(W_GD, W^mm at GD's selection) and the softmax saturation against the iteration,
per mode and parameterization."""
from __future__ import annotations

from svmattn.io import plots
from svmattn.models import attention as model_lib

OWN_NORM = {name: p.svm_norm for name, p in model_lib.PARAMETERIZATIONS.items()}
NORM_NAMES = {"fro": "Frobenius", "nuc": "nuclear"}
MODE_COLORS = {"seq2seq": "tab:blue", "causal": "tab:orange"}


def draw(arrays, summary, out, flags, extras=None):
  """OUT/correlation.png (corr vs iteration, mean +- std per mode) and OUT/softmax.png (mean over
  queries of max_t s_ikt vs iteration)."""
  modes, params = flags["modes"], flags["params"]
  steps = arrays["steps"]
  styles = {"W": "-", "KQ": "--"}
  fig, (ax,) = plots.figure()
  for mode in modes:
    for p in params:
      plots.band(ax, steps, arrays[f"corr_{mode}_{p}"], MODE_COLORS[mode],
                 f"{mode}, {'W' if p == 'W' else '(K,Q)'} vs {NORM_NAMES[OWN_NORM[p]]} SVM", styles[p])
  ax.set(xlabel="iteration", ylabel=r"corr$(W_{GD}, W^{mm}_{\hat\alpha})$", ylim=(0, 1.02),
         title="Seq2seq / causal attention: GD vs SVM")
  ax.legend(loc="lower right")
  plots.save(fig, f"{out}/correlation.png")

  fig, (ax,) = plots.figure()
  for mode in modes:
    for p in params:
      plots.band(ax, steps, arrays[f"max_prob_{mode}_{p}"], MODE_COLORS[mode],
                 f"{mode}, {'W' if p == 'W' else '(K,Q)'}", styles[p])
  ax.set(xlabel="iteration", ylabel=r"$\frac{1}{nT}\sum_{i,k} \max_t s_{ikt}$", title="Attention saturates")
  ax.legend(loc="lower right")
  plots.save(fig, f"{out}/softmax.png")
