r"""E5: multi-token selection with a ReLU head, and the general SVM equivalence (SCIENCE.md sections 6, 8).

Head h(r) = 1^T ReLU(V^T r), V Gaussian with ||V||_F = 1; n=3 sequences of T=4
unit tokens, unit queries, labels +-1; W trained by normalized GD (lr 0.1,
2001 steps, snapshot every 100) from the uniform initialization. For every d,
data sets are drawn in run order until --runs of them are KEPT:
  skipped    no negative label (the authors' rule: with only Y = +1 the convex
             head selects one token per sequence)
  discarded  by the Gen-SVM thresholds rule on the final softmax (some s_it in
             (1e-6, 1e-3], or no s_it <= 1e-6), or an SVM that is infeasible/failed
The kept runs are the first --runs passing runs in run order (independent of --batch).

For each kept run: W^fin, W^mm, W^SVMeq = W^fin + C W^mm (C fitted to the FINAL
W_GD) and W^1token = Att-SVM(argmax s) from the FINAL softmax, and
1 - corr(W(k), object) at every snapshot k against these final-step objects, as
in the authors' notebook (multi_token_converge.ipynb). The authors plot the mean
over runs; we plot the median and the quartile band, and report both.

Multi-token selection (some |O_i| > 1) happens in Y = -1 sequences (they minimize
the convex head h >= 0). A sequence is "dead" when every ReLU unit is off at its
final pooled token (h = 0 there, a minimum for Y = -1): its gradient vanishes, its
logits freeze, and the margins W^mm asks of its masked tokens stop growing, so
W^SVMeq mispredicts W_GD by a constant. The summary reports 1 - corr apart for
runs with a dead sequence, with every sequence live, and with/without multi-token
selection; scatter.png marks the dead runs.

Writes to --out: results.npz, summary.json (with "checks"), correlation.png
(1 - corr vs iteration per d), scatter.png (max masked s vs final 1 - corr).

    python -m experiments.multi_token --out=results/e5
    python -m experiments.multi_token --out=results/e5_quick --runs=40 --ds=4,6
"""
from __future__ import annotations


from absl import app
from absl import flags
from absl import logging
import numpy as np

from experiments import common
from svmattn.data import datasets as data_lib
from svmattn.svm import gensvm
from svmattn.models import heads
from svmattn.analysis import metrics
from svmattn.io import plots
from svmattn.io import progress as progress_lib
from svmattn.io import results
from svmattn.train import loop as train_lib

FLAGS = flags.FLAGS
common.define_common_flags(runs=500)  # --runs: KEPT runs per d
flags.DEFINE_list("ds", ["4", "6", "8", "10"], "Embedding dimensions d.")
flags.DEFINE_integer("n", 3, "Sequences per data set.")
flags.DEFINE_integer("T", 4, "Tokens per sequence.")
flags.DEFINE_integer("steps", 2001, "Normalized GD steps.")
flags.DEFINE_float("lr", 0.1, "Learning rate.")
flags.DEFINE_integer("snapshot_every", 100, "Snapshot W every this many steps.")
flags.DEFINE_integer("chunk_steps", 1000, "Steps per jitted chunk (progress granularity).")
flags.DEFINE_integer("batch", 1000, "Data sets trained together (one compiled shape per d).")
flags.DEFINE_integer("max_draws", 200_000, "Give up on a d after drawing this many data sets.")
flags.DEFINE_float("tau_L", gensvm.TAU_L, "Lower softmax threshold of the discard rule.")
flags.DEFINE_float("tau_H", gensvm.TAU_H, "Selection threshold: O_i = {t: s_it >= tau_H}.")
flags.DEFINE_float("target", 3e-3, "Issue acceptance: median final 1 - corr(W_GD, W^SVMeq) at d >= 6.")

OBJECTS = ("svmeq", "mm", "1token")
LABELS = {"svmeq": r"$W^{SVMeq}$", "mm": r"$W^{mm}$", "1token": r"$W^{1token}$"}
STYLES = {"svmeq": "-", "mm": ":", "1token": "--"}
COLORS = ["tab:blue", "tab:green", "tab:red", "tab:cyan", "tab:purple", "tab:orange"]
# Outcome codes of a trained run (per-run records in results.npz).
OUTCOMES = ("kept", "intermediate", "finite", "infeasible", "failed")


