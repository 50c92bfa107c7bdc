"""E16: stochastic and adaptive optimizers, step sizes and rates, checked first on a linear
classifier (docs/science.md section 19), as a study.

A grid of cells over ``models`` x ``minibatches``: the linear-classifier control ("linear":
binary logistic regression, "linear_mc": k-class softmax regression; ``data.linear``) and
attention on E2's data sets ("W", "KQ"). In every cell one training stage per entry of
``optimizers``: an optimizer name of ``optim.optimizers.get_optimizer``, optionally with its own
step size as NAME:LR (e.g. gd:16, a large constant step; polyak:1000, the Polyak step capped at
1000); the others take ``lr``. Every stage of a cell trains the same data sets.

The host analysis, per run and stage: the max-margin problem in every norm of the model's
``NORMS`` (linear: ``svm.linear_margin`` per data set; attention: Att-SVM at the tokens the run
selected, ``svm.att_svm``); per snapshot corr(W, W^mm_N) and the normalized-margin gap
(``analysis.rates``) in each norm; the norm whose solution the run ends nearest to (largest final
corr); in the stage's target norm (``target_norm``: the theorem's norm for the optimizer) the
log-log slopes of the gap and of 1 - corr over the last ``1 - fit_from`` of the run; and the end
of the oscillating phase (the last snapshot at which the loss rose).

The summary holds, per cell and stage, the nearest-norm counts, mean final corr and median final
gap in the target norm, the slopes' mean with a 95% interval over data sets, and the oscillation
ends; ``questions`` gathers the five numbers the issue asks (see ``report``).
"""
from __future__ import annotations

import functools

import numpy as np

from svmattn import registry
from svmattn.analysis import health
from svmattn.analysis import metrics
from svmattn.analysis import rates
from svmattn.config import allowed
from svmattn.config import common
from svmattn.config import fields as F
from svmattn.data import datasets as data_lib
from svmattn.data import linear as linear_data
from svmattn.figures import optimizer_rates as figures
from svmattn.optim import optimizers
from svmattn.execution import pipeline
from svmattn.execution import stages
from svmattn.execution import sweep as sweep_lib
from svmattn.studies import local_convergence
from svmattn.svm import att_svm as svm_lib
from svmattn.svm import linear_margin
from svmattn.train import loop as train_lib

NAME = "optimizer_rates"
MODELS = ("linear", "linear_mc", "W", "KQ")
# The norms whose max-margin problem every run is compared with, per model.
NORMS = {"linear": ("l2", "linf"), "linear_mc": ("fro", "linf", "spectral"),
         "W": ("fro", "linf", "spectral"), "KQ": ("nuc", "fro", "linf")}


def parse_entry(entry: str, lr: float) -> tuple[str, str, float]:
  """(stage name, optimizer, step size) of an ``optimizers`` entry NAME or NAME:LR."""
  name, sep, text = str(entry).partition(":")
  if not sep:
    return name, name, float(lr)
  step = float(text)
  return f"{name}_lr{step:g}", name, step


def _core(optimizer: str) -> str:
  """The direction of an optimizer name: without its schedule and momentum."""
  core = optimizer.split("@", 1)[0]
  return core.split("+", 1)[0]


def target_norm(model: str, optimizer: str) -> str | None:
  """The norm of the max-margin solution the optimizer is predicted to reach on the model (None:
  no prediction). Linear control and W: l2 / Frobenius for GD, normalized GD and the Polyak step
  (with momentum or a schedule), l_inf for sign descent, Signum and Adam (full batch), spectral for
  spectral descent and Muon. (K,Q): the nuclear norm for the GD family (the paper's (K,Q) result),
  no prediction for the others."""
  core = _core(optimizer)
  l2 = "l2" if model == "linear" else "fro"
  if core in ("gd", "normalized_gd", "ngd", "sd_l2", "polyak"):
    return "nuc" if model == "KQ" else l2
  if model == "KQ":
    return None
  if core in ("sign_gd", "sd_linf", "adam") or core.startswith("signum"):
    return "linf"
  if core in ("sd_spectral", "sd_spectral_ns", "muon"):
    return l2 if model == "linear" else "spectral"    # a vector's spectral norm is its l2 norm
  return None


