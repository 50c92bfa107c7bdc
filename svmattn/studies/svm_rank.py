"""E3: numerical rank of the Frobenius and the nuclear Att-SVM solutions (docs/science.md section 8), as a study.

A grid of cells (n, T, d): every shape (n, T) of ``shapes`` with every d of ``ds``. Data
set r of a cell is run r of the paper's unit-Gaussian generator (linear head) with that
shape; alpha = opt (the tokens of largest score gamma_it = Y_i v^T x_it). A cell draws its
data sets in run order until ``runs`` of them have a feasible Att-SVM(opt)
(``svm.feasibility.check``), at most ``max_draws_factor * runs`` (the cell's ``runs`` in the
pipeline; it stops early through ``Study.enough``, in growing batches: ``Study.grow``). The host analysis of a batch checks the
feasibility of every data set and, where feasible, solves Att-SVM(opt) in the Frobenius
norm (NNLS, exact) and the nuclear norm (``nuc_solver``) and takes numerical ranks with
relative tolerance ``rtol``; the reduction keeps the first ``runs`` feasible data sets of
each cell in run order (a batch may hold more: they are solved, and left out). Every solve
starts cold (``solve_many``), so a data set's results depend on it alone, whatever the batch
size, the worker count or an interruption, and alone in a replay. Everything is host-side
float64. Prediction: the nuclear solution has lower rank than the Frobenius one, whose rank
is min(n, d).
"""
from __future__ import annotations

import dataclasses
import logging
import math

from absl import logging as absl_logging
import numpy as np

from svmattn import registry
from svmattn.analysis import metrics
from svmattn.config import allowed
from svmattn.config import common
from svmattn.config import fields as F
from svmattn.data import datasets as data_lib
from svmattn.figures import svm_rank as figures
from svmattn.execution import pipeline
from svmattn.execution import sweep as sweep_lib
from svmattn.svm import att_svm as svm_lib
from svmattn.svm import feasibility as feas_lib

NAME = "svm_rank"
NORMS = ("fro", "nuc")
NORM_NAMES = {"fro": "Frobenius", "nuc": "nuclear"}
NUC_SOLVERS = ("SCS", "CLARABEL", "scs_direct", "clarabel_dual", "nuc_auto", "nuc_ipm")
# nuc_auto: the dual by Clarabel's interior point for small reduced problems, SCS on the primal
# otherwise. Against cvxpy's SCS (eps 1e-9, the default before issue 14) over E3's 4000 data
# sets: the same ranks wherever both solved, 4 data sets SCS left "failed" solved, and on
# ill-conditioned ones (n=15, T=5, d=3) an objective 12% lower that cvxpy's Clarabel confirms.
# nuc_ipm (the default from numerics version 12): svmattn.svm.nuclear_ipm, the interior point built
# for rank-one constraint rows, a batch's problems of one shape stacked, nuc_auto where it does not finish.
DEFAULT_NUC_SOLVER = "nuc_ipm"
UNSOLVED = "unsolved"   # per-run SVM status of a data set with an infeasible Att-SVM(opt) ("" in results.npz)

log = logging.getLogger(__name__)


def parse_shapes(values) -> list[tuple[int, int]]:
  """Entries "n:T" as (n, T) pairs; ValueError naming a bad one (n >= 1, T >= 2)."""
  shapes = []
  for v in values:
    try:
      n, T = (int(x) for x in str(v).split(":"))
    except ValueError:
      raise ValueError(f"expected entries n:T such as 5:5, got {v!r}") from None
    if n < 1 or T < 2:
      raise ValueError(f"need n >= 1 and T >= 2, got n={n} T={T}")
    shapes.append((n, T))
  if not shapes:
    raise ValueError("no shapes")
  return shapes


def grid(fl: dict) -> tuple[list[tuple[int, int]], list[int], list[tuple[int, int, int]]]:
  """(shapes, ds (sorted, distinct), cells (n, T, d) in the order shape-major, then d)."""
  shapes = parse_shapes(fl.shapes)
  ds = sorted({int(x) for x in fl.ds})
  return shapes, ds, [(*c["shape"], c["d"]) for c in sweep_lib.grid({"shape": shapes, "d": ds})]


