r"""E2: local convergence of normalized GD to the attention SVM (docs/science.md section 8).

Trains W and (K,Q) attention on every data set with normalized GD, solves the
Frobenius and the nuclear Att-SVM for the tokens each run selected, and writes
to --out:
  results.npz    final W / KQ^T, selections, SVM solutions, per-snapshot
                 correlations and softmax curves (see README, "Output files")
  summary.json   flags, final correlations (mean, std), convergence types, timings
  softmax.png    (1/n) sum_i max_t s_it vs iteration, mean +- std, W blue, (K,Q) red
  correlation.png  1 - corr with the SVM solutions vs iteration (log axis; median, 10..90th percentile)

    python -m experiments.local_convergence --out=results/e2
    python -m experiments.local_convergence --out=results/e2_mine --data=my_data.npz
    python -m experiments.local_convergence --out=results/e2 --resume      # after an interruption
"""
from __future__ import annotations

from absl import app
from absl import flags
import numpy as np

from . import common
from svmattn.io import plots
from svmattn.io import results
from svmattn.studies import local_convergence as e2
from svmattn.svm import att_svm as svm_lib

FLAGS = flags.FLAGS
common.define_common_flags(runs=100)
common.define_pipeline_flags(batch_size=1000)
common.define_numerics_flag()
flags.DEFINE_integer("n", 6, "Sequences per data set.", lower_bound=1)
flags.DEFINE_integer("T", 8, "Tokens per sequence.", lower_bound=2)
flags.DEFINE_integer("d", 10, "Embedding dimension.", lower_bound=1)
flags.DEFINE_integer("m", None, "(K,Q) width m (default d).", lower_bound=1)
flags.DEFINE_integer("steps", 2000, "Optimizer steps.", lower_bound=0)
flags.DEFINE_float("lr", 0.1, "Learning rate (step size eta).")
flags.DEFINE_list("params", ["W", "KQ"], "Parameterizations to train: W, KQ.")
flags.DEFINE_list("norms", ["fro", "nuc"], "Att-SVMs solved at each run's selection: fro (Frobenius), nuc "
                  "(nuclear; the slower one). E.g. --params=W --norms=fro solves only W's own SVM.")
flags.register_validator("norms", lambda v: bool(v) and len(set(v)) == len(v) and set(v) <= {"fro", "nuc"},
                         message="must be a non-empty list of distinct norms among fro, nuc")
flags.DEFINE_enum("loss", "logistic", ["logistic", "exponential", "correlation"], "Loss.")
flags.DEFINE_string("optimizer", "normalized_gd", "normalized_gd, gd, or an optax optimizer name.")
flags.DEFINE_enum("attention", "cross", ["cross", "self"], "Cross-attention or self-attention.")
flags.DEFINE_integer("query_pos", 0, "Query position for self-attention (0 <= query_pos < T).", lower_bound=0)
flags.DEFINE_integer("snapshot_every", 10, "Record W, softmax and loss every this many steps.", lower_bound=1)
flags.DEFINE_integer("chunk_steps", 1000, "Steps per jitted chunk; a checkpoint is saved after each.",
                     lower_bound=1)
flags.DEFINE_integer("block_size", 64, "Data sets per vectorized block (results are bit-identical for a "
                     "fixed block size, whatever the batch size or device count).", lower_bound=1)
flags.DEFINE_string("loss_scale", "default", "Loss scaling: 'auto' (rescale each step's gradient so that "
                    "float32 does not underflow; see BUILD.md), a number, or 'default' (auto in float32, 1 in "
                    "float64).")
common.positive_float("lr")
common.known_optimizer()
common.known_params()
flags.register_validator("loss_scale", lambda v: v in ("default", "auto") or _positive_number(v),
                         message="must be 'default', 'auto' or a finite number > 0")
flags.register_multi_flags_validator(["query_pos", "T"], lambda v: v["query_pos"] < v["T"],
                                     message="--query_pos must be below --T")


def _positive_number(value: str) -> bool:
  try:
    return np.isfinite(float(value)) and float(value) > 0
  except ValueError:
    return False


def main(argv):
  del argv
  timer = common.Timer()
  fl, study = common.start_study(e2)

  def write(output):
    arrays, summary = e2.reduce(fl, output.cells[0])
    with timer("write"):
      results.write_npz(f"{FLAGS.out}/results.npz", arrays)
      draw(arrays, FLAGS.params, FLAGS.out)
    summary = common.write_summary(summary, fl, output, timer)
    report(summary)

  common.run_study(study, write)


def draw(arrays, params, out):
  steps = arrays["steps"]
  fig, (ax,) = plots.figure()
  for p in params:
    plots.band(ax, steps, arrays[f"max_prob_{p}"], plots.COLORS[p], {"W": "W", "KQ": "(K,Q)"}[p])
  ax.set(xlabel="iteration", ylabel=r"softmax probability $\frac{1}{n}\sum_i \max_t s_{it}$",
         title="Attention saturates")
  ax.legend(title=plots.BAND_MEAN_STD)
  plots.save(fig, f"{out}/softmax.png")

  # 1 - corr on a log axis: the regime that matters (1 - corr near 1e-3) is invisible on a 0..1
  # axis; median and 10..90th percentile (a mean +- std band leaves a log axis). Floor: float64
  # rounding of a correlation (1e-15), so an exact match stays on the plot.
  fig, (ax,) = plots.figure()
  own = common.own_norms()
  for p in params:
    for norm in [m for m in svm_lib.NORMS if f"corr_{p}_{m}" in arrays]:
      style = "-" if own[p] == norm else "--"
      label = f"{'W' if p == 'W' else '(K,Q)'} vs {e2.NORM_NAMES[norm]} SVM"
      gap = np.maximum(1.0 - np.asarray(arrays[f"corr_{p}_{norm}"], np.float64), 1e-15)
      plots.quantile_band(ax, steps, gap, plots.COLORS[p], label, style)
  drawn = [np.asarray(arrays[f"corr_{p}_{m}"]) for p in params for m in svm_lib.NORMS if f"corr_{p}_{m}" in arrays]
  if any(np.isfinite(c).any() for c in drawn):      # (no solved SVM at all, e.g. all ties: nothing to log)
    ax.set_yscale("log")
  ax.set(xlabel="iteration", ylabel="1 - correlation coefficient",
         title="GD direction vs max-margin SVM")
  ax.legend(loc="lower left", title=plots.quantile_band_caption())
  plots.save(fig, f"{out}/correlation.png")


def report(summary):
  lines = [f"E2 local convergence: {summary['data_sets']} data sets"]
  for key, v in summary["final_corr"].items():
    if v["mean"] is not None:
      lines.append(f"  corr {key:<10} {v['mean']:.4f} +- {v['std']:.4f} ({v['solved']} solved)")
  for p, fr in summary["convergence_types"].items():
    lines.append(f"  types {p:<3} " + "  ".join(f"{k} {100 * x:.0f}%" for k, x in fr.items()))
  t = summary["timings_s"]
  lines.append(f"  wall {t['total']:.2f}s: train {t['train']:.2f}s (compile {t['compile']:.2f}s), "
               f"svm {t['svm']:.2f}s, overlap {t['overlap']:.2f}")
  print("\n".join(lines))


common.block_fits_batch()
common.distinct_lists()   # a repeated list entry would compute the same thing twice

if __name__ == "__main__":
  app.run(main)