def cells(fl: dict) -> tuple:
  return tuple(pipeline.Cell(label, int(fl.runs))
               for label in sweep_lib.grid({"model": list(fl.models), "minibatch": [int(b) for b in fl.minibatches]}))


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  spec = data_lib.DataSpec(fl.n, fl.T, fl.d).validate()
  attention = local_convergence.batches(spec, fl.seed)
  entries = [parse_entry(e, fl.lr) for e in fl.optimizers]

  def load(cell, runs):
    model = cell.label["model"]
    if model == "linear":
      data = linear_data.binary(fl.seed, runs, fl.linear_n, fl.linear_d, fl.linear_margin)
    elif model == "linear_mc":
      data = linear_data.multiclass(fl.seed, runs, fl.linear_n, fl.linear_d, fl.linear_k,
                                    fl.linear_margin)
    else:
      return attention(runs)
    return {"X": data.X, "y": data.y}

  def stages_of(cell):
    model, mb = cell.label["model"], int(cell.label["minibatch"])
    if model in ("linear", "linear_mc"):
      return tuple(stages.LinearTrain(name, opt, step, fl.linear_steps, fl.linear_every,
                                      fl.linear_k if model == "linear_mc" else 0, mb, fl.sampling,
                                      fl.block_size) for name, opt, step in entries)
    return tuple(stages.Train(name, train_lib.TrainConfig(
        param=model, optimizer=opt, lr=step, steps=fl.steps, snapshot_every=fl.snapshot_every,
        chunk_steps=fl.chunk_steps, block_size=fl.block_size, minibatch=mb,
        sampling=fl.sampling).validate()) for name, opt, step in entries)

  return pipeline.Study(NAME, cells(fl), load, stages_of,
                        functools.partial(analyze, fit_from=fl.fit_from, k=fl.linear_k,
                                          saturation=fl.saturation),
                        fl.batch_size, fl.seed, identity if identity is not None else fl)


def _solve_linear(X, y, model: str, k: int) -> dict:
  """{norm: [MarginResult per data set]}."""
  out = {}
  for norm in NORMS[model]:
    if model == "linear":
      out[norm] = [linear_margin.solve_binary(X[b], y[b], norm) for b in range(len(X))]
    else:
      out[norm] = [linear_margin.solve_multiclass(X[b], y[b], k, norm) for b in range(len(X))]
  return out


def _linear_margins(W: np.ndarray, X: np.ndarray, y: np.ndarray, model: str) -> np.ndarray:
  """(S,) the smallest margin of each snapshot W (S, 1, d) or (S, k, d) on one data set."""
  if model == "linear":
    return np.min(y[None, :] * np.einsum("sd,nd->sn", W[:, 0], X), axis=1)
  S = np.einsum("skd,nd->snk", W, X)                    # (S, n, k)
  own = np.take_along_axis(S, np.broadcast_to(y[None, :, None], S.shape[:2] + (1,)), axis=2)
  diff = own - S
  diff[:, np.arange(len(y)), y] = np.inf
  return np.min(diff.reshape(len(W), -1), axis=1)


