r"""E14: multi-head attention (docs/science.md section 13): which tokens each head selects and what it approaches.

f = sum_h v_h^T X^T softmax(X W_h z) with H heads (W_h, or K_h Q_h^T), trained by normalized GD as
a flax module (svmattn.models.flax_models.MultiHead) on E2's data sets; each data set has H fixed
unit heads v_h (or, --shared_head, its own v for all). No theorem predicts the limit: the binary
reports per head the selection, the softmax's sparsity, corr with the Att-SVM at that selection
(Frobenius for W, nuclear for (K,Q)), for the sum of the heads' matrices the SVM of the tokens the
sum selects, and whether heads select the same tokens or split them. Writes to --out:
  results.npz   <P>_head<h>_{selected (B,n), max_prob (B,), above_tau (B,), svm_status, corr (B,S),
                W_final}, <P>_sum_{selected, svm_status, corr}, <P>_W_final (the sum), <P>_all_same,
                <P>_all_different (B,) shares of sequences, steps (S,)
  summary.json  the per-head and summed tables
  heads.png     per head and for the sum: corr with its SVM against iteration; heads' agreement

    python -m experiments.multi_head --out=results/e14
    python -m experiments.multi_head --out=/tmp/e14 --heads=4 --params=W
"""
from __future__ import annotations

from absl import app
from absl import flags
import numpy as np

from . import common
from svmattn.io import plots
from svmattn.studies import multi_head as e14

FLAGS = flags.FLAGS
common.define_common_flags(runs=100)
common.define_pipeline_flags(batch_size=1000)
common.define_numerics_flag()
flags.DEFINE_integer("heads", 2, "Number of attention heads H.", lower_bound=1)
flags.DEFINE_bool("shared_head", False, "One head v (the data set's) for every attention head.")
common.define_training_flags()


def main(argv):
  del argv
  common.run_one_cell(e14, draw, report)


def draw(arrays, summary, out):
  steps = arrays["steps"]
  names = list(summary["params"])
  fig, axes = plots.figure(ncols=len(names) + 1, width=4.6)
  for ax, p in zip(axes, names):
    for k, h in enumerate(summary["params"][p]["heads"]):
      plots.band(ax, steps, arrays[f"{p}_{h}_corr"], f"C{k % 10}", f"{h} vs its Att-SVM")
    plots.band(ax, steps, arrays[f"{p}_sum_corr"], "k", "sum of heads vs the SVM of its selection", "--")
    ax.set(xlabel="iteration", ylabel="correlation", title=f"{p}: {summary['heads']} heads", ylim=(0, 1.02))
    ax.legend(loc="lower right")
  ax = axes[-1]
  width = 0.35
  x = np.arange(len(names))
  same = [summary["params"][p]["all_heads_same_token"]["mean"] for p in names]
  diff = [summary["params"][p]["all_heads_different_tokens"]["mean"] for p in names]
  ax.bar(x - width / 2, same, width, label="every head the same token")
  ax.bar(x + width / 2, diff, width, label="every head a different token")
  ax.set(xticks=x, xticklabels=names, ylabel="share of sequences", title="do the heads split the tokens?", ylim=(0, 1))
  ax.legend()
  plots.save(fig, f"{out}/heads.png")


def report(summary):
  lines = [f"E14 multi-head attention: {summary['heads']} heads "
           f"({'shared head' if summary['shared_head'] else 'a fixed head per attention head'}), "
           f"{summary['data_sets']} data sets; mean final corr with the Att-SVM at each selection"]
  f = lambda d: "-" if d is None else f"{d['mean']:.4f}"  # noqa: E731
  for p, row in summary["params"].items():
    for h, e in row["heads"].items():
      lines.append(f"  {p} {h}: corr {f(e['corr_final'])} (SVM solved {e['svm_solved']}), mean max prob "
                   f"{f(e['max_prob'])}, tokens >= tau_H {f(e['tokens_above_tau'])}")
    lines.append(f"  {p} sum of heads: corr with its {row['sum']['svm_norm']} SVM {f(row['sum']['corr_final'])}; "
                 f"sequences where every head picks the same token {f(row['all_heads_same_token'])}, "
                 f"each a different one {f(row['all_heads_different_tokens'])}")
  common.print_report(lines, summary)


common.distinct_lists()   # a repeated list entry would compute the same thing twice

if __name__ == "__main__":
  app.run(main)
