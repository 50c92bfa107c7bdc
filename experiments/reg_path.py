r"""E7: regularization paths RP-W and RP-KQ (SCIENCE.md sections 4 and 8).

For every data set, on a geometric grid of radii R:
  RP-W:  W_R = argmin_{||W||_F <= R} L(W)
  RP-KQ: (K_R, Q_R) = argmin_{||K||_F^2 + ||Q||_F^2 <= 2R} L(K, Q)
(``svmattn.train.regpath``: accelerated projected gradient, warm-started along R, plus
a second start along the SVM of the optimal tokens at every R, the lower loss
kept), and their correlation with the attention SVM of the optimal tokens
alpha = opt (gamma = Y v^T x): W_R with W^mm (Frobenius), K_R Q_R^T with W^mm_*
(nuclear). Prediction: both correlations rise to 1 as R grows. Writes to --out:
  results.npz     R grid, optimal tokens, SVM solutions, W_R / K_R Q_R^T per R,
                  loss, constraint values, KKT cosines, correlations, where the
                  SVM start won (took_candidate) and by how much (candidate_gain)
  summary.json    flags, correlations at the largest R, checks, timings
  correlation.png corr vs R (mean +- std); right: 1 - corr on log-log axes (median, 10-90%)

    python -m experiments.reg_path --out=results/e7
    python -m experiments.reg_path --out=/tmp/e7 --runs=20 --num_r=16   # quick
"""
from __future__ import annotations


from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from experiments import common
from svmattn.data import datasets as data_lib
from svmattn.models import heads
from svmattn.analysis import metrics
from svmattn.models import attention as model_lib
from svmattn.io import plots
from svmattn.io import progress as progress_lib
from svmattn.train import regpath
from svmattn.io import results
from svmattn.svm import att_svm as svm_lib
from svmattn.train import loop as train_lib

FLAGS = flags.FLAGS
common.define_common_flags(runs=100)
flags.DEFINE_integer("n", 6, "Sequences per data set.")
flags.DEFINE_integer("T", 8, "Tokens per sequence.")
flags.DEFINE_integer("d", 10, "Embedding dimension (d >= max(T-1, n): the SVM of opt is feasible).")
flags.DEFINE_integer("m", None, "(K,Q) width m (default d).")
flags.DEFINE_enum("attention", "cross", ["cross", "self"], "Cross-attention or self-attention.")
flags.DEFINE_enum("loss", "logistic", ["logistic", "exponential", "correlation"], "Loss.")
flags.DEFINE_list("params", ["W", "KQ"], "Paths to compute: W, KQ.")
flags.DEFINE_float("r_min", 0.5, "Smallest radius R.")
flags.DEFINE_float("r_max", 300.0, "Largest radius R (keep the margins R / ||W^mm|| below ~700: "
                   "float64 gradients underflow beyond).")
flags.DEFINE_integer("num_r", 24, "Number of radii (geometric grid).")
flags.DEFINE_integer("iters", 400, "Solver iterations per radius.")
flags.DEFINE_integer("first_iters", 2000, "Solver iterations at the smallest radius.")
flags.DEFINE_bool("candidates", True, "Also start every radius along the SVM of the optimal tokens and keep "
                  "the lower loss (the problem is nonconvex: continuation alone can follow a local branch).")
flags.DEFINE_integer("batch", 25, "Data sets per vmapped batch (progress granularity).")

OWN_NORM = common.own_norms()
LABEL = {"W": r"$W_R$", "KQ": r"$K_RQ_R^\top$"}
NORM_NAME = {"fro": "Frobenius", "nuc": "nuclear"}


def solve_svms(data, opt, on):
  """Frobenius and nuclear Att-SVM(opt) of every data set: {norm: stacked arrays}."""
  X, Z = np.asarray(data.X, np.float64), np.asarray(data.Z, np.float64)
  B, d = X.shape[0], X.shape[-1]
  out = {}
  with progress_lib.Progress("SVM solves", 2 * B, "solves", enabled=on) as bar:
    for norm in svm_lib.NORMS:
      res = []
      for b in range(B):
        res.append(svm_lib.att_svm(X[b], Z[b], opt[b], norm))
        bar.update(1)
      out[norm] = svm_lib.stack(res, d)
  return out