def analyze(label: dict, data: dict, trajs: dict, fit_from: float = 0.1, k: int = 3,
            saturation: float = health.SATURATION) -> dict:
  """Per run and stage: health, per-norm SVM status, corr and gap per snapshot, the nearest norm,
  the slopes in the target norm and the end of the oscillating phase (module docstring)."""
  model = label["model"]
  norms = NORMS[model]
  X = np.asarray(data["X"], np.float64)
  B = len(X)
  out = {"runs": np.asarray(data["runs"])}
  linear = model in ("linear", "linear_mc")
  if linear:
    y = np.asarray(data["y"])
    solved_linear = _solve_linear(X, y if model == "linear_mc" else y.astype(np.float64), model, k)
  else:
    Z = np.asarray(data["Z"], np.float64)
    solved = svm_lib.at_selections(X, Z, [t["selected"] for t in trajs.values()], norms)
  for name, t in trajs.items():
    W = np.asarray(t["W"], np.float64)                    # (B, S, r, c)
    steps = np.asarray(t["steps"])
    if steps.ndim > 1:
      steps = steps[0]
    S = W.shape[1]
    lab = health.of_trajectory(t, saturation)
    out[f"health_{name}"] = lab
    out[f"stalled_step_{name}"] = np.asarray(t["stalled_step"])
    out[f"loss_{name}"] = np.asarray(t["loss"])
    if not linear:
      out[f"selected_{name}"] = np.asarray(t["selected"])
    final_corr, solutions, gammas = {}, {}, {}
    for norm in norms:
      if linear:
        res = solved_linear[norm]
        ok = np.array([r.status == "optimal" for r in res])
        W_svm = np.stack([r.w.reshape(W.shape[2:]) if r.status == "optimal" else np.full(W.shape[2:], np.nan)
                          for r in res])
        gamma = np.array([r.gamma if r.status == "optimal" else np.nan for r in res])
        margins = np.stack([_linear_margins(W[b], X[b], y[b], model) for b in range(B)])
        status = np.array([r.status for r in res], dtype="<U10")
      else:
        res = [solved[svm_lib.selection_key(b, t["selected"][b], norm)] for b in range(B)]
        ok = np.array([r.ok for r in res])
        W_svm = np.stack([r.W if r.ok else np.full(W.shape[2:], np.nan) for r in res])
        gamma = np.array([1.0 / r.objective if r.ok else np.nan for r in res])
        margins = np.stack([rates.att_margins(W[b], X[b], Z[b], t["selected"][b]) for b in range(B)])
        status = np.array([r.status for r in res], dtype="<U10")
      corr = metrics.corr(W, W_svm[:, None])
      gap = np.stack([rates.margin_gap(margins[b], W[b], norm, gamma[b]) for b in range(B)])
      gap[~ok] = np.nan
      out[f"svm_{norm}_{name}_status"] = status
      out[f"corr_{name}_{norm}"] = corr
      out[f"gap_{name}_{norm}"] = gap
      final_corr[norm] = corr[:, -1]
      solutions[norm] = W_svm
      gammas[norm] = gamma
    target = _stage_norm(model, name)
    if target is not None:
      # the target norm's gap of every other norm's solution: the run "beats" them when its own final
      # gap is smaller (the margin-based reading of "nearest", well posed where a norm's max-margin
      # solution is not unique, as l_inf's often is)
      others = []
      for m in norms:
        if m == target:
          continue
        if linear:
          mg = np.array([_linear_margins(solutions[m][b][None], X[b], y[b], model)[0] for b in range(B)])
        else:
          mg = np.array([rates.att_margins(solutions[m][b][None], X[b], Z[b], t["selected"][b])[0]
                         for b in range(B)])
        others.append(np.array([rates.margin_gap(mg[b:b + 1], solutions[m][b][None], target, gammas[target][b])[0]
                                for b in range(B)]))
      other = np.nanmin(np.stack(others), axis=0) if others else np.full(B, np.nan)
      out[f"other_gap_{name}"] = other
      out[f"beats_others_{name}"] = out[f"gap_{name}_{target}"][:, -1] < other
    nearest, distinct = _nearest(norms, final_corr, solutions)
    out[f"nearest_{name}"] = nearest
    out[f"distinct_{name}"] = distinct
    if "last_rise" in t:          # the linear control checks every step
      last = np.asarray(t["last_rise"], np.int64)
      out[f"osc_end_{name}"] = last
      out[f"osc_ended_{name}"] = last < 0.9 * steps[-1]
    else:                         # attention: at the snapshots
      ends = [rates.oscillation_end(steps, out[f"loss_{name}"][b]) for b in range(B)]
      out[f"osc_end_{name}"] = np.array([e for e, _ in ends], np.int64)
      out[f"osc_ended_{name}"] = np.array([d for _, d in ends], bool)
    out["snapshot_steps"] = np.broadcast_to(steps, (B, S)).copy()   # (the same for every stage of a cell)
  # slopes in each stage's target norm (analysis needs the optimizer name: the stage name's prefix)
  for name in trajs:
    norm = _stage_norm(model, name)
    steps = out["snapshot_steps"][0] if B else np.zeros(0)
    lo, hi = fit_from * (steps[-1] if len(steps) else 0), steps[-1] if len(steps) else 0
    if norm is None:
      out[f"slope_gap_{name}"] = np.full(B, np.nan)
      out[f"slope_corr_{name}"] = np.full(B, np.nan)
      continue
    gap, corr = out[f"gap_{name}_{norm}"], out[f"corr_{name}_{norm}"]
    out[f"slope_gap_{name}"] = np.array([rates.slope(steps, gap[b], lo, hi) for b in range(B)])
    out[f"slope_corr_{name}"] = np.array([rates.slope(steps, 1.0 - corr[b], lo, hi) for b in range(B)])
  return out


