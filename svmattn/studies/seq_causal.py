"""E8: sequence-to-sequence and causal attention, GD versus their SVMs (docs/science.md sections 7-8), as a study.

One cell of ``runs`` seq2seq data sets (``svm.seq2seq.unit_gaussian``: every position k of
sequence i is a query z_ik = x_ik with its own label Y_ik; or the rows of a data file). The
modes are device stages: for each mode (seq2seq: all tokens visible; causal: position k sees
t <= k) and parameterization P, a ``stages.Train`` named "{mode}_{P}" trains P with
normalized GD on every data set. The host analysis reads off the tokens GD selected,
solves the matching SVM (Frobenius for W, nuclear for (K,Q); ``seq2seq.svm_batch``) and
correlates every snapshot with it; it also classifies each W run (global / local /
not-local) and records whether GD selected the optimal tokens opt_ik = argmax_t Y_ik v^T x_it
(causal: over t <= k; causal position 0 sees one token and is left out).

``fl`` below is a dict of the experiment's settings (``SETTINGS``: the binary's flags or a config's
fields), or the "flags" of its summary.json: ``build`` rebuilds the same study from it.
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
from svmattn.models import attention as model_lib
from svmattn.execution import pipeline
from svmattn.execution import stages
from svmattn.svm import att_svm as svm_lib
from svmattn.svm import seq2seq as s2s
from svmattn.train import loop as train_lib
from svmattn.figures import seq_causal as figures

NAME = "seq_causal"
OWN_NORM = {name: p.svm_norm for name, p in model_lib.PARAMETERIZATIONS.items()}
NORM_NAMES = figures.NORM_NAMES
CORR_TARGET = 0.99


def configs(fl: dict) -> tuple:
  """(("{mode}_{P}", mode, P, TrainConfig), ...) for every mode of fl["modes"] and P of fl["params"]."""
  out = []
  for mode in fl.modes:
    for p in fl.params:
      config = train_lib.TrainConfig(param=p, model=mode, loss=fl.loss, optimizer=fl.optimizer, lr=fl.lr,
                                     steps=fl.steps, snapshot_every=fl.snapshot_every,
                                     chunk_steps=fl.chunk_steps, numerics=fl.numerics,
                                     minibatch=fl.minibatch,
                                     sampling=fl.sampling).validate()
      out.append((f"{mode}_{p}", mode, p, config))
  return tuple(out)


def _dtype(fl: dict):
  return np.float32 if fl.precision == "float32" else np.float64


def token_scores(batch: data_lib.Dataset) -> np.ndarray:
  """gamma (B,n,T,T) float64: gamma_ikt = Y_ik v^T x_it, on the host in the batch's dtype (v^T x_it
  by ``analysis.metrics.linear_token_scores``: no program compiled per shape; numerics version 9,
  before a vmapped program of the head, within an ulp)."""
  X, Y, v = (np.asarray(a) for a in (batch.X, batch.Y, batch.v))
  h = metrics.linear_token_scores(v, X, np.ones(X.shape[:2], X.dtype))      # (B,n,T): v^T x_it
  return np.asarray(Y[..., :, None] * h[..., None, :], np.float64)


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  """The E8 study of flag values ``fl``: the seq2seq data sets of fl["data"] (a .npz file; raises
  ``data.datasets.DataError`` for a bad one) or fl["runs"] generated ones."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  for mode in fl.modes:
    if mode not in s2s.MODES:
      raise ValueError(f"unknown mode {mode!r}; use {', '.join(s2s.MODES)}")
  cfgs = configs(fl)
  dtype = _dtype(fl)
  file_data = s2s.load_npz(fl.data, dtype) if fl.data else None
  if file_data is not None:
    minibatch.check_loaded(fl, file_data.X.shape[1])
  runs = file_data.X.shape[0] if file_data is not None else fl.runs
  spec = None if file_data is not None else s2s.Seq2SeqSpec(fl.n, fl.T, fl.d, fl.labels).validate()

  def load(cell, runs):
    if file_data is not None:
      batch = data_lib.take(file_data, runs)
    else:   # drawn in the run's precision, as the E8 binary always did
      batch = data_lib.generate_host(spec, fl.seed, runs, sampler=s2s.unit_gaussian, dtype=dtype)
    batch = data_lib.Dataset(*(np.asarray(a) for a in batch))
    return {**batch._asdict(), "gamma": token_scores(batch)}

  return pipeline.Study(NAME, (pipeline.Cell({}, int(runs)),), load,
                        lambda cell: tuple(stages.Train(name, c) for name, _, _, c in cfgs),
                        functools.partial(analyze, saturation=fl.saturation),
                        fl.batch_size, fl.seed, identity if identity is not None else fl)


