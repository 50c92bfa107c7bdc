r"""E4: over-parameterization: global / local / not-local convergence of GD versus d (SCIENCE.md 8).

For each n in --n_values and each d from --d_min to --d_max, trains the W
attention with normalized GD (--steps steps, step --lr, uniform initialization)
on --runs data sets (the paper's unit-Gaussian generator, T tokens, linear head,
cross-attention), reads the selected tokens alpha_hat_i = argmax_t s_it, solves the
Frobenius Att-SVM(alpha_hat) (NNLS) and classifies each run
(``metrics.convergence_type``): global (alpha_hat = opt), local (alpha_hat locally
optimal, not opt) or not-local (otherwise, an infeasible SVM included).
Prediction: the global share grows with d, and not-local vanishes once the SVM is
always feasible (d >= max(T-1, n)). Runs that diverge to NaN are counted and left
out of the shares. Writes to --out:
  results.npz     types (len(n_values), D, runs) str, corr(W_GD, W^mm_alpha_hat), SVM statuses,
                  feasibility of Att-SVM(opt), selected / optimal tokens per n
  summary.json    flags, shares per (n, d), checks, timings
  overparam.png   stacked bars of the shares vs d, one panel per n, d = max(T-1, n) marked

    python -m experiments.overparam --out=results/e4
    python -m experiments.overparam --out=/tmp/e4 --runs=50 --n_values=5 --d_max=8 --steps=500
"""
from __future__ import annotations


from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np
import scipy.stats

from experiments import common
from svmattn.data import datasets as data_lib
from svmattn.svm import feasibility as feas_lib
from svmattn.models import heads
from svmattn.analysis import metrics
from svmattn.io import plots
from svmattn.io import progress as progress_lib
from svmattn.io import results
from svmattn.svm import att_svm as svm_lib
from svmattn.train import loop as train_lib

FLAGS = flags.FLAGS
common.define_common_flags(runs=500)
flags.DEFINE_list("n_values", ["5", "10"], "Numbers of sequences n (one panel each).")
flags.DEFINE_integer("T", 5, "Tokens per sequence.")
flags.DEFINE_integer("d_min", 2, "Smallest embedding dimension d.")
flags.DEFINE_integer("d_max", 20, "Largest embedding dimension d.")
flags.DEFINE_integer("steps", 2000, "Normalized GD steps.")
flags.DEFINE_float("lr", 0.1, "Learning rate (step size eta).")
flags.DEFINE_integer("chunk_steps", 500, "Steps per jitted chunk (one snapshot each; only the final W is used).")

TYPES = metrics.CONVERGENCE_TYPES
TYPE_COLORS = {"global": "tab:green", "local": "tab:blue", "not-local": "tab:red"}


def classify(data, trajectory):
  """Convergence type, corr(W_GD, W^mm_alpha_hat), SVM status of each run, and opt (B, n)."""
  gamma = np.asarray(jax.vmap(lambda v, X, Y: heads.token_scores(heads.LINEAR, v, X, Y))(
      data.v, data.X, data.Y), np.float64)
  X, Z = np.asarray(data.X, np.float64), np.asarray(data.Z, np.float64)
  selected = trajectory.selected
  B = len(X)
  types, corr = np.full(B, "", dtype="<U9"), np.full(B, np.nan)
  status = np.full(B, "", dtype="<U10")
  for b in range(B):
    res = svm_lib.att_svm(X[b], Z[b], selected[b], "fro")
    status[b] = res.status
    types[b] = metrics.convergence_type(gamma[b], selected[b], res)
    if res.ok:
      corr[b] = metrics.corr(trajectory.W_final[b], res.W)
  return types, corr, status, metrics.optimal_tokens(gamma), X, Z