def opt_tokens(data: data_lib.Dataset) -> np.ndarray:
  """(B, n) alpha = opt, the tokens of largest score (E3 and E9), computed on the host."""
  return metrics.optimal_tokens(metrics.linear_token_scores(data.v, data.X, data.Y))


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  """The E3 study of flag values ``fl`` (runs, seed, shapes, ds, rtol, max_draws_factor,
  nuc_solver, batch_size)."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  _, _, cells = grid(fl)
  R = int(fl.runs)
  if R < 1 or int(fl.max_draws_factor) < 1:
    raise ValueError("runs and max_draws_factor must be >= 1")
  if not float(fl.rtol) > 0:
    raise ValueError(f"rtol must be positive, got {fl.rtol}")
  if fl.nuc_solver not in NUC_SOLVERS:
    raise ValueError(f"unknown nuclear-norm solver {fl.nuc_solver!r}")
  max_draws = int(fl.max_draws_factor) * R
  rtol, nuc_solver = float(fl.rtol), fl.nuc_solver

  def load(cell, runs):
    label = cell.label
    spec = data_lib.DataSpec(label["n"], label["T"], label["d"]).validate()
    data = data_lib.generate_host(spec, fl.seed, runs)             # float64: host-side SVMs
    alpha = opt_tokens(data)
    # the analysis options travel with the batch (analyze is a module-level function)
    return {"X": np.asarray(data.X, np.float64), "Z": np.asarray(data.Z, np.float64), "alpha": alpha,
            "rtol": np.array(rtol), "nuc_solver": np.array(nuc_solver)}

  def enough(label, arrays):
    return int(np.sum(arrays["feasible"])) >= R

  study_cells = tuple(pipeline.Cell({"n": n, "T": T, "d": d}, max_draws) for n, T, d in cells)
  return pipeline.Study(NAME, study_cells, load, lambda cell: (), analyze, fl.batch_size, fl.seed,
                        identity if identity is not None else fl, enough=enough, grow=True)


def solve_many(X, Z, alpha, norm: str, nuc_solver: str) -> list[svm_lib.SVMResult]:
  """Att-SVM(alpha) of data sets X (B,n,T,d), Z (B,n,d), alpha (B,n): NNLS for "fro", ``nuc_solver``
  for "nuc" (any solver of ``svm.att_svm``; nuc_ipm stacks the problems of one shape). Every solve
  starts cold and works on its own problem, so a solution depends on its data set alone (bit for
  bit), whatever the batch, the worker or an interruption."""
  return svm_lib.att_svm_batch(X, Z, alpha, norm, None if norm == "fro" else nuc_solver)


def analyze(label: dict, data: dict, stage_arrays: dict) -> dict:
  """Per data set: feasibility of Att-SVM(opt) and, where feasible, the Frobenius and the
  nuclear SVM solutions' statuses (UNSOLVED where infeasible), numerical ranks (-1: not
  solved) and singular values (NaN: not solved)."""
  del stage_arrays
  X, Z, alpha = np.asarray(data["X"], np.float64), np.asarray(data["Z"], np.float64), np.asarray(data["alpha"])
  rtol, nuc_solver = float(data["rtol"]), str(data["nuc_solver"])
  B, d = len(X), X.shape[-1]
  res = feas_lib.check(X, Z, alpha)
  out = {"run": np.asarray(data["runs"], np.int64), "alpha": alpha, "feasible": np.asarray(res.feasible, bool),
         "feasibility": np.asarray(res.status, "<U10")}
  solve = np.flatnonzero(out["feasible"])
  for norm in NORMS:
    rank, status, sv = np.full(B, -1, np.int64), np.full(B, UNSOLVED, dtype="<U10"), np.full((B, d), np.nan)
    for b, r in zip(solve, solve_many(X[solve], Z[solve], alpha[solve], norm, nuc_solver)):
      status[b] = r.status
      if r.ok:
        sv[b] = np.linalg.svd(r.W, compute_uv=False)
        rank[b] = int(np.sum(sv[b] > rtol * sv[b][0]))       # metrics.numerical_rank of these values
    out[f"rank_{norm}"], out[f"status_{norm}"], out[f"singular_values_{norm}"] = rank, status, sv
  return out


def kept(fl: dict, cell: dict) -> dict:
  """The first ``runs`` feasible data sets of a cell's per-run arrays (in run order) and the
  draw counts up to the one that completed the cell (all of them when it stayed incomplete)."""
  R = int(fl.runs)
  feasible = np.asarray(cell["feasible"], bool)
  idx = np.flatnonzero(feasible)[:R]
  draws = int(idx[-1]) + 1 if len(idx) == R else len(feasible)
  status = np.asarray(cell["feasibility"])[:draws]
  return {"index": idx, "draws": draws, "infeasible": int(np.sum(status == "infeasible")),
          "failed": int(np.sum(status == "failed"))}


def reduce(fl: dict, cells: list) -> tuple[dict, dict]:
  """(results.npz arrays, summary) from the per-run arrays of every cell (run order)."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  shapes, ds, grid_cells = grid(fl)
  R, rtol, dmax = int(fl.runs), float(fl.rtol), max(ds)
  C = len(grid_cells)
  rank = {k: np.full((C, R), -1, np.int64) for k in NORMS}
  status = {k: np.full((C, R), "", dtype="<U10") for k in NORMS}
  sv = {k: np.full((C, R, dmax), np.nan) for k in NORMS}
  kept_runs = np.full((C, R), -1, np.int64)
  draws, infeasible, failed_checks = (np.zeros(C, np.int64) for _ in range(3))
  for c, ((n, T, d), arrays) in enumerate(zip(grid_cells, cells)):
    k = kept(fl, arrays)
    idx, K = k["index"], len(k["index"])
    draws[c], infeasible[c], failed_checks[c] = k["draws"], k["infeasible"], k["failed"]
    kept_runs[c, :K] = np.asarray(arrays["run"])[idx]
    for norm in NORMS:
      rank[norm][c, :K] = arrays[f"rank_{norm}"][idx]
      status[norm][c, :K] = arrays[f"status_{norm}"][idx]    # kept: feasible, so solved
      sv[norm][c, :K, :d] = arrays[f"singular_values_{norm}"][idx]
    if K < R:
      log.warning("E3 cell n=%d T=%d d=%d: only %d feasible data sets in %d draws", n, T, d, K, draws[c])

  def mean_rank(norm, c):
    ok = rank[norm][c] >= 0
    return float(np.mean(rank[norm][c][ok])) if ok.any() else float("nan")

  summary_cells = []
  for c, (n, T, d) in enumerate(grid_cells):
    both = (rank["fro"][c] >= 0) & (rank["nuc"][c] >= 0)
    summary_cells.append({
        "n": n, "T": T, "d": d, "feasible_kept": int(np.sum(kept_runs[c] >= 0)), "draws": int(draws[c]),
        "infeasible_draws": int(infeasible[c]), "failed_checks": int(failed_checks[c]),
        "complete": bool(np.sum(kept_runs[c] >= 0) == R),
        "mean_rank_fro": mean_rank("fro", c), "mean_rank_nuc": mean_rank("nuc", c),
        "min_n_d": min(n, d),
        "nuc_minus_fro_paired_mean": float(np.mean(rank["nuc"][c][both] - rank["fro"][c][both])) if both.any()
        else None,
        "status_fro": {s: int(np.sum(status["fro"][c] == s)) for s in svm_lib.STATUSES},
        "status_nuc": {s: int(np.sum(status["nuc"][c] == s)) for s in svm_lib.STATUSES}})
  arrays = {"cells": np.array(grid_cells), "rank_fro": rank["fro"], "rank_nuc": rank["nuc"],
            "status_fro": status["fro"], "status_nuc": status["nuc"], "singular_values_fro": sv["fro"],
            "singular_values_nuc": sv["nuc"], "kept_runs": kept_runs, "draws": draws,
            "infeasible_draws": infeasible, "rtol": np.array(rtol)}
  nuc_solver = fl.nuc_solver
  summary = {"experiment": "E3 rank of SVM solutions", "rank_rtol": rtol,
             "rank_definition": f"number of singular values > {rtol:g} * the largest (metrics.numerical_rank)",
             "solvers": {"fro": "nnls", "nuc": nuc_solver}, "cells": summary_cells,
             "incomplete_cells": [f"n={x['n']} T={x['T']} d={x['d']}: {x['feasible_kept']} feasible in "
                                  f"{x['draws']} draws" for x in summary_cells if not x["complete"]],
             "checks": checks(summary_cells, shapes)}
  return arrays, summary


