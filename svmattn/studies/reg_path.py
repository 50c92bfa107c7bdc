"""E7: regularization paths RP-W and RP-KQ versus the attention SVM (docs/science.md sections 4 and 8), as a study.

One cell of ``runs`` data sets (the paper's generator, or the rows of a data file). The
host ``load`` also solves the Frobenius and the nuclear Att-SVM of the optimal tokens
(alpha = opt, gamma = Y v^T x): the paths start a second solve along them at every radius
(``candidates``). The device stage ``Paths`` (one per parameterization) computes the
regularization path of every data set on the geometric grid of radii R, which is part of
its configuration (``svmattn.train.regpath``); the host analysis correlates W_R (K_R Q_R^T)
with both SVMs. Prediction: the correlation with the SVM of the parameterization's own norm
rises to 1 as R grows.

``fl`` below is a dict of the experiment's settings (``SETTINGS``: the binary's flags or a config's
fields), or the "flags" of its summary.json: ``build`` rebuilds the same study from it.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from svmattn import registry
from svmattn.analysis import metrics
from svmattn.config import allowed
from svmattn.config import common
from svmattn.config import fields as F
from svmattn.data import datasets as data_lib
from svmattn.models import attention as model_lib
from svmattn.execution import pipeline
from svmattn.studies import local_convergence
from svmattn.svm import att_svm as svm_lib
from svmattn.train import loop as train_lib
from svmattn.train import regpath
from svmattn.figures import reg_path as figures

NAME = "reg_path"
OWN_NORM = {name: p.svm_norm for name, p in model_lib.PARAMETERIZATIONS.items()}
NORM_NAME = figures.NORM_NAME
PATH_FIELDS = ("loss", "constraint", "kkt_cos", "grad_norm", "took_candidate", "candidate_gain")
# data sets per compiled path solve (``Paths``): E7's default batch was 25, so a default run keeps its
# results bit for bit (the default batch is now 50, two blocks: measured faster on 2 cores)
BLOCK = 25
# the attention at the last radius, one compiled program (op by op it compiled eight small ones per shape)
_attention = jax.jit(jax.vmap(model_lib.attention))


@dataclasses.dataclass(frozen=True)
class Paths:
  """Device stage: the regularization path of every data set of a batch on the grid ``R``.

  ``config.param`` names the parameterization; with ``candidates`` every radius is also
  solved from a start along the SVM of the parameterization's own norm (the batch's
  svm_fro / svm_nuc, from ``load``; the identity where it is not solved) and the lower loss
  kept. (K,Q) starts are drawn from ``train.loop.init_keys(seed, runs)``.

  Stores per data set: W (B,G,d,d) (K_R Q_R^T for (K,Q)), the path fields loss, constraint,
  kkt_cos, grad_norm, took_candidate, candidate_gain (B,G), the tokens the attention at the
  largest radius selects, selected_at_rmax (B,n), and the grid R (B,G).

  A path is one compiled solve over the whole grid (warm-started from radius to radius),
  so there is nothing to save part-way: ``checkpoints`` is not used, and a batch interrupted
  in a path solves that path again on --resume (its other finished paths are kept).
  The solver (``train.regpath``, one jitted program vmapped over data sets) solves every batch in
  blocks of ``BLOCK`` data sets, the last one filled up with copies of
  the batch's first data set: XLA compiles a vmapped batch differently for different sizes (a batch
  of one about 1e-14 apart for (K,Q); batches of 25 and 50 apart on every data set, some (K,Q)
  paths then ending on another branch), while within one size a data set's path does not depend
  on its position. So a data set's path is the same whatever the batch it is in, and one program
  is compiled per path configuration."""
  name: str
  config: regpath.PathConfig
  R: tuple
  candidates: bool = True
  gradient_steps = False     # its steps are path points, not GD steps (the pipeline's work counts)
  concurrent = True          # the W and (K,Q) paths of a batch run at once, one per device (pipeline)

  @property
  def steps(self) -> int:
    return len(self.R)

  def run(self, batch: dict, runs: np.ndarray, seed: int, progress: Callable[[int], None], checkpoints):
    del checkpoints   # see the class docstring
    data = data_lib.Dataset(*(np.asarray(batch[f]) for f in data_lib.Dataset._fields))
    B, d = data.X.shape[0], data.X.shape[-1]
    R = np.asarray(self.R, np.float64)
    keys = train_lib.init_keys(seed, runs)
    cand = None
    if self.candidates:
      cand = np.array(batch[f"svm_{OWN_NORM[self.config.param]}"], np.float64)
      unsolved = ~np.all(np.isfinite(cand.reshape(B, -1)), axis=1)
      cand[unsolved] = np.eye(d)  # a harmless start where the SVM is not solved (corr is NaN there)
    block_size = BLOCK
    blocks, attention = [], []
    for lo in range(0, B, block_size):
      at = np.arange(lo, lo + block_size)
      at[at >= B] = 0                      # (the last block filled up with the first data set)
      block = data_lib.take(data, at)
      blocks.append(regpath.regularization_path(self.config, block, R, keys[at],
                                                candidates=None if cand is None else cand[at]))
      attention.append(_attention(jnp.asarray(blocks[-1].W[:, -1]), jnp.asarray(block.X), jnp.asarray(block.Z)))
    res = {f: np.concatenate([getattr(r, f) for r in blocks])[:B] for f in ("W",) + PATH_FIELDS}
    arrays = {**res,
              "selected_at_rmax": metrics.selected_tokens(np.concatenate([np.asarray(a) for a in attention])[:B]),
              "R": np.broadcast_to(R, (B, len(R))).copy()}
    if progress is not None:
      progress(self.steps)
    return arrays, 0.0   # compilation is part of the solve (regularization_path jits on first use)


def grid(fl: dict) -> np.ndarray:
  """The radii R (G,): fl["num_r"] radii from fl["r_min"] to fl["r_max"], evenly spaced in log R."""
  return regpath.geometric_grid(fl.r_min, fl.r_max, fl.num_r)


def path_config(fl: dict, param: str) -> regpath.PathConfig:
  return regpath.PathConfig(param=param, m=fl.m, loss=fl.loss, iters=fl.iters,
                            numerics=fl.numerics,
                            first_iters=fl.first_iters).validate()


def _dtype(fl: dict):
  return np.float32 if fl.precision == "float32" else np.float64


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  """The E7 study of flag values ``fl``: the data sets of fl["data"] (a .npz file; raises
  ``data.datasets.DataError`` for a bad one) or fl["runs"] generated ones. Raises ValueError
  for a bad grid (r_min, r_max, num_r)."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  spec = data_lib.DataSpec(fl.n, fl.T, fl.d, fl.attention).validate()
  R = tuple(float(r) for r in grid(fl))
  stage = tuple(Paths(p, path_config(fl, p), R, bool(fl.candidates)) for p in fl.params)
  dtype = _dtype(fl)
  file_data = data_lib.load_npz(fl.data, dtype) if fl.data else None
  runs = file_data.X.shape[0] if file_data is not None else fl.runs

  def load(cell, runs):
    if file_data is not None:
      batch = data_lib.take(file_data, runs)
    else:   # drawn in float64 and rounded, so that float32 runs see the same data sets
      batch = data_lib.generate_host(spec, fl.seed, runs)
      batch = data_lib.Dataset(*(np.asarray(a).astype(dtype) for a in batch))
    gamma = local_convergence.token_scores(batch)
    return {**batch._asdict(), "gamma": gamma, **svms(batch.X, batch.Z, metrics.optimal_tokens(gamma))}

  return pipeline.Study(NAME, (pipeline.Cell({}, int(runs)),), load, lambda cell: stage, analyze,
                        fl.batch_size, fl.seed, identity if identity is not None else fl,
                        light_analysis=True)