# Two norms' max-margin solutions count as the same one when their corr is within this of 1 (the
# solvers' accuracy is ~1e-8 relative; on some data sets the l2 and l_inf solutions coincide).
SAME_SOLUTION = 1e-6


def _nearest(norms, final_corr: dict, solutions: dict):
  """((B,) nearest-norm labels, (B,) distinct): the norm of largest final corr, written "a=b" when
  that norm's solution is the same as another's (``SAME_SOLUTION``: the run cannot tell them apart);
  ""  where no solution is known. ``distinct``: every pair of the norms' solutions differs."""
  B = len(next(iter(final_corr.values())))
  labels = np.full(B, "", dtype="<U32")
  distinct = np.ones(B, bool)
  for b in range(B):
    corr = {n: final_corr[n][b] for n in norms if np.isfinite(final_corr[n][b])}
    same = {(i, j): bool(metrics.corr(solutions[i][b], solutions[j][b]) > 1 - SAME_SOLUTION)
            for i in norms for j in norms if i != j}
    distinct[b] = len(corr) == len(norms) and not any(same.values())
    if not corr:
      continue
    best = max(corr, key=corr.get)
    labels[b] = "=".join(n for n in norms if n == best or same[(best, n)])
  return labels, distinct


def _stage_norm(model: str, name: str) -> str | None:
  """The target norm of a stage (the optimizer is its name without an _lr<step> suffix)."""
  opt = name.rsplit("_lr", 1)[0] if "_lr" in name else name
  return target_norm(model, opt)


def _finite(x, reduce=np.mean):
  """reduce() of the finite entries of x (None where there are none)."""
  x = np.asarray(x, np.float64)
  ok = np.isfinite(x)
  return float(reduce(x[ok])) if ok.any() else None


_mean = _finite
_median = functools.partial(_finite, reduce=np.median)


def _cell_summary(fl: dict, label: dict, a: dict) -> dict:
  model = label["model"]
  full = int(label["minibatch"]) == 0
  out = {}
  for entry in fl.optimizers:
    name, opt, step = parse_entry(entry, fl.lr)
    norm = target_norm(model, opt)
    # Stalled runs (the gradient underflowed to exactly 0: their state froze) and diverged ones are
    # counted under health and left out of every statistic below; unsaturated ones stay in.
    use = ~np.isin(a[f"health_{name}"], ("stalled", "diverged"))
    nearest = a[f"nearest_{name}"][use]
    distinct = a[f"distinct_{name}"] & use
    labels = [n for n in NORMS[model]] + sorted({str(x) for x in nearest if "=" in str(x)})
    beats = a.get(f"beats_others_{name}")
    row = {"optimizer": opt, "lr": step, "target_norm": norm, "runs_used": int(np.sum(use)),
           "runs_stalled": int(np.sum(a[f"health_{name}"] == "stalled")),
           "nearest": {n: int(np.sum(nearest == n)) for n in labels if np.any(nearest == n)},
           "distinct_runs": int(np.sum(distinct)),
           "beats_other_solutions": (int(np.sum(beats[distinct])) if beats is not None else None),
           "final_corr_distinct": {n: _mean(a[f"corr_{name}_{n}"][distinct, -1]) for n in NORMS[model]},
           "final_corr": {n: _mean(a[f"corr_{name}_{n}"][use, -1]) for n in NORMS[model]},
           "final_gap": {n: _median(a[f"gap_{name}_{n}"][use, -1]) for n in NORMS[model]},
           "slope_gap": rates.slope_ci(a[f"slope_gap_{name}"][use]),
           "slope_corr": rates.slope_ci(a[f"slope_corr_{name}"][use]),
           # (with mini-batches the loss a step sees is a different batch's: its rises are noise)
           "osc_end_median": _median(a[f"osc_end_{name}"][use]) if full else None,
           "osc_end_max": int(np.max(a[f"osc_end_{name}"][use])) if full and np.any(use) else None,
           "osc_unended": int(np.sum(~a[f"osc_ended_{name}"][use])) if full else None,
           "health": health.counts(a[f"health_{name}"])}
    # over the runs whose solutions all differ (elsewhere two norms are the same target)
    by_corr = {n: v for n, v in row["final_corr_distinct"].items() if v is not None}
    row["nearest_by_mean_corr"] = max(by_corr, key=by_corr.get) if by_corr else None
    out[name] = row
  return out


