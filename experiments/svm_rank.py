r"""E3: numerical rank of the Frobenius and the nuclear Att-SVM solutions (SCIENCE.md section 8).

alpha = opt (the tokens of largest score gamma_it = Y_i v^T x_it, linear head).
For each shape (n, T) and each d, data sets are drawn in order (run 0, 1, 2, ...)
until --runs of them have a feasible Att-SVM(opt) (``svmattn.svm.feasibility.check``);
the infeasible draws are counted, and a cell stops after --max_draws_factor * --runs
draws (d = 1 with many constraints is almost never feasible) and is reported as
incomplete. On the kept data sets it solves Att-SVM(opt) in the Frobenius norm
(NNLS, exact) and in the nuclear norm (SCS), and takes numerical ranks with
relative tolerance --rtol (singular values above rtol * the largest; the SDP is
accurate to about 1e-6, so rtol sits well above that). Prediction: the nuclear
solution has lower rank than the Frobenius one, whose rank is min(n, d).
Everything is host-side float64 (--precision does not apply).
Writes to --out:
  results.npz   per cell: ranks (cells, runs) fro/nuc (-1 where not solved), statuses,
                draws and infeasible counts, singular values (cells, runs, d_max)
  summary.json  flags, per-cell mean ranks and draw counts, checks, timings
  rank.png      mean rank vs d; left: n varies (T=5), right: T varies (n=5);
                Frobenius solid, nuclear dashed, min(n, d) dotted

    python -m experiments.svm_rank --out=results/e3
    python -m experiments.svm_rank --out=/tmp/e3 --runs=10 --ds=1,2,5,10 --shapes=5:5,10:5
"""
from __future__ import annotations

import functools

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from experiments import common
from svmattn.data import datasets as data_lib
from svmattn.svm import feasibility as feas_lib
from svmattn.models import heads
from svmattn.analysis import metrics
from svmattn.io import plots
from svmattn.io import progress as progress_lib
from svmattn.io import results
from svmattn.svm import att_svm as svm_lib

FLAGS = flags.FLAGS
common.define_common_flags(runs=100)
flags.DEFINE_list("shapes", ["5:5", "10:5", "15:5", "5:10", "5:15"],
                  "Shapes n:T. The paper: n in {5,10,15} with T=5 and T in {5,10,15} with n=5.")
flags.DEFINE_list("ds", ["1", "2", "3", "4", "5", "10", "15", "20"], "Embedding dimensions d.")
flags.DEFINE_float("rtol", 1e-4, "Numerical rank: singular values > rtol * the largest.")
flags.DEFINE_integer("max_draws_factor", 100, "Stop a cell after this many times --runs draws.")
flags.DEFINE_integer("batch", 200, "Data sets drawn per jitted generator call.")
flags.DEFINE_enum("nuc_solver", "SCS", ["SCS", "CLARABEL"], "Solver of the nuclear-norm SDP.")

NORMS = ("fro", "nuc")
NORM_NAMES = {"fro": "Frobenius", "nuc": "nuclear"}


@functools.lru_cache(maxsize=None)
def _opt_fn():
  score = jax.vmap(lambda v, X, Y: jnp.argmax(heads.token_scores(heads.LINEAR, v, X, Y), axis=-1))
  return jax.jit(score)


def draw_feasible(spec, runs_wanted, max_draws, batch, seed, on_batch=None):
  """Draw data sets r = 0, 1, ... until ``runs_wanted`` have a feasible Att-SVM(opt).

  Returns (X (K,n,T,d), Z (K,n,d), alpha (K,n), run indices (K,), draws, infeasible draws,
  failed checks), K <= runs_wanted (fewer when max_draws is reached)."""
  kept, draws, infeasible, failed = [], 0, 0, 0
  while len(kept) < runs_wanted and draws < max_draws:
    runs = np.arange(draws, draws + batch)
    data = data_lib.generate(spec, seed, runs)             # float64: host-side SVMs
    alpha = np.asarray(_opt_fn()(data.v, data.X, data.Y))
    X, Z = np.asarray(data.X, np.float64), np.asarray(data.Z, np.float64)
    take = min(batch, max_draws - draws)
    res = feas_lib.check(X[:take], Z[:take], alpha[:take])
    # Count draws in run order, up to the one that completes the cell.
    for b in range(take):
      if len(kept) == runs_wanted:
        break
      draws += 1
      if res.feasible[b]:
        kept.append((X[b], Z[b], alpha[b], runs[b]))
      elif res.status[b] == "failed":
        failed += 1
      else:
        infeasible += 1
    if on_batch is not None:
      on_batch()
  if not kept:
    n, T, d = spec.n, spec.T, spec.d
    return (np.zeros((0, n, T, d)), np.zeros((0, n, d)), np.zeros((0, n), np.int64), np.zeros(0, np.int64),
            draws, infeasible, failed)
  X, Z, alpha, runs = (np.stack(x) for x in zip(*kept))
  return X, Z, alpha, runs, draws, infeasible, failed


