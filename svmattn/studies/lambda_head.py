"""E6: the lambda head selects more tokens as lambda grows (docs/science.md sections 6, 8).

Head h(r) = v^T r - lambda ||r||^2 (v unit Gaussian); the tokens of each sequence are
orthonormal (X_i X_i^T = I, T <= d), queries unit Gaussian, labels Y = +1. One cell per
lambda (``{"lam": lam}``), each the same ``runs`` data sets (data set r from
fold_in(PRNGKey(seed), r), or row r of the data file fl["data"]); W trained by normalized GD.

With orthonormal tokens h(X_i^T s) = a_i^T s - lambda ||s||^2 (a_i = X_i v), so the
attention that maximizes h over the simplex is s*_i = Proj_simplex(a_i / (2 lambda))
(argmax_t a_it at lambda = 0): its support is the predicted selected set.

Per run and lambda: the selected sets O_i = {t: s_it >= tau_H} of the final softmax, the
outcome of the Gen-SVM thresholds rule, and for the evaluated runs W^SVMeq, W^mm, W^1token
with 1 - corr(W_GD, .) (final W) and the distance of the final softmax to s* on the selected
entries. Evaluated: runs the rule keeps, plus (``keep_intermediate``) those it discards as
"intermediate", whose Gen-SVM objects are optimal; runs with nothing masked ("finite") never.

``fl`` below is a dict of the experiment's settings (``SETTINGS``: the binary's flags or a config's
fields), or the "flags" of its summary.json: replay rebuilds the same study from it.
"""
from __future__ import annotations


import numpy as np

from svmattn import registry
from svmattn.analysis import health
from svmattn.analysis import metrics
from svmattn.config import allowed
from svmattn.config import common
from svmattn.config import fields as F
from svmattn.config import minibatch
from svmattn.data import datasets as data_lib
from svmattn.models import heads
from svmattn.execution import pipeline
from svmattn.execution import stages
from svmattn.svm import gensvm
from svmattn.train import loop as train_lib
from svmattn.figures import lambda_head as figures

NAME = "lambda_head"
OBJECTS = figures.OBJECTS
# Tokens count as orthonormal when max |X_i X_i^T - I| <= this, per precision of the stored
# tokens (float32 rounding alone leaves about 1e-6).
ORTHONORMAL_ATOL = {np.dtype(np.float64): 1e-6, np.dtype(np.float32): 1e-4}
SHARED = ("X", "Z", "v", "Y")   # the same data sets at every lambda: written once
# Training health (``analysis.health``) without the "unsaturated" label: E6 studies multi-token
# selection (Gen-SVM; more tokens as lambda grows), where a softmax spread over several tokens is
# the expected outcome, not a run in progress; only "diverged" and "stalled" runs are labelled.
SATURATION = 0.0


@data_lib.host_sampler
def orthonormal_tokens(spec: data_lib.DataSpec, seed: int, runs: np.ndarray, head: heads.Head,
                       dtype=np.float64) -> tuple[np.ndarray, ...]:
  """E6's sampler (on the host, every run at once: ``data.datasets.host_sampler``): the T tokens of
  each sequence are the rows of a Haar-random d x T orthonormal frame (the Q factor, signs fixed by
  diag R > 0, of a Gaussian matrix: ``datasets.orthonormal_columns``), so X_i X_i^T = I; queries unit
  Gaussian (or x_{i,query_pos} for self-attention); labels +1 ("positive") or +-1 ("random"); head
  parameters unit Gaussian. Run r draws from split(data key of r, 4) = (kx, kz, ky, kv): the
  Gaussian matrices (n, d, T) from kx, the queries from kz, the labels from ky, the head from kv.
  (Numerics version 9; before, a compiled program per shape took the QR of XLA's LAPACK call.)"""
  n, T, d = spec.n, spec.T, spec.d
  if T > d:
    raise ValueError(f"orthonormal_tokens: need T <= d for orthonormal tokens, got T={T}, d={d}")
  counts = (n * d * T, n * d, n, data_lib.head_size(head, d))
  fx, fz, fy, fv = data_lib.flat_draws(counts, seed, runs, dtype)
  B = len(fx)
  X = np.swapaxes(data_lib.orthonormal_columns(fx.reshape(B, n, d, T)), -1, -2)   # (B, n, T, d)
  if spec.attention == "self":
    Z = X[:, :, spec.query_pos]
  else:
    Z = data_lib.unit_rows_host(fz.reshape(B, n, d))
  dt = np.dtype(dtype)
  Y = np.ones((B, n), dt) if spec.labels == "positive" else np.where(fy, 1.0, -1.0).astype(dt)
  return np.ascontiguousarray(X), Y, Z, data_lib.flat_head(fv, head, d)


