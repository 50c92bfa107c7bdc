r"""E6: the lambda head selects more tokens as lambda grows (SCIENCE.md sections 6, 8).

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
vs lambda, measured and predicted), correlation.png (final 1 - corr vs lambda).

    python -m experiments.lambda_head --out=results/e6
    python -m experiments.lambda_head --out=results/e6_quick --runs=16 --lams=0,0.2,0.5,1
"""
from __future__ import annotations


from absl import app
from absl import flags
import jax
import jax.numpy as jnp
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
common.define_common_flags(runs=100)  # --runs: data sets, each trained at every lambda
flags.DEFINE_list("lams", ["0", "0.05", "0.1", "0.2", "0.3", "0.4", "0.5", "0.75", "1", "1.5"],
                  "Values of lambda in h(r) = v^T r - lambda ||r||^2.")
flags.DEFINE_integer("n", 3, "Sequences per data set.")
flags.DEFINE_integer("T", 4, "Tokens per sequence (T <= d: orthonormal tokens).")
flags.DEFINE_integer("d", 8, "Embedding dimension.")
flags.DEFINE_integer("steps", 2001, "Normalized GD steps.")
flags.DEFINE_float("lr", 0.1, "Learning rate.")
flags.DEFINE_integer("snapshot_every", 100, "Snapshot W every this many steps.")
flags.DEFINE_integer("chunk_steps", 1000, "Steps per jitted chunk (progress granularity).")
flags.DEFINE_float("tau_L", gensvm.TAU_L, "Lower softmax threshold of the discard rule.")
flags.DEFINE_float("tau_H", gensvm.TAU_H, "Selection threshold: O_i = {t: s_it >= tau_H}.")
flags.DEFINE_bool("keep_intermediate", True, "Evaluate Gen-SVM also on runs the thresholds rule discards as "
                  "'intermediate' (some s_it in (tau_L, tau_H]); their count is reported either way. Runs "
                  "discarded as 'finite' (nothing masked) are never evaluated.")

OBJECTS = ("svmeq", "mm", "1token")
LABELS = {"svmeq": r"$W^{SVMeq}$", "mm": r"$W^{mm}$", "1token": r"$W^{1token}$"}
COLORS = {"svmeq": "tab:blue", "mm": "tab:green", "1token": "tab:red"}


def orthonormal_tokens(key: jax.Array, spec: data_lib.DataSpec, head: heads.Head, dtype=jnp.float64):
  """Sampler (the signature of data.unit_gaussian): the T tokens of each sequence are the
  rows of a Haar-random d x T orthonormal frame (QR of a Gaussian matrix, signs fixed by
  diag R), so X_i X_i^T = I; queries unit Gaussian (or x_{i,query_pos} for self-attention);
  labels +1 ("positive") or +-1 ("random"); head parameters from head.init."""
  if spec.T > spec.d:
    raise ValueError(f"orthonormal_tokens: need T <= d for orthonormal tokens, got T={spec.T}, d={spec.d}")
  kx, kz, ky, kv = jax.random.split(key, 4)
  G = data_lib.normal(kx, (spec.n, spec.d, spec.T), dtype)
  Q, R = jnp.linalg.qr(G)                                          # Q (n,d,T), R (n,T,T)
  signs = jnp.sign(jnp.diagonal(R, axis1=-2, axis2=-1))
  X = jnp.swapaxes(Q * jnp.where(signs == 0, 1.0, signs)[:, None, :], 1, 2)   # (n,T,d)
  if spec.attention == "self":
    Z = X[:, spec.query_pos]
  else:
    Z = data_lib.normal(kz, (spec.n, spec.d), dtype)
    Z = Z / jnp.linalg.norm(Z, axis=-1, keepdims=True)
  if spec.labels == "positive":
    Y = jnp.ones((spec.n,), dtype)
  else:
    Y = jnp.where(jax.random.bernoulli(ky, 0.5, (spec.n,)), 1.0, -1.0).astype(dtype)
  return data_lib.Dataset(X, Y, Z, head.init(kv, spec.d, dtype))


def stats(x):
  x = np.asarray(x, np.float64)
  x = x[np.isfinite(x)]
  if not x.size:
    return {"count": 0, "median": None, "q25": None, "q75": None, "mean": None}
  q25, med, q75 = np.percentile(x, [25, 50, 75])
  return {"count": int(x.size), "median": float(med), "q25": float(q25), "q75": float(q75), "mean": float(x.mean())}


