"""E18: rank dynamics of (K,Q) attention from a small initialization (docs/science.md section 23).

On E2's data sets and sizes, (K,Q) attention trains from its random start times ``init_scale``
(``--init_scale``) with each optimizer entry (NAME or NAME:LR, as E16's); a grid of cells over the
init scale and the optimizer. Per run, from the snapshots of K Q^T (``analysis.observables``): the
stable rank over steps, the visible rank (singular values >= VISIBLE sigma_1) and the number of
times it grows (rank increments), the steps at which the loss leaves a plateau (the observables'
stated rule) and the rank there, and the final corr with the nuclear-norm Att-SVM at the run's
selection. No theorem here is checked: Boix-Adsera et al. 2023 (arXiv 2306.07042) and Zhang et al.
2025 (arXiv 2501.16265) describe saddle-to-saddle dynamics from a small start, one direction at a
time; E18 reports what the grid shows.

``fl`` below is a dict of the experiment's settings (``SETTINGS``), or the "flags" of its
summary.json: replay rebuilds the same study from it.
"""
from __future__ import annotations

import functools

import numpy as np

from svmattn import registry
from svmattn.config import allowed
from svmattn.config import common
from svmattn.config import fields as F
from svmattn.data import datasets as data_lib
from svmattn.execution import pipeline
from svmattn.execution import stages
from svmattn.execution import sweep as sweep_lib
from svmattn.figures import rank_dynamics as figures
from svmattn.studies import local_convergence
from svmattn.studies import optimizer_rates
from svmattn.train import loop as train_lib

NAME = "rank_dynamics"
VISIBLE = 0.1          # a direction is visible where its singular value is at least this times sigma_1
OBSERVED = ("stable_rank", "singular_values", "plateau_exit_rank")


def _grid(fl) -> list[dict]:
  return sweep_lib.grid({"init_scale": [float(s) for s in fl.init_scales], "optimizer": list(fl.optimizers)})


def config(fl, label: dict) -> train_lib.TrainConfig:
  _, opt, step = optimizer_rates.parse_entry(label["optimizer"], fl.lr)
  return train_lib.TrainConfig(param="KQ", optimizer=opt, lr=step, steps=fl.steps, snapshot_every=fl.snapshot_every,
                               chunk_steps=fl.chunk_steps, block_size=fl.block_size,
                               init_scale=float(label["init_scale"])).validate()


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  spec = data_lib.DataSpec(fl.n, fl.T, fl.d).validate()
  load = local_convergence.batches(spec, fl.seed)
  cells = tuple(pipeline.Cell(label, int(fl.runs)) for label in _grid(fl))
  return pipeline.Study(NAME, cells, lambda cell, runs: load(runs),
                        lambda cell: (stages.Train("KQ", config(fl, cell.label)),),
                        functools.partial(analyze, saturation=fl.saturation), fl.batch_size, fl.seed,
                        identity if identity is not None else fl)


def analyze(label: dict, data: dict, trajs: dict, saturation: float = 0.9) -> dict:
  out = local_convergence.analyze(label, data, trajs, saturation=saturation, norms=("nuc",), observe=OBSERVED)
  sv = out["singular_values_KQ"]                                         # (B, S, d)
  with np.errstate(invalid="ignore", divide="ignore"):
    visible = np.sum(sv >= VISIBLE * sv[..., :1], axis=-1) * (sv[..., 0] > 0)
  out["visible_rank_KQ"] = visible
  out["rank_increments_KQ"] = np.sum(np.diff(visible, axis=1) > 0, axis=1)
  exits = np.isfinite(out["plateau_exit_rank_KQ"])
  steps = np.asarray(trajs["KQ"]["steps"])
  out["first_exit_step_KQ"] = np.array([steps[np.flatnonzero(e)[0]] if e.any() else -1 for e in exits])
  out["plateau_exits_KQ"] = exits.sum(axis=1)
  del out["singular_values_KQ"]          # (the stable and visible ranks keep what the tables read)
  return out


def _median(a):
  a = np.asarray(a, np.float64)
  a = a[np.isfinite(a)]
  return float(np.median(a)) if a.size else None


