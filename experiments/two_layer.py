r"""E15: two-layer attention (SCIENCE.md section 13): per layer, the tokens selected and the SVM approached.

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
from svmattn.io import results
from svmattn.studies import two_layer as e15

FLAGS = flags.FLAGS
common.define_common_flags(runs=100)
common.define_pipeline_flags(batch_size=1000)
common.define_numerics_flag()
flags.DEFINE_integer("n", 6, "Sequences per data set.", lower_bound=1)
flags.DEFINE_integer("T", 8, "Tokens per sequence.", lower_bound=2)
flags.DEFINE_integer("d", 10, "Embedding dimension.", lower_bound=1)
flags.DEFINE_list("params", ["W", "KQ"], "Parameterizations of both layers: W, KQ.")
flags.DEFINE_integer("steps", 2000, "Normalized-GD steps.", lower_bound=0)
flags.DEFINE_float("lr", 0.1, "Step size.")
flags.DEFINE_string("optimizer", "normalized_gd", "Optimizer (each parameter normalized by its own norm).")
flags.DEFINE_integer("snapshot_every", 10, "Record the matrices every this many steps.", lower_bound=1)
flags.DEFINE_integer("chunk_steps", 1000, "Steps per jitted chunk; a checkpoint is saved after each.", lower_bound=1)
flags.DEFINE_integer("block_size", 64, "Data sets per vectorized block.", lower_bound=1)
common.positive_float("lr")
common.known_params()
common.known_optimizer()


def main(argv):
  del argv
  timer = common.Timer()
  fl, study = common.start_study(e15)

  def write(output):
    arrays, summary = e15.reduce(fl, output.cells[0])
    with timer("write"):
      results.write_npz(f"{FLAGS.out}/results.npz", arrays)
      draw(arrays, summary, FLAGS.out)
    summary = common.write_summary(summary, fl, output, timer)
    report(summary)

  common.run_study(study, write)


def draw(arrays, summary, out):
  steps = arrays["steps"]
  names = list(summary["params"])
  fig, axes = plots.figure(ncols=2, width=5.0)
  for k, p in enumerate(names):
    for j, layer in enumerate(("layer1", "layer2")):
      plots.band(axes[0], steps, arrays[f"{p}_{layer}_corr"], f"C{2 * k + j}", f"{p} {layer}", "-" if j else "--")
  axes[0].set(xlabel="iteration", ylabel="corr with the Att-SVM at the layer's selection", ylim=(0, 1.02),
              title="two-layer attention")
  axes[0].legend(fontsize=7, loc="lower right")
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


if __name__ == "__main__":
  app.run(main)