def run_lambda(lam, spec, runs, bar, timer, file_data=None):
  head = heads.lambda_head(lam)
  config = train_lib.TrainConfig(param="W", head=head.name, lr=FLAGS.lr, steps=FLAGS.steps,
                                 snapshot_every=FLAGS.snapshot_every, chunk_steps=FLAGS.chunk_steps)
  with timer("data"):
    if file_data is not None:
      data = file_data
    else:
      data = data_lib.generate(spec, FLAGS.seed, runs, head, sampler=orthonormal_tokens, dtype=common.dtype())
  with timer("train"):
    tr = train_lib.train(config, data, train_lib.init_keys(FLAGS.seed, runs), bar.update)
  X, Z, v = (np.asarray(a, np.float64) for a in (data.X, data.Z, data.v))
  s, W = np.asarray(tr.attention, np.float64), np.asarray(tr.W_final, np.float64)
  B = len(runs)
  with timer("gensvm"):
    rule = np.array([gensvm.discard_reason(s[b], FLAGS.tau_L, FLAGS.tau_H).split(":")[0] for b in range(B)])
    res = [gensvm.gen_svm(X[b], Z[b], s[b], W[b], FLAGS.tau_L, FLAGS.tau_H, apply_discard=False)
           for b in range(B)]
    s_star = np.stack([gensvm.lambda_head_optimum(X[b], v[b], lam) for b in range(B)])
  st = gensvm.stack(res, X.shape[-1])
  usable = (rule == "") | ((rule == "intermediate") & FLAGS.keep_intermediate)
  kept = usable & (st["status"] == "optimal")     # the runs evaluated
  O = gensvm.selected_sets(s, FLAGS.tau_H)
  predicted = s_star > 0
  match = np.all(O == predicted, axis=-1)                                   # (B, n)
  gap = np.where(O, np.abs(s - s_star), 0.0).max(axis=(-2, -1))             # (B,) on the selected entries
  out = {"attention": s, "s_star": s_star, "selected": O, "predicted": predicted, "match": match,
         "gap": gap, "status": st["status"], "rule": rule, "kept": kept,
         "C": st["C"], "max_masked": st["max_masked"], "W_gd": W}
  for obj, key in (("svmeq", "W_svmeq"), ("mm", "W_mm"), ("1token", "W_1token")):
    out[f"W_{obj}"] = st[key]
    out[f"final_{obj}"] = np.where(kept, 1 - metrics.corr(W, st[key]), np.nan)  # NaN where not evaluated
  out.update(X=X, Z=Z, v=v, Y=np.asarray(data.Y, np.float64))
  return out


def main(argv):
  del argv
  timer = common.Timer()
  try:
    lams = [float(x) for x in FLAGS.lams]
  except ValueError:
    raise app.UsageError(f"--lams must be a list of numbers, got {FLAGS.lams}") from None
  if any(not np.isfinite(x) or x < 0 for x in lams):
    raise app.UsageError(f"--lams must be finite and >= 0, got {FLAGS.lams}")
  if FLAGS.runs < 1:
    raise app.UsageError(f"--runs must be >= 1, got {FLAGS.runs}")
  spec = data_lib.DataSpec(FLAGS.n, FLAGS.T, FLAGS.d, labels="positive").validate()
  if FLAGS.T > FLAGS.d:
    raise app.UsageError(f"--T={FLAGS.T} must be <= --d={FLAGS.d} (orthonormal tokens)")
  runs = np.arange(FLAGS.runs)
  file_data = None
  if FLAGS.data:
    file_data = data_lib.load_npz(FLAGS.data, common.dtype())
    B, _, T, d = file_data.X.shape
    gram = np.einsum("bntd,bnud->bntu", file_data.X, file_data.X)
    if file_data.v.shape != (B, d) or np.max(np.abs(gram - np.eye(T))) > 1e-6:
      raise app.UsageError(f"--data: E6 needs orthonormal tokens (X_i X_i^T = I) and v of shape (B, d) = "
                           f"({B}, {d}); got v {file_data.v.shape}, max |X_i X_i^T - I| "
                           f"{np.max(np.abs(gram - np.eye(T))):.2g}")
    runs = np.arange(B)

  per = {}
  with progress_lib.Progress("train", FLAGS.steps * len(lams), "steps", enabled=FLAGS.progress) as bar:
    for lam in lams:
      per[lam] = run_lambda(lam, spec, runs, bar, timer, file_data)

  arrays = {"lams": np.array(lams), "runs": runs}
  for i, lam in enumerate(lams):
    for k, v in per[lam].items():
      shared = k in ("X", "Z", "v", "Y")   # the same data sets at every lambda
      if shared and i > 0:
        continue
      arrays[k if shared else f"{k}_l{i}"] = v
  summary = {"experiment": "E6 lambda head (orthonormal tokens, Y=+1)", "flags": common.flag_values(),
             "shape": {"n": FLAGS.n, "T": FLAGS.T, "d": FLAGS.d}, "data_sets": len(runs),
             "lambda_index": {f"l{i}": lam for i, lam in enumerate(lams)}, "per_lambda": {}}
  for i, lam in enumerate(lams):
    p = per[lam]
    kept = p["kept"]
    sizes = p["selected"].sum(-1)
    summary["per_lambda"][repr(lam)] = {
        "evaluated": int(kept.sum()),
        "thresholds_rule": {"kept": int(np.sum(p["rule"] == "")),
                            "intermediate": int(np.sum(p["rule"] == "intermediate")),
                            "finite": int(np.sum(p["rule"] == "finite"))},
        "svm_status": {k: int(np.sum(p["status"][p["rule"] != "finite"] == k)) for k in gensvm.STATUSES},
        "mean_selected_all_runs": float(sizes.mean()),
        "mean_selected_evaluated": float(sizes[kept].mean()) if kept.any() else None,
        "mean_predicted": float(p["predicted"].sum(-1).mean()),
        "selected_histogram": {str(k): int(np.sum(sizes == k)) for k in range(1, FLAGS.T + 1)},
        "match_predicted_evaluated": float(p["match"][kept].mean()) if kept.any() else None,
        "match_predicted_all": float(p["match"].mean()),
        "median_gap_to_optimum_evaluated": stats(p["gap"][kept])["median"],
        "final_one_minus_corr": {obj: stats(p[f"final_{obj}"][kept]) for obj in OBJECTS},
    }
  summary["checks"] = checks(summary, lams)
  with timer("write"):
    results.write_npz(f"{FLAGS.out}/results.npz", arrays)
    draw(summary, per, lams, FLAGS.out)
  summary["timings_s"] = {**timer.seconds, "total": timer.total()}
  summary["environment"] = common.environment()
  results.write_json(f"{FLAGS.out}/summary.json", summary)
  report(summary, lams)


