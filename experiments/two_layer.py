r"""E15: two-layer attention (docs/science.md section 13): per layer, the tokens selected and the SVM approached.

Layer 1 is self-attention over the tokens with a residual, x1_k = x_k + sum_t softmax_t(x_t^T W1 x_k) x_t; layer 2 is
cross-attention of the query over layer 1's outputs, f = v^T X1^T softmax(X1 W2 z)
(svmattn.models.flax_models.TwoLayer, trained as a flax module by normalized GD on E2's data
sets). No theorem predicts the limit: per layer the binary reports the selection, the sparsity,
and corr with the Att-SVM at that selection (layer 1: the sequence-to-sequence SVM of self-
attention; layer 2: the single-query SVM on layer 1's final outputs). Writes to --out:
  results.npz   <P>_layer<l>_{selected, max_prob, above_tau, svm_status, corr (B,S), W_final},
                <P>_layer1_self (the share of tokens attending to themselves), steps (S,)
  summary.json  the per-layer tables
  layers.png    per layer: corr with its SVM against iteration, and the sparsity

    python -m experiments.two_layer --out=results/e15
"""
from __future__ import annotations

from absl import app
from absl import flags

from . import common
from svmattn.io import plots
from svmattn.studies import two_layer as e15

FLAGS = flags.FLAGS
common.define_common_flags(runs=100)
common.define_pipeline_flags(batch_size=1000)
common.define_numerics_flag()
common.define_training_flags()


def main(argv):
  del argv
  common.run_one_cell(e15, draw, report)


def draw(arrays, summary, out):
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


def report(summary):
  lines = [f"E15 two-layer attention: {summary['data_sets']} data sets"]
  f = lambda d: "-" if d is None else f"{d['mean']:.4f}"  # noqa: E731
  for p, row in summary["params"].items():
    for layer in ("layer1", "layer2"):
      e = row[layer]
      lines.append(f"  {p} {layer}: corr with its Att-SVM {f(e['corr_final'])} (solved {e['svm_solved']}, infeasible "
                   f"{e['svm_infeasible']}), mean max prob {f(e['max_prob'])}, tokens >= tau_H {f(e['tokens_above_tau'])}")
    lines.append(f"  {p} layer1: share of tokens attending to themselves {f(row['layer1']['attends_to_itself'])}")
  common.print_report(lines, summary)


common.distinct_lists()   # a repeated list entry would compute the same thing twice

if __name__ == "__main__":
  app.run(main)