def lams_of(fl: dict) -> list[float]:
  return [float(x) for x in fl.lams]


def dtype_of(fl: dict):
  return np.float32 if fl.precision == "float32" else np.float64


def load_data_file(path: str, dtype) -> data_lib.Dataset:
  """A --data file for E6 (raises ``data.datasets.DataError``): orthonormal tokens, v (B, d)."""
  data = data_lib.load_npz(path, dtype)
  B, _, T, d = data.X.shape
  gram = np.einsum("bntd,bnud->bntu", data.X, data.X)
  err = float(np.max(np.abs(gram - np.eye(T))))
  if data.v.shape != (B, d) or err > ORTHONORMAL_ATOL[np.dtype(dtype)]:
    raise data_lib.DataError(f"{path}: E6 needs orthonormal tokens (X_i X_i^T = I) and v of shape (B, d) = "
                             f"({B}, {d}); got v {data.v.shape}, max |X_i X_i^T - I| {err:.2g}")
  return data


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  """The E6 study of flag values ``fl`` (a dict as in summary.json "flags"): one cell per
  lambda of fl["lams"], each the same data sets (generated, or those of the file fl["data"];
  raises ``data.datasets.DataError`` for a bad one, ValueError for bad sizes)."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  dtype = dtype_of(fl)
  lams = lams_of(fl)
  if any(not np.isfinite(lam) or lam < 0 for lam in lams) or not lams:
    raise ValueError(f"lams must be finite numbers >= 0, got {fl.lams}")
  spec = data_lib.DataSpec(fl.n, fl.T, fl.d, labels="positive").validate()
  if spec.T > spec.d:
    raise ValueError(f"T={spec.T} must be <= d={spec.d} (orthonormal tokens)")
  if not 0 < fl.tau_L < fl.tau_H < 1:
    raise ValueError(f"need 0 < tau_L < tau_H < 1, got tau_L={fl.tau_L}, tau_H={fl.tau_H}")
  configs = {lam: train_lib.TrainConfig(param="W", head=heads.lambda_head(lam).name, lr=fl.lr, steps=fl.steps,
                                        snapshot_every=fl.snapshot_every,
                                        chunk_steps=fl.chunk_steps,
                                        numerics=fl.numerics, minibatch=fl.minibatch,
                                        sampling=fl.sampling).validate() for lam in lams}
  file_data = load_data_file(fl.data, dtype) if fl.data else None
  if file_data is not None:
    minibatch.check_loaded(fl, file_data.X.shape[1])
  runs = int(file_data.X.shape[0]) if file_data is not None else int(fl.runs)
  params = {"tau_L": np.asarray(float(fl.tau_L)), "tau_H": np.asarray(float(fl.tau_H)),
            "keep_intermediate": np.asarray(bool(fl.keep_intermediate))}

  def load(cell, runs):
    if file_data is not None:
      batch = data_lib.take(file_data, np.asarray(runs))
    else:
      batch = data_lib.generate_host(spec, fl.seed, runs, heads.lambda_head(cell.label["lam"]),
                                sampler=orthonormal_tokens, dtype=dtype)
    return {**{f: np.asarray(a) for f, a in batch._asdict().items()}, **params}

  cells = tuple(pipeline.Cell({"lam": lam}, runs) for lam in lams)
  return pipeline.Study(NAME, cells, load, lambda cell: (stages.Train("W", configs[cell.label["lam"]]),), analyze,
                        fl.batch_size, fl.seed, identity if identity is not None else fl,
                        light_analysis=True)


def analyze(label: dict, data: dict, trajs: dict) -> dict:
  """Per run at lambda = label["lam"]: final softmax, optimum s*, selected and predicted sets,
  the thresholds rule, Gen-SVM objects, final 1 - corr (NaN where not evaluated) and the training
  health (``analysis.health`` at threshold ``SATURATION`` = 0)."""
  lam = float(label["lam"])
  tau_L, tau_H = float(data["tau_L"]), float(data["tau_H"])
  keep_intermediate = bool(data["keep_intermediate"])
  tr = trajs["W"]
  atol = ORTHONORMAL_ATOL[np.asarray(data["X"]).dtype]
  X, Z, v = (np.asarray(data[k], np.float64) for k in ("X", "Z", "v"))
  s, W = np.asarray(tr["attention"], np.float64), np.asarray(tr["W"][:, -1], np.float64)
  B = len(X)
  rule = np.array([gensvm.discard_reason(s[b], tau_L, tau_H).split(":")[0] for b in range(B)], "<U12")
  res = [gensvm.gen_svm(X[b], Z[b], s[b], W[b], tau_L, tau_H, apply_discard=False) for b in range(B)]
  s_star = np.stack([gensvm.lambda_head_optimum(X[b], v[b], lam, atol=atol) for b in range(B)])
  st = gensvm.stack(res, X.shape[-1])
  usable = (rule == "") | ((rule == "intermediate") & keep_intermediate)
  kept = usable & (st["status"] == "optimal")     # the runs evaluated
  O = gensvm.selected_sets(s, tau_H)
  predicted = s_star > 0
  match = np.all(O == predicted, axis=-1)                                   # (B, n)
  gap = np.where(O, np.abs(s - s_star), 0.0).max(axis=(-2, -1))             # (B,) on the selected entries
  out = {"runs": np.asarray(data["runs"]), "attention": s, "s_star": s_star, "selected": O, "predicted": predicted,
         "match": match, "gap": gap, "status": st["status"].astype("<U10"), "rule": rule, "kept": kept,
         "C": st["C"], "max_masked": st["max_masked"], "W_gd": W}
  for obj, key in (("svmeq", "W_svmeq"), ("mm", "W_mm"), ("1token", "W_1token")):
    out[f"W_{obj}"] = st[key]
    out[f"final_{obj}"] = np.where(kept, 1 - metrics.corr(W, st[key]), np.nan)  # NaN where not evaluated
  out.update(X=X, Z=Z, v=v, Y=np.asarray(data["Y"], np.float64))
  out["health"] = health.of_trajectory(tr, SATURATION)
  out["stalled_step"] = np.asarray(tr["stalled_step"])
  return out


stats = metrics.quantile_stats


def reduce(fl: dict, cells: list) -> tuple[dict, dict, list]:
  """(results.npz arrays, summary, per-lambda arrays) from the per-run arrays of every cell
  (one per lambda, in the order of fl["lams"])."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  lams = lams_of(fl)
  per = []
  for cell in cells:
    p = dict(cell)
    for key in ("rule", "status"):   # the dtype of a list of the names, as the previous binary wrote it
      p[key] = np.array(p[key].tolist())
    per.append(p)
  runs = per[0]["runs"]
  arrays = {"lams": np.array(lams), "runs": runs}
  for i, p in enumerate(per):
    for k, v in p.items():
      if k == "runs" or (k in SHARED and i > 0):
        continue
      arrays[k if k in SHARED else f"{k}_l{i}"] = v
  T = int(fl.T)
  summary = {"experiment": "E6 lambda head (orthonormal tokens, Y=+1)", "numerics": fl.numerics,
             "shape": {"n": fl.n, "T": fl.T, "d": fl.d}, "data_sets": len(runs),
             "lambda_index": {f"l{i}": lam for i, lam in enumerate(lams)}, "per_lambda": {}}
  for lam, p in zip(lams, per):
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
        "selected_histogram": {str(k): int(np.sum(sizes == k)) for k in range(1, T + 1)},
        "match_predicted_evaluated": float(p["match"][kept].mean()) if kept.any() else None,
        "match_predicted_all": float(p["match"].mean()),
        "median_gap_to_optimum_evaluated": stats(p["gap"][kept])["median"],
        "final_one_minus_corr": {obj: stats(p[f"final_{obj}"][kept]) for obj in OBJECTS},
    }
  summary["health"] = health.summary(arrays)     # {l<i>: counts} (health_l<i> of lambda_index l<i>)
  summary["saturation_threshold"] = SATURATION
  summary["checks"] = checks(summary, lams)
  return arrays, summary, per


