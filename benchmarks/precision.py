r"""Precision: float32 versus float64 normalized GD on E2 (docs/science.md sections 4 and 8).

Trains E2 (n=6, T=8, d=10, cross-attention, normalized GD, lr 0.1, W and (K,Q))
on the same data sets (drawn in float64; the float32 copies are rounded) and the
same initializations in several precision variants:

  float64         the reference (the paper's setting)
  float32         no loss scaling
  float32_static  a static loss scale --static_scale (normalized GD is invariant to it)
  float32_auto    loss_scale="auto" (``svmattn.models.attention.make_loss``): the per-token gradient
                  weights exp(log s_it + c) with one shift c per data set and step
  float64_auto    the reference with loss_scale="auto" (float64 underflows too, later)

and reports, per variant, corr(W_variant, W_reference) of the snapshots (W or
K Q^T) and corr with the max-margin SVM of the reference's selected tokens
(Frobenius for W, nuclear for (K,Q)). The reference's tail exponent
c = min_i (log sum_t exp(l_it) - l_{i,2nd}) (the largest softmax weight of a
non-selected token is exp(-c)) tells where a precision must fail: exp(-c) falls
below the smallest normal number at c = 87.3 in float32 and c = 708.4 in float64
(XLA flushes smaller results to zero).

Writes to --out:
  results.npz    steps, runs, per param and variant: final W, corr with the reference and
                 with the SVM per snapshot (B, S), ||W|| per snapshot; the reference's tail
                 exponent c (B, S), selected tokens, SVM solutions
  summary.json   flags, per variant: final corr with the reference (mean, min), at
                 --check_step, the first step where it falls below --threshold, the
                 reference's c there, runs frozen (W stopped moving), corr with the SVM;
                 checks, timings
  corr_ref.png   1 - corr(W_variant, W_reference) vs iteration (mean solid, max dashed)
  corr_svm.png   corr with the SVM vs iteration (mean +- std)
  saturation.png the reference's tail exponent c vs iteration (with float32's 87.3) and ||W||

    python -m benchmarks.precision --out=results/precision
    python -m benchmarks.precision --out=results/precision_long --steps=20000 --snapshot_every=100
    python -m benchmarks.precision --out=/tmp/p --runs=20                          # quick (~1 min)

There is no --precision: every variant fixes its own.
"""
from __future__ import annotations


from absl import app
from absl import flags
from absl import logging
import math
import os

import numpy as np
import scipy.special

from benchmarks import flag_checks as checks_lib
from svmattn.data import datasets as data_lib
from svmattn.analysis import metrics
from svmattn.config import allowed
from svmattn.io import plots
from svmattn.io import progress as progress_lib
from svmattn.io import atomic_files as results_io
from svmattn.svm import att_svm as svm_lib
from svmattn.execution import run_experiment
from svmattn.train import loop as train_lib

FLAGS = flags.FLAGS
checks_lib.define_data_flags(runs=100)
flags.DEFINE_integer("n", 6, "Sequences per data set.")
flags.DEFINE_integer("T", 8, "Tokens per sequence.")
flags.DEFINE_integer("d", 10, "Embedding dimension.")
flags.DEFINE_integer("m", None, "(K,Q) width m (default d).")
flags.DEFINE_integer("steps", 2000, "Optimizer steps (the paper: 2000; try 20000 to see float32 and float64 fail).")
flags.DEFINE_float("lr", 0.1, "Learning rate of normalized GD.")
flags.DEFINE_list("params", ["W", "KQ"], "Parameterizations: W, KQ.")
VARIANTS = ("float64", "float64_auto", "float32", "float32_static", "float32_auto")
flags.DEFINE_list("variants", list(VARIANTS), f"Precision variants to run, among {VARIANTS}.")
flags.DEFINE_enum("reference", "float64", list(VARIANTS), "The variant the others are compared with.")
flags.DEFINE_float("static_scale", 2.0 ** 64, "Loss scale of the float32_static variant.")
flags.DEFINE_float("threshold", 0.999, "Faithful: corr(W_variant, W_reference) >= this.")
flags.DEFINE_integer("check_step", 2000, "The step at which float32 is compared with float64 in the checks "
                     "(or --steps if fewer).")