def analyze(label: dict, data: dict, trajs: dict, saturation: float = health.SATURATION) -> dict:
  """Per run, for each trained "{mode}_{P}": the final W, the selections (B,n,T), the SVM at
  them (svm_{mode}_{P}, _status), corr of every snapshot with it, the softmax and loss
  curves, whether every scored position selected the optimal token (global_), finite_ and,
  for the Frobenius SVM, the convergence type; optimal_{mode} (B,n,T) per mode."""
  del label
  X = np.asarray(data["X"], np.float64)
  gamma = data["gamma"]
  d = X.shape[-1]
  out = {"runs": data["runs"], "token_scores": gamma}
  for name, t in trajs.items():
    mode, p = name.rsplit("_", 1)
    norm = OWN_NORM[p]
    labels = health.add(out, name, t, saturation)   # an unhealthy run's convergence type is its label
    out.setdefault(f"optimal_{mode}", s2s.optimal_tokens(gamma, mode))
    selected = t["selected"]                                                 # (B,n,T)
    solved = s2s.svm_batch(X, selected, norm, mode=mode)
    stacked = svm_lib.stack(solved, d)
    optimal = s2s.selects_optimal(gamma, selected, mode)                     # (B,n,T)
    out.update({f"W_final_{name}": t["W"][:, -1], f"selected_{name}": selected,
                f"svm_{name}": stacked["W"], f"svm_{name}_status": stacked["status"],
                f"corr_{name}": metrics.corr(t["W"], stacked["W"][:, None]),   # (B,S)
                f"max_prob_{name}": t["max_prob"], f"loss_{name}": t["loss"],
                f"global_{name}": np.all(optimal, axis=(1, 2)), f"finite_{name}": t["finite"]})
    if norm == "fro":
      out[f"convergence_type_{name}"] = np.array(
          [s2s.convergence_type(gamma[b], selected[b], solved[b], mode) if labels[b] == "ok" else labels[b]
           for b in range(len(X))])
  return out


def _stats(x) -> dict:
  x = np.asarray(x, np.float64)
  if not np.any(np.isfinite(x)):
    return {"mean": None, "std": None, "min": None, "solved": 0}
  return {"mean": float(np.nanmean(x)), "std": float(np.nanstd(x)), "min": float(np.nanmin(x)),
          "solved": int(np.sum(np.isfinite(x)))}


def steps(fl: dict) -> np.ndarray:
  return train_lib.snapshot_steps(train_lib.schedule(fl.steps, fl.snapshot_every, fl.chunk_steps))


def reduce(fl: dict, cells: list) -> tuple[dict, dict]:
  """(results.npz arrays, summary) from the per-run arrays of the one cell."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  a = cells[0]
  gamma = a["token_scores"]
  B, n, T, _ = gamma.shape
  d = a[f"svm_{configs(fl)[0][0]}"].shape[-1]
  arrays = {"runs": a["runs"], "token_scores": gamma}
  summary = {"experiment": "E8 seq2seq and causal attention", "numerics": fl.numerics,
             "data_sets": int(B),
             "shape": {"n": int(n), "T": int(T), "d": int(d)}, "final_corr": {}, "svm_status": {},
             "global_selection": {}, "convergence_types": {}, "diverged_runs": {}}
  out_checks = []
  for mode in fl.modes:
    scored = int(n * np.sum(s2s.scored_positions(T, T, mode)))          # queries with >= 2 visible tokens
    arrays[f"optimal_{mode}"] = a[f"optimal_{mode}"]
    for p in fl.params:
      name, norm = f"{mode}_{p}", OWN_NORM[p]
      for key in ("W_final", "selected", "svm"):
        arrays[f"{key}_{name}"] = a[f"{key}_{name}"]
      arrays[f"svm_{name}_status"] = status_arr = a[f"svm_{name}_status"]
      for key in ("corr", "max_prob", "loss", "global"):
        arrays[f"{key}_{name}"] = a[f"{key}_{name}"]
      arrays.setdefault("steps", steps(fl))
      curve, selected = a[f"corr_{name}"], a[f"selected_{name}"]
      optimal = s2s.selects_optimal(gamma, selected, mode)
      positions = s2s.scored_positions(T, T, mode)
      all_opt = a[f"global_{name}"]
      summary["diverged_runs"][name] = int(np.sum(~a[f"finite_{name}"]))
      if f"health_{name}" in a:
        arrays[f"health_{name}"] = a[f"health_{name}"]
        arrays[f"stalled_step_{name}"] = a[f"stalled_step_{name}"]
        summary.setdefault("health", {})[name] = health.counts(a[f"health_{name}"])
      summary["final_corr"][f"{name}_vs_{norm}"] = _stats(curve[:, -1])
      status = {s: int(np.sum(status_arr == s)) for s in svm_lib.STATUSES}
      summary["svm_status"][f"{name}_{norm}"] = status
      summary["global_selection"][name] = {
          "runs_all_positions_optimal": float(np.mean(all_opt)),
          "positions_optimal": float(np.mean(optimal[:, :, positions])),
          "scored_positions_per_data_set": scored}
      if norm == "fro":
        types = a[f"convergence_type_{name}"]
        arrays[f"convergence_type_{name}"] = types
        summary["convergence_types"][name] = metrics.type_fractions(list(types))

      final = summary["final_corr"][f"{name}_vs_{norm}"]
      out_checks.append({"name": f"{mode}: final corr({p}_GD, {NORM_NAMES[norm]} SVM at GD's selection), "
                                 f"mean over {final['solved']} feasible runs",
                         "value": final["mean"] if final["mean"] is not None else "no feasible run",
                         "expected": f">= {CORR_TARGET}",
                         "ok": bool(final["mean"] is not None and final["mean"] >= CORR_TARGET)})
      if d >= scored:
        feasible = status["optimal"] / B
        out_checks.append({"name": f"{mode}: share of runs whose SVM at GD's selection is solved ({p}, {norm})",
                           "value": feasible,
                           "expected": f"= 1 (d = {d} >= {scored} queries with a choice: every selection is "
                                       "feasible)",
                           "ok": bool(feasible == 1.0)})
  summary["checks"] = out_checks
  return arrays, summary


def report(summary: dict, fl: dict) -> list[str]:
  """The terminal lines of a finished run (the checks and the wall times follow)."""
  lines = [f"E8 seq2seq / causal: {summary['data_sets']} data sets, shape {summary['shape']}"]
  for key, v in summary["final_corr"].items():
    if v["mean"] is not None:
      lines.append(f"  corr {key:<16} {v['mean']:.4f} +- {v['std']:.4f} (min {v['min']:.4f}, "
                   f"{v['solved']} solved)")
    else:
      lines.append(f"  corr {key:<16} no feasible SVM")
  for key, g in summary["global_selection"].items():
    lines.append(f"  optimal tokens {key:<10} all positions {100 * g['runs_all_positions_optimal']:.0f}% of runs, "
                 f"{100 * g['positions_optimal']:.1f}% of positions")
  for key, fr in summary["convergence_types"].items():
    lines.append(f"  types {key:<10} " + "  ".join(f"{k} {100 * x:.0f}%" for k, x in fr.items()))
  return lines


def prepare(fl: dict, study: pipeline.Study) -> None:
  """Warn about float32, and log the study's size (at INFO: shown with --verbosity=0)."""
  if fl.precision == "float32":
    logging.warning("float32: gradients of saturated softmax underflow; see BUILD.md")
  logging.info("E8: %d data sets, n=%d T=%d d=%d, modes %s, params %s", study.cells[0].runs, fl.n, fl.T,
               fl.d, fl.modes, fl.params)