def checks(summary, lams):
  per = [summary["per_lambda"][repr(lam)] for lam in lams]
  out = []
  means = [p["mean_selected_all_runs"] for p in per]
  out.append({"name": "mean |O_i| (all runs) vs lambda", "value": ", ".join(f"{m:.2f}" for m in means),
              "expected": "nondecreasing in lambda, 1 at lambda = 0",
              "ok": bool(np.all(np.diff(means) >= 0) and (lams[0] > 0 or means[0] == 1))})
  match = [p["match_predicted_evaluated"] for p in per if p["match_predicted_evaluated"] is not None]
  if match:
    out.append({"name": "O_i = support of argmax_s h(X_i^T s) (evaluated runs), worst lambda", "value": min(match),
                "expected": ">= 0.95 of sequences (theory: all)", "ok": bool(min(match) >= 0.95)})
  for lam, p in zip(lams, per):
    f = p["final_one_minus_corr"]
    if f["svmeq"]["median"] is None or not p["mean_selected_evaluated"] > 1:
      continue  # Gen-SVM = the 1-token SVM when every |O_i| = 1
    for other in ("1token", "mm"):
      out.append({"name": f"lambda={lam:g}: median final 1-corr, W^SVMeq vs W^{other}",
                  "value": f"{f['svmeq']['median']:.3g} vs {f[other]['median']:.3g}",
                  "expected": f"W^SVMeq below W^{other}", "ok": bool(f["svmeq"]["median"] < f[other]["median"])})
  return out


def draw(summary, per, lams, out):
  x = np.array(lams)
  fig, (ax,) = plots.figure()
  sizes = [per[lam]["selected"].sum(-1).reshape(-1) for lam in lams]
  kept_sizes = [per[lam]["selected"][per[lam]["kept"]].sum(-1).reshape(-1) for lam in lams]
  pred = [per[lam]["predicted"].sum(-1).reshape(-1) for lam in lams]
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
  for obj in OBJECTS:
    vals = [np.maximum(per[lam][f"final_{obj}"][per[lam]["kept"]], 1e-16) for lam in lams]
    med = np.array([np.median(v) if v.size else np.nan for v in vals])
    lo = np.array([np.percentile(v, 25) if v.size else np.nan for v in vals])
    hi = np.array([np.percentile(v, 75) if v.size else np.nan for v in vals])
    ax.plot(x, med, "o-", color=COLORS[obj], lw=2, label=LABELS[obj])
    ax.fill_between(x, lo, hi, color=COLORS[obj], alpha=0.15, lw=0)
  ax.set(xlabel=r"$\lambda$", ylabel=r"final 1 - corr$(W_{GD}, \cdot)$ (median, quartiles)", yscale="log",
         title="Gen-SVM predictivity (evaluated runs)")
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


if __name__ == "__main__":
  app.run(main)