flags.DEFINE_bool("svm", True, "Solve the SVMs at the reference's selected tokens (corr with the SVM).")
flags.DEFINE_integer("snapshot_every", 10, "Record W every this many steps.")
flags.DEFINE_integer("chunk_steps", 1000, "Steps per jitted chunk (progress granularity).")
# every value checked when the flags are parsed (one line, nothing run): DataSpec/TrainConfig would refuse them later
checks_lib.at_least("n", 1, "an integer >= 1")
checks_lib.at_least("T", 2, "an integer >= 2 (token selection needs two tokens)")
checks_lib.at_least("d", 1, "an integer >= 1")
checks_lib.at_least("m", 1, "an integer >= 1 (or unset: m = d)")
checks_lib.at_least("steps", 0, "an integer >= 0")
checks_lib.at_least("check_step", 0, "an integer >= 0")
checks_lib.at_least("snapshot_every", 1, "an integer >= 1")
checks_lib.at_least("chunk_steps", 1, "an integer >= 1")
checks_lib.positive_float("lr")
checks_lib.positive_float("static_scale")
checks_lib.check("params", allowed.params)
flags.register_validator("variants", lambda v: bool(v) and all(x in VARIANTS for x in v),
                         message=f"must list variants among {', '.join(VARIANTS)}")
flags.register_validator("threshold", lambda v: math.isfinite(v) and -1 <= v <= 1,
                         message="must be a correlation in [-1, 1]")


def _data_fits(v) -> bool:
  """The --data file's values must not overflow the float32 variants (data_lib.magnitude_limit)."""
  if v["data"] and os.path.isfile(v["data"]):
    precision = "float32" if any(x.startswith("float32") for x in v["variants"] or ()) else "float64"
    try:
      data_lib.check_file_magnitudes(v["data"], np.dtype(precision))
    except data_lib.DataError as e:
      raise flags.ValidationError(str(e)) from None
  return True


flags.register_multi_flags_validator(["data", "variants"], _data_fits)

OWN_NORM = allowed.own_norms()
LOG_TINY = {"float32": -np.log(np.finfo(np.float32).tiny), "float64": -np.log(np.finfo(np.float64).tiny)}
DEPARTED = 1e-6  # 1 - corr above this to the end: the variant has left the reference (rounding: ~1e-11)
COLORS = {"float64": "black", "float64_auto": "tab:gray", "float32": "tab:red",
          "float32_static": "tab:orange", "float32_auto": "tab:blue"}


def variant_config(variant: str, param: str) -> train_lib.TrainConfig:
  scale = {"auto": "auto", "static": FLAGS.static_scale}.get(variant.partition("_")[2], 1.0)
  return train_lib.TrainConfig(param=param, m=FLAGS.m, lr=FLAGS.lr, steps=FLAGS.steps,
                               snapshot_every=FLAGS.snapshot_every, chunk_steps=FLAGS.chunk_steps,
                               loss_scale=scale)


def tail_exponent(W, X, Z):
  """c (B, S): min over sequences of log sum_t exp(l_it) - l_{i,2nd} for snapshots W (B,S,d,d),
  X (B,n,T,d), Z (B,n,d), in float64: exp(-c) is the largest softmax weight of a non-top token."""
  logits = np.einsum("bntd,bsde,bne->bsnt", X, W, Z)
  second = np.sort(logits, axis=-1)[..., -2]
  return np.min(scipy.special.logsumexp(logits, axis=-1) - second, axis=-1)


def first_step(mask, steps):
  """Per run (B,): the first snapshot step where mask (B,S) holds, -1 where never."""
  hit = np.any(mask, axis=1)
  return np.where(hit, steps[np.argmax(mask, axis=1)], -1)


def persistent(mask):
  """mask (B,S) -> (B,S): True where mask holds from this snapshot to the last one."""
  return np.flip(np.logical_and.accumulate(np.flip(mask, axis=1), axis=1), axis=1)


def at_step(steps, step):
  return int(np.searchsorted(steps, min(step, steps[-1])))


