"""E4: over-parameterization: global / local / not-local convergence of GD versus d (docs/science.md section 8).

A grid of cells (n, d) for n in ``n_values`` and d in d_min..d_max, ``runs`` data sets each
(the paper's unit-Gaussian generator, T tokens, linear head, cross-attention; data set r of
every cell from fold_in(PRNGKey(seed), r)). The W attention is trained with normalized GD;
the host analysis solves the Frobenius Att-SVM at the selected tokens, classifies each run
(``analysis.metrics.convergence_type``) and checks the feasibility of Att-SVM(opt).
Prediction: the global share grows with d, and not-local vanishes once the SVM is always
feasible (d >= max(T-1, n)). Runs that diverge to NaN are counted and left out of the shares.
"""
from __future__ import annotations

import functools

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
from svmattn.figures import overparam as figures
from svmattn.execution import pipeline
from svmattn.execution import stages
from svmattn.execution import sweep as sweep_lib
from svmattn.studies import local_convergence
from svmattn.studies import svm_rank
from svmattn.svm import att_svm as svm_lib
from svmattn.svm import feasibility as feas_lib
from svmattn.train import loop as train_lib

NAME = "overparam"
TYPES = metrics.CONVERGENCE_TYPES


def grid(fl: dict) -> tuple[list[int], np.ndarray]:
  return [int(x) for x in fl.n_values], np.arange(fl.d_min, fl.d_max + 1)


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  n_values, ds = grid(fl)
  every = min(fl.chunk_steps, fl.steps) if fl.steps > 0 else 1
  config = train_lib.TrainConfig(param="W", lr=fl.lr, steps=fl.steps, snapshot_every=every,
                                 chunk_steps=every, numerics=fl.numerics,
                                 minibatch=fl.minibatch, sampling=fl.sampling,
                                 block_size=fl.block_size).validate()
  dtype = np.float32 if fl.precision == "float32" else np.float64
  cells = tuple(pipeline.Cell(c, fl.runs) for c in sweep_lib.grid({"n": n_values, "d": [int(d) for d in ds]}))

  def load(cell, runs):
    spec = data_lib.DataSpec(cell.label["n"], fl.T, cell.label["d"]).validate()
    data = data_lib.generate_host(spec, fl.seed, runs)   # float64; --precision=float32 trains on it rounded
    data = data_lib.Dataset(*(np.asarray(a) for a in data))
    return {**data._asdict(), "gamma": local_convergence.token_scores(data)}

  return pipeline.Study(NAME, cells, load, lambda cell: (stages.Train("W", config, dtype),),
                        functools.partial(analyze, saturation=fl.saturation),
                        fl.batch_size, fl.seed, identity if identity is not None else fl)


def analyze(label: dict, data: dict, trajs: dict, saturation: float = health.SATURATION) -> dict:
  """Per run: convergence type (an unhealthy run's health label, ``analysis.health``),
  corr(W_GD, W^mm_alpha_hat), SVM status, feasibility of Att-SVM(opt), the selected and the
  optimal tokens."""
  X, Z, gamma = np.asarray(data["X"], np.float64), np.asarray(data["Z"], np.float64), data["gamma"]
  tr = trajs["W"]
  selected, W_final = tr["selected"], tr["W"][:, -1]
  B = len(X)
  labels = health.of_trajectory(tr, saturation)
  results = svm_lib.att_svm_batch(X, Z, selected, "fro")
  status = np.array([res.status for res in results], dtype="<U10").reshape(B)
  types = metrics.convergence_types(gamma, selected, results, labels)
  corr = metrics.corr(W_final, svm_lib.stack(results, X.shape[-1])["W"])   # (NaN where not optimal)
  opt = metrics.optimal_tokens(gamma)
  return {"types": types, "corr": corr, "svm_status": status, "finite": tr["finite"], "health": labels,
          "stalled_step": tr["stalled_step"],
          "feasible_opt": feas_lib.check(X, Z, opt).feasible, "selected": selected, "optimal": opt}


