r"""E6: the lambda head selects more tokens as lambda grows (docs/science.md sections 6, 8).

Head h(r) = v^T r - lambda ||r||^2 (v unit Gaussian); the tokens of each sequence
are orthonormal (X_i X_i^T = I, T <= d), queries unit Gaussian, labels Y = +1.
W is trained by normalized GD (lr 0.1, 2001 steps) on the same --runs data sets
for every lambda of --lams. With orthonormal tokens h(X_i^T s) = a_i^T s - lambda ||s||^2
(a_i = X_i v), so the attention that maximizes h over the simplex is
s*_i = Proj_simplex(a_i / (2 lambda)) (argmax_t a_it at lambda = 0): its support is
the predicted selected set, of size 1 at lambda = 0 and growing with lambda.

For each lambda and run: the selected sets O_i = {t: s_it >= tau_H} of the final
softmax, the outcome of the Gen-SVM thresholds rule, and for the evaluated runs
W^SVMeq, W^mm, W^1token with 1 - corr(W_GD, .) (final W) and the distance of the
final softmax to s* on the selected entries.

Evaluated runs. At lambda > 0 the selected tokens of a sequence settle at a finite
optimum; normalized GD (a fixed step 0.1) keeps zig-zagging around it, so only a
small share of each step drives the masked tokens, whose probabilities then decay
like 1/t instead of exponentially (at 2001 steps typically 1e-6 to 1e-3; 10x more
steps, 10x smaller). The paper's rule would discard almost every run as
"intermediate". By default (--keep_intermediate) those runs are evaluated with
O_i = {s_it >= tau_H}, and the rule's counts are reported beside them;
--nokeep_intermediate applies the rule. Runs with nothing masked ("finite": W has
a finite limit, typically every token selected at large lambda) are never evaluated.

Writes to --out: results.npz, summary.json (with "checks"), tokens.png (|O_i|
vs lambda, measured and predicted), correlation.png (final 1 - corr vs lambda),
and runs/ (every run's per-run arrays, one file per lambda).

    python -m experiments.lambda_head --out=results/e6
    python -m experiments.lambda_head --out=results/e6_quick --runs=16 --lams=0,0.2,0.5,1
    python -m experiments.lambda_head --out=results/e6 --resume      # after an interruption

Each lambda is a cell of the study pipeline (svmattn.studies.lambda_head): batches of
--batch_size data sets train while the previous batch's SVMs are solved, --resume
continues an interrupted run bit for bit, and several processes (--num_processes)
share every lambda's data sets.
"""
from __future__ import annotations

from absl import app
from absl import flags
import numpy as np

from . import common
from svmattn.io import plots
from svmattn.io import results
from svmattn.studies import lambda_head as e6
from svmattn.svm import gensvm

FLAGS = flags.FLAGS
common.define_common_flags(runs=100)  # --runs: data sets, each trained at every lambda
common.define_pipeline_flags(batch_size=1000)
common.define_numerics_flag()
flags.DEFINE_list("lams", ["0", "0.05", "0.1", "0.2", "0.3", "0.4", "0.5", "0.75", "1", "1.5"],
                  "Values of lambda in h(r) = v^T r - lambda ||r||^2.")
flags.DEFINE_integer("n", 3, "Sequences per data set.", lower_bound=1)
flags.DEFINE_integer("T", 4, "Tokens per sequence (T <= d: orthonormal tokens).", lower_bound=2)
flags.DEFINE_integer("d", 8, "Embedding dimension.", lower_bound=1)
flags.DEFINE_integer("steps", 2001, "Normalized GD steps.", lower_bound=0)
flags.DEFINE_float("lr", 0.1, "Learning rate.")
flags.DEFINE_integer("snapshot_every", 100, "Snapshot W every this many steps.", lower_bound=1)
flags.DEFINE_integer("chunk_steps", 1000, "Steps per jitted chunk (one checkpoint each).", lower_bound=1)
flags.DEFINE_float("tau_L", gensvm.TAU_L, "Lower softmax threshold of the discard rule.")
flags.DEFINE_float("tau_H", gensvm.TAU_H, "Selection threshold: O_i = {t: s_it >= tau_H}.")
flags.DEFINE_bool("keep_intermediate", True, "Evaluate Gen-SVM also on runs the thresholds rule discards as "
                  "'intermediate' (some s_it in (tau_L, tau_H]); their count is reported either way. Runs "
                  "discarded as 'finite' (nothing masked) are never evaluated.")
common.float_list("lams", minimum=0.0, strict=False)
common.positive_float("lr")
flags.register_multi_flags_validator(["T", "d"], lambda v: v["T"] <= v["d"],
                                     message="--T must be <= --d (orthonormal tokens)")