def summarize(corr_ref, corr_svm, norms, tail, steps, stalled):
  """Numbers of one (param, variant): see the module docstring."""
  k = at_step(steps, FLAGS.check_step)
  below = first_step(corr_ref < FLAGS.threshold, steps)
  # left for good (early transients near saddles amplify rounding for a while, then contract)
  departed = first_step(persistent(1 - corr_ref > DEPARTED), steps)
  gone = departed >= 0
  # the reference's tail exponent c where each departing run left it for good
  c_gone = tail[gone, np.searchsorted(steps, departed[gone])]
  fell = below >= 0
  mean_below = first_step(np.mean(corr_ref, 0)[None] < FLAGS.threshold, steps)[0]
  out = {"final_corr_ref": {"mean": float(np.mean(corr_ref[:, -1])), "min": float(np.min(corr_ref[:, -1]))},
         "corr_ref_at_start_min": float(np.min(corr_ref[:, 0])),
         "check_step": int(steps[k]),
         "corr_ref_at_check_step": {"mean": float(np.mean(corr_ref[:, k])), "min": float(np.min(corr_ref[:, k]))},
         "first_step_below_threshold": int(below[fell].min()) if fell.any() else None,
         "first_step_mean_below_threshold": int(mean_below) if mean_below >= 0 else None,
         "runs_below_threshold_at_end": int(np.sum(corr_ref[:, -1] < FLAGS.threshold)),
         "runs_departed": int(np.sum(gone)),
         "first_step_departed": int(departed[gone].min()) if gone.any() else None,
         "tail_exponent_at_departure": {"min": float(c_gone.min()) if gone.any() else None,
                                        "median": float(np.median(c_gone)) if gone.any() else None},
         "runs_stalled": int(np.sum(stalled)),
         "final_norm_mean": float(np.mean(norms[:, -1]))}
  if corr_svm is not None and np.any(np.isfinite(corr_svm[:, -1])):
    out["final_corr_svm"] = {"mean": float(np.nanmean(corr_svm[:, -1])), "min": float(np.nanmin(corr_svm[:, -1]))}
  return out


def main(argv):
  del argv
  timer = run_experiment.Timer()
  for v in FLAGS.variants:
    if v not in VARIANTS:
      raise app.UsageError(f"--variants: unknown variant {v!r}; use some of {VARIANTS}")
  if not 0 < FLAGS.static_scale < float("inf"):
    raise app.UsageError(f"--static_scale must be a positive finite number, got {FLAGS.static_scale}")
  variants = [FLAGS.reference] + [v for v in FLAGS.variants if v != FLAGS.reference]
  spec = data_lib.DataSpec(FLAGS.n, FLAGS.T, FLAGS.d).validate()
  with timer("data"):
    data, runs = checks_lib.load_or_generate(spec)
    data64 = data_lib.Dataset(*(np.asarray(a, np.float64) for a in data))
    data32 = data_lib.Dataset(*(a.astype(np.float32) for a in data64))
  B, n, T, d = data64.X.shape
  keys = train_lib.init_keys(FLAGS.seed, runs)
  logging.info("precision: %d data sets, n=%d T=%d d=%d, %d steps, variants %s", B, n, T, d, FLAGS.steps, variants)

  arrays = {"runs": runs}
  summary = {"experiment": "precision (float32 vs float64, E2)", "flags": checks_lib.flag_values(),
             "data_sets": B, "shape": {"n": n, "T": T, "d": d}, "reference": FLAGS.reference,
             "underflow_tail_exponent": LOG_TINY, "variants": {}, "final_corr_min": {}, "svm_status": {}}
  compile_s = {}
  for p in FLAGS.params:
    ref_W = svm_W = tail = None
    finals = {}
    summary["variants"][p] = {}
    for v in variants:
      data_v = data32 if v.startswith("float32") else data64
      with timer(f"train_{p}_{v}"):
        with progress_lib.Progress(f"train {p} {v}", FLAGS.steps, "steps", enabled=FLAGS.progress) as bar:
          tr = train_lib.train(variant_config(v, p), data_v, keys, bar.update)
      compile_s[f"{p}_{v}"] = tr.compile_seconds
      W = np.asarray(tr.W, np.float64)
      steps = tr.steps
      if ref_W is None:  # the reference: SVM at its selection, tail exponent
        ref_W = W
        arrays["steps"] = steps
        arrays[f"selected_{p}"] = tr.selected
        tail = tail_exponent(W, data64.X, data64.Z)
        arrays[f"tail_exponent_{p}"] = tail
        if FLAGS.svm:
          with timer("svm"):
            with progress_lib.Progress(f"SVM {p}", B, "solves", enabled=FLAGS.progress) as bar:
              solved = svm_lib.att_svm_batch(data64.X, data64.Z, tr.selected, OWN_NORM[p], progress=bar.update)
          stacked = svm_lib.stack(solved, d)
          svm_W = stacked["W"]
          arrays[f"svm_{p}"] = svm_W
          summary["svm_status"][p] = {s: int(np.sum(stacked["status"] == s)) for s in svm_lib.STATUSES}
      corr_ref = metrics.corr(W, ref_W)
      corr_svm = metrics.corr(W, svm_W[:, None]) if svm_W is not None else None
      norms = np.linalg.norm(W, axis=(-2, -1))
      arrays[f"W_final_{p}_{v}"] = tr.W_final
      arrays[f"corr_ref_{p}_{v}"] = corr_ref
      arrays[f"norm_{p}_{v}"] = norms
      if corr_svm is not None:
        arrays[f"corr_svm_{p}_{v}"] = corr_svm
      stalled = np.all(W[:, -1] == W[:, -2], axis=(-2, -1)) if W.shape[1] > 1 else np.zeros(B, bool)
      s = summarize(corr_ref, corr_svm, norms, tail, steps, stalled)
      s["same_selection"] = int(np.sum(np.all(tr.selected == arrays[f"selected_{p}"], axis=-1)))
      s["diverged_runs"] = int(np.sum(~tr.finite))
      summary["variants"][p][v] = s
      finals[v] = np.asarray(tr.W_final, np.float64)
    summary["final_corr_min"][p] = {v: {u: float(np.min(metrics.corr(finals[v], finals[u]))) for u in finals if u != v}
                                    for v in finals}

  summary["checks"] = checks(summary["variants"])
  with timer("write"):
    results_io.write_npz(f"{FLAGS.out}/results.npz", arrays)
    draw(arrays, FLAGS.params, variants, FLAGS.out)
  summary["timings_s"] = {"compile": compile_s, **timer.seconds, "total": timer.total()}
  summary["environment"] = run_experiment.environment()
  results_io.write_json(f"{FLAGS.out}/summary.json", summary)
  report(summary)


