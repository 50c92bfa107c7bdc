r"""E9: feasibility of Att-SVM(alpha) versus d around max(T-1, n) (SCIENCE.md sections 3, 8).

For each shape (n, T) and each d, draws --runs data sets (the paper's unit-Gaussian
generator, linear head) and asks whether Att-SVM(alpha) is feasible
(``svmattn.svm.feasibility.check``) for alpha = opt (the tokens of largest score
gamma_it = Y_i v^T x_it) and for a uniformly random alpha (drawn from the run's
initialization key). Prediction: 100% feasible for every d >= max(T-1, n),
below that possibly infeasible. Everything is host-side float64 (--precision does not apply). Writes to --out:
  results.npz     feasible (shapes, alphas, ds, runs) bool, fraction (shapes, alphas, ds),
                  method (how each was decided), ns, Ts, ds, runs
  summary.json    flags, per-cell fractions, checks, timings
  feasibility.png fraction feasible vs d, one panel per (n, T); opt solid, random dashed;
                  a vertical line at d = max(T-1, n)

    python -m experiments.feasibility --out=results/e9
    python -m experiments.feasibility --out=/tmp/e9 --runs=200 --shapes=5:5,10:5 --d_max=11
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
from svmattn.io import plots
from svmattn.io import progress as progress_lib
from svmattn.io import results

FLAGS = flags.FLAGS
common.define_common_flags(runs=1000)
flags.DEFINE_list("shapes", ["5:5", "10:5", "5:10"], "Shapes n:T (sequences:tokens).")
flags.DEFINE_integer("d_min", 1, "Smallest embedding dimension d.")
flags.DEFINE_integer("d_max", 14, "Largest embedding dimension d (include some d >= max(T-1, n)).")
flags.DEFINE_list("alphas", ["opt", "random"], "Token choices: opt (largest score) and/or random.")
flags.DEFINE_integer("batch", 1000, "Data sets drawn per jitted generator call.")

ALPHA_STYLE = {"opt": "-", "random": "--"}


@functools.lru_cache(maxsize=None)
def _alphas_fn(n, T):
  """Jitted (seed, runs) -> (opt (B,n), random (B,n)) given the batch's data."""

  def one(seed, run, v, X, Y):
    gamma = heads.token_scores(heads.LINEAR, v, X, Y)
    k_init = data_lib.split_run_key(data_lib.run_key(seed, run))[1]
    return jnp.argmax(gamma, axis=-1), jax.random.randint(k_init, (n,), 0, T)

  return jax.jit(jax.vmap(one, (None, 0, 0, 0, 0)))


def token_choices(spec, seed, runs, data):
  """alpha = opt and a uniform random alpha (from each run's initialization key): (B, n) each."""
  opt, rnd = _alphas_fn(spec.n, spec.T)(jnp.asarray(seed, jnp.uint32), jnp.asarray(runs, jnp.uint32),
                                        data.v, data.X, data.Y)
  return {"opt": np.asarray(opt), "random": np.asarray(rnd)}