def main(argv):
  del argv
  timer = common.Timer()
  shapes = common.parse_shapes(FLAGS.shapes)
  try:
    ds = sorted({int(x) for x in FLAGS.ds})
  except ValueError:
    raise app.UsageError(f"--ds: expected integers, got {FLAGS.ds}") from None
  if not ds or ds[0] < 1:
    raise app.UsageError(f"--ds: need positive dimensions, got {FLAGS.ds}")
  if FLAGS.data:
    raise app.UsageError("--data is not supported by E3: it sweeps shapes and d")
  if FLAGS.runs < 1 or FLAGS.max_draws_factor < 1 or FLAGS.batch < 1:
    raise app.UsageError("--runs, --max_draws_factor and --batch must be >= 1")
  if not FLAGS.rtol > 0:
    raise app.UsageError(f"--rtol must be positive, got {FLAGS.rtol}")
  R, dmax = FLAGS.runs, max(ds)
  cells = [(n, T, d) for n, T in shapes for d in ds]
  C = len(cells)
  max_draws = FLAGS.max_draws_factor * R
  batch = min(FLAGS.batch, max_draws)
  rank = {k: np.full((C, R), -1, np.int64) for k in NORMS}
  status = {k: np.full((C, R), "", dtype="<U10") for k in NORMS}
  sv = {k: np.full((C, R, dmax), np.nan) for k in NORMS}
  kept_runs = np.full((C, R), -1, np.int64)
  draws, infeasible, failed_checks = (np.zeros(C, np.int64) for _ in range(3))
  logging.info("E3: %d cells, %d feasible data sets each, rtol %g", C, R, FLAGS.rtol)

  with progress_lib.Progress("SVM solves", C * R, "data sets", enabled=FLAGS.progress) as bar:
    for c, (n, T, d) in enumerate(cells):
      spec = data_lib.DataSpec(n, T, d).validate()
      with timer("data_and_feasibility"):
        X, Z, alpha, runs, draws[c], infeasible[c], failed_checks[c] = draw_feasible(
            spec, R, max_draws, batch, FLAGS.seed)
      K = len(runs)
      kept_runs[c, :K] = runs
      for b in range(K):
        for norm in NORMS:
          with timer(f"svm_{norm}"):
            res = svm_lib.att_svm(X[b], Z[b], alpha[b], norm,
                                  None if norm == "fro" else FLAGS.nuc_solver)
          status[norm][c, b] = res.status
          if res.ok:
            rank[norm][c, b] = metrics.numerical_rank(res.W, FLAGS.rtol)
            sv[norm][c, b, :d] = np.linalg.svd(res.W, compute_uv=False)
        bar.update(1)
      bar.update(R - K)
      if K < R:
        logging.warning("E3 cell n=%d T=%d d=%d: only %d feasible data sets in %d draws", n, T, d, K, draws[c])

  def mean_rank(norm, c):
    ok = rank[norm][c] >= 0
    return float(np.mean(rank[norm][c][ok])) if ok.any() else float("nan")

  summary_cells = []
  for c, (n, T, d) in enumerate(cells):
    both = (rank["fro"][c] >= 0) & (rank["nuc"][c] >= 0)
    summary_cells.append({
        "n": n, "T": T, "d": d, "feasible_kept": int(np.sum(kept_runs[c] >= 0)), "draws": int(draws[c]),
        "infeasible_draws": int(infeasible[c]), "failed_checks": int(failed_checks[c]),
        "complete": bool(np.sum(kept_runs[c] >= 0) == R),
        "mean_rank_fro": mean_rank("fro", c), "mean_rank_nuc": mean_rank("nuc", c),
        "min_n_d": min(n, d),
        "nuc_minus_fro_paired_mean": float(np.mean(rank["nuc"][c][both] - rank["fro"][c][both])) if both.any()
        else None,
        "status_fro": {s: int(np.sum(status["fro"][c] == s)) for s in svm_lib.STATUSES},
        "status_nuc": {s: int(np.sum(status["nuc"][c] == s)) for s in svm_lib.STATUSES}})
  checks = make_checks(summary_cells, shapes)

  arrays = {"cells": np.array(cells), "rank_fro": rank["fro"], "rank_nuc": rank["nuc"],
            "status_fro": status["fro"], "status_nuc": status["nuc"], "singular_values_fro": sv["fro"],
            "singular_values_nuc": sv["nuc"], "kept_runs": kept_runs, "draws": draws,
            "infeasible_draws": infeasible, "rtol": np.array(FLAGS.rtol)}
  with timer("write"):
    results.write_npz(f"{FLAGS.out}/results.npz", arrays)
    draw(summary_cells, shapes, ds, FLAGS.out)
  summary = {"experiment": "E3 rank of SVM solutions", "flags": common.flag_values(),
             "rank_rtol": FLAGS.rtol,
             "rank_definition": f"number of singular values > {FLAGS.rtol:g} * the largest (metrics.numerical_rank)",
             "solvers": {"fro": "nnls", "nuc": FLAGS.nuc_solver}, "cells": summary_cells,
             "incomplete_cells": [f"n={x['n']} T={x['T']} d={x['d']}: {x['feasible_kept']} feasible in "
                                  f"{x['draws']} draws" for x in summary_cells if not x["complete"]],
             "checks": checks, "timings_s": {**timer.seconds, "total": timer.total()},
             "environment": common.environment()}
  results.write_json(f"{FLAGS.out}/summary.json", summary)
  report(summary)