def checks(variants):
  """float32 with scaling matches float64; both start at the same point; where
  float32 without scaling departs, the reference's softmax tail is near float32's underflow."""
  out = []
  ref = FLAGS.reference
  for p, per in variants.items():
    start = [s["corr_ref_at_start_min"] for v, s in per.items() if v != ref and v.startswith("float32")]
    if start:
      out.append({"name": f"{p} float32 vs {ref}: min corr at step 0 (same initialization)",
                  "value": min(start), "expected": f">= {1 - DEPARTED} (float32 starts at the float64 "
                  "initialization, rounded)", "ok": min(start) >= 1 - DEPARTED})
    if "float32_auto" in per and ref.startswith("float64"):
      s = per["float32_auto"]
      out.append({"name": f"{p} float32_auto vs {ref}: min corr at step {s['check_step']}",
                  "value": s["corr_ref_at_check_step"]["min"], "expected": f">= {FLAGS.threshold}",
                  "ok": s["corr_ref_at_check_step"]["min"] >= FLAGS.threshold})
      if s["check_step"] != FLAGS.steps:
        out.append({"name": f"{p} float32_auto vs {ref}: min final corr (step {FLAGS.steps})",
                    "value": s["final_corr_ref"]["min"], "expected": f">= {FLAGS.threshold}",
                    "ok": s["final_corr_ref"]["min"] >= FLAGS.threshold})
    if "float32" in per and ref.startswith("float64"):
      s = per["float32"]
      if p == "W":
        c = s["tail_exponent_at_departure"]["min"]
        out.append({"name": "W float32 (no scaling): the reference's tail exponent c where float32 leaves it",
                    "value": "no departure" if c is None else c,
                    "expected": f"> 60 (float32 exp underflows at c = {LOG_TINY['float32']:.1f})",
                    "ok": c is None or c > 60})
      else:
        out.append({"name": "KQ float32 (no scaling) vs float64: min final corr", "value": s["final_corr_ref"]["min"],
                    "expected": f">= {FLAGS.threshold} (the eps ridge holds c near 30, far from float32's "
                    f"underflow at {LOG_TINY['float32']:.1f})", "ok": s["final_corr_ref"]["min"] >= FLAGS.threshold})
  return out