def reduce(fl: dict, cell_arrays: list) -> tuple[dict, dict]:
  """(results.npz arrays, summary): per-cell arrays under "<model>_mb<minibatch>__<name>", and the
  per-cell tables, the questions' numbers and the checks."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  arrays = {}
  table = {}
  for cell, a in zip(cells(fl), cell_arrays):
    tag = f"{cell.label['model']}_mb{cell.label['minibatch']}"
    for k, v in a.items():
      arrays[f"{tag}__{k}"] = v
    table[tag] = _cell_summary(fl, cell.label, a)
  summary = {"experiment": "E16 optimizer rates", "models": list(fl.models),
             "minibatches": [int(b) for b in fl.minibatches], "optimizers": list(fl.optimizers),
             "data_sets_per_cell": int(fl.runs), "fit_window": [fl.fit_from, 1.0], "cells": table,
             "health": {f"{tag}/{name}": row["health"] for tag, rows in table.items() for name, row in rows.items()}}
  summary["questions"] = questions(fl, table)
  summary["checks"] = checks(fl, table)
  summary["reported"] = reported(table)
  return arrays, summary


def questions(fl: dict, table: dict) -> dict:
  """The issue's five questions, as numbers drawn from the cell tables (None where the grid lacks
  the cell or stage)."""
  def row(model, mb, name):
    return (table.get(f"{model}_mb{mb}") or {}).get(name)

  def brief(r):
    if r is None:
      return None
    n = r["target_norm"] or r["nearest_by_mean_corr"]
    return {"target_norm": r["target_norm"], "nearest_by_mean_corr": r["nearest_by_mean_corr"],
            "runs_used": r["runs_used"], "distinct_runs": r["distinct_runs"],
            "beats_other_solutions": r["beats_other_solutions"], "final_corr_every_norm": r["final_corr"],
            "nearest_counts": r["nearest"], "final_corr": r["final_corr"].get(n) if n else None,
            "final_gap": r["final_gap"].get(n) if n else None, "slope_gap": r["slope_gap"],
            "slope_corr": r["slope_corr"]}

  names = [parse_entry(e, fl.lr)[0] for e in fl.optimizers]
  q1 = {f"{m}/{nm}": brief(row(m, 0, nm)) for m in ("linear", "linear_mc") for nm in names if row(m, 0, nm)}
  q2 = {f"{m}/mb{mb}/{nm}": {"final_corr": (row(m, mb, nm) or {}).get("final_corr", {}).get(
            "fro" if m == "W" else "nuc"), "nearest_counts": (row(m, mb, nm) or {}).get("nearest")}
        for m in ("W", "KQ") for mb in fl.minibatches for nm in names
        if nm.startswith("normalized_gd") and row(m, mb, nm)}
  q3 = {f"{m}/mb{mb}/adam": brief(row(m, mb, "adam")) for m in ("linear", "W") for mb in fl.minibatches
        if row(m, mb, "adam")}
  q4 = {nm: brief(row("W", 0, nm)) for nm in names if _core(nm.rsplit("_lr", 1)[0]) in ("gd", "normalized_gd", "polyak")
        and row("W", 0, nm)}
  q5 = {}
  for m in ("linear", "linear_mc", "W", "KQ"):
    for e in fl.optimizers:
      nm, opt, step = parse_entry(e, fl.lr)
      r = row(m, 0, nm)
      if opt == "gd" and r is not None:
        q5[f"{m}/gd/lr{step:g}"] = {"lr": step, "osc_end_median": r["osc_end_median"], "osc_end_max": r["osc_end_max"],
                                    "unended": r["osc_unended"]}
  return {"1_linear_control": q1, "2_minibatch_ngd": q2, "3_per_sample_adam": q3, "4_gd_ngd_polyak_on_W": q4,
          "5_large_steps": q5}


def asymptotic_only(optimizer: str) -> str | None:
  """Why the margin-gap ordering is no prediction at a finite horizon for ``optimizer`` (None where it
  is one): unnormalized GD at any step size and the Polyak step converge in direction at the rate
  1/log t (Soudry et al. 2018; Nacson et al. 2019), and a decaying schedule (@sqrt, @inv) slows
  normalized GD to a rate of the same kind; at 10^4 steps their gaps are measurements."""
  core = _core(optimizer)
  if core in ("gd", "polyak"):
    return f"{core}: the direction converges at rate 1/log t, so no ordering of the gaps is predicted at this horizon"
  if "@" in optimizer:
    return "a decaying step size: the rate is of order 1/log t, so no ordering of the gaps is predicted at this horizon"
  return None


def margin_gap(model: str, name: str, r: dict) -> tuple[str, float] | None:
  """(name, share) of the margin-gap comparison of one stage, or None without distinct solutions."""
  if not r["distinct_runs"]:
    return None
  return (f"{model} {name}: share of data sets whose final {r['target_norm']} margin gap is below that of every "
          "other norm's solution", r["beats_other_solutions"] / r["distinct_runs"])


def reported(table: dict) -> list:
  """The margin-gap comparisons theory does not predict at the horizon measured (``asymptotic_only``):
  reported with the reason, never a check that fails by design."""
  out = []
  for model in ("linear", "linear_mc"):
    for name, r in (table.get(f"{model}_mb0") or {}).items():
      why = asymptotic_only(r["optimizer"]) if r["target_norm"] is not None else None
      gap = margin_gap(model, name, r) if why else None
      if gap:
        out.append({"name": gap[0], "value": gap[1], "why": why})
  return out


def checks(fl: dict, table: dict) -> list:
  """On the linear control at full batch, where the theorems are proven, for each optimizer with a
  target norm, over the usable data sets whose norms' solutions all differ: does it end nearest (mean
  final corr) to that norm's max-margin solution, and (where theory predicts it at this horizon:
  ``asymptotic_only``) is its final margin gap in that norm below the gap of every other norm's
  solution in more than half of them? A "no" is a finding, not a failure of the run."""
  out = []
  for model in ("linear", "linear_mc"):
    for name, r in (table.get(f"{model}_mb0") or {}).items():
      if r["target_norm"] is None:
        continue
      runs = [f"{model}_mb0/{name}"]
      if r["nearest_by_mean_corr"] is None:
        if r["health"].get("stalled", 0) + r["health"].get("diverged", 0):   # (analysis.checks.gate says why)
          out.append({"name": f"{model} {name}: max-margin solution nearest by mean final corr", "value": None,
                      "expected": f"{r['target_norm']} (the theorem's norm)", "ok": None, "runs": runs,
                      "reason": "no data set trained to a result"})
        continue
      out.append({"name": f"{model} {name}: max-margin solution nearest by mean final corr "
                          f"({r['distinct_runs']} data sets with distinct solutions)",
                  "value": r["nearest_by_mean_corr"], "expected": f"{r['target_norm']} (the theorem's norm)",
                  "ok": r["nearest_by_mean_corr"] == r["target_norm"], "runs": runs})
      gap = margin_gap(model, name, r)
      if gap and not asymptotic_only(r["optimizer"]):
        out.append({"name": gap[0], "value": gap[1],
                    "expected": "> 0.5 (it is nearer its own norm's max margin than the other norms' limits are)",
                    "ok": bool(gap[1] > 0.5), "runs": runs})
  return out


def _fmt(x, spec=".3f"):
  return "-" if x is None else format(x, spec)


def _ci(c):
  if c is None or c.get("mean") is None:
    return "-"
  if c.get("lo") is None:
    return f"{c['mean']:.2f}"
  return f"{c['mean']:.2f} [{c['lo']:.2f}, {c['hi']:.2f}]"


def report(summary: dict, fl: dict) -> list[str]:
  """Per cell: each stage's target norm, nearest-norm counts, final corr and gap in the target norm,
  the gap's slope with its 95% interval, and the oscillation end."""
  lines = [f"E16 optimizer rates: {summary['data_sets_per_cell']} data sets per cell; nearest: the norm of largest "
           "final corr (a=b: the two solutions coincide); corr, gap: mean final corr and median final gap in the "
           f"target norm; slopes of log gap vs log t over the last {1 - summary['fit_window'][0]:.0%} of each run, "
           "mean [95% CI]; osc end: median last step at which the loss rose, full batch only (linear: every step; "
           "attention: at the snapshots; * some runs still oscillate in the last tenth); used: runs in the "
           "statistics (stall: stalled runs, left out with diverged ones)"]
  for tag, rows in summary["cells"].items():
    lines.append(f"  {tag}")
    lines.append(f"    {'stage':<27}{'used':>5}{'stall':>6}{'target':>9}{'nearest (runs)':>30}{'corr':>8}{'gap':>10}"
                 f"{'slope(gap)':>24}{'osc end':>9}")
    for name, r in rows.items():
      n = r["target_norm"] or r["nearest_by_mean_corr"]
      near = ",".join(f"{k}:{v}" for k, v in r["nearest"].items() if v)
      osc = _fmt(r['osc_end_median'], '.0f') + ("*" if r.get("osc_unended") else "")
      lines.append(f"    {name:<27}{r['runs_used']:>5}{r.get('runs_stalled', 0):>6}{str(r['target_norm'] or '-'):>9}{near:>30}"
                   f"{_fmt(r['final_corr'].get(n) if n else None, '.4f'):>8}"
                   f"{_fmt(r['final_gap'].get(n) if n else None, '.2e'):>10}{_ci(r['slope_gap']):>24}"
                   f"{osc:>9}")
  for m in summary.get("reported") or []:
    lines.append(f"  [reported] {m['name']}: {m['value']:.3g} ({m['why']})")
  return lines