def candidate_batches(spec, head, batch, dtype):
  """Yields (runs (batch,), data) of data sets with a negative label, in run order,
  and records the skipped runs in ``skipped`` (a list the caller reads)."""
  skipped = []
  pool_runs, pool = [], []
  next_run = 0

  def gen():
    nonlocal next_run
    while True:
      runs = np.arange(next_run, next_run + batch)
      next_run += batch
      draw = data_lib.Dataset(*(np.asarray(a) for a in data_lib.generate(spec, FLAGS.seed, runs, head,
                                                                            dtype=dtype)))
      neg = np.any(draw.Y < 0, axis=1)
      skipped.extend(runs[~neg].tolist())
      pool_runs.extend(runs[neg].tolist())
      pool.append(data_lib.take(draw, neg))
      while len(pool_runs) >= batch:
        joined = data_lib.Dataset(*(np.concatenate(f) for f in zip(*pool)))
        out_runs, out = np.array(pool_runs[:batch]), data_lib.take(joined, slice(0, batch))
        del pool_runs[:batch]
        pool[:] = [data_lib.take(joined, slice(batch, None))]
        yield out_runs, out

  return gen(), skipped


def dead_sequences(X, V, s):
  """(K, n) bool: sequence i is dead when every ReLU unit is off at its final pooled token,
  max_j (V^T r_i)_j < 0 with r_i = X_i^T s_i: then h = 0 nearby and grad h(r_i) = 0, so the
  sequence sends no gradient and its logits stop moving (its masked margins no longer grow)."""
  r = np.einsum("knt,kntd->knd", s, X)
  return np.einsum("knd,kde->kne", r, V).max(axis=-1) < 0


def outcome(res: gensvm.GenSVMResult) -> str:
  if res.ok:
    return "kept"
  if res.status == "discarded":
    return res.reason.split(":")[0]
  return res.status


def run_d(d, config, head, timer):
  """Train and solve until FLAGS.runs runs of dimension d are kept.

  Returns (kept, counts, (trained runs, their outcomes)): kept is a list of
  (run, GenSVMResult, W trajectory (S,d,d), final softmax (n,T), data set) in run order."""
  spec = data_lib.DataSpec(FLAGS.n, FLAGS.T, d).validate()
  want = FLAGS.runs
  kept, trained_runs, trained_outcomes = [], [], []
  if FLAGS.data:
    file_data = data_lib.load_npz(FLAGS.data, common.dtype())
    neg = np.any(file_data.Y < 0, axis=1)
    all_runs = np.arange(file_data.X.shape[0])
    skipped = all_runs[~neg].tolist()
    batches = iter([(all_runs[neg], data_lib.take(file_data, neg))]) if neg.any() else iter([])
    want = min(want, int(neg.sum()))
  else:
    batches, skipped = candidate_batches(spec, head, FLAGS.batch, common.dtype())
  drawn = 0
  with progress_lib.Progress(f"d={d} kept", want, "runs", enabled=FLAGS.progress) as bar:
    for runs, batch in batches:
      with timer("train"):
        tr = train_lib.train(config, batch, train_lib.init_keys(FLAGS.seed, runs))
      with timer("gensvm"):
        X, Z = np.asarray(batch.X, np.float64), np.asarray(batch.Z, np.float64)
        s = np.asarray(tr.attention, np.float64)
        W_final = np.asarray(tr.W_final, np.float64)
        before = len(kept)
        for b in range(len(runs)):
          if not np.all(np.isfinite(W_final[b])) or not np.all(np.isfinite(s[b])):
            res = gensvm.GenSVMResult("failed", "training diverged (non-finite W or softmax)",
                                      np.zeros(s[b].shape, bool), np.zeros(len(s[b]), int))
          else:
            res = gensvm.gen_svm(X[b], Z[b], s[b], W_final[b], FLAGS.tau_L, FLAGS.tau_H)
          trained_runs.append(int(runs[b]))
          trained_outcomes.append(outcome(res))
          if res.ok:
            # copies: a view would keep the whole batch's trajectory alive
            kept.append((int(runs[b]), res, np.array(tr.W[b]), s[b].copy(),
                         data_lib.Dataset(*(np.array(f[b]) for f in batch))))
        bar.update(min(len(kept), want) - min(before, want))
      drawn = int(runs[-1]) + 1
      if len(kept) >= want or drawn >= FLAGS.max_draws:
        break
  kept = kept[:want]
  # Counts over the runs up to the last kept one (independent of the batch size).
  cutoff = kept[-1][0] + 1 if len(kept) == want and kept else drawn
  trained_runs, trained_outcomes = np.array(trained_runs, int), np.array(trained_outcomes)
  in_range = trained_runs < cutoff
  counts = {"drawn": int(cutoff),
            "skipped_no_negative_label": int(np.sum(np.array(skipped, int) < cutoff)),
            "trained": int(in_range.sum())}
  counts.update({o: int(np.sum(trained_outcomes[in_range] == o)) for o in OUTCOMES})
  if len(kept) < want:
    logging.warning("d=%d: only %d of %d runs kept after %d draws (--max_draws)", d, len(kept), want, drawn)
  return kept, counts, (trained_runs[in_range], trained_outcomes[in_range])


