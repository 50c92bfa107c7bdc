r"""E8: sequence-to-sequence and causal attention, GD versus their SVMs (docs/science.md sections 7-8).

Every position k of sequence i is a query z_ik = x_ik with its own label Y_ik.
For each mode (seq2seq: all tokens visible; causal: position k sees t <= k) the
binary trains W with normalized GD on every data set, reads off the tokens GD
selected, alpha_hat_ik = argmax_t s_ikt, solves the matching SVM

    min ||W||_F  s.t.  (x_{i,alpha_hat_ik} - x_it)^T W x_ik >= 1   (all t != alpha_hat_ik; causal: t <= k)

and reports corr(W_GD, W^mm) per iteration and at the end, SVM feasibility,
and how often GD selected the globally optimal tokens opt_ik = argmax_t Y_ik v^T x_it
(causal: over t <= k; causal position 0 sees one token and is left out).
With --params=W,KQ the (K,Q) runs are compared with the nuclear-norm SVM.

Default sizes n=4, T=5, d=20 = n T: the n T queries are then linearly
independent, so the SVM is feasible for every selection (seq2seq and causal).

Writes to --out:
  runs/           every data set's per-run arrays (one file for the study's one cell)
  results.npz     per mode m and parameterization p: W_final_{m}_{p}, selected_{m}_{p} (B,n,T),
                  svm_{m}_{p} (B,d,d) and _status, corr_{m}_{p} (B,S), max_prob_{m}_{p}, loss_{m}_{p},
                  optimal_{m} (B,n,T), global_{m}_{p} (B,) ; steps, runs, token_scores (B,n,T,T)
  summary.json    flags, final correlations, feasibility, global selections, types, checks, timings
  correlation.png corr(W_GD, W^mm_alpha_hat) vs iteration, mean +- std per mode
  softmax.png     mean over queries of max_t s_ikt vs iteration (causal position 0, always 1, included)

    python -m experiments.seq_causal --out=results/e8
    python -m experiments.seq_causal --out=results/e8_quick --runs=20
    python -m experiments.seq_causal --out=results/e8 --resume      # after an interruption

Each mode and parameterization trains as one stage of every batch of --batch_size data sets;
--resume keeps finished batches and stages and continues the others from their checkpoints.
"""
from __future__ import annotations

from absl import app
from absl import flags
from absl import logging

from . import common
from svmattn.io import plots
from svmattn.io import results
from svmattn.studies import seq_causal as e8
from svmattn.svm import seq2seq as s2s

FLAGS = flags.FLAGS
common.define_common_flags(runs=100)
common.define_pipeline_flags(batch_size=1000)
common.define_numerics_flag()
flags.DEFINE_integer("n", 4, "Sequences per data set.", lower_bound=1)
flags.DEFINE_integer("T", 5, "Tokens (= query positions) per sequence.", lower_bound=2)
flags.DEFINE_integer("d", 20, "Embedding dimension (d >= n T: every selection's SVM is feasible).", lower_bound=1)
flags.DEFINE_integer("steps", 2000, "Optimizer steps.", lower_bound=0)
flags.DEFINE_float("lr", 0.1, "Learning rate (step size eta).")
flags.DEFINE_list("modes", list(s2s.MODES), "Attention modes: seq2seq and/or causal.")
flags.DEFINE_list("params", ["W"], "Parameterizations to train: W (vs Frobenius SVM), KQ (vs nuclear SVM).")
flags.DEFINE_enum("loss", "logistic", ["logistic", "exponential", "correlation"], "Loss.")
flags.DEFINE_string("optimizer", "normalized_gd", "normalized_gd, gd, or an optax optimizer name.")
flags.DEFINE_enum("labels", "random", ["random", "positive"], "Labels Y_ik: uniform +-1 or all +1.")
flags.DEFINE_integer("snapshot_every", 10, "Record W, softmax and loss every this many steps.", lower_bound=1)
flags.DEFINE_integer("chunk_steps", 500, "Steps per jitted chunk (progress granularity; a checkpoint is saved "
                     "after each).", lower_bound=1)
common.positive_float("lr")
common.known_optimizer()
common.known_params()
flags.register_validator("modes", lambda v: bool(v) and all(m in s2s.MODES for m in v) and len(set(v)) == len(v),
                         message=f"must list distinct modes among {list(s2s.MODES)}")
flags.register_validator("params", lambda v: len(set(v)) == len(v), message="must not repeat a parameterization")

OWN_NORM = e8.OWN_NORM
NORM_NAMES = e8.NORM_NAMES
MODE_COLORS = {"seq2seq": "tab:blue", "causal": "tab:orange"}


def main(argv):
  del argv
  timer = common.Timer()
  if FLAGS.precision == "float32":
    logging.warning("float32: gradients of saturated softmax underflow; see BUILD.md")
  fl, study = common.start_study(e8)
  logging.info("E8: %d data sets, n=%d T=%d d=%d, modes %s, params %s", study.cells[0].runs, FLAGS.n, FLAGS.T,
               FLAGS.d, FLAGS.modes, FLAGS.params)

  def write(output):
    arrays, summary = e8.reduce(fl, output.cells)
    with timer("write"):
      results.write_npz(f"{FLAGS.out}/results.npz", arrays)
      draw(arrays, FLAGS.modes, FLAGS.params, FLAGS.out)
    summary = common.write_summary(summary, fl, output, timer)
    report(summary)

  common.run_study(study, write)


def draw(arrays, modes, params, out):
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


def report(summary):
  lines = [f"E8 seq2seq / causal: {summary['data_sets']} data sets, shape {summary['shape']}"]
  for key, v in summary["final_corr"].items():
    if v["mean"] is not None:
      lines.append(f"  corr {key:<16} {v['mean']:.4f} +- {v['std']:.4f} (min {v['min']:.4f}, "
                   f"{v['solved']} solved)")
    else:
      lines.append(f"  corr {key:<16} no feasible SVM")
  for key, g in summary["global_selection"].items():
    lines.append(f"  optimal tokens {key:<10} all positions {100 * g['runs_all_positions_optimal']:.0f}% of runs, "
                 f"{100 * g['positions_optimal']:.1f}% of positions")
  for key, fr in summary["convergence_types"].items():
    lines.append(f"  types {key:<10} " + "  ".join(f"{k} {100 * x:.0f}%" for k, x in fr.items()))
  common.print_report(lines, summary)


common.distinct_lists()   # a repeated list entry would compute the same thing twice

if __name__ == "__main__":
  app.run(main)