def svms(X, Z, opt) -> dict:
  """svm_{norm} (B,d,d) (NaN where not solved) and svm_{norm}_status (B,): the Frobenius and
  nuclear Att-SVM(opt) of every data set (on ``att_svm.THREADS`` threads; the same results)."""
  X, Z = np.asarray(X, np.float64), np.asarray(Z, np.float64)
  B, d = X.shape[0], X.shape[-1]
  solved = svm_lib.att_svm_many([(X[b], Z[b], opt[b], norm) for norm in svm_lib.NORMS for b in range(B)])
  out = {}
  for k, norm in enumerate(svm_lib.NORMS):
    stacked = svm_lib.stack(solved[k * B:(k + 1) * B], d)
    out[f"svm_{norm}"], out[f"svm_{norm}_status"] = stacked["W"], stacked["status"]
  return out


def analyze(label: dict, data: dict, paths: dict) -> dict:
  """Per run: optimal tokens, token scores, both SVMs of opt, and per parameterization P the
  path arrays (suffix _P), corr_P_norm (B,G) with both SVMs, ||W_R||_* / R (nuclear_over_R_P)
  and the tokens selected at the largest R."""
  del label
  gamma = data["gamma"]
  out = {"runs": data["runs"], "optimal_tokens": metrics.optimal_tokens(gamma), "token_scores": gamma}
  for norm in svm_lib.NORMS:
    out[f"svm_{norm}"] = data[f"svm_{norm}"]
    out[f"svm_{norm}_status"] = data[f"svm_{norm}_status"]
  for p, res in paths.items():
    out[f"W_{p}"] = res["W"]
    for name in PATH_FIELDS:
      out[f"{name}_{p}"] = res[name]
    for norm in svm_lib.NORMS:
      out[f"corr_{p}_{norm}"] = metrics.corr(res["W"], data[f"svm_{norm}"][:, None])   # (B, G)
    out[f"nuclear_over_R_{p}"] = np.linalg.norm(res["W"], "nuc", axis=(-2, -1)) / res["R"]
    out[f"selected_at_rmax_{p}"] = res["selected_at_rmax"]
  return out


