r"""E8: sequence-to-sequence and causal attention, GD versus their SVMs (SCIENCE.md sections 7-8).

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
  results.npz     per mode m and parameterization p: W_final_{m}_{p}, selected_{m}_{p} (B,n,T),
                  svm_{m}_{p} (B,d,d) and _status, corr_{m}_{p} (B,S), max_prob_{m}_{p}, loss_{m}_{p},
                  optimal_{m} (B,n,T), global_{m}_{p} (B,) ; steps, runs, token_scores (B,n,T,T)
  summary.json    flags, final correlations, feasibility, global selections, types, checks, timings
  correlation.png corr(W_GD, W^mm_alpha_hat) vs iteration, mean +- std per mode
  softmax.png     mean over queries of max_t s_ikt vs iteration (causal position 0, always 1, included)

    python -m experiments.seq_causal --out=results/e8
    python -m experiments.seq_causal --out=results/e8_quick --runs=20
"""
from __future__ import annotations


from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np

from experiments import common
from svmattn.models import heads
from svmattn.analysis import metrics
from svmattn.io import plots
from svmattn.io import progress as progress_lib
from svmattn.io import results
from svmattn.svm import seq2seq as s2s
from svmattn.svm import att_svm as svm_lib
from svmattn.train import loop as train_lib

FLAGS = flags.FLAGS
common.define_common_flags(runs=100)
flags.DEFINE_integer("n", 4, "Sequences per data set.")
flags.DEFINE_integer("T", 5, "Tokens (= query positions) per sequence.")
flags.DEFINE_integer("d", 20, "Embedding dimension (d >= n T: every selection's SVM is feasible).")
flags.DEFINE_integer("steps", 2000, "Optimizer steps.")
flags.DEFINE_float("lr", 0.1, "Learning rate (step size eta).")
flags.DEFINE_list("modes", list(s2s.MODES), "Attention modes: seq2seq and/or causal.")
flags.DEFINE_list("params", ["W"], "Parameterizations to train: W (vs Frobenius SVM), KQ (vs nuclear SVM).")
flags.DEFINE_enum("loss", "logistic", ["logistic", "exponential", "correlation"], "Loss.")
flags.DEFINE_string("optimizer", "normalized_gd", "normalized_gd, gd, or an optax optimizer name.")
flags.DEFINE_enum("labels", "random", ["random", "positive"], "Labels Y_ik: uniform +-1 or all +1.")
flags.DEFINE_integer("snapshot_every", 10, "Record W, softmax and loss every this many steps.")
flags.DEFINE_integer("chunk_steps", 500, "Steps per jitted chunk (progress granularity).")

OWN_NORM = common.own_norms()
NORM_NAMES = {"fro": "Frobenius", "nuc": "nuclear"}
MODE_COLORS = {"seq2seq": "tab:blue", "causal": "tab:orange"}
CORR_TARGET = 0.99


def _stats(x):
  x = np.asarray(x, np.float64)
  if not np.any(np.isfinite(x)):
    return {"mean": None, "std": None, "min": None, "solved": 0}
  return {"mean": float(np.nanmean(x)), "std": float(np.nanstd(x)), "min": float(np.nanmin(x)),
          "solved": int(np.sum(np.isfinite(x)))}