def checks(summary: dict, lams) -> list:
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


def report(summary: dict, fl: dict) -> list[str]:
  """The terminal lines of a finished run (the checks and the wall times follow)."""
  lines = [f"E6 lambda head: {summary['data_sets']} data sets per lambda; final 1 - corr(W_GD, .) medians over "
           f"evaluated runs (--keep_intermediate={fl.keep_intermediate})"]
  for lam in lams_of(fl):
    p = summary["per_lambda"][repr(lam)]
    f = p["final_one_minus_corr"]
    med = "  ".join(f"{o} {f[o]['median']:.2e}" if f[o]["median"] is not None else f"{o} -" for o in OBJECTS)
    r = p["thresholds_rule"]
    m = p["match_predicted_evaluated"]
    lines.append(f"  lambda={lam:<5g} |O_i| {p['mean_selected_all_runs']:.2f} (pred {p['mean_predicted']:.2f}, "
                 f"match {'-' if m is None else format(m, '.2f')})  rule: kept {r['kept']} interm. "
                 f"{r['intermediate']} finite {r['finite']}; evaluated {p['evaluated']}  {med}")
  return lines


def key_numbers(summary: dict) -> list:
  """The mean number of tokens selected per sequence (all runs) at every lambda."""
  return [(f"mean tokens selected, lambda={summary['lambda_index'][f'l{i}']:g}", p["mean_selected_all_runs"])
          for i, p in enumerate(summary["per_lambda"].values())]