def key_numbers(summary: dict) -> list:
  """The two linear-control check counts, then per cell how many stages end nearest (by their runs'
  majority) their target norm's solution, and the fastest gap slope."""
  checks_ = summary.get("checks") or []
  by_corr = [c for c in checks_ if "nearest by mean final corr" in c["name"]]
  by_gap = [c for c in checks_ if "margin gap" in c["name"]]
  held = lambda cs: f"{sum(c['ok'] is True for c in cs)}/{sum(c['ok'] is not None for c in cs)}"  # noqa: E731
  out = [("linear control: nearest (corr) to the theorem's norm", held(by_corr)),
         ("linear control: gap below the other norms' solutions", held(by_gap))]
  for tag, rows in (summary.get("cells") or {}).items():
    targeted = {n: r for n, r in rows.items() if r.get("target_norm") and r.get("nearest")}
    hit = sum(max(r["nearest"], key=r["nearest"].get).split("=").count(r["target_norm"]) > 0 for r in targeted.values())
    slopes = {n: (r.get("slope_gap") or {}).get("mean") for n, r in targeted.items()}
    slopes = {n: v for n, v in slopes.items() if v is not None}
    out.append((f"{tag}: stages mostly nearest their target norm", f"{hit}/{len(targeted)}"))
    if slopes:
      best = min(slopes, key=slopes.get)
      out.append((f"{tag}: steepest gap slope", f"{best} {slopes[best]:.2f}"))
  return out