def main(argv):
  del argv
  timer = common.Timer()
  try:
    n_values = [int(x) for x in FLAGS.n_values]
  except ValueError:
    raise app.UsageError(f"--n_values: expected integers, got {FLAGS.n_values}") from None
  if not n_values or min(n_values) < 1:
    raise app.UsageError(f"--n_values: need positive integers, got {FLAGS.n_values}")
  if FLAGS.data:
    raise app.UsageError("--data is not supported by E4: it sweeps n and d")
  if FLAGS.runs < 1:
    raise app.UsageError(f"--runs must be >= 1, got {FLAGS.runs}")
  if not 1 <= FLAGS.d_min <= FLAGS.d_max:
    raise app.UsageError(f"need 1 <= --d_min <= --d_max, got {FLAGS.d_min}, {FLAGS.d_max}")
  T, R = FLAGS.T, FLAGS.runs
  ds = np.arange(FLAGS.d_min, FLAGS.d_max + 1)
  runs = np.arange(R)
  every = min(FLAGS.chunk_steps, FLAGS.steps) if FLAGS.steps > 0 else 1
  config = train_lib.TrainConfig(param="W", lr=FLAGS.lr, steps=FLAGS.steps, snapshot_every=every,
                                 chunk_steps=every).validate()
  shape = (len(n_values), len(ds), R)
  types = np.full(shape, "", dtype="<U9")
  corr = np.full(shape, np.nan)
  svm_status = np.full(shape, "", dtype="<U10")
  finite = np.zeros(shape, bool)
  feasible_opt = np.zeros(shape, bool)
  arrays = {}
  compile_s = 0.0
  logging.info("E4: n %s, T=%d, d %d..%d, %d runs per cell, %d steps", n_values, T, ds[0], ds[-1], R, FLAGS.steps)

  for ni, n in enumerate(n_values):
    selected, optimal = np.zeros((len(ds), R, n), np.int64), np.zeros((len(ds), R, n), np.int64)
    with progress_lib.Progress(f"train n={n}", len(ds) * FLAGS.steps, "steps", enabled=FLAGS.progress) as bar:
      for di, d in enumerate(ds):
        spec = data_lib.DataSpec(n, T, int(d)).validate()
        with timer("data"):
          data = data_lib.generate(spec, FLAGS.seed, runs)    # float64; --precision=float32 trains on it rounded
          train_data = data_lib.Dataset(*(np.asarray(a).astype(common.dtype()) for a in data))
        with timer("train"):
          tr = train_lib.train(config, train_data, train_lib.init_keys(FLAGS.seed, runs), bar.update)
        compile_s += tr.compile_seconds
        with timer("svm"):
          t, c, st, opt, X, Z = classify(data, tr)
        with timer("feasibility"):
          feasible_opt[ni, di] = feas_lib.check(X, Z, opt).feasible
        finite[ni, di] = tr.finite
        types[ni, di], corr[ni, di], svm_status[ni, di] = t, c, st
        selected[di], optimal[di] = tr.selected, opt
    arrays[f"selected_n{n}"], arrays[f"optimal_n{n}"] = selected, optimal

  shares = {t: np.zeros((len(n_values), len(ds))) for t in TYPES}
  cells = []
  for ni, n in enumerate(n_values):
    for di, d in enumerate(ds):
      ok = finite[ni, di]
      fr = metrics.type_fractions(types[ni, di][ok])
      for t in TYPES:
        shares[t][ni, di] = fr[t] if ok.any() else np.nan
      c = corr[ni, di][ok]
      cells.append({"n": n, "T": T, "d": int(d), "runs": R, "diverged": int(np.sum(~ok)),
                    **{f"share_{t}": fr[t] for t in TYPES},
                    "svm_infeasible": int(np.sum(svm_status[ni, di] == "infeasible")),
                    "svm_failed": int(np.sum(svm_status[ni, di] == "failed")),
                    "feasible_opt_fraction": float(np.mean(feasible_opt[ni, di])),
                    "corr_mean": float(np.nanmean(c)) if np.any(np.isfinite(c)) else None})
  checks = make_checks(shares, n_values, ds, T)

  arrays.update({"n_values": np.array(n_values), "ds": ds, "runs": runs, "types": types, "corr": corr,
                 "svm_status": svm_status, "finite": finite, "feasible_opt": feasible_opt,
                 **{f"share_{t.replace('-', '_')}": shares[t] for t in TYPES}})
  with timer("write"):
    results.write_npz(f"{FLAGS.out}/results.npz", arrays)
    draw(shares, n_values, ds, T, FLAGS.out)
  summary = {"experiment": "E4 over-parameterization", "flags": common.flag_values(), "T": T,
             "n_values": n_values, "ds": ds, "runs_per_cell": R, "cells": cells, "checks": checks,
             "timings_s": {"compile": compile_s, **timer.seconds, "total": timer.total()},
             "environment": common.environment()}
  results.write_json(f"{FLAGS.out}/summary.json", summary)
  report(summary)


def make_checks(shares, n_values, ds, T):
  checks = []
  for ni, n in enumerate(n_values):
    g = shares["global"][ni]
    ok = np.isfinite(g)
    if ok.sum() >= 2:
      rho = float(scipy.stats.spearmanr(ds[ok], g[ok])[0]) if np.ptp(g[ok]) > 0 else 0.0
      checks.append({"name": f"Spearman correlation of global share with d, n={n}", "value": rho,
                     "expected": "> 0.5 (global share grows with d)", "ok": bool(rho > 0.5)})
      first, last = g[ok][0], g[ok][-1]
      checks.append({"name": f"global share at d={int(ds[ok][-1])} minus at d={int(ds[ok][0])}, n={n}",
                     "value": float(last - first), "expected": "> 0", "ok": bool(last - first > 0)})
    above = ds >= max(T - 1, n)
    nl = shares["not-local"][ni][above & np.isfinite(shares["not-local"][ni])]
    if nl.size:
      checks.append({"name": f"max not-local share over d >= max(T-1,n)={max(T - 1, n)}, n={n}",
                     "value": float(nl.max()), "expected": "<= 0.02 (near zero: SVM always feasible)",
                     "ok": bool(nl.max() <= 0.02)})
  return checks


def draw(shares, n_values, ds, T, out):
  fig, axes = plots.figure(ncols=len(n_values), width=5.0, height=3.6)
  for ni, (n, ax) in enumerate(zip(n_values, axes)):
    bottom = np.zeros(len(ds))
    for t in TYPES:
      h = 100 * np.nan_to_num(shares[t][ni])
      ax.bar(ds, h, bottom=bottom, color=TYPE_COLORS[t], label=t, width=0.8)
      bottom += h
    ax.axvline(max(T - 1, n) - 0.5, color="k", ls=":", lw=1.5, label="d = max(T-1, n)")
    ax.set(xlabel="d", ylabel="runs (%)", title=f"n={n}, T={T}", ylim=(0, 100))
    ax.set_xticks(ds[::2] if len(ds) > 10 else ds)
    if ni == len(n_values) - 1:
      ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)
  plots.save(fig, f"{out}/overparam.png")


def report(summary):
  lines = [f"E4 over-parameterization: {summary['runs_per_cell']} runs per cell, T={summary['T']}"]
  lines.append("      n   d  global  local  not-local  infeasible  corr")
  for x in summary["cells"]:
    corr = f"{x['corr_mean']:.4f}" if x["corr_mean"] is not None else "  -  "
    lines.append(f"    {x['n']:3d} {x['d']:3d}  {100 * x['share_global']:5.1f}% {100 * x['share_local']:5.1f}% "
                 f"{100 * x['share_not-local']:6.1f}%  {x['svm_infeasible']:6d}     {corr}")
  common.print_report(lines, summary)


if __name__ == "__main__":
  app.run(main)