def summarize_d(d, kept, steps):
  """Arrays and statistics of the kept runs of one d."""
  K = len(kept)
  res = [k[1] for k in kept]
  W_traj = np.stack([k[2] for k in kept]) if K else np.zeros((0, len(steps), d, d))
  s = np.stack([k[3] for k in kept]) if K else np.zeros((0, FLAGS.n, FLAGS.T))
  data = data_lib.Dataset(*(np.stack(f) for f in zip(*[k[4] for k in kept]))) if K else None
  st = gensvm.stack(res, d)
  arrays = {"runs": np.array([k[0] for k in kept], int), "W_gd": W_traj[:, -1] if K else W_traj[:, 0],
            "attention": s, "selected": st["selected"], "C": st["C"], "max_masked": st["max_masked"],
            "fin_residual": st["fin_residual"], "mm_min_margin": st["mm_min_margin"]}
  for obj, key in (("svmeq", "W_svmeq"), ("mm", "W_mm"), ("1token", "W_1token")):
    arrays[f"W_{obj}"] = st[key]
    arrays[f"corr_{obj}"] = metrics.corr(W_traj, st[key][:, None]) if K else np.zeros((0, len(steps)))
  arrays["W_fin"] = st["W_fin"]
  arrays["dead"] = dead_sequences(data.X, data.v, s) if K else np.zeros((0, FLAGS.n), bool)
  arrays["Y"] = data.Y if K else np.zeros((0, FLAGS.n))
  arrays["V"] = data.v if K else np.zeros((0, d, d))
  arrays["X"] = data.X if K else np.zeros((0, FLAGS.n, FLAGS.T, d))
  arrays["Z"] = data.Z if K else np.zeros((0, FLAGS.n, d))
  return arrays


def stats(x):
  x = np.asarray(x, np.float64)
  x = x[np.isfinite(x)]
  if not x.size:
    return {"count": 0, "median": None, "q25": None, "q75": None, "mean": None}
  q25, med, q75 = np.percentile(x, [25, 50, 75])
  return {"count": int(x.size), "median": float(med), "q25": float(q25), "q75": float(q75), "mean": float(x.mean())}