def _known_entries(values):
  names = []
  for v in values:
    try:
      name, opt, step = parse_entry(v, 0.1)
    except ValueError:
      return f"must list entries NAME or NAME:LR with LR a number; {v!r} is not one"
    if not (np.isfinite(step) and step > 0):
      return f"must list entries NAME or NAME:LR with a step size LR > 0; {v!r} is not one"
    try:
      optimizers.get_optimizer(opt, step)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      return f"entry {v!r}: {' '.join(str(e).split())}"
    names.append(name)
  if not names or len(set(names)) != len(names):
    return "must list distinct entries NAME or NAME:LR (gd, normalized_gd, polyak:1000, signum0.9, adam, ...)"
  return None


def _minibatch_rule(v):
  sizes = []
  if {"W", "KQ"} & set(v["models"]):
    sizes.append((v["n"], f"--n={v['n']} attention sequences"))
  if {"linear", "linear_mc"} & set(v["models"]):
    sizes.append((v["linear_n"], f"--linear_n={v['linear_n']} linear points"))
  for b in v["minibatches"]:
    for size, what in sizes:
      if int(b) > size:
        return f"--minibatches={b} exceeds a data set's size ({what}): a step draws at most all of them"
  return None


def _every_rule(v):
  return None if v["linear_steps"] % v["linear_every"] == 0 else "--linear_every must divide --linear_steps"


