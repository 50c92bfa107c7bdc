"""E5: multi-token selection with a ReLU head, and the general SVM equivalence (docs/science.md sections 6, 8).

Head h(r) = 1^T ReLU(V^T r), V Gaussian with ||V||_F = 1; n sequences of T unit tokens,
unit queries, labels +-1; W trained by normalized GD from the uniform initialization.

One cell per d (``{"d": d}``): its runs are the draws 0, 1, ... of that d (data set r from
fold_in(PRNGKey(seed), r)), at most ``max_draws`` of them, analyzed in run order until
``runs`` of them are KEPT (``Study.enough``):
  skipped    no negative label (the authors' rule: with only Y = +1 the convex head
             selects one token per sequence); not trained
  discarded  by the Gen-SVM thresholds rule on the final softmax (some s_it in
             (tau_L, tau_H], or no s_it <= tau_L), or an SVM that is infeasible/failed
The reduction keeps the first ``runs`` kept draws in run order: a draw's outcome does not
depend on the batch it ran in, so neither does the kept set. With a data file (fl["data"])
the cell is the file's d and its rows are the draws.

Per kept run: W^fin, W^mm, W^SVMeq = W^fin + C W^mm (C fitted to the FINAL W_GD) and
W^1token = Att-SVM(argmax s) from the FINAL softmax, and 1 - corr(W(k), object) at every
snapshot k against these final-step objects (as in the authors' notebook).

A sequence is "dead" when every ReLU unit is off at its final pooled token (h = 0 there,
a minimum for Y = -1): its gradient vanishes and the margins W^mm asks of its masked
tokens stop growing, so W^SVMeq mispredicts W_GD by a constant; the summary reports such
runs apart.

``fl`` below is a dict of the experiment's settings (``SETTINGS``: the binary's flags or a config's
fields), or the "flags" of its summary.json: replay rebuilds the same study from it.
"""
from __future__ import annotations

import dataclasses

from absl import logging
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
from svmattn.figures import multi_token as figures

NAME = "multi_token"
OBJECTS = figures.OBJECTS
# Outcome of a trained draw; "skipped" for a draw without a negative label (not trained).
OUTCOMES = ("kept", "intermediate", "finite", "infeasible", "failed")
OUTCOME_DTYPE = "<U12"
# The per-kept-run arrays of results.npz (``<key>_d<d>``), in the order they are written.
KEPT_KEYS = ("runs", "W_gd", "attention", "selected", "C", "max_masked", "fin_residual", "mm_min_margin",
             "W_svmeq", "corr_svmeq", "W_mm", "corr_mm", "W_1token", "corr_1token", "W_fin", "dead", "Y", "V",
             "X", "Z")
# Training health (``analysis.health``) without the "unsaturated" label: E5 studies multi-token
# selection (Gen-SVM), where a softmax spread over several tokens is the expected outcome, not a
# run in progress; only "diverged" and "stalled" runs are labelled.
SATURATION = 0.0
CORR_REFERENCE = ("1 - corr(W(k), X) at every snapshot k against the Gen-SVM objects of the FINAL softmax and W "
                  "(as the authors do); figures show median and quartiles (the authors plot the mean)")


def dtype_of(fl: dict):
  return np.float32 if fl.precision == "float32" else np.float64


def config(fl: dict) -> train_lib.TrainConfig:
  return train_lib.TrainConfig(param="W", head=heads.RELU.name, lr=fl.lr, steps=fl.steps,
                               snapshot_every=fl.snapshot_every, chunk_steps=fl.chunk_steps,
                               numerics=fl.numerics, minibatch=fl.minibatch,
                               sampling=fl.sampling).validate()


def snapshot_steps(fl: dict) -> np.ndarray:
  return train_lib.snapshot_steps(train_lib.schedule(fl.steps, fl.snapshot_every, fl.chunk_steps))


def has_negative_label(Y) -> np.ndarray:
  """(B,) the draws that are trained: some Y_i = -1."""
  return np.any(np.asarray(Y) < 0, axis=1)