def reduce(fl: dict, cells: list) -> tuple[dict, dict, dict]:
  """(results.npz arrays, summary, shares per type (len(n_values), D)) from the per-run arrays of every cell."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  n_values, ds = grid(fl)
  T, R = fl.T, fl.runs
  shape = (len(n_values), len(ds), R)

  def stack(key):
    return np.stack([c[key] for c in cells]).reshape(shape + cells[0][key].shape[1:])

  types, corr, svm_status = stack("types"), stack("corr"), stack("svm_status")
  finite, feasible_opt = stack("finite"), stack("feasible_opt")
  labels = stack("health") if "health" in cells[0] else np.where(finite, "ok", "diverged")
  arrays = {}
  for ni, n in enumerate(n_values):
    part = cells[ni * len(ds):(ni + 1) * len(ds)]
    arrays[f"selected_n{n}"] = np.stack([c["selected"] for c in part])
    arrays[f"optimal_n{n}"] = np.stack([c["optimal"] for c in part])
  shares = {t: np.zeros((len(n_values), len(ds))) for t in TYPES}
  summary_cells = []
  for ni, n in enumerate(n_values):
    for di, d in enumerate(ds):
      ok = finite[ni, di]
      fr = metrics.type_fractions(types[ni, di][ok])
      for t in TYPES:
        shares[t][ni, di] = fr[t] if ok.any() else np.nan
      c = corr[ni, di][ok]
      summary_cells.append({"n": n, "T": T, "d": int(d), "runs": R, "diverged": int(np.sum(~ok)),
                            **{f"share_{t}": fr[t] for t in TYPES},
                            "ties": int(np.sum(types[ni, di][ok] == "tie")),
                            **{h: int(np.sum(labels[ni, di] == h)) for h in ("stalled", "unsaturated")},
                            "svm_infeasible": int(np.sum(svm_status[ni, di] == "infeasible")),
                            "svm_failed": int(np.sum(svm_status[ni, di] == "failed")),
                            "feasible_opt_fraction": float(np.mean(feasible_opt[ni, di])),
                            "corr_mean": float(np.nanmean(c)) if np.any(np.isfinite(c)) else None})
  arrays.update({"n_values": np.array(n_values), "ds": ds, "runs": np.arange(R), "types": types, "corr": corr,
                 "svm_status": svm_status, "finite": finite, "feasible_opt": feasible_opt, "health": labels,
                 **({"stalled_step": stack("stalled_step")} if "stalled_step" in cells[0] else {}),
                 **{f"share_{t.replace('-', '_')}": shares[t] for t in TYPES}})
  summary = {"experiment": "E4 over-parameterization", "numerics": fl.numerics,
             "T": T, "n_values": n_values, "ds": ds,
             "runs_per_cell": R, "health": health.counts(labels),
             "saturation_threshold": fl.saturation, "cells": summary_cells, "checks": checks(shares, n_values, ds, T)}
  return arrays, summary, shares


def checks(shares, n_values, ds, T) -> list:
  out = []
  for ni, n in enumerate(n_values):
    g = shares["global"][ni]
    ok = np.isfinite(g)
    if ok.sum() >= 2:
      rho = metrics.spearman(ds[ok], g[ok]) if np.ptp(g[ok]) > 0 else 0.0
      out.append({"name": f"Spearman correlation of global share with d, n={n}", "value": rho,
                  "expected": "> 0.5 (global share grows with d)", "ok": bool(rho > 0.5)})
      first, last = g[ok][0], g[ok][-1]
      out.append({"name": f"global share at d={int(ds[ok][-1])} minus at d={int(ds[ok][0])}, n={n}",
                  "value": float(last - first), "expected": "> 0", "ok": bool(last - first > 0)})
    above = ds >= max(T - 1, n)
    nl = shares["not-local"][ni][above & np.isfinite(shares["not-local"][ni])]
    if nl.size:
      out.append({"name": f"max not-local share over d >= max(T-1,n)={max(T - 1, n)}, n={n}",
                  "value": float(nl.max()), "expected": "<= 0.02 (near zero: SVM always feasible)",
                  "ok": bool(nl.max() <= 0.02)})
  return out


# ----------------------------------------------------------------------------------------
# The experiment's settings and registry entry
# ----------------------------------------------------------------------------------------


def report(summary: dict, fl: dict) -> list[str]:
  """The terminal lines of a finished run (the checks follow)."""
  lines = [f"E4 over-parameterization: {summary['runs_per_cell']} runs per cell, T={summary['T']}"]
  lines.append("      n   d  global  local  not-local  tie  infeasible  corr")
  for x in summary["cells"]:
    corr = f"{x['corr_mean']:.4f}" if x["corr_mean"] is not None else "  -  "
    lines.append(f"    {x['n']:3d} {x['d']:3d}  {100 * x['share_global']:5.1f}% {100 * x['share_local']:5.1f}% "
                 f"{100 * x['share_not-local']:6.1f}% {100 * x['share_tie']:4.1f}% {x['svm_infeasible']:6d}     {corr}")
  return lines


def prepare(fl: dict, study: pipeline.Study) -> None:
  n_values, ds = grid(fl)
  logging.info("E4: n %s, T=%d, d %d..%d, %d runs per cell, %d steps", n_values, fl.T, ds[0], ds[-1],
               fl.runs, fl.steps)


def key_numbers(summary: dict) -> list:
  """Per n: the global share at the largest d minus at the smallest (of the d with a run that did not
  diverge), as the check "global share at d=.. minus at d=.." computes it."""
  out = []
  for n in summary.get("n_values") or []:
    shares = [x["share_global"] for x in summary.get("cells") or []
              if x["n"] == n and x["diverged"] < x["runs"] and x["share_global"] is not None]
    if len(shares) >= 2:
      out.append((f"global share, largest minus smallest d (n={n})", float(shares[-1] - shares[0])))
  return out


SETTINGS = (common.base(runs=500) + common.pipeline(batch_size=1000) + common.numerics() + F.Settings((
    svm_rank.no_data("E4: it sweeps n and d"),
    F.List("n_values", (5, 10), "Numbers of sequences n (one panel each).", item=int,
                          check=allowed.int_list(minimum=1)),
    F.Int("T", 5, "Tokens per sequence.", lower=2),
    F.Int("d_min", 2, "Smallest embedding dimension d.", lower=1),
    F.Int("d_max", 20, "Largest embedding dimension d.", lower=1),
    F.Int("steps", 2000, "Normalized GD steps.", lower=0),
    F.Float("lr", 0.1, "Learning rate (step size eta).", check=allowed.positive),
    F.Int("chunk_steps", 500, "Steps per jitted chunk (one snapshot and checkpoint each; only the final W is "
          "used).", lower=1),
    common.block_size_field(),
), (F.Rule(("d_min", "d_max"), lambda v: None if v["d_min"] <= v["d_max"] else "need --d_min <= --d_max"),
    common.block_fits_batch()))
    + minibatch.settings(("n_values",), lambda v: (min(v["n_values"]), f"--n_values' smallest n={min(v['n_values'])}")))

EXPERIMENT = registry.Experiment(
    id="E4", name=NAME, title="Over-parameterization: global / local / not-local convergence",
    cost_s=36,
    claim="The larger d, the more often GD converges globally (to the optimal tokens); not-local convergence "
          "vanishes once d >= max(T-1, n).",
    settings=SETTINGS, quick={"runs": 100, "n_values": [5], "d_max": 8},
    key_numbers=key_numbers, figures=figures.draw, report=report, prepare=prepare)