def main(argv):
  del argv
  timer = common.Timer()
  try:
    ds = [int(x) for x in FLAGS.ds]
  except ValueError:
    raise app.UsageError(f"--ds must be a list of integers, got {FLAGS.ds}") from None
  for name in ("runs", "batch", "max_draws"):
    if getattr(FLAGS, name) < 1:
      raise app.UsageError(f"--{name} must be >= 1, got {getattr(FLAGS, name)}")
  if FLAGS.data:
    file_data = data_lib.load_npz(FLAGS.data)
    file_d = file_data.X.shape[-1]
    if file_data.v.shape[1:] != (file_d, file_d):
      raise app.UsageError(f"--data: the ReLU head needs v of shape (B, d, d) = (B, {file_d}, {file_d}) "
                           f"(the matrix V), got {file_data.v.shape}")
    if ds != [file_d]:
      logging.warning("--data: using d=%d of the data file instead of --ds=%s", file_d, FLAGS.ds)
    ds = [file_d]
  head = heads.get_head("relu")
  config = train_lib.TrainConfig(param="W", head=head.name, lr=FLAGS.lr, steps=FLAGS.steps,
                                 snapshot_every=FLAGS.snapshot_every, chunk_steps=FLAGS.chunk_steps)
  config.validate()
  steps = np.array([0] + [s for e, k in train_lib.schedule(FLAGS.steps, FLAGS.snapshot_every, FLAGS.chunk_steps)
                          for s in [e] * k]).cumsum()

  arrays = {"steps": steps, "ds": np.array(ds)}
  summary = {"experiment": "E5 multi-token selection (ReLU head, Gen-SVM)", "flags": common.flag_values(),
             "shape": {"n": FLAGS.n, "T": FLAGS.T, "ds": ds}, "per_d": {},
             "corr_reference": "1 - corr(W(k), X) at every snapshot k against the Gen-SVM objects of the FINAL "
                               "softmax and W (as the authors do); figures show median and quartiles "
                               "(the authors plot the mean)"}
  for d in ds:
    kept, counts, (tr_runs, tr_out) = run_d(d, config, head, timer)
    a = summarize_d(d, kept, steps)
    for k, v in a.items():
      arrays[f"{k}_d{d}"] = v
    arrays[f"trained_runs_d{d}"], arrays[f"trained_outcome_d{d}"] = tr_runs, tr_out
    final = {obj: 1 - a[f"corr_{obj}"][:, -1] for obj in OBJECTS}
    sizes = a["selected"].sum(-1) if len(kept) else np.zeros((0, FLAGS.n))
    multi = np.any(sizes > 1, axis=1)
    dead = np.any(a["dead"], axis=1)
    summary["per_d"][str(d)] = {
        "counts": counts, "kept": len(kept),
        "final_one_minus_corr": {obj: stats(final[obj]) for obj in OBJECTS},
        "selected_per_sequence": {str(k): int(np.sum(sizes == k)) for k in range(1, FLAGS.T + 1)},
        "multi_token_runs": int(multi.sum()),
        "multi_token_runs_with_negative_label": int(np.sum(np.any((sizes > 1) & (a["Y"] < 0), axis=1))),
        "final_one_minus_corr_svmeq_multi_token_runs": stats(final["svmeq"][multi]),
        "final_one_minus_corr_svmeq_single_token_runs": stats(final["svmeq"][~multi]),
        "runs_with_dead_sequence": int(dead.sum()),
        "final_one_minus_corr_svmeq_all_live_runs": stats(final["svmeq"][~dead]),
        "final_one_minus_corr_svmeq_dead_runs": stats(final["svmeq"][dead]),
        "median_C": stats(a["C"])["median"],
        "max_fin_residual": float(np.nanmax(a["fin_residual"])) if len(kept) else None,
        "min_mm_margin": float(np.nanmin(a["mm_min_margin"])) if np.any(np.isfinite(a["mm_min_margin"])) else None,
    }
  summary["checks"] = checks(summary, ds)
  with timer("write"):
    results.write_npz(f"{FLAGS.out}/results.npz", arrays)
    draw(arrays, ds, FLAGS.out)
  summary["timings_s"] = {**timer.seconds, "total": timer.total()}
  summary["environment"] = common.environment()
  results.write_json(f"{FLAGS.out}/summary.json", summary)
  report(summary, ds)


def checks(summary, ds):
  out = []
  for d in ds:
    per = summary["per_d"][str(d)]
    med = {obj: per["final_one_minus_corr"][obj]["median"] for obj in OBJECTS}
    out.append({"name": f"d={d}: kept runs", "value": per["kept"], "expected": f"{FLAGS.runs} (--runs)",
                "ok": per["kept"] == FLAGS.runs})
    if med["svmeq"] is None:
      continue
    for other in ("mm", "1token"):
      out.append({"name": f"d={d}: median final 1-corr, W^SVMeq vs W^{other}",
                  "value": f"{med['svmeq']:.3g} vs {med[other]:.3g}",
                  "expected": f"W^SVMeq below W^{other}", "ok": bool(med["svmeq"] < med[other])})
    if d >= 6:
      out.append({"name": f"d={d}: median final 1-corr(W_GD, W^SVMeq) after {FLAGS.steps} steps",
                  "value": med["svmeq"],
                  "expected": f"<= {FLAGS.target:g} (paper: ~2e-3 at d=6,8,10 after 2001 steps)",
                  "ok": bool(med["svmeq"] <= FLAGS.target)})
  return out