def load_data_file(path: str, dtype) -> data_lib.Dataset:
  """A --data file for E5 (raises ``data.datasets.DataError``): the ReLU head needs V (B, d, d)."""
  data = data_lib.load_npz(path, dtype)
  d = data.X.shape[-1]
  if data.v.shape[1:] != (d, d):
    raise data_lib.DataError(f"{path}: the ReLU head needs v of shape (B, d, d) = (B, {d}, {d}) (the matrix V), "
                             f"got {data.v.shape}")
  return data


@dataclasses.dataclass(frozen=True)
class TrainNegative(stages.Train):
  """``stages.Train`` on the draws with a negative label only (the others are skipped):
  every array has the batch's leading axis B, NaN / 0 / False in the rows of skipped draws.
  A draw's trajectory does not depend on the others trained with it (``train.loop``)."""

  def run(self, batch: dict, runs: np.ndarray, seed: int, progress, checkpoints):
    data = self.dataset(batch)
    runs = np.asarray(runs)
    B = len(runs)
    mask = has_negative_label(data.Y)
    if not mask.any():   # nothing to train: the arrays of B skipped draws
      if progress is not None:
        progress(self.steps)
      c = self.config
      steps = train_lib.config_snapshot_steps(c)
      n, T, d = data.X.shape[1:]
      f = data.X.dtype
      return {"W": np.full((B, len(steps), d, d), np.nan, f), "max_prob": np.full((B, len(steps)), np.nan, f),
              "loss": np.full((B, len(steps)), np.nan, f), "attention": np.full((B, n, T), np.nan, f),
              "selected": np.zeros((B, n), np.int64), "finite": np.zeros(B, bool), "steps": steps,
              "stalled_step": np.full(B, -1, np.int64)}, 0.0
    traj = train_lib.train(self.config, data_lib.take(data, mask), train_lib.init_keys(seed, runs[mask]), progress,
                           checkpoints)
    arrays = {"W": traj.W, "max_prob": traj.max_prob, "loss": traj.loss, "attention": traj.attention,
              "selected": traj.selected, "finite": traj.finite}
    out, trained = {}, np.flatnonzero(mask)
    for key, a in arrays.items():
      a = np.asarray(a)
      if len(trained) == B:             # every draw trained: the arrays as they are (in C order, as below)
        out[key] = np.ascontiguousarray(a)
        continue
      full = np.empty((B,) + a.shape[1:], a.dtype)
      full[np.flatnonzero(~mask)] = np.nan if np.issubdtype(a.dtype, np.floating) else 0
      full[trained] = a
      out[key] = full
    out["steps"] = traj.steps
    out["stalled_step"] = np.full(B, -1, np.int64)        # -1 (never stalled) for the skipped draws
    out["stalled_step"][mask] = health.stalled_step(traj.W, traj.loss, traj.steps)
    return out, traj.compile_seconds


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  """The E5 study of flag values ``fl`` (a dict as in summary.json "flags"): one cell per d of
  fl["ds"], or the d of the data file fl["data"] (raises ``data.datasets.DataError`` for a bad one)."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  dtype = dtype_of(fl)
  cfg = config(fl)
  if not 0 < fl.tau_L < fl.tau_H < 1:
    raise ValueError(f"need 0 < tau_L < tau_H < 1, got tau_L={fl.tau_L}, tau_H={fl.tau_H}")
  file_data = load_data_file(fl.data, dtype) if fl.data else None
  if file_data is not None:
    minibatch.check_loaded(fl, file_data.X.shape[1])
    cells = (pipeline.Cell({"d": int(file_data.X.shape[-1])}, int(file_data.X.shape[0])),)
    want = min(int(fl.runs), int(has_negative_label(file_data.Y).sum()))
  else:
    cells = tuple(pipeline.Cell({"d": int(d)}, int(fl.max_draws)) for d in fl.ds)
    want = int(fl.runs)
    for cell in cells:
      data_lib.DataSpec(fl.n, fl.T, cell.label["d"]).validate()
  taus = {"tau_L": np.asarray(float(fl.tau_L)), "tau_H": np.asarray(float(fl.tau_H))}

  def load(cell, runs):
    if file_data is not None:
      batch = data_lib.take(file_data, np.asarray(runs))
    else:
      spec = data_lib.DataSpec(fl.n, fl.T, cell.label["d"]).validate()
      batch = data_lib.generate_host(spec, fl.seed, runs, heads.RELU, dtype=dtype)
    return {**{f: np.asarray(a) for f, a in batch._asdict().items()}, **taus}

  def enough(label, arrays):
    return int(np.sum(arrays["outcome"] == "kept")) >= want

  return pipeline.Study(NAME, cells, load, lambda cell: (TrainNegative("W", cfg),), analyze,
                        fl.batch_size, fl.seed, identity if identity is not None else fl, enough)


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


def analyze(label: dict, data: dict, trajs: dict) -> dict:
  """Per draw of the batch: its outcome ("skipped" or one of ``OUTCOMES``), the Gen-SVM objects
  and 1 - corr curves (NaN where not solved), dead sequences, the data set and the training
  health (``analysis.health`` at threshold ``SATURATION`` = 0; "skipped" for a skipped draw)."""
  tau_L, tau_H = float(data["tau_L"]), float(data["tau_H"])
  X, Y, Z, V = (np.asarray(data[k]) for k in ("X", "Y", "Z", "v"))
  B, n, T, d = X.shape
  tr = trajs["W"]
  W_traj = np.asarray(tr["W"])
  s = np.asarray(tr["attention"], np.float64)
  W_final = np.asarray(W_traj[:, -1], np.float64)
  X64, Z64 = np.asarray(X, np.float64), np.asarray(Z, np.float64)
  candidate = has_negative_label(Y)
  outcomes = np.full(B, "skipped", OUTCOME_DTYPE)
  finite = np.all(np.isfinite(W_final), axis=(1, 2)) & np.all(np.isfinite(s), axis=(1, 2))
  solve = np.flatnonzero(candidate & finite)
  solved = dict(zip(solve, gensvm.gen_svm_many(X64[solve], Z64[solve], s[solve], W_final[solve], tau_L, tau_H)))
  res = []
  for b in range(B):
    if not candidate[b]:
      r = gensvm.GenSVMResult("skipped", "no negative label", np.zeros((n, T), bool), np.zeros(n, int))
    elif not finite[b]:
      r = gensvm.GenSVMResult("failed", "training diverged (non-finite W or softmax)", np.zeros((n, T), bool),
                              np.zeros(n, int))
    else:
      r = solved[b]
    if candidate[b]:
      outcomes[b] = outcome(r)
    res.append(r)
  st = gensvm.stack(res, d)
  out = {"runs": np.asarray(data["runs"]), "outcome": outcomes, "W_gd": W_traj[:, -1], "attention": s,
         "selected": st["selected"], "C": st["C"], "max_masked": st["max_masked"],
         "fin_residual": st["fin_residual"], "mm_min_margin": st["mm_min_margin"]}
  for obj, key in (("svmeq", "W_svmeq"), ("mm", "W_mm"), ("1token", "W_1token")):
    out[f"W_{obj}"] = st[key]
    out[f"corr_{obj}"] = metrics.corr_per_run(W_traj, st[key])
  out["W_fin"] = st["W_fin"]
  with np.errstate(invalid="ignore"):
    out["dead"] = dead_sequences(X, V, s)
  out.update(Y=Y, V=V, X=X, Z=Z)
  out["health"] = np.where(candidate, health.of_trajectory(tr, SATURATION), "skipped").astype("<U11")
  out["stalled_step"] = np.asarray(tr["stalled_step"])
  return out


stats = metrics.quantile_stats


def norm_stats(x):
  """median and 10th / 90th percentiles of the final ||W_GD||_F over the kept runs."""
  x = np.asarray(x, np.float64)
  x = x[np.isfinite(x)]
  if not x.size:
    return {"median": None, "p10": None, "p90": None}
  p10, med, p90 = np.percentile(x, [10, 50, 90])
  return {"median": float(med), "p10": float(p10), "p90": float(p90)}


def _no_kept_runs(n, T, d, S) -> dict:
  """The arrays of a d without kept runs (the shapes the previous binary wrote)."""
  return {"runs": np.array([], int), "W_gd": np.zeros((0, d, d)), "attention": np.zeros((0, n, T)),
          "selected": np.zeros((0,), bool), "C": np.zeros(0), "max_masked": np.zeros(0),
          "fin_residual": np.zeros(0), "mm_min_margin": np.zeros(0),
          **{f"W_{obj}": np.full((0, d, d), np.nan) for obj in OBJECTS}, "W_fin": np.full((0, d, d), np.nan),
          **{f"corr_{obj}": np.zeros((0, S)) for obj in OBJECTS}, "dead": np.zeros((0, n), bool),
          "Y": np.zeros((0, n)), "V": np.zeros((0, d, d)), "X": np.zeros((0, n, T, d)), "Z": np.zeros((0, n, d))}


def reduce_cell(fl: dict, arrays: dict, S: int) -> tuple[dict, dict, dict]:
  """(the kept runs' arrays, counts, (trained runs, their outcomes and health)) of one d from the per-draw
  arrays of its analyzed draws (run order): the first ``runs`` kept draws; the counts cover the
  draws up to the last kept one (all analyzed draws if fewer were kept)."""
  runs, outcomes = np.asarray(arrays["runs"]), np.asarray(arrays["outcome"])
  candidate = outcomes != "skipped"
  want = int(fl.runs)
  if fl.data:
    want = min(want, int(candidate.sum()))
  kept = np.flatnonzero(outcomes == "kept")[:want]
  cutoff = int(runs[kept[-1]]) + 1 if len(kept) == want and len(kept) else len(runs)
  in_range = runs < cutoff
  trained = candidate & in_range
  counts = {"drawn": int(cutoff), "skipped_no_negative_label": int(np.sum(~candidate & in_range)),
            "trained": int(trained.sum())}
  counts.update({o: int(np.sum(outcomes[trained] == o)) for o in OUTCOMES})
  n, T, d = arrays["X"].shape[1:]
  if len(kept):
    out = {k: arrays[k][kept] for k in KEPT_KEYS}
  else:
    out = _no_kept_runs(n, T, d, S)
  # the dtype of a list of the outcome names, as the previous binary wrote it
  trained_outcome = np.array(outcomes[trained].tolist())
  health_ = {}
  if "health" in arrays:   # (a per-draw record written before the health labels has none)
    health_ = {k: np.asarray(arrays[k])[trained] for k in ("health", "stalled_step")}
  return out, counts, {"runs": runs[trained], "outcome": trained_outcome, "want": want, **health_}


def reduce(fl: dict, cells: list) -> tuple[dict, dict]:
  """(results.npz arrays, summary) from the per-draw arrays of every cell (one per d)."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  steps = snapshot_steps(fl)
  ds = [int(c["X"].shape[-1]) for c in cells]
  n, T = int(fl.n), int(fl.T)
  arrays = {"steps": steps, "ds": np.array(ds)}
  summary = {"experiment": "E5 multi-token selection (ReLU head, Gen-SVM)", "numerics": fl.numerics,
             "shape": {"n": n, "T": T, "ds": ds},
             "per_d": {}, "corr_reference": CORR_REFERENCE}
  for d, cell in zip(ds, cells):
    a, counts, trained = reduce_cell(fl, cell, len(steps))
    for k, v in a.items():
      arrays[f"{k}_d{d}"] = v
    arrays[f"trained_runs_d{d}"], arrays[f"trained_outcome_d{d}"] = trained["runs"], trained["outcome"]
    if "health" in trained:
      arrays[f"health_d{d}"], arrays[f"stalled_step_d{d}"] = trained["health"], trained["stalled_step"]
    K = len(a["runs"])
    final = {obj: 1 - a[f"corr_{obj}"][:, -1] for obj in OBJECTS}
    sizes = a["selected"].sum(-1) if K else np.zeros((0, n))
    multi = np.any(sizes > 1, axis=1)
    dead = np.any(a["dead"], axis=1)
    summary["per_d"][str(d)] = {
        "counts": counts, "kept": K, "wanted": trained["want"],
        "final_one_minus_corr": {obj: stats(final[obj]) for obj in OBJECTS},
        "selected_per_sequence": {str(k): int(np.sum(sizes == k)) for k in range(1, T + 1)},
        "multi_token_runs": int(multi.sum()),
        "multi_token_runs_with_negative_label": int(np.sum(np.any((sizes > 1) & (a["Y"] < 0), axis=1))),
        "final_one_minus_corr_svmeq_multi_token_runs": stats(final["svmeq"][multi]),
        "final_one_minus_corr_svmeq_single_token_runs": stats(final["svmeq"][~multi]),
        "runs_with_dead_sequence": int(dead.sum()),
        "final_one_minus_corr_svmeq_all_live_runs": stats(final["svmeq"][~dead]),
        "final_one_minus_corr_svmeq_dead_runs": stats(final["svmeq"][dead]),
        "final_W_norm": norm_stats(np.linalg.norm(a["W_gd"].reshape(K, -1), axis=-1) if K else np.zeros(0)),
        "median_C": stats(a["C"])["median"],
        "max_fin_residual": float(np.nanmax(a["fin_residual"])) if K else None,
        "min_mm_margin": float(np.nanmin(a["mm_min_margin"])) if np.any(np.isfinite(a["mm_min_margin"])) else None,
    }
  summary["health"] = health.summary(arrays)                # {d<d>: counts} over the trained draws
  summary["saturation_threshold"] = SATURATION
  summary["checks"] = checks(fl, summary, ds)
  return arrays, summary


def checks(fl: dict, summary: dict, ds) -> list:
  out = []
  for d in ds:
    per = summary["per_d"][str(d)]
    med = {obj: per["final_one_minus_corr"][obj]["median"] for obj in OBJECTS}
    out.append({"name": f"d={d}: kept runs", "value": per["kept"], "expected": f"{fl.runs} (--runs)",
                "ok": per["kept"] == fl.runs})
    if med["svmeq"] is None:
      continue
    for other in ("mm", "1token"):
      out.append({"name": f"d={d}: median final 1-corr, W^SVMeq vs W^{other}",
                  "value": f"{med['svmeq']:.3g} vs {med[other]:.3g}",
                  "expected": f"W^SVMeq below W^{other}", "ok": bool(med["svmeq"] < med[other])})
    if d >= 6:
      out.append({"name": f"d={d}: median final 1-corr(W_GD, W^SVMeq) after {fl.steps} steps",
                  "value": med["svmeq"],
                  "expected": f"<= {fl.target:g} (paper: ~2e-3 at d=6,8,10 after 2001 steps)",
                  "ok": bool(med["svmeq"] <= fl.target)})
  return out


def _fmt(x):
  return "-" if x is None else format(x, ".2e")


def report(summary: dict, fl: dict) -> list[str]:
  """The terminal lines of a finished run (the checks and the wall times follow); warns on stderr
  about a d that kept fewer than --runs runs."""
  ds = summary["shape"]["ds"]
  for d in ds:
    per = summary["per_d"][str(d)]
    if per["kept"] < per["wanted"]:
      logging.warning("d=%d: only %d of %d runs kept after %d draws (--max_draws)", d, per["kept"],
                      per["wanted"], per["counts"]["drawn"])
  lines = [f"E5 multi-token selection (ReLU head, {summary['numerics']} numerics): final 1 - corr(W_GD, .) over "
           "kept runs, median [mean]; upper quartile of W^SVMeq; final ||W||_F median (10th-90th pct)"]
  for d in ds:
    per = summary["per_d"][str(d)]
    f = per["final_one_minus_corr"]
    c = per["counts"]
    parts = "  ".join(f"{obj} {f[obj]['median']:.2e} [{f[obj]['mean']:.2e}]" if f[obj]["median"] is not None
                      else f"{obj} -" for obj in OBJECTS)
    q75, wn = f["svmeq"]["q75"], per["final_W_norm"]
    norm = f"{wn['median']:.1f} ({wn['p10']:.0f}-{wn['p90']:.0f})" if wn["median"] is not None else "-"
    lines.append(f"  d={d:<3} kept {per['kept']:4d}  {parts}  svmeq q75 {_fmt(q75)}  ||W|| {norm}")
    mt = per["final_one_minus_corr_svmeq_multi_token_runs"]["median"]
    st = per["final_one_minus_corr_svmeq_single_token_runs"]["median"]
    lines.append(f"         drawn {c['drawn']} skipped {c['skipped_no_negative_label']} discarded: intermediate "
                 f"{c['intermediate']} finite {c['finite']} infeasible {c['infeasible']} failed {c['failed']}; "
                 f"multi-token runs {per['multi_token_runs']} (svmeq median {_fmt(mt)}; single-token runs "
                 f"{_fmt(st)}); runs with a dead sequence {per['runs_with_dead_sequence']} (svmeq median "
                 f"{_fmt(per['final_one_minus_corr_svmeq_dead_runs']['median'])}; all live "
                 f"{_fmt(per['final_one_minus_corr_svmeq_all_live_runs']['median'])})")
  return lines


def prepare(fl: dict, study: pipeline.Study) -> None:
  """With --data the file's d replaces --ds: say so."""
  ds = [c.label["d"] for c in study.cells]
  if fl.data and [int(x) for x in fl.ds] != ds:
    logging.warning("--data: using d=%d of the data file instead of --ds=%s", ds[0], ",".join(map(str, fl.ds)))


def key_numbers(summary: dict) -> list:
  """The median final 1 - corr(W_GD, W^SVMeq) of every d >= 6 (the d a check holds to --target)."""
  out = []
  for d in summary["shape"]["ds"]:
    median = summary["per_d"][str(d)]["final_one_minus_corr"]["svmeq"]["median"]
    if d >= 6 and median is not None:
      out.append((f"median 1 - corr(W, W^SVMeq), d={d}", median))
  return out


SETTINGS = (common.base(runs=500) + common.pipeline(batch_size=1000, hosts=False) + common.numerics()
            + F.Settings((
                F.List("ds", (4, 6, 8, 10), "Embedding dimensions d.", item=int,
                            check=allowed.int_list(minimum=1)),
                F.Int("n", 3, "Sequences per data set.", lower=1),
                F.Int("T", 4, "Tokens per sequence.", lower=2),
                F.Int("steps", 2001, "Normalized GD steps.", lower=0),
                F.Float("lr", 0.1, "Learning rate.", check=allowed.positive),
                F.Int("snapshot_every", 100, "Snapshot W every this many steps.", lower=1),
                F.Int("chunk_steps", 1000, "Steps per jitted chunk (one checkpoint each).", lower=1),
                F.Int("max_draws", 200_000, "Give up on a d after drawing this many data sets.", lower=1),
                F.Float("tau_L", gensvm.TAU_L, "Lower softmax threshold of the discard rule."),
                F.Float("tau_H", gensvm.TAU_H, "Selection threshold: O_i = {t: s_it >= tau_H}."),
                F.Float("target", 3e-3, "Threshold of a check: the median final 1 - corr(W_GD, W^SVMeq) over the "
                        "kept runs of every d >= 6 must be at most this (the paper reports about 2e-3 at d = 6, 8, "
                        "10 after 2001 steps).", check=allowed.positive),
            ), (F.Rule(("tau_L", "tau_H"), lambda v: None if 0 < v["tau_L"] < v["tau_H"] < 1
                       else "need 0 < --tau_L < --tau_H < 1"),)) + minibatch.settings())

EXPERIMENT = registry.Experiment(
    id="E5", name=NAME, title="Multi-token selection with a ReLU head (Gen-SVM)",
    cost_s=47,
    claim="With a ReLU head attention selects several tokens per sequence, and GD follows the Gen-SVM "
          "W^SVMeq = W^fin + C W^mm more closely than the single-token W^mm or W^1token.",
    settings=SETTINGS, quick={"runs": 20, "batch_size": 500},
    variants=(registry.Variant("authors", "Multi-token selection, the authors' numerics (g / (||g|| + eps), X^T s)",
                               {"numerics": "authors"}, cost_s=46),),
    key_numbers=key_numbers, figures=figures.draw, report=report, prepare=prepare)