def make_checks(cells, shapes):
  """Acceptance checks from the per-cell mean ranks (cells with at least one solved pair)."""
  solved = [x for x in cells if np.isfinite(x["mean_rank_fro"]) and np.isfinite(x["mean_rank_nuc"])]
  checks = []
  if solved:
    worst = max(solved, key=lambda x: x["mean_rank_nuc"] - x["mean_rank_fro"])
    gap = worst["mean_rank_nuc"] - worst["mean_rank_fro"]
    checks.append({"name": "max over cells of mean nuclear rank - mean Frobenius rank "
                           f"(at n={worst['n']} T={worst['T']} d={worst['d']})",
                   "value": gap, "expected": "<= 0 (nuclear rank never above Frobenius)", "ok": bool(gap <= 0)})
    rows_lower = [(n, T) for n, T in shapes
                  if any(x["mean_rank_nuc"] < x["mean_rank_fro"] for x in solved if (x["n"], x["T"]) == (n, T))]
    checks.append({"name": "(n,T) rows with some d where mean nuclear rank < mean Frobenius rank",
                   "value": f"{len(rows_lower)}/{len(shapes)}", "expected": "every row (strictly lower for some d)",
                   "ok": len(rows_lower) == len(shapes)})
    complete = [x for x in solved if x["complete"]]
    if complete:
      ratio = min(x["mean_rank_fro"] / x["min_n_d"] for x in complete)
      worst = min(complete, key=lambda x: x["mean_rank_fro"] / x["min_n_d"])
      checks.append({"name": "min over complete cells of mean Frobenius rank / min(n, d) "
                             f"(at n={worst['n']} T={worst['T']} d={worst['d']})",
                     "value": ratio, "expected": ">= 0.95 (Frobenius rank reaches min(n, d))",
                     "ok": bool(ratio >= 0.95)})
  incomplete = [x for x in cells if not x["complete"]]
  checks.append({"name": "cells with fewer feasible data sets than --runs within the draw cap",
                 "value": len(incomplete), "expected": "only cells with d < max(T-1, n) (always feasible above)",
                 "ok": all(x["d"] < max(x["T"] - 1, x["n"]) for x in incomplete)})
  return checks


def draw(cells, shapes, ds, out):
  vary_n = [s for s in shapes if s[1] == 5]
  vary_T = [s for s in shapes if s[0] == 5]
  if len(vary_n) >= 2 and len(vary_T) >= 2:
    groups = [("n varies, T = 5", vary_n), ("T varies, n = 5", vary_T)]
  else:
    groups = [("(n, T)", shapes)]
  colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
  fig, axes = plots.figure(ncols=len(groups), width=4.8, height=3.8)
  for ax, (title, group) in zip(axes, groups):
    for j, (n, T) in enumerate(group):
      rows = [x for x in cells if (x["n"], x["T"]) == (n, T)]
      x_d = [x["d"] for x in rows]
      color = colors[j % len(colors)]
      ax.plot(x_d, [x["mean_rank_fro"] for x in rows], "-", marker="o", ms=3, color=color, label=f"n={n}, T={T}")
      ax.plot(x_d, [x["mean_rank_nuc"] for x in rows], "--", marker="s", ms=3, color=color)
      ax.plot(x_d, [min(n, d) for d in x_d], ":", color=color, lw=1)
    ax.plot([], [], "k-", label="Frobenius")
    ax.plot([], [], "k--", label="nuclear")
    ax.plot([], [], "k:", lw=1, label="min(n, d)")
    ax.set(xlabel="d", ylabel="mean numerical rank", title=title)
    ax.legend(fontsize=8)
  plots.save(fig, f"{out}/rank.png")


def report(summary):
  lines = [f"E3 SVM rank (rtol {summary['rank_rtol']:g}):"]
  lines.append("      n   T   d  kept draws  rank_fro rank_nuc")
  for x in summary["cells"]:
    lines.append(f"    {x['n']:3d} {x['T']:3d} {x['d']:3d} {x['feasible_kept']:5d} {x['draws']:5d}  "
                 f"{x['mean_rank_fro']:8.2f} {x['mean_rank_nuc']:8.2f}")
  common.print_report(lines, summary)


if __name__ == "__main__":
  app.run(main)