def main(argv):
  del argv
  timer = common.Timer()
  shapes = common.parse_shapes(FLAGS.shapes)
  for a in FLAGS.alphas:
    if a not in ALPHA_STYLE:
      raise app.UsageError(f"--alphas: unknown choice {a!r}; use opt and/or random")
  if FLAGS.data:
    raise app.UsageError("--data is not supported by E9: it sweeps d, a data file has one d")
  if FLAGS.runs < 1 or FLAGS.batch < 1:
    raise app.UsageError(f"--runs and --batch must be >= 1, got {FLAGS.runs}, {FLAGS.batch}")
  if not 1 <= FLAGS.d_min <= FLAGS.d_max:
    raise app.UsageError(f"need 1 <= --d_min <= --d_max, got {FLAGS.d_min}, {FLAGS.d_max}")
  ds = np.arange(FLAGS.d_min, FLAGS.d_max + 1)
  alphas = list(FLAGS.alphas)
  R = FLAGS.runs
  batch = min(FLAGS.batch, R)
  feasible = np.zeros((len(shapes), len(alphas), len(ds), R), bool)
  method = np.full((len(shapes), len(alphas), len(ds), R), "", dtype="<U5")
  status_counts = {}
  logging.info("E9: shapes %s, d %d..%d, %d runs per cell, alphas %s", shapes, ds[0], ds[-1], R, alphas)

  with progress_lib.Progress("feasibility", len(shapes) * len(ds) * R, "data sets", enabled=FLAGS.progress) as bar:
    for si, (n, T) in enumerate(shapes):
      for di, d in enumerate(ds):
        spec = data_lib.DataSpec(n, T, int(d)).validate()
        for lo in range(0, R, batch):
          runs = np.arange(lo, lo + batch)           # fixed batch shape: one compile per spec
          with timer("data"):
            data = data_lib.generate(spec, FLAGS.seed, runs)        # host-side float64 checks
            choice = token_choices(spec, FLAGS.seed, runs, data)
            X, Z = np.asarray(data.X, np.float64), np.asarray(data.Z, np.float64)
          take = slice(0, min(batch, R - lo))
          with timer("feasibility"):
            for ai, a in enumerate(alphas):
              res = feas_lib.check(X[take], Z[take], choice[a][take])
              feasible[si, ai, di, lo:lo + batch] = res.feasible
              method[si, ai, di, lo:lo + batch] = res.method
              for s in res.status:
                status_counts[s] = status_counts.get(s, 0) + 1
          bar.update(take.stop)

  fraction = feasible.mean(axis=-1)
  arrays = {"feasible": feasible, "fraction": fraction, "method": method, "ns": np.array([s[0] for s in shapes]),
            "Ts": np.array([s[1] for s in shapes]), "ds": ds, "alphas": np.array(alphas), "runs": np.arange(R)}
  cells, checks = [], []
  for si, (n, T) in enumerate(shapes):
    threshold = max(T - 1, n)
    for ai, a in enumerate(alphas):
      for di, d in enumerate(ds):
        cells.append({"n": n, "T": T, "d": int(d), "alpha": a, "feasible_fraction": float(fraction[si, ai, di]),
                      "decided_by_nnls": int(np.sum(method[si, ai, di] == "nnls"))})
      above = fraction[si, ai, ds >= threshold]
      below = fraction[si, ai, ds < threshold]
      if above.size:
        checks.append({"name": f"feasible fraction at d >= max(T-1,n)={threshold}, n={n} T={T}, alpha={a} (min)",
                       "value": float(above.min()), "expected": "== 1 (always feasible)",
                       "ok": bool(above.min() == 1.0)})
      if below.size:
        checks.append({"name": f"feasible fraction at smallest d={int(ds[0])}, n={n} T={T}, alpha={a}",
                       "value": float(below[0]), "expected": "< 0.9 (visibly below 100%)",
                       "ok": bool(below[0] < 0.9)})
  first_full = {}
  for si, (n, T) in enumerate(shapes):
    for ai, a in enumerate(alphas):
      full = [j for j in range(len(ds)) if np.all(fraction[si, ai, j:] == 1.0)]
      first_full[f"n={n},T={T},alpha={a}"] = int(ds[full[0]]) if full else None

  with timer("write"):
    results.write_npz(f"{FLAGS.out}/results.npz", arrays)
    draw(fraction, shapes, alphas, ds, FLAGS.out)
  summary = {"experiment": "E9 feasibility vs d", "flags": common.flag_values(), "shapes": shapes,
             "ds": ds, "runs_per_cell": R, "cells": cells, "status_counts": status_counts,
             "smallest_d_feasible_from_then_on": first_full,
             "decision": "svmattn.svm.feasibility.check: batched least-squares certificate, exact NNLS test "
                         "(Lawson-Hanson, residual r = 0 <=> infeasible) where undecided",
             "checks": checks, "timings_s": {**timer.seconds, "total": timer.total()},
             "environment": common.environment()}
  results.write_json(f"{FLAGS.out}/summary.json", summary)
  report(summary)


def draw(fraction, shapes, alphas, ds, out):
  fig, axes = plots.figure(ncols=len(shapes), width=3.6, height=3.2)
  for si, ((n, T), ax) in enumerate(zip(shapes, axes)):
    for ai, a in enumerate(alphas):
      ax.plot(ds, 100 * fraction[si, ai], ALPHA_STYLE[a], marker="o", ms=3, color="tab:blue" if a == "opt"
              else "tab:orange", label=r"$\alpha$ = opt" if a == "opt" else r"random $\alpha$")
    ax.axvline(max(T - 1, n), color="gray", ls=":", lw=1.5, label="d = max(T-1, n)")
    ax.set(xlabel="d", title=f"n={n}, T={T}", ylim=(-3, 103))
    if si == 0:
      ax.set_ylabel("feasible data sets (%)")
      ax.legend(loc="lower right", fontsize=8)
  plots.save(fig, f"{out}/feasibility.png")


def report(summary):
  lines = [f"E9 feasibility: {summary['runs_per_cell']} data sets per cell"]
  for key, d in summary["smallest_d_feasible_from_then_on"].items():
    lines.append(f"  {key:<28} 100% feasible from d={d}")
  common.print_report(lines, summary)


if __name__ == "__main__":
  app.run(main)
