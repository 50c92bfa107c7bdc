"""E9: feasibility of Att-SVM(alpha) versus d around max(T-1, n) (docs/science.md sections 3, 8), as a study.

A grid of cells (n, T, d): every shape (n, T) of ``shapes`` with every d from ``d_min`` to
``d_max``, ``runs`` data sets each (the paper's unit-Gaussian generator, linear head; data
set r of a cell is run r of the seed with that shape). For every data set the host analysis
asks whether Att-SVM(alpha) is feasible (``svm.feasibility.check``) for each token choice
of ``alphas``: opt (the tokens of largest score gamma_it = Y_i v^T x_it) and random (uniform,
drawn from the run's initialization key). Everything is host-side float64. Prediction: 100%
feasible for every d >= max(T-1, n), below that possibly infeasible.
"""
from __future__ import annotations

from absl import logging
import numpy as np

from svmattn import registry
from svmattn import rng
from svmattn.config import common
from svmattn.config import fields as F
from svmattn.data import datasets as data_lib
from svmattn.figures import feasibility as figures
from svmattn.execution import pipeline
from svmattn.execution import sweep as sweep_lib
from svmattn.studies import svm_rank
from svmattn.svm import feasibility as feas_lib

NAME = "feasibility"
ALPHAS = ("opt", "random")
parse_shapes = svm_rank.parse_shapes   # "n:T" entries -> (n, T); ValueError for a bad one


def grid(fl: dict) -> tuple[list[tuple[int, int]], np.ndarray, list[str]]:
  """(shapes, ds, alphas) of flag values ``fl``; ValueError for bad ones."""
  shapes = parse_shapes(fl.shapes)
  if not 1 <= int(fl.d_min) <= int(fl.d_max):
    raise ValueError(f"need 1 <= d_min <= d_max, got {fl.d_min}, {fl.d_max}")
  alphas = list(fl.alphas)
  if not alphas or any(a not in ALPHAS for a in alphas):
    raise ValueError(f"alphas: use opt and/or random, got {alphas}")
  return shapes, np.arange(int(fl.d_min), int(fl.d_max) + 1), alphas