def key_numbers(summary: dict) -> list:
  """The mean final corr(W_GD, own-norm SVM at GD's selection) of every mode and parameterization."""
  out = []
  for key, v in summary["final_corr"].items():
    name, norm = key.rsplit("_vs_", 1)
    mode, p = name.rsplit("_", 1)
    out.append((f"corr({'W' if p == 'W' else 'KQ^T'}, {NORM_NAMES[norm]} SVM): {mode}", v["mean"]))
  return out


def _modes(values):
  if values and all(m in s2s.MODES for m in values) and len(set(values)) == len(values):
    return None
  return f"must list distinct modes among {list(s2s.MODES)}"


SETTINGS = (common.base(runs=100) + common.pipeline(batch_size=1000) + common.numerics() + F.Settings((
    F.Int("n", 4, "Sequences per data set.", lower=1),
    F.Int("T", 5, "Tokens (= query positions) per sequence.", lower=2),
    F.Int("d", 20, "Embedding dimension (d >= n T: every selection's SVM is feasible).", lower=1),
    F.Int("steps", 2000, "Optimizer steps.", lower=0),
    F.Float("lr", 0.1, "Learning rate (step size eta).", check=allowed.positive),
    F.List("modes", s2s.MODES, "Attention modes: seq2seq and/or causal.", check=_modes),
    F.List("params", ("W",), "Parameterizations to train: W (vs Frobenius SVM), KQ (vs nuclear SVM).",
           check=allowed.params),
    F.Enum("loss", "logistic", ["logistic", "exponential", "correlation"], "Loss."),
    F.Str("optimizer", "normalized_gd", "normalized_gd, gd, or an optax optimizer name.", check=allowed.optimizer),
    F.Enum("labels", "random", ["random", "positive"], "Labels Y_ik: uniform +-1 or all +1."),
    F.Int("snapshot_every", 10, "Record W, softmax and loss every this many steps.", lower=1),
    F.Int("chunk_steps", 500, "Steps per jitted chunk (progress granularity; a checkpoint is saved "
          "after each).", lower=1),
)) + minibatch.settings())

EXPERIMENT = registry.Experiment(
    id="E8", name=NAME, title="Sequence-to-sequence and causal attention",
    cost_s=4,
    claim="Sequence-to-sequence and causal attention converge in direction to their own Att-SVMs (one set of "
          "constraints per query position).",
    settings=SETTINGS, quick={"runs": 20},
    key_numbers=key_numbers, figures=figures.draw, report=report, prepare=prepare)