def checks(cells, shapes) -> list:
  """Acceptance checks from the per-cell mean ranks (cells with at least one solved pair)."""
  solved = [x for x in cells if np.isfinite(x["mean_rank_fro"]) and np.isfinite(x["mean_rank_nuc"])]
  out = []
  if solved:
    worst = max(solved, key=lambda x: x["mean_rank_nuc"] - x["mean_rank_fro"])
    gap = worst["mean_rank_nuc"] - worst["mean_rank_fro"]
    out.append({"name": "max over cells of mean nuclear rank - mean Frobenius rank "
                        f"(at n={worst['n']} T={worst['T']} d={worst['d']})",
                "value": gap, "expected": "<= 0 (nuclear rank never above Frobenius)", "ok": bool(gap <= 0)})
    rows_lower = [(n, T) for n, T in shapes
                  if any(x["mean_rank_nuc"] < x["mean_rank_fro"] for x in solved if (x["n"], x["T"]) == (n, T))]
    out.append({"name": "(n,T) rows with some d where mean nuclear rank < mean Frobenius rank",
                "value": f"{len(rows_lower)}/{len(shapes)}", "expected": "every row (strictly lower for some d)",
                "ok": len(rows_lower) == len(shapes)})
    complete = [x for x in solved if x["complete"]]
    if complete:
      ratio = min(x["mean_rank_fro"] / x["min_n_d"] for x in complete)
      worst = min(complete, key=lambda x: x["mean_rank_fro"] / x["min_n_d"])
      out.append({"name": "min over complete cells of mean Frobenius rank / min(n, d) "
                          f"(at n={worst['n']} T={worst['T']} d={worst['d']})",
                  "value": ratio, "expected": ">= 0.95 (Frobenius rank reaches min(n, d))",
                  "ok": bool(ratio >= 0.95)})
  incomplete = [x for x in cells if not x["complete"]]
  out.append({"name": "cells with fewer feasible data sets than --runs within the draw cap",
              "value": len(incomplete), "expected": "only cells with d < max(T-1, n) (always feasible above)",
              "ok": all(x["d"] < max(x["T"] - 1, x["n"]) for x in incomplete)})
  return out