def token_choices(spec, seed, runs, data) -> dict:
  """alpha = opt and a uniform random alpha (B, n) each: the random one is
  jax.random.randint(k_init, (n,), 0, T) of each run's initialization key, computed on the host
  (``rng.randints``: integer arithmetic, JAX's values bit for bit, no program to compile;
  a program per (n, T) took 1 to 1.5 s to compile)."""
  opt = svm_rank.opt_tokens(data)
  init_keys = rng.split_keys(rng.run_keys(seed, np.asarray(runs, np.uint32)))[:, 1]
  return {"opt": np.asarray(opt), "random": rng.randints(init_keys, spec.n, 0, spec.T)}


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  """The E9 study of flag values ``fl`` (runs, seed, shapes, d_min, d_max, alphas, batch_size)."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  shapes, ds, alphas = grid(fl)
  if int(fl.runs) < 1:
    raise ValueError("runs must be >= 1")

  def load(cell, runs):
    label = cell.label
    spec = data_lib.DataSpec(label["n"], label["T"], label["d"]).validate()
    data = data_lib.generate_host(spec, fl.seed, runs)             # host-side float64 checks
    choice = token_choices(spec, fl.seed, runs, data)
    return {"X": np.asarray(data.X, np.float64), "Z": np.asarray(data.Z, np.float64),
            **{f"alpha_{a}": choice[a] for a in dict.fromkeys(alphas)}}

  cells = tuple(pipeline.Cell({"n": c["shape"][0], "T": c["shape"][1], "d": c["d"]}, int(fl.runs))
                for c in sweep_lib.grid({"shape": shapes, "d": [int(d) for d in ds]}))
  return pipeline.Study(NAME, cells, load, lambda cell: (), analyze, fl.batch_size, fl.seed,
                        identity if identity is not None else fl)


def analyze(label: dict, data: dict, stage_arrays: dict) -> dict:
  """Per data set and token choice A (the batch's alpha_A): feasible_A (bool), status_A and
  method_A (how it was decided: lstsq or nnls)."""
  del label, stage_arrays
  X, Z = np.asarray(data["X"], np.float64), np.asarray(data["Z"], np.float64)
  out = {"run": np.asarray(data["runs"], np.int64)}
  for key in sorted(k for k in data if k.startswith("alpha_")):
    a = key[len("alpha_"):]
    res = feas_lib.check(X, Z, np.asarray(data[key]))
    out[f"feasible_{a}"] = np.asarray(res.feasible, bool)
    out[f"status_{a}"] = np.asarray(res.status, "<U10")
    out[f"method_{a}"] = np.asarray(res.method, "<U5")
  return out


def reduce(fl: dict, cells: list) -> tuple[dict, dict]:
  """(results.npz arrays, summary) from the per-run arrays of every cell (run order)."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  shapes, ds, alphas = grid(fl)
  R, D = int(fl.runs), len(ds)
  batch = int(fl.batch_size)
  feasible = np.zeros((len(shapes), len(alphas), D, R), bool)
  method = np.full((len(shapes), len(alphas), D, R), "", dtype="<U5")
  status_counts = {}
  for c, arrays in enumerate(cells):
    si, di = divmod(c, D)
    for ai, a in enumerate(alphas):
      feasible[si, ai, di] = arrays[f"feasible_{a}"]
      method[si, ai, di] = arrays[f"method_{a}"]
    for lo in range(0, R, batch):    # counted in the order of the one-process run: batch, alpha, data set
      for a in alphas:
        for s in arrays[f"status_{a}"][lo:lo + batch]:
          status_counts[str(s)] = status_counts.get(str(s), 0) + 1
  fraction = feasible.mean(axis=-1)
  arrays = {"feasible": feasible, "fraction": fraction, "method": method, "ns": np.array([s[0] for s in shapes]),
            "Ts": np.array([s[1] for s in shapes]), "ds": ds, "alphas": np.array(alphas), "runs": np.arange(R)}
  summary_cells, checks = [], []
  for si, (n, T) in enumerate(shapes):
    threshold = max(T - 1, n)
    for ai, a in enumerate(alphas):
      for di, d in enumerate(ds):
        summary_cells.append({"n": n, "T": T, "d": int(d), "alpha": a,
                              "feasible_fraction": float(fraction[si, ai, di]),
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
      full = [j for j in range(D) if np.all(fraction[si, ai, j:] == 1.0)]
      first_full[f"n={n},T={T},alpha={a}"] = int(ds[full[0]]) if full else None
  summary = {"experiment": "E9 feasibility vs d", "shapes": shapes, "ds": ds, "runs_per_cell": R,
             "cells": summary_cells, "status_counts": status_counts,
             "smallest_d_feasible_from_then_on": first_full,
             "decision": "svmattn.svm.feasibility.check: batched least-squares certificate, exact NNLS test "
                         "(Lawson-Hanson, residual r = 0 <=> infeasible) where undecided",
             "checks": checks}
  return arrays, summary


# ----------------------------------------------------------------------------------------
# The experiment's settings and registry entry
# ----------------------------------------------------------------------------------------


def report(summary: dict, fl: dict) -> list[str]:
  """The terminal lines of a finished run (the checks follow)."""
  lines = [f"E9 feasibility: {summary['runs_per_cell']} data sets per cell"]
  for key, d in summary["smallest_d_feasible_from_then_on"].items():
    lines.append(f"  {key:<28} 100% feasible from d={d}")
  return lines


def prepare(fl: dict, study: pipeline.Study) -> None:
  shapes, ds, alphas = grid(fl)
  logging.info("E9: shapes %s, d %d..%d, %d runs per cell, alphas %s", shapes, ds[0], ds[-1], fl.runs, alphas)


def key_numbers(summary: dict) -> list:
  """Per shape and token choice, as the checks compute them: the smallest feasible fraction over
  d >= max(T-1, n), and the feasible fraction at the smallest d where that d is below max(T-1, n)."""
  rows = {}
  for x in summary.get("cells") or []:
    rows.setdefault((x["n"], x["T"], x["alpha"]), []).append(x)
  above, smallest = [], []
  for (n, T, a), cells in rows.items():
    threshold = max(T - 1, n)
    at = [x["feasible_fraction"] for x in cells if x["d"] >= threshold]
    if at:
      above.append((f"feasible at d >= max(T-1, n) (n={n} T={T} alpha={a})", min(at)))
    if cells[0]["d"] < threshold:
      smallest.append((f"feasible at the smallest d={cells[0]['d']} (n={n} T={T} alpha={a})",
                       cells[0]["feasible_fraction"]))
  return above + smallest


def _alphas(values):
  return None if values and all(a in ALPHAS for a in values) else "must list opt and/or random"


SETTINGS = (common.base(runs=1000) + common.pipeline(batch_size=1000) + F.Settings((
    svm_rank.no_data("E9: it sweeps d, a data file has one d"),
    F.List("shapes", ("5:5", "10:5", "5:10"), "Shapes n:T (sequences:tokens).", check=svm_rank.shapes_check),
    F.Int("d_min", 1, "Smallest embedding dimension d.", lower=1),
    F.Int("d_max", 14, "Largest embedding dimension d (include some d >= max(T-1, n)).", lower=1),
    F.List("alphas", ALPHAS, "Token choices: opt (largest score) and/or random.", check=_alphas),
), (F.Rule(("d_min", "d_max"), lambda v: None if v["d_min"] <= v["d_max"] else "need --d_min <= --d_max"),)))

EXPERIMENT = registry.Experiment(
    id="E9", name=NAME, title="Feasibility of Att-SVM vs d",
    cost_s=9,
    claim="Att-SVM(alpha) is feasible for every selection alpha once d >= max(T-1, n); below that it can be "
          "infeasible.",
    settings=SETTINGS, quick={"runs": 200, "shapes": ["5:5", "10:5"], "d_max": 11},
    key_numbers=key_numbers, figures=figures.draw, report=report, prepare=prepare,
    timing_names={"data_s": "data", "data_wait_s": "data_wait", "svm_s": "feasibility", "wall_s": "pipeline_wall"})