flags.register_multi_flags_validator(
    ["tau_L", "tau_H"], lambda v: 0 < v["tau_L"] < v["tau_H"] < 1, message="need 0 < --tau_L < --tau_H < 1")

OBJECTS = e6.OBJECTS
LABELS = {"svmeq": r"$W^{SVMeq}$", "mm": r"$W^{mm}$", "1token": r"$W^{1token}$"}
COLORS = {"svmeq": "tab:blue", "mm": "tab:green", "1token": "tab:red"}


def main(argv):
  del argv
  timer = common.Timer()
  fl, study = common.start_study(e6)
  lams = e6.lams_of(fl)

  def write(output):
    arrays, summary, per = e6.reduce(fl, output.cells)
    with timer("write"):
      results.write_npz(f"{FLAGS.out}/results.npz", arrays)
      draw(per, lams, FLAGS.out)
    summary = common.write_summary(summary, fl, output, timer)
    report(summary, lams)

  common.run_study(study, write)


def draw(per, lams, out):
  x = np.array(lams)
  fig, (ax,) = plots.figure()
  sizes = [p["selected"].sum(-1).reshape(-1) for p in per]
  kept_sizes = [p["selected"][p["kept"]].sum(-1).reshape(-1) for p in per]
  pred = [p["predicted"].sum(-1).reshape(-1) for p in per]
  q = np.array([np.percentile(s, [25, 75]) for s in sizes])
  ax.plot(x, [s.mean() for s in sizes], "o-", color="tab:blue", lw=2, label=r"GD: $|O_i|$, all runs (mean)")
  ax.fill_between(x, q[:, 0], q[:, 1], color="tab:blue", alpha=0.15, lw=0)
  ax.plot(x, [s.mean() if s.size else np.nan for s in kept_sizes], "s:", color="tab:green",
          label=r"GD: $|O_i|$, evaluated runs (mean)")
  ax.plot(x, [s.mean() for s in pred], "k--", label=r"support of $\arg\max_s h$ (mean)")
  ax.set(xlabel=r"$\lambda$", ylabel="tokens selected per sequence",
         title=r"$h(r) = v^\top r - \lambda \|r\|^2$, orthonormal tokens")
  ax.grid(alpha=0.3)
  ax.legend(loc="lower right")
  plots.save(fig, f"{out}/tokens.png")

  fig, (ax,) = plots.figure()
  evaluated = False
  for obj in OBJECTS:
    vals = [np.maximum(p[f"final_{obj}"][p["kept"]], 1e-16) for p in per]
    med = np.array([np.median(v) if v.size else np.nan for v in vals])
    lo = np.array([np.percentile(v, 25) if v.size else np.nan for v in vals])
    hi = np.array([np.percentile(v, 75) if v.size else np.nan for v in vals])
    evaluated |= bool(np.any(np.isfinite(med)))
    ax.plot(x, med, "o-", color=COLORS[obj], lw=2, label=LABELS[obj])
    ax.fill_between(x, lo, hi, color=COLORS[obj], alpha=0.15, lw=0)
  ax.set(xlabel=r"$\lambda$", ylabel=r"final 1 - corr$(W_{GD}, \cdot)$ (median, quartiles)",
         title="Gen-SVM predictivity (evaluated runs)" if evaluated else "no evaluated runs")
  if evaluated:   # (a log axis without a positive value cannot be drawn)
    ax.set_yscale("log")
  ax.grid(alpha=0.3)
  ax.legend()
  plots.save(fig, f"{out}/correlation.png")


def report(summary, lams):
  lines = [f"E6 lambda head: {summary['data_sets']} data sets per lambda; final 1 - corr(W_GD, .) medians over "
           f"evaluated runs (--keep_intermediate={FLAGS.keep_intermediate})"]
  for lam in lams:
    p = summary["per_lambda"][repr(lam)]
    f = p["final_one_minus_corr"]
    med = "  ".join(f"{o} {f[o]['median']:.2e}" if f[o]["median"] is not None else f"{o} -" for o in OBJECTS)
    r = p["thresholds_rule"]
    m = p["match_predicted_evaluated"]
    lines.append(f"  lambda={lam:<5g} |O_i| {p['mean_selected_all_runs']:.2f} (pred {p['mean_predicted']:.2f}, "
                 f"match {'-' if m is None else format(m, '.2f')})  rule: kept {r['kept']} interm. "
                 f"{r['intermediate']} finite {r['finite']}; evaluated {p['evaluated']}  {med}")
  common.print_report(lines, summary, each_check=False)


common.distinct_lists()   # a repeated list entry would compute the same thing twice

if __name__ == "__main__":
  app.run(main)