SETTINGS = (common.base(runs=100) + common.pipeline(batch_size=1000) + common.numerics() + F.Settings((
    F.List("lams", (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5), "Values of lambda in h(r) = v^T r - lambda ||r||^2.", item=float,
                check=allowed.float_list(minimum=0.0, strict=False)),
    F.Int("n", 3, "Sequences per data set.", lower=1),
    F.Int("T", 4, "Tokens per sequence (T <= d: orthonormal tokens).", lower=2),
    F.Int("d", 8, "Embedding dimension.", lower=1),
    F.Int("steps", 2001, "Normalized GD steps.", lower=0),
    F.Float("lr", 0.1, "Learning rate.", check=allowed.positive),
    F.Int("snapshot_every", 100, "Snapshot W every this many steps.", lower=1),
    F.Int("chunk_steps", 1000, "Steps per jitted chunk (one checkpoint each).", lower=1),
    F.Float("tau_L", gensvm.TAU_L, "Lower softmax threshold of the discard rule."),
    F.Float("tau_H", gensvm.TAU_H, "Selection threshold: O_i = {t: s_it >= tau_H}."),
    F.Bool("keep_intermediate", True, "Evaluate Gen-SVM also on runs the thresholds rule discards as "
           "'intermediate' (some s_it in (tau_L, tau_H]); their count is reported either way. Runs "
           "discarded as 'finite' (nothing masked) are never evaluated."),
), (F.Rule(("T", "d"), lambda v: None if v["T"] <= v["d"] else "--T must be <= --d (orthonormal tokens)"),
    F.Rule(("tau_L", "tau_H"), lambda v: None if 0 < v["tau_L"] < v["tau_H"] < 1
           else "need 0 < --tau_L < --tau_H < 1"))) + minibatch.settings())

EXPERIMENT = registry.Experiment(
    id="E6", name=NAME, title="Lambda head: tokens selected vs lambda",
    cost_s=6,
    claim="With the head v^T r - lambda ||r||^2, attention selects more tokens per sequence as lambda grows, "
          "and W^SVMeq describes GD better than W^mm or W^1token.",
    settings=SETTINGS, quick={"runs": 20, "lams": [0.0, 0.1, 0.2, 0.4, 0.75, 1.5]},
    key_numbers=key_numbers, figures=figures.draw, report=report)