def quartile_band(ax, x, curves, color, label, linestyle):
  """Median and 25-75% band over the leading axis of curves (R, S), NaN-aware."""
  curves = np.asarray(curves, np.float64)
  if not len(curves):
    return
  q25, med, q75 = np.nanpercentile(curves, [25, 50, 75], axis=0)
  ax.plot(x, med, color=color, linestyle=linestyle, label=label, lw=2)
  ax.fill_between(x, q25, q75, color=color, alpha=0.15, lw=0)


def draw(arrays, ds, out):
  steps = arrays["steps"]
  floor = 1e-16
  fig, axes = plots.figure(ncols=len(ds), width=4.2, height=3.6)
  for ax, d, color in zip(axes, ds, COLORS * 4):
    for obj in OBJECTS:
      quartile_band(ax, steps, np.maximum(1 - arrays[f"corr_{obj}_d{d}"], floor), color, LABELS[obj], STYLES[obj])
    ax.set_yscale("log")
    ax.set(xlabel="iteration", title=f"d={d} ({len(arrays[f'runs_d{d}'])} runs)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")
  axes[0].set_ylabel("1 - correlation coefficient (median, quartiles)")
  plots.save(fig, f"{out}/correlation.png")

  fig, axes = plots.figure(ncols=len(ds), width=4.2, height=3.6)
  for ax, d, color in zip(axes, ds, COLORS * 4):
    x = arrays[f"max_masked_d{d}"]
    y = np.maximum(1 - arrays[f"corr_svmeq_d{d}"][:, -1], floor) if len(x) else x
    dead = np.any(arrays[f"dead_d{d}"], axis=1) if len(x) else np.zeros(0, bool)
    ax.scatter(np.maximum(x[~dead], 1e-300), y[~dead], s=12, color=color, alpha=0.7, label="every sequence live")
    ax.scatter(np.maximum(x[dead], 1e-300), y[dead], s=12, color="k", marker="x", alpha=0.6,
               label="a dead sequence (ReLU all off)")
    ax.set(xscale="log", yscale="log", title=f"d={d}",
           xlabel=r"$\max_{i,\tau \notin O_i} s_{i\tau}$")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
  axes[0].set_ylabel(r"final 1 - corr$(W_{GD}, W^{SVMeq})$")
  plots.save(fig, f"{out}/scatter.png")


def _fmt(x):
  return "-" if x is None else format(x, ".2e")


def report(summary, ds):
  lines = ["E5 multi-token selection (ReLU head): final 1 - corr(W_GD, .) over kept runs, median [mean]"]
  for d in ds:
    per = summary["per_d"][str(d)]
    f = per["final_one_minus_corr"]
    c = per["counts"]
    parts = "  ".join(f"{obj} {f[obj]['median']:.2e} [{f[obj]['mean']:.2e}]" if f[obj]["median"] is not None
                      else f"{obj} -" for obj in OBJECTS)
    lines.append(f"  d={d:<3} kept {per['kept']:4d}  {parts}")
    mt = per["final_one_minus_corr_svmeq_multi_token_runs"]["median"]
    st = per["final_one_minus_corr_svmeq_single_token_runs"]["median"]
    lines.append(f"         drawn {c['drawn']} skipped {c['skipped_no_negative_label']} discarded: intermediate "
                 f"{c['intermediate']} finite {c['finite']} infeasible {c['infeasible']} failed {c['failed']}; "
                 f"multi-token runs {per['multi_token_runs']} (svmeq median {_fmt(mt)}; single-token runs "
                 f"{_fmt(st)}); runs with a dead sequence {per['runs_with_dead_sequence']} (svmeq median "
                 f"{_fmt(per['final_one_minus_corr_svmeq_dead_runs']['median'])}; all live "
                 f"{_fmt(per['final_one_minus_corr_svmeq_all_live_runs']['median'])})")
  common.print_report(lines, summary, each_check=False)


if __name__ == "__main__":
  app.run(main)