def reduce(fl: dict, cells: list) -> tuple[dict, dict]:
  """(results.npz arrays, summary) from the per-run arrays of the one cell."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  a = cells[0]
  R = grid(fl)
  params = list(fl.params)
  opt = a["optimal_tokens"]
  B, n, T = a["token_scores"].shape
  d = a["svm_fro"].shape[-1]
  arrays = {"R": R, "runs": a["runs"], "optimal_tokens": opt, "token_scores": a["token_scores"]}
  for norm in svm_lib.NORMS:
    arrays[f"svm_{norm}"] = a[f"svm_{norm}"]
    arrays[f"svm_{norm}_status"] = a[f"svm_{norm}_status"]
  for p in params:
    arrays[f"W_{p}"] = a[f"W_{p}"]
    for name in PATH_FIELDS:
      arrays[f"{name}_{p}"] = a[f"{name}_{p}"]
    for norm in svm_lib.NORMS:
      arrays[f"corr_{p}_{norm}"] = a[f"corr_{p}_{norm}"]
    arrays[f"nuclear_over_R_{p}"] = a[f"nuclear_over_R_{p}"]
    arrays[f"selected_at_rmax_{p}"] = a[f"selected_at_rmax_{p}"]

  summary = {"experiment": "E7 regularization paths", "numerics": fl.numerics,
             "data_sets": int(B),
             "shape": {"n": int(n), "T": int(T), "d": int(d)}, "R": R.tolist(),
             "svm_status": {norm: {s: int(np.sum(a[f"svm_{norm}_status"] == s)) for s in svm_lib.STATUSES}
                            for norm in svm_lib.NORMS},
             "corr_at_rmax": {}, "selected_opt_at_rmax": {}, "candidate_wins": {}}
  for p in params:
    for norm in svm_lib.NORMS:
      final = arrays[f"corr_{p}_{norm}"][:, -1]
      ok = np.isfinite(final)
      summary["corr_at_rmax"][f"{p}_vs_{norm}"] = {
          "mean": float(np.mean(final[ok])) if ok.any() else None,
          "std": float(np.std(final[ok])) if ok.any() else None,
          "min": float(np.min(final[ok])) if ok.any() else None, "solved": int(ok.sum())}
    summary["selected_opt_at_rmax"][p] = float(np.mean(np.all(arrays[f"selected_at_rmax_{p}"] == opt, axis=1)))
    took, gain = arrays[f"took_candidate_{p}"], arrays[f"candidate_gain_{p}"]
    summary["candidate_wins"][p] = {
        "data_sets": int(np.sum(np.any(took, axis=1))),
        "radii": int(np.sum(took)),
        # a relative loss gain above 1e-6 means another branch of minima, not a finer solve
        "data_sets_other_branch": int(np.sum(np.any(gain > 1e-6, axis=1)))}
  summary["checks"] = checks(arrays, R, params)
  return arrays, summary


def _curve_rises(mean) -> bool:
  """The mean curve ends above where it starts and never falls by more than 1e-3
  over the upper half of the grid (where the limit is approached)."""
  upper = mean[len(mean) // 2:]
  return bool(mean[-1] > mean[0] and np.all(np.diff(upper) >= -1e-3))


def checks(arrays, R, params) -> list:
  """Acceptance checks computed from the results (docs/science.md section 4)."""
  out = []
  for p in params:
    norm = OWN_NORM[p]
    corr = arrays[f"corr_{p}_{norm}"]
    ok = np.all(np.isfinite(corr), axis=1)
    if not ok.any():
      out.append({"name": f"{p}: data sets with a solved {NORM_NAME[norm]} SVM(opt)", "value": 0,
                  "expected": ">= 1", "ok": False})
      continue
    mean = np.mean(corr[ok], axis=0)
    what = "W_R" if p == "W" else "K_R Q_R^T"
    out.append({"name": f"mean corr({what}, {NORM_NAME[norm]} W^mm(opt)) at the largest R={R[-1]:g}",
                "value": float(mean[-1]), "expected": ">= 0.99", "ok": bool(mean[-1] >= 0.99)})
    mid = len(R) // 2
    out.append({"name": f"mean corr({what}, {NORM_NAME[norm]} W^mm(opt)) rises with R "
                        f"(R={R[0]:g}, {R[mid]:g}, {R[-1]:g})",
                "value": f"{mean[0]:.4f}, {mean[mid]:.4f}, {mean[-1]:.4f}",
                "expected": "increasing to 1 (no drop > 1e-3 on the upper half of the grid)",
                "ok": _curve_rises(mean)})
    excess = float(np.max((arrays[f"constraint_{p}"] - R) / R))
    bound = "||W_R||_F <= R" if p == "W" else "(||K_R||^2+||Q_R||^2)/2 <= R"
    out.append({"name": f"{p}: max over data sets and R of (constraint - R)/R ({bound})",
                "value": excess, "expected": "<= 1e-12 (feasible)", "ok": bool(excess <= 1e-12)})
    kkt = 1.0 - arrays[f"kkt_cos_{p}"][:, -1]
    worst = float(np.nanmax(kkt)) if np.any(np.isfinite(kkt)) else float("nan")
    out.append({"name": f"{p}: max over data sets of 1 - cos(-grad L, params) at the largest R (KKT)",
                "value": worst, "expected": "<= 1e-6 (gradient anti-parallel to the solution)",
                "ok": bool(worst <= 1e-6)})
    loss = arrays[f"loss_{p}"]
    rise = float(np.max(np.diff(loss, axis=1) / loss[:, :-1])) if loss.shape[1] > 1 else 0.0
    out.append({"name": f"{p}: max relative loss increase from one R to the next",
                "value": rise, "expected": "<= 1e-12 (nested balls: the minimum cannot rise)",
                "ok": bool(rise <= 1e-12)})
    if p == "KQ":
      ratio = float(np.mean(arrays["nuclear_over_R_KQ"][:, -1]))
      out.append({"name": "mean ||K_R Q_R^T||_* / R at the largest R (balanced factors)",
                  "value": ratio, "expected": ">= 0.99 (-> 1)", "ok": bool(ratio >= 0.99)})
  return out


def report(summary: dict, fl: dict) -> list[str]:
  """The terminal lines of a finished run (the checks and the wall times follow)."""
  lines = [f"E7 regularization paths: {summary['data_sets']} data sets, R up to {summary['R'][-1]:g}"]
  for key, v in summary["corr_at_rmax"].items():
    if v["mean"] is not None:
      lines.append(f"  corr at R_max {key:<10} {v['mean']:.5f} +- {v['std']:.5f} (min {v['min']:.5f}, "
                   f"{v['solved']} solved)")
  for p, x in summary["selected_opt_at_rmax"].items():
    wins = summary["candidate_wins"][p]
    lines.append(f"  {p}: selects opt at R_max in {100 * x:.0f}% of data sets; the SVM start won at "
                 f"{wins['radii']} radii of {wins['data_sets']} data sets ({wins['data_sets_other_branch']} "
                 "with a loss gain > 1e-6: continuation was on another branch)")
  return lines


def prepare(fl: dict, study: pipeline.Study) -> None:
  """Log the study's size and grid (at INFO: shown with --verbosity=0)."""
  R = grid(fl)
  logging.info("E7: %d data sets, n=%d T=%d d=%d, %d radii in [%g, %g]", study.cells[0].runs, fl.n, fl.T,
               fl.d, len(R), R[0], R[-1])