def reduce(fl: dict, cells: list) -> tuple[dict, dict]:
  fl = F.Values(fl)
  arrays, rows = {}, []
  for label, a in zip(_grid(fl), cells):
    tag = f"s{label['init_scale']:g}_{optimizer_rates.parse_entry(label['optimizer'], fl.lr)[0]}"
    for k, v in a.items():
      arrays[f"{k}_{tag}"] = v
    first = a["first_exit_step_KQ"]
    rows.append({"init_scale": label["init_scale"], "optimizer": label["optimizer"], "data_sets": int(len(a["runs"])),
                 "runs_with_plateau": int(np.sum(first >= 0)),
                 "median_first_exit_step": _median(np.where(first >= 0, first, np.nan)),
                 "final_stable_rank": _median(a["stable_rank_KQ"][:, -1]),
                 "final_visible_rank": _median(a["visible_rank_KQ"][:, -1]),
                 "median_rank_increments": _median(a["rank_increments_KQ"]),
                 "final_corr_nuc": _median(a["corr_KQ_nuc"][:, -1]),
                 "final_loss": _median(a["loss_KQ"][:, -1]),
                 "stable_rank_curve": [_median(c) for c in a["stable_rank_KQ"].T],
                 "loss_curve": [_median(c) for c in a["loss_KQ"].T]})
  arrays["steps"] = train_lib.config_snapshot_steps(config(fl, _grid(fl)[0]))
  summary = {"experiment": "E18 rank dynamics", "shape": {"n": fl.n, "T": fl.T, "d": fl.d}, "visible": VISIBLE,
             "cells": rows, "checks": []}
  return arrays, summary


def report(summary: dict, fl: dict) -> list[str]:
  def f(x, spec=".3g"):
    return "-" if x is None else format(x, spec)

  lines = [f"E18 rank dynamics ((K,Q), n={summary['shape']['n']} T={summary['shape']['T']} d={summary['shape']['d']}): "
           "medians over data sets; visible rank: singular values >= 0.1 sigma_1",
           f"  {'init scale':>10} {'optimizer':<20} {'plateau':>8} {'1st exit':>9} {'incr.':>6} {'stable r.':>9} "
           f"{'visible r.':>10} {'corr nuc':>9} {'loss':>8}"]
  for r in summary["cells"]:
    lines.append(f"  {r['init_scale']:>10g} {r['optimizer']:<20} {r['runs_with_plateau']:>4}/{r['data_sets']:<3} "
                 f"{f(r['median_first_exit_step']):>9} {f(r['median_rank_increments']):>6} "
                 f"{f(r['final_stable_rank']):>9} {f(r['final_visible_rank']):>10} {f(r['final_corr_nuc'], '.4f'):>9} "
                 f"{f(r['final_loss'], '.4f'):>8}")
  return lines


SETTINGS = (common.base(runs=10, data=False, precision=False) + common.pipeline(batch_size=1000) + F.Settings((
    F.List("init_scales", (1e-4, 1e-3, 1e-2, 1e-1, 1.0), "Init scales (a cell each): the random start times S.",
           item=float, check=allowed.float_list(minimum=0.0)),
    F.List("optimizers", ("gd:0.5", "normalized_gd:0.1", "adam:0.01", "muon:0.01"), "Optimizer entries NAME or "
           "NAME:LR (a cell each; E16's syntax).", check=optimizer_rates._known_entries),
    F.Float("lr", 0.1, "Step size of the entries without their own.", check=allowed.positive),
    F.Int("n", 6, "Sequences per data set.", lower=1),
    F.Int("T", 8, "Tokens per sequence.", lower=2),
    F.Int("d", 10, "Embedding dimension.", lower=1),
    F.Int("steps", 3000, "Optimizer steps.", lower=1),
    F.Int("snapshot_every", 10, "Record K Q^T every this many steps.", lower=1),
    F.Int("chunk_steps", 1000, "Steps per jitted chunk; a checkpoint is saved after each.", lower=1),
    common.block_size_field(),
), (common.block_fits_batch(),)))

EXPERIMENT = registry.Experiment(
    id="E18", name=NAME, title="Rank dynamics of (K,Q) from a small initialization",
    cost_s=90,
    claim="From a small start, does (K,Q) attention learn one direction at a time (loss plateaus, K Q^T of rank "
          "one first, then more), and do normalized GD, Adam and Muon skip the saddles GD sits at?",
    beyond=True, settings=SETTINGS, quick={"runs": 3, "init_scales": [1e-3, 1.0], "steps": 1500,
                                           "optimizers": ["gd:0.5", "muon:0.01"]},
    figures=figures.draw, report=report, calibrated_for=("runs",))