def draw(arrays, params, variants, out):
  steps = arrays["steps"]
  fig, axes = plots.figure(ncols=len(params))
  for ax, p in zip(axes, params):
    for v in variants[1:]:
      gap = np.clip(1 - arrays[f"corr_ref_{p}_{v}"], 1e-17, None)
      ax.semilogy(steps, np.mean(gap, 0), color=COLORS[v], lw=2, label=f"{v} (mean)")
      ax.semilogy(steps, np.max(gap, 0), color=COLORS[v], lw=1, linestyle="--")
    ax.axhline(1 - FLAGS.threshold, color="k", lw=0.8, linestyle=":")
    ax.set(xlabel="iteration", ylabel=f"1 - corr(W, W_{variants[0]})", ylim=(1e-17, 2),
           title=f"{'W' if p == 'W' else '(K,Q)'}: distance to {variants[0]} (max dashed)")
    ax.legend(fontsize=8)
  plots.save(fig, f"{out}/corr_ref.png")

  if any(f"corr_svm_{p}_{v}" in arrays for p in params for v in variants):
    fig, axes = plots.figure(ncols=len(params))
    for ax, p in zip(axes, params):
      for v in variants:
        if f"corr_svm_{p}_{v}" in arrays:
          plots.band(ax, steps, arrays[f"corr_svm_{p}_{v}"], COLORS[v], v)
      ax.set(xlabel="iteration", ylabel="corr with the SVM", ylim=(0, 1.02),
             title=f"{'W vs Frobenius' if p == 'W' else '(K,Q) vs nuclear'} SVM")
      ax.legend(loc="lower right", fontsize=8)
    plots.save(fig, f"{out}/corr_svm.png")

  fig, axes = plots.figure(ncols=2)
  for p in params:
    plots.band(axes[0], steps, arrays[f"tail_exponent_{p}"], plots.COLORS[p], f"{p} ({variants[0]})")
    for v in variants:
      axes[1].plot(steps, np.mean(arrays[f"norm_{p}_{v}"], 0), color=COLORS[v],
                   linestyle="-" if p == "W" else "--", label=f"{p} {v}")
  for name, c in LOG_TINY.items():
    if c < 1.2 * np.nanmax([arrays[f"tail_exponent_{p}"] for p in params]):
      axes[0].axhline(c, color="k", lw=0.8, linestyle=":")
      axes[0].text(steps[0], c, f" {name} underflow", va="bottom", fontsize=8)
  axes[0].set(xlabel="iteration", ylabel="tail exponent c (largest non-top weight exp(-c))",
              title="Softmax saturation of the reference")
  axes[0].legend(fontsize=8)
  axes[1].set(xlabel="iteration", ylabel="mean ||W|| (W or KQ^T)", title="Norm growth (flat: frozen)")
  axes[1].legend()
  plots.save(fig, f"{out}/saturation.png")


def report(summary):
  lines = [f"precision: {summary['data_sets']} data sets, reference {summary['reference']}"]
  for p, per in summary["variants"].items():
    for v, s in per.items():
      fr, ck = s["final_corr_ref"], s["corr_ref_at_check_step"]
      svm = s.get("final_corr_svm")
      lines.append(f"  {p:<2} {v:<15} corr@{s['check_step']} mean {ck['mean']:.7f} min {ck['min']:.7f}  "
                   f"final mean {fr['mean']:.7f} min {fr['min']:.7f}  below {FLAGS.threshold} from step "
                   f"{s['first_step_below_threshold']}  departs at c={s['tail_exponent_at_departure']['median']}"
                   f"  stalled {s['runs_stalled']}" + (f"  svm {svm['mean']:.4f}/{svm['min']:.4f}" if svm else ""))
  run_experiment.print_report(lines, summary)


checks_lib.distinct_lists("params", "variants", "figure_format")   # a repeated entry would compute the same thing twice

if __name__ == "__main__":
  import svmattn
  svmattn.configure()
  app.run(main)