def main(argv):
  del argv
  timer = common.Timer()
  common.check_params(FLAGS.params)
  for m in FLAGS.modes:
    if m not in s2s.MODES:
      raise app.UsageError(f"--modes: unknown mode {m!r}; use {', '.join(s2s.MODES)}")
  if FLAGS.precision == "float32":
    logging.warning("float32: gradients of saturated softmax underflow; see BUILD.md")
  with timer("data"):
    if FLAGS.data:
      data = s2s.load_npz(FLAGS.data, common.dtype())
      runs = np.arange(data.X.shape[0])
    else:
      if FLAGS.runs < 1:
        raise app.UsageError(f"--runs must be >= 1, got {FLAGS.runs}")
      spec = s2s.Seq2SeqSpec(FLAGS.n, FLAGS.T, FLAGS.d, FLAGS.labels).validate()
      runs = np.arange(FLAGS.runs)
      data = s2s.generate(spec, FLAGS.seed, runs, dtype=common.dtype())
  B, n, T, d = data.X.shape
  X = np.asarray(data.X, np.float64)
  gamma = np.asarray(jax.vmap(lambda v, X, Y: s2s.token_scores(heads.LINEAR, v, X, Y))(
      data.v, data.X, data.Y), np.float64)                                      # (B,n,T,T)
  logging.info("E8: %d data sets, n=%d T=%d d=%d, modes %s, params %s", B, n, T, d, FLAGS.modes, FLAGS.params)

  arrays = {"runs": runs, "token_scores": gamma}
  summary = {"experiment": "E8 seq2seq and causal attention", "flags": common.flag_values(),
             "data_sets": B, "shape": {"n": n, "T": T, "d": d}, "final_corr": {}, "svm_status": {},
             "global_selection": {}, "convergence_types": {}, "diverged_runs": {}}
  checks, compile_s = [], {}
  for mode in FLAGS.modes:
    scored = int(n * np.sum(s2s.scored_positions(T, T, mode)))          # queries with >= 2 visible tokens
    arrays[f"optimal_{mode}"] = s2s.optimal_tokens(gamma, mode)
    for p in FLAGS.params:
      name, norm = f"{mode}_{p}", OWN_NORM[p]
      config = train_lib.TrainConfig(param=p, model=mode, loss=FLAGS.loss, optimizer=FLAGS.optimizer,
                                     lr=FLAGS.lr, steps=FLAGS.steps, snapshot_every=FLAGS.snapshot_every,
                                     chunk_steps=FLAGS.chunk_steps)
      with timer(f"train_{name}"):
        with progress_lib.Progress(f"train {mode} {p}", FLAGS.steps, "steps", enabled=FLAGS.progress) as bar:
          tr = train_lib.train(config, data, train_lib.init_keys(FLAGS.seed, runs), bar.update)
      compile_s[name] = tr.compile_seconds
      selected = tr.selected                                                  # (B,n,T)
      with timer(f"svm_{name}"):
        with progress_lib.Progress(f"SVM {mode} {norm}", B, "solves", enabled=FLAGS.progress) as bar:
          solved = s2s.svm_batch(X, selected, norm, mode=mode, progress=bar.update)
      stacked = svm_lib.stack(solved, d)
      curve = metrics.corr(tr.W, stacked["W"][:, None])                       # (B,S)
      optimal = s2s.selects_optimal(gamma, selected, mode)                    # (B,n,T)
      positions = s2s.scored_positions(T, T, mode)
      all_opt = np.all(optimal, axis=(1, 2))
      arrays.update({f"W_final_{name}": tr.W_final, f"selected_{name}": selected,
                     f"svm_{name}": stacked["W"], f"svm_{name}_status": stacked["status"],
                     f"corr_{name}": curve, f"max_prob_{name}": tr.max_prob, f"loss_{name}": tr.loss,
                     f"global_{name}": all_opt})
      arrays.setdefault("steps", tr.steps)
      summary["diverged_runs"][name] = int(np.sum(~tr.finite))
      summary["final_corr"][f"{name}_vs_{norm}"] = _stats(curve[:, -1])
      status = {s: int(np.sum(stacked["status"] == s)) for s in svm_lib.STATUSES}
      summary["svm_status"][f"{name}_{norm}"] = status
      summary["global_selection"][name] = {
          "runs_all_positions_optimal": float(np.mean(all_opt)),
          "positions_optimal": float(np.mean(optimal[:, :, positions])),
          "scored_positions_per_data_set": scored}
      if norm == "fro":
        types = [s2s.convergence_type(gamma[b], selected[b], solved[b], mode) for b in range(B)]
        arrays[f"convergence_type_{name}"] = np.array(types)
        summary["convergence_types"][name] = metrics.type_fractions(types)

      final = summary["final_corr"][f"{name}_vs_{norm}"]
      checks.append({"name": f"{mode}: final corr({p}_GD, {NORM_NAMES[norm]} SVM at GD's selection), "
                             f"mean over {final['solved']} feasible runs",
                     "value": final["mean"] if final["mean"] is not None else "no feasible run",
                     "expected": f">= {CORR_TARGET}",
                     "ok": bool(final["mean"] is not None and final["mean"] >= CORR_TARGET)})
      if d >= scored:
        feasible = status["optimal"] / B
        checks.append({"name": f"{mode}: share of runs whose SVM at GD's selection is solved ({p}, {norm})",
                       "value": feasible,
                       "expected": f"= 1 (d = {d} >= {scored} queries with a choice: every selection is feasible)",
                       "ok": bool(feasible == 1.0)})

  with timer("write"):
    results.write_npz(f"{FLAGS.out}/results.npz", arrays)
    draw(arrays, FLAGS.modes, FLAGS.params, FLAGS.out)
  summary["checks"] = checks
  summary["timings_s"] = {"compile": compile_s, **timer.seconds, "total": timer.total()}
  summary["environment"] = common.environment()
  results.write_json(f"{FLAGS.out}/summary.json", summary)
  report(summary)


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


if __name__ == "__main__":
  app.run(main)