# ----------------------------------------------------------------------------------------
# The experiment's settings and registry entry
# ----------------------------------------------------------------------------------------


def no_data(why: str):
  """The --data field of ``common.base`` refusing any file: ``why`` names the experiment and its reason."""
  return dataclasses.replace(common.base().field("data"),
                             check=lambda v: None if v is None else f"is not supported by {why}")


def shapes_check(values):
  try:
    parse_shapes(values)
  except ValueError:
    return "must be a non-empty list of n:T with n >= 1 and T >= 2, such as 5:5,10:5"
  return None


def report(summary: dict, fl: dict) -> list[str]:
  """The terminal lines of a finished run (the checks follow)."""
  lines = [f"E3 SVM rank (rtol {summary['rank_rtol']:g}):"]
  lines.append("      n   T   d  kept draws  rank_fro rank_nuc")
  for x in summary["cells"]:
    lines.append(f"    {x['n']:3d} {x['T']:3d} {x['d']:3d} {x['feasible_kept']:5d} {x['draws']:5d}  "
                 f"{x['mean_rank_fro']:8.2f} {x['mean_rank_nuc']:8.2f}")
  return lines


def prepare(fl: dict, study: pipeline.Study) -> None:
  absl_logging.info("E3: %d cells, %d feasible data sets each, rtol %g", len(study.cells), fl.runs, fl.rtol)


def _finite(x) -> bool:
  return isinstance(x, (int, float)) and math.isfinite(x)


def key_numbers(summary: dict) -> list:
  """The (n, T) rows with some d where the mean nuclear rank is below the mean Frobenius rank (of the
  cells where both were solved), as "rows/shapes"."""
  cells = summary.get("cells") or []
  shapes = list(dict.fromkeys((x["n"], x["T"]) for x in cells))
  lower = {(x["n"], x["T"]) for x in cells if _finite(x["mean_rank_fro"]) and _finite(x["mean_rank_nuc"])
           and x["mean_rank_nuc"] < x["mean_rank_fro"]}
  return [("(n, T) rows where the nuclear rank is lower", f"{len(lower)}/{len(shapes)}")] if shapes else []


# A cell stops early once it holds --runs feasible data sets: one process. Small batches: the
# feasible data sets of a cell's last batch beyond the --runs-th are solved too (and left out).
SETTINGS = (common.base(runs=100) + common.pipeline(batch_size=50, hosts=False) + F.Settings((
    no_data("E3: it sweeps shapes and d"),
    F.List("shapes", ("5:5", "10:5", "15:5", "5:10", "5:15"),
           "Shapes n:T. The paper: n in {5,10,15} with T=5 and T in {5,10,15} with n=5.", check=shapes_check),
    F.List("ds", (1, 2, 3, 4, 5, 10, 15, 20), "Embedding dimensions d.", item=int,
                 check=allowed.int_list(minimum=1)),
    F.Float("rtol", 1e-4, "Numerical rank: singular values > rtol * the largest.", check=allowed.positive),
    F.Int("max_draws_factor", 100, "Stop a cell after this many times --runs draws.", lower=1),
    F.Enum("nuc_solver", DEFAULT_NUC_SOLVER, NUC_SOLVERS,
           "Solver of the nuclear-norm SVM: nuc_ipm (the structured interior point; nuc_auto where it does not "
           "finish), nuc_auto (Clarabel on the dual for small problems, SCS on the primal otherwise), "
           "clarabel_dual, scs_direct, or SCS / CLARABEL through cvxpy."),
)))

EXPERIMENT = registry.Experiment(
    id="E3", name=NAME, title="Rank of Frobenius vs nuclear SVM solutions",
    cost_s=50,
    claim="The nuclear-norm Att-SVM (the (K,Q) limit) has lower rank than the Frobenius one (the W limit), "
          "whose rank is min(n, d).",
    settings=SETTINGS, quick={"runs": 10, "ds": [1, 2, 5, 10], "shapes": ["5:5", "10:5"]},
    key_numbers=key_numbers, figures=figures.draw, report=report, prepare=prepare,
    timing_names={"data_s": "data", "data_wait_s": "data_wait", "svm_s": "svm", "wall_s": "pipeline_wall"})