def _grid_rule(v):
  try:
    regpath.geometric_grid(v["r_min"], v["r_max"], v["num_r"])
  except (ValueError, TypeError):
    return "need 0 < --r_min < --r_max (or --num_r=1)"
  return None


SETTINGS = (common.base(runs=100) + common.pipeline(batch_size=50) + common.numerics() + F.Settings((
    F.Int("n", 6, "Sequences per data set.", lower=1),
    F.Int("T", 8, "Tokens per sequence.", lower=2),
    F.Int("d", 10, "Embedding dimension (d >= max(T-1, n): the SVM of opt is feasible).", lower=1),
    F.Int("m", None, "(K,Q) width m (default d).", lower=1),
    F.Enum("attention", "cross", ["cross", "self"], "Cross-attention or self-attention."),
    F.Enum("loss", "logistic", ["logistic", "exponential", "correlation"], "Loss."),
    F.List("params", ("W", "KQ"), "Paths to compute: W, KQ.", check=allowed.params),
    F.Float("r_min", 0.5, "Smallest radius R.", check=allowed.positive),
    F.Float("r_max", 300.0, "Largest radius R (keep the margins R / ||W^mm|| below ~700: "
            "float64 gradients underflow beyond).", check=allowed.positive),
    F.Int("num_r", 24, "Number of radii (geometric grid).", lower=1),
    F.Int("iters", 400, "Solver iterations per radius.", lower=1),
    F.Int("first_iters", 2000, "Solver iterations at the smallest radius.", lower=1),
    F.Bool("candidates", True, "Also start every radius along the SVM of the optimal tokens and keep "
           "the lower loss (the problem is nonconvex: continuation alone can follow a local branch)."),
), (F.Rule(("r_min", "r_max", "num_r"), _grid_rule),)))

EXPERIMENT = registry.Experiment(
    id="E7", name=NAME, title="Regularization paths RP-W and RP-KQ",
    cost_s=10,
    claim="The regularization paths converge in direction to the Att-SVM as the radius R grows: W_R to the "
          "Frobenius W^mm, K_R Q_R^T to the nuclear W^mm_*.",
    settings=SETTINGS, quick={"runs": 20, "num_r": 16},
    key_numbers=(("corr(W_R, W^mm) at the largest R", "corr_at_rmax.W_vs_fro.mean"),
                 ("corr(K_R Q_R^T, W^mm_*) at the largest R", "corr_at_rmax.KQ_vs_nuc.mean")),
    figures=figures.draw, report=report, one_cell=False, prepare=prepare,
    timing_names={"train_s": "paths", "svm_s": "analysis", "wall_s": "pipeline_wall"})