def _k_rule(v):
  return None if 2 <= v["linear_k"] <= v["linear_d"] else "--linear_k must be in [2, --linear_d]"


SETTINGS = (common.base(runs=20, data=False, precision=False) + common.pipeline(batch_size=1000) + F.Settings((
    F.List("models", MODELS, "Models: linear (binary logistic regression), linear_mc (softmax regression, "
           "--linear_k classes), W, KQ (attention on E2's data sets).", check=allowed.one_of(MODELS, "models")),
    F.List("optimizers", ("gd", "normalized_gd", "normalized_gd@sqrt", "polyak:1000", "normalized_gd+mom0.9",
                          "sign_gd", "signum0.9", "sd_spectral", "adam", "gd:4", "gd:64", "gd:1024"),
           "Optimizer entries NAME or NAME:LR (a stage's own step size; the others take --lr): names of "
           "svmattn.optim.optimizers.get_optimizer, e.g. gd, normalized_gd, polyak (LR is its cap), sign_gd, "
           "signum0.9, normalized_gd+nesterov0.9, sd_spectral, adam, with schedules @sqrt / @inv.",
           check=_known_entries),
    F.List("minibatches", (0, 1), "Mini-batch sizes (a cell each): 0 is full batch.", item=int,
           check=allowed.int_list(minimum=0)),
    F.Enum("sampling", "without", ["with", "without", "cyclic"], "How a mini-batch is drawn (see E2's --sampling)."),
    F.Float("lr", 0.1, "Step size of the entries without their own.", check=allowed.positive),
    F.Int("n", 6, "Attention: sequences per data set.", lower=1),
    F.Int("T", 8, "Attention: tokens per sequence.", lower=2),
    F.Int("d", 10, "Attention: embedding dimension.", lower=1),
    F.Int("steps", 2000, "Attention: optimizer steps.", lower=1),
    F.Int("snapshot_every", 10, "Attention: record W every this many steps.", lower=1),
    F.Int("chunk_steps", 1000, "Attention: steps per jitted chunk; a checkpoint is saved after each.", lower=1),
    F.Int("linear_n", 20, "Linear control: points per data set.", lower=2),
    F.Int("linear_d", 5, "Linear control: dimension.", lower=2),
    F.Int("linear_k", 3, "Linear control (linear_mc): classes.", lower=2),
    F.Float("linear_margin", 0.1, "Linear control: the teacher's margin of the generated data.",
            check=allowed.positive),
    F.Int("linear_steps", 10000, "Linear control: optimizer steps.", lower=1),
    F.Int("linear_every", 10, "Linear control: record w every this many steps (divides --linear_steps).", lower=1),
    F.Float("fit_from", 0.1, "Fit the log-log slopes on the snapshots from this fraction of the run to its end.",
            lower=0.0, upper=0.99),
    F.Int("block_size", 64, "Data sets per vectorized block.", lower=1),
), (F.Rule(("minibatches", "models", "n", "linear_n"), _minibatch_rule), F.Rule(("linear_k", "linear_d"), _k_rule),
    F.Rule(("linear_steps", "linear_every"), _every_rule))))

EXPERIMENT = registry.Experiment(
    id="E16", name=NAME, title="Stochastic and adaptive optimizers, step sizes and rates",
    cost_s=575,
    claim="Which max-margin solution does each optimizer reach, at which batch size and how fast: checked on a linear "
          "classifier, where the theorems are proven (GD -> l2, sign GD and Signum -> l_inf, spectral GD -> spectral), "
          "then asked of attention W and (K,Q) (mini-batch normalized SGD, per-sample Adam, the Polyak step, large "
          "constant steps).",
    beyond=True, settings=SETTINGS,
    quick={"runs": 6, "steps": 600, "linear_steps": 3000, "models": ["linear", "W"],
           "optimizers": ["gd", "normalized_gd", "polyak:1000", "sign_gd", "adam", "gd:16"]},
    key_numbers=key_numbers, report=report, figures=figures.draw)