def run_paths(param, data, R, keys, candidates):
  """regularization_path over batches of --batch data sets; returns a PathResult on all."""
  config = regpath.PathConfig(param=param, m=FLAGS.m, loss=FLAGS.loss, iters=FLAGS.iters,
                              first_iters=FLAGS.first_iters)
  B = data.X.shape[0]
  parts = []
  with progress_lib.Progress(f"path {param}", B, "data sets", enabled=FLAGS.progress) as bar:
    for start in range(0, B, FLAGS.batch):
      idx = np.arange(start, min(B, start + FLAGS.batch))
      cand = None if candidates is None else candidates[idx]
      parts.append(regpath.regularization_path(config, data_lib.take(data, idx), R, keys[idx], candidates=cand))
      bar.update(len(idx))
  fields = {}
  for name in regpath.PathResult._fields:
    if name == "R":
      fields[name] = R
    elif name == "params":
      fields[name] = jax.tree_util.tree_map(lambda *a: np.concatenate(a), *[p.params for p in parts])
    else:
      fields[name] = np.concatenate([getattr(p, name) for p in parts])
  return regpath.PathResult(**fields)


def main(argv):
  del argv
  timer = common.Timer()
  common.check_params(FLAGS.params)
  if FLAGS.batch < 1:
    raise app.UsageError(f"--batch must be >= 1, got {FLAGS.batch}")
  try:
    R = regpath.geometric_grid(FLAGS.r_min, FLAGS.r_max, FLAGS.num_r)
  except ValueError as e:
    raise app.UsageError(f"--r_min/--r_max/--num_r: {e}") from e
  spec = data_lib.DataSpec(FLAGS.n, FLAGS.T, FLAGS.d, FLAGS.attention).validate()
  with timer("data"):
    data, runs = common.load_or_generate(spec)
  B, n, T, d = data.X.shape
  logging.info("E7: %d data sets, n=%d T=%d d=%d, %d radii in [%g, %g]", B, n, T, d, len(R), R[0], R[-1])
  gamma = np.asarray(jax.vmap(lambda v, X, Y: heads.token_scores(heads.LINEAR, v, X, Y))(
      data.v, data.X, data.Y), np.float64)
  opt = metrics.optimal_tokens(gamma)

  with timer("svm"):
    svms = solve_svms(data, opt, FLAGS.progress)
  keys = train_lib.init_keys(FLAGS.seed, runs)

  arrays = {"R": R, "runs": runs, "optimal_tokens": opt, "token_scores": gamma}
  for norm in svm_lib.NORMS:
    arrays[f"svm_{norm}"] = svms[norm]["W"]
    arrays[f"svm_{norm}_status"] = svms[norm]["status"]
  paths = {}
  for p in FLAGS.params:
    cand = None
    if FLAGS.candidates:
      cand = svms[OWN_NORM[p]]["W"].copy()
      unsolved = ~np.all(np.isfinite(cand.reshape(B, -1)), axis=1)
      cand[unsolved] = np.eye(d)  # a harmless start where the SVM is not solved (corr is NaN there)
    with timer(f"path_{p}"):
      paths[p] = res = run_paths(p, data, R, keys, cand)
    arrays[f"W_{p}"] = res.W
    for name in ("loss", "constraint", "kkt_cos", "grad_norm", "took_candidate", "candidate_gain"):
      arrays[f"{name}_{p}"] = getattr(res, name)
    for norm in svm_lib.NORMS:
      arrays[f"corr_{p}_{norm}"] = metrics.corr(res.W, svms[norm]["W"][:, None])   # (B, G)
    arrays[f"nuclear_over_R_{p}"] = np.linalg.norm(res.W, "nuc", axis=(-2, -1)) / R
    attention = jax.vmap(model_lib.attention)(jnp.asarray(res.W[:, -1]), data.X, data.Z)
    arrays[f"selected_at_rmax_{p}"] = metrics.selected_tokens(np.asarray(attention))

  summary = {"experiment": "E7 regularization paths", "flags": common.flag_values(), "data_sets": B,
             "shape": {"n": n, "T": T, "d": d}, "R": R.tolist(),
             "svm_status": {norm: {s: int(np.sum(svms[norm]["status"] == s)) for s in svm_lib.STATUSES}
                            for norm in svm_lib.NORMS},
             "corr_at_rmax": {}, "selected_opt_at_rmax": {}, "candidate_wins": {}}
  for p in FLAGS.params:
    for norm in svm_lib.NORMS:
      final = arrays[f"corr_{p}_{norm}"][:, -1]
      ok = np.isfinite(final)
      summary["corr_at_rmax"][f"{p}_vs_{norm}"] = {
          "mean": float(np.mean(final[ok])) if ok.any() else None,
          "std": float(np.std(final[ok])) if ok.any() else None,
          "min": float(np.min(final[ok])) if ok.any() else None, "solved": int(ok.sum())}
    summary["selected_opt_at_rmax"][p] = float(np.mean(np.all(arrays[f"selected_at_rmax_{p}"] == opt, axis=1)))
    gain = paths[p].candidate_gain
    summary["candidate_wins"][p] = {
        "data_sets": int(np.sum(np.any(paths[p].took_candidate, axis=1))),
        "radii": int(np.sum(paths[p].took_candidate)),
        # a relative loss gain above 1e-6 means another branch of minima, not a finer solve
        "data_sets_other_branch": int(np.sum(np.any(gain > 1e-6, axis=1)))}
  summary["checks"] = make_checks(arrays, R, FLAGS.params)

  with timer("write"):
    results.write_npz(f"{FLAGS.out}/results.npz", arrays)
    draw(arrays, R, FLAGS.params, FLAGS.out)
  summary["timings_s"] = {**timer.seconds, "total": timer.total()}
  summary["environment"] = common.environment()
  results.write_json(f"{FLAGS.out}/summary.json", summary)
  report(summary)


def _curve_rises(mean):
  """The mean curve ends above where it starts and never falls by more than 1e-3
  over the upper half of the grid (where the limit is approached)."""
  upper = mean[len(mean) // 2:]
  return bool(mean[-1] > mean[0] and np.all(np.diff(upper) >= -1e-3))


def make_checks(arrays, R, params):
  """Acceptance checks computed from the results (SCIENCE.md section 4)."""
  checks = []
  for p in params:
    norm = OWN_NORM[p]
    corr = arrays[f"corr_{p}_{norm}"]
    ok = np.all(np.isfinite(corr), axis=1)
    if not ok.any():
      checks.append({"name": f"{p}: data sets with a solved {NORM_NAME[norm]} SVM(opt)", "value": 0,
                     "expected": ">= 1", "ok": False})
      continue
    mean = np.mean(corr[ok], axis=0)
    what = "W_R" if p == "W" else "K_R Q_R^T"
    checks.append({"name": f"mean corr({what}, {NORM_NAME[norm]} W^mm(opt)) at the largest R={R[-1]:g}",
                   "value": float(mean[-1]), "expected": ">= 0.99", "ok": bool(mean[-1] >= 0.99)})
    mid = len(R) // 2
    checks.append({"name": f"mean corr({what}, {NORM_NAME[norm]} W^mm(opt)) rises with R "
                           f"(R={R[0]:g}, {R[mid]:g}, {R[-1]:g})",
                   "value": f"{mean[0]:.4f}, {mean[mid]:.4f}, {mean[-1]:.4f}",
                   "expected": "increasing to 1 (no drop > 1e-3 on the upper half of the grid)",
                   "ok": _curve_rises(mean)})
    excess = float(np.max((arrays[f"constraint_{p}"] - R) / R))
    bound = "||W_R||_F <= R" if p == "W" else "(||K_R||^2+||Q_R||^2)/2 <= R"
    checks.append({"name": f"{p}: max over data sets and R of (constraint - R)/R ({bound})",
                   "value": excess, "expected": "<= 1e-12 (feasible)", "ok": bool(excess <= 1e-12)})
    kkt = 1.0 - arrays[f"kkt_cos_{p}"][:, -1]
    worst = float(np.nanmax(kkt)) if np.any(np.isfinite(kkt)) else float("nan")
    checks.append({"name": f"{p}: max over data sets of 1 - cos(-grad L, params) at the largest R (KKT)",
                   "value": worst, "expected": "<= 1e-6 (gradient anti-parallel to the solution)",
                   "ok": bool(worst <= 1e-6)})
    loss = arrays[f"loss_{p}"]
    rise = float(np.max(np.diff(loss, axis=1) / loss[:, :-1])) if loss.shape[1] > 1 else 0.0
    checks.append({"name": f"{p}: max relative loss increase from one R to the next",
                   "value": rise, "expected": "<= 1e-12 (nested balls: the minimum cannot rise)",
                   "ok": bool(rise <= 1e-12)})
    if p == "KQ":
      ratio = float(np.mean(arrays["nuclear_over_R_KQ"][:, -1]))
      checks.append({"name": "mean ||K_R Q_R^T||_* / R at the largest R (balanced factors)",
                     "value": ratio, "expected": ">= 0.99 (-> 1)", "ok": bool(ratio >= 0.99)})
  return checks


def draw(arrays, R, params, out):
  fig, (ax, ax_log) = plots.figure(ncols=2)
  for p in params:
    for norm in svm_lib.NORMS:
      corr = arrays[f"corr_{p}_{norm}"]
      ok = np.all(np.isfinite(corr), axis=1)
      if not ok.any():
        continue
      own = OWN_NORM[p] == norm
      label = f"{LABEL[p]} vs {NORM_NAME[norm]} SVM"
      plots.band(ax, R, corr[ok], plots.COLORS[p], label, "-" if own else "--")
      if own:  # log scale: median and the 10-90% band (mean - std would go below 0)
        gap = np.maximum(1.0 - corr[ok], 1e-16)
        lo, mid, hi = np.quantile(gap, [0.1, 0.5, 0.9], axis=0)
        ax_log.plot(R, mid, color=plots.COLORS[p], lw=2, label=label + " (median)")
        ax_log.fill_between(R, lo, hi, color=plots.COLORS[p], alpha=0.2, lw=0)
  ax.set(xscale="log", xlabel="R", ylabel="correlation coefficient", ylim=(0, 1.02),
         title="Regularization path vs SVM (alpha = opt)")
  ax.legend(loc="lower right")
  ax_log.set(xscale="log", yscale="log", xlabel="R", ylabel="1 - corr (median, 10-90% band)",
             title="Distance to the SVM direction")
  ax_log.legend(loc="lower left")
  plots.save(fig, f"{out}/correlation.png")


def report(summary):
  lines = [f"E7 regularization paths: {summary['data_sets']} data sets, R up to {summary['R'][-1]:g}"]
  for key, v in summary["corr_at_rmax"].items():
    if v["mean"] is not None:
      lines.append(f"  corr at R_max {key:<10} {v['mean']:.5f} +- {v['std']:.5f} (min {v['min']:.5f}, "
                   f"{v['solved']} solved)")
  for p, x in summary["selected_opt_at_rmax"].items():
    wins = summary["candidate_wins"][p]
    lines.append(f"  {p}: selects opt at R_max in {100 * x:.0f}% of data sets; the SVM start won at "
                 f"{wins['radii']} radii of {wins['data_sets']} data sets ({wins['data_sets_other_branch']} "
                 "with a loss gain > 1e-6: continuation was on another branch)")
  common.print_report(lines, summary)


if __name__ == "__main__":
  app.run(main)
