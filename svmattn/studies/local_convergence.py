"""E2: local convergence of normalized GD to the attention SVM (docs/science.md section 8), as a study.

One cell of ``runs`` data sets (generated from (seed, run), or the rows of a data file);
W and/or (K,Q) trained on each; the host analysis solves the Frobenius and the nuclear
Att-SVM at the tokens each parameterization selected and correlates every snapshot with
them (``analysis.versus_svm.compare_with_svms``).

``fl`` below is a dict of the experiment's settings (``SETTINGS``: the binary's flags or a
config's fields), or the "flags" of its summary.json: replay rebuilds the same study from it.
"""
from __future__ import annotations

import functools

import numpy as np

from svmattn import registry
from svmattn.analysis import versus_svm
from svmattn.analysis import health
from svmattn.analysis import metrics
from svmattn.analysis import observables
from svmattn.analysis import predictions
from svmattn.config import allowed
from svmattn.config import common
from svmattn.config import fields as F
from svmattn.data import datasets as data_lib
from svmattn.execution import pipeline
from svmattn.execution import stages
from svmattn.models import losses
from svmattn.svm import att_svm as svm_lib
from svmattn.train import init_file as init_lib
from svmattn.train import loop as train_lib
from svmattn.figures import local_convergence as figures

NAME = "local_convergence"
NORM_NAMES = figures.NORM_NAMES


def loss_scale(value: str, precision: str):
  """--loss_scale: "default" is "auto" in float32 (see BUILD.md) and 1 in float64; else "auto" or a number."""
  if value == "default":
    return "auto" if precision == "float32" else 1.0
  if value == "auto":
    return value
  try:
    return float(value)
  except ValueError:
    raise ValueError(f"--loss_scale must be 'default', 'auto' or a positive number, got {value!r}") from None


def setup(fl: dict):
  """(DataSpec, ((name, TrainConfig), ...)) of an E2 run from its settings (``config.fields.Values``,
  or any mapping of every E2 setting)."""
  fl = F.Values(fl)
  spec = data_lib.DataSpec(fl.n, fl.T, fl.d, fl.attention, fl.query_pos).validate()
  configs = tuple((p, train_lib.TrainConfig(
      param=p, m=fl.m, loss=fl.loss, optimizer=fl.optimizer, lr=fl.lr, steps=fl.steps,
      snapshot_every=fl.snapshot_every, chunk_steps=fl.chunk_steps, block_size=fl.block_size,
      loss_scale=loss_scale(fl.loss_scale, fl.precision),
      numerics=fl.numerics, init=init_scheme(fl), init_scale=fl.init_scale, minibatch=fl.minibatch,
      sampling=fl.sampling).validate())
      for p in fl.params)
  return spec, configs


def token_scores(batch: data_lib.Dataset) -> np.ndarray:
  """The linear head's token scores gamma (B, n, T) of a batch, computed on the host in the
  batch's dtype (``analysis.metrics.linear_token_scores``), as float64."""
  return np.asarray(metrics.linear_token_scores(batch.v, batch.X, batch.Y), np.float64)


def batches(spec: data_lib.DataSpec, seed: int, dtype=np.float64, file_data: data_lib.Dataset | None = None,
            test_n: int = 0, file_test: dict | None = None):
  """load(runs) -> {X, Y, Z, v (host arrays), gamma (token scores)}: the rows ``runs`` of
  ``file_data`` (as loaded), or those runs of ``spec``'s generator at ``seed`` cast to ``dtype``.
  The data source of every study on E2's data sets. With a test set (the rows of ``file_test``, or
  ``test_n`` sequences per run from the generator's test key: ``data.generate_test_host``), also
  X_test, Y_test, Z_test; the training arrays are the same with or without it."""
  def load(runs):
    if file_data is not None:
      batch = data_lib.take(file_data, runs)
    else:
      batch = data_lib.generate_host(spec, seed, runs)
      batch = data_lib.Dataset(*(np.asarray(a).astype(dtype) for a in batch))
    out = {**{f: np.asarray(a) for f, a in batch._asdict().items()}, "gamma": token_scores(batch)}
    if file_test is not None:
      out.update({k: np.asarray(v)[np.asarray(runs)] for k, v in file_test.items()})
    elif test_n and file_data is None:
      out.update({k: v.astype(dtype) for k, v in data_lib.generate_test_host(spec, seed, runs, test_n).items()})
    return out
  return load


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  """The E2 study of flag values ``fl``: the data sets of fl["data"] (a .npz file; raises
  ``data.datasets.DataError`` for a bad one) or fl["runs"] generated ones."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  spec, configs = setup(fl)
  dtype = np.float32 if fl.precision == "float32" else np.float64
  file_data = data_lib.load_npz(fl.data, dtype) if fl.data else None
  file_test = data_lib.load_test_npz(fl.data, file_data, dtype) if fl.data else None
  if fl.data and fl.test_n and file_test is None:
    raise ValueError(f"--test_n={fl.test_n}: a --data file's test set comes from the file (X_test, Y_test, "
                     f"Z_test), and {fl.data} has none")
  runs = file_data.X.shape[0] if file_data is not None else fl.runs
  load = batches(spec, fl.seed, dtype, file_data, fl.test_n, file_test)
  d = file_data.X.shape[-1] if file_data is not None else spec.d
  check_init(fl, {p: c.param for p, c in configs}, runs, d, fl.m, dtype)
  if file_data is not None and fl.minibatch > file_data.X.shape[1]:
    raise ValueError(f"--minibatch={fl.minibatch} exceeds the n={file_data.X.shape[1]} sequences of each "
                     f"data set of --data")

  return pipeline.Study(NAME, (pipeline.Cell({}, int(runs)),), lambda cell, runs: load(runs),
                        lambda cell: tuple(train_stage(p, c, fl) for p, c in configs),
                        functools.partial(analyze, saturation=fl.saturation,
                                          norms=norms(fl), loss=fl.loss, observe=tuple(fl.observe)),
                        fl.batch_size, fl.seed, identity if identity is not None else fl)


def init_scheme(fl: dict) -> str:
  """The random initialization of --init (uniform where --init names a file of starting points)."""
  init = fl.init or "uniform"
  return "uniform" if init.endswith(".npz") else init


def train_stage(name: str, config: train_lib.TrainConfig, fl: dict) -> stages.Train:
  """The training stage of one parameterization; with --init=FILE.npz, every run starts from its row."""
  fl = F.Values(fl)
  init = fl.init or "uniform"
  if init.endswith(".npz"):
    return stages.Train(name, config, init_file=init)
  return stages.Train(name, config)


def check_init(fl: dict, params: dict, runs: int, d: int, m, dtype) -> None:
  """With --init=FILE.npz: the file holds a start for every run of every parameterization
  ({stage: "W" or "KQ"}), else ValueError naming the problem (before anything runs)."""
  init = fl.init or "uniform"
  if init.endswith(".npz"):
    try:
      init_lib.check(init, params, int(runs), int(d), m, dtype)
    except data_lib.DataError as e:
      raise ValueError(f"--init: {e}") from None


def norms(fl: dict) -> tuple[str, ...]:
  """The Att-SVM norms solved (--norms; default every one of ``svm.att_svm.NORMS``), in that order."""
  wanted = fl.norms or svm_lib.NORMS
  unknown = set(wanted) - set(svm_lib.NORMS)
  if unknown:
    raise ValueError(f"--norms: unknown norm(s) {sorted(unknown)}; known: {', '.join(svm_lib.NORMS)}")
  return tuple(n for n in svm_lib.NORMS if n in wanted)


def analyze(label: dict, data: dict, trajs: dict, saturation: float = health.SATURATION,
            norms: tuple[str, ...] = svm_lib.NORMS, loss: str = "logistic", observe: tuple = ()) -> dict:
  """The per-run results of one batch: the SVM comparison plus the final W, selections,
  softmax and loss curves and the training health (``analysis.health``) of each
  parameterization P; with a test set in ``data``, ``scores``."""
  out = scores(data, trajs, loss) if "X_test" in data else {}
  for p, t in trajs.items():
    seen = observables.compute(observe, t["W"], data, t["selected"], t["loss"], t["steps"])
    out.update({f"{name}_{p}": v for name, v in seen.items()})
  labels = {p: health.add(out, p, t, saturation) for p, t in trajs.items()}
  out.update(versus_svm.compare_with_svms(data["X"], data["Z"], data["gamma"], {p: t["W"] for p, t in trajs.items()},
                                       {p: t["selected"] for p, t in trajs.items()}, norms=norms, health=labels))
  for p, t in trajs.items():
    out[f"W_final_{p}"] = t["W"][:, -1]
    out[f"selected_{p}"] = t["selected"]
    out[f"max_prob_{p}"] = t["max_prob"]
    out[f"loss_{p}"] = t["loss"]
    out[f"attention_{p}"] = t["attention"]
    out[f"finite_{p}"] = t["finite"]
  if "X_test" in data:
    out.update(svm_scores(data, out, tuple(trajs)))
  out["runs"] = data["runs"]
  out["token_scores"] = data["gamma"]
  out["optimal_tokens"] = metrics.optimal_tokens(data["gamma"])
  return out


def scores(data: dict, trajs: dict, loss: str = "logistic") -> dict:
  """Per parameterization P and snapshot: train_acc_P, test_acc_P, test_loss_P (B, S) (the training
  loss is loss_P), and the final predictions on the test sequences, test_pred_P (B, m)."""
  lossf = losses.get_loss(loss)
  X, Y, Z, v = (np.asarray(data[k], np.float64) for k in ("X", "Y", "Z", "v"))
  Xt, Yt, Zt = (np.asarray(data[k], np.float64) for k in ("X_test", "Y_test", "Z_test"))
  out = {}
  for p, t in trajs.items():
    W = np.asarray(t["W"], np.float64)                                   # (B, S, d, d)
    B, S = W.shape[:2]
    f = np.stack([[predictions.single_query(W[b, s], v[b], X[b], Z[b])[0] for s in range(S)] for b in range(B)])
    ft = np.stack([[predictions.single_query(W[b, s], v[b], Xt[b], Zt[b])[0] for s in range(S)] for b in range(B)])
    out[f"train_acc_{p}"] = predictions.accuracy(f, Y[:, None])
    out[f"test_acc_{p}"] = predictions.accuracy(ft, Yt[:, None])
    out[f"test_loss_{p}"] = np.asarray(np.mean(lossf(Yt[:, None] * ft), axis=-1), np.float64)
    out[f"test_pred_{p}"] = ft[:, -1]
  return out


def svm_scores(data: dict, analyzed: dict, params: tuple) -> dict:
  """The max-margin solutions as predictors: for each parameterization P and solved norm N, train and
  test accuracy of the Att-SVM direction W^N (at P's selection) in its large-norm limit (all attention
  on argmax_t x_t^T W^N z), svm_<N>_<P>_train_acc and svm_<N>_<P>_test_acc (B,) (NaN where unsolved)."""
  X, Y, Z, v = (np.asarray(data[k], np.float64) for k in ("X", "Y", "Z", "v"))
  Xt, Yt, Zt = (np.asarray(data[k], np.float64) for k in ("X_test", "Y_test", "Z_test"))
  out = {}
  for p in params:
    for key in [k for k in analyzed if k.startswith("svm_") and k.endswith(f"_{p}") and analyzed[k].ndim == 3]:
      W = np.asarray(analyzed[key], np.float64)
      for name, (A, y, Q) in (("train", (X, Y, Z)), ("test", (Xt, Yt, Zt))):
        acc = [predictions.accuracy(predictions.hard_single_query(W[b], v[b], A[b], Q[b]), y[b])
               if np.all(np.isfinite(W[b])) else np.nan for b in range(len(W))]
        out[f"{key}_{name}_acc"] = np.asarray(acc, np.float64)
  return out


def reduce(fl: dict, arrays: dict) -> tuple[dict, dict]:
  """(results.npz arrays, summary) of the whole run from its per-run ``arrays``."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  _, configs = setup(fl)
  arrays = {**arrays, "steps": train_lib.config_snapshot_steps(configs[0][1])}   # the same for every config
  params = [p for p, _ in configs]
  n, T = arrays["token_scores"].shape[1:3]
  d = arrays[f"W_final_{params[0]}"].shape[-1]
  summary = {"experiment": "E2 local convergence", "numerics": fl.numerics,
             "data_sets": len(arrays["runs"]),
             "shape": {"n": int(n), "T": int(T), "d": int(d)}, "final_corr": {}, "convergence_types": {},
             "svm_status": {}, "diverged_runs": {}}
  for p in params:
    summary["diverged_runs"][p] = int(np.sum(~arrays[f"finite_{p}"]))
    for norm in norms(fl):
      summary["final_corr"][f"{p}_vs_{norm}"] = versus_svm.summarize_corr(arrays[f"corr_{p}_{norm}"][:, -1])
      status = arrays[f"svm_{norm}_{p}_status"]
      summary["svm_status"][f"{norm}_{p}"] = {s: int(np.sum(status == s)) for s in svm_lib.STATUSES}
    if f"convergence_type_{p}" in arrays:          # (it needs the Frobenius SVM)
      summary["convergence_types"][p] = metrics.type_fractions(arrays[f"convergence_type_{p}"])
  summary["health"] = health.summary(arrays)
  summary["saturation_threshold"] = fl.saturation
  tested = [p for p in params if f"test_acc_{p}" in arrays]
  if tested:
    summary["accuracy"] = {p: {"train": float(np.mean(arrays[f"train_acc_{p}"][:, -1])),
                               "test": float(np.mean(arrays[f"test_acc_{p}"][:, -1])),
                               "test_loss": float(np.mean(arrays[f"test_loss_{p}"][:, -1])),
                               **{f"svm_{n}_test": (float(np.nanmean(arrays[f"svm_{n}_{p}_test_acc"]))
                                                    if np.any(np.isfinite(arrays[f"svm_{n}_{p}_test_acc"])) else None)
                                  for n in norms(fl) if f"svm_{n}_{p}_test_acc" in arrays}} for p in tested}
  summary["checks"] = checks(summary["final_corr"])
  return arrays, summary


def checks(final_corr: dict) -> list:
  """The paper's expectations (docs/science.md section 8, E2: 0.996, 0.997; cross pairs about 0.86 / 0.85)."""
  mean = {k: v["mean"] for k, v in final_corr.items()}
  out = []
  for key, paper in (("W_vs_fro", 0.996), ("KQ_vs_nuc", 0.997)):
    if mean.get(key) is not None:
      out.append({"name": f"mean final corr {key}", "value": mean[key],
                  "expected": f">= 0.99 (authors: {paper})", "ok": mean[key] >= 0.99, "runs": [key.split("_")[0]]})
    elif key in mean:                # trained and compared, but no run has a solved SVM (diverged, infeasible)
      out.append({"name": f"mean final corr {key}", "value": None, "expected": f">= 0.99 (authors: {paper})",
                  "ok": None, "runs": [key.split("_")[0]],
                  "reason": "no run has a finite corr with a solved SVM (diverged, or no SVM solved)"})
  for cross, own, paper in (("W_vs_nuc", "W_vs_fro", 0.86), ("KQ_vs_fro", "KQ_vs_nuc", 0.85)):
    if mean.get(cross) is not None and mean.get(own) is not None:
      out.append({"name": f"mean final corr {cross} (cross pair)", "value": mean[cross],
                  "expected": f"clearly below {own} (authors: about {paper})",
                  "ok": mean[cross] < mean[own] - 0.05, "runs": [cross.split("_")[0]]})
  return out


def report(summary: dict, fl: dict) -> list[str]:
  """The terminal lines of a finished run (the checks follow)."""
  lines = [f"E2 local convergence: {summary['data_sets']} data sets"]
  for key, v in summary["final_corr"].items():
    if v["mean"] is not None:
      lines.append(f"  corr {key:<10} {v['mean']:.4f} +- {v['std']:.4f} ({v['solved']} solved)")
  for p, fr in summary["convergence_types"].items():
    lines.append(f"  types {p:<3} " + "  ".join(f"{k} {100 * x:.0f}%" for k, x in fr.items()))
  return lines


def _loss_scale(value):
  if value in ("default", "auto"):
    return None
  try:
    return None if np.isfinite(float(value)) and float(value) > 0 else "must be 'default', 'auto' or a finite number > 0"
  except ValueError:
    return "must be 'default', 'auto' or a finite number > 0"


SHARED = (common.base(runs=100) + common.pipeline(batch_size=1000) + common.numerics()
            + common.training(params=("W", "KQ"), steps=2000, minibatch=True) + F.Settings((
                F.Int("m", None, "(K,Q) width m (default d).", lower=1),
                common.init_scale_field(),
                F.List("observe", (), "Per-snapshot quantities to record for every run, NAME_P in results.npz: "
                       + ", ".join(observables.BUILT_IN) + ", or a name registered with "
                       "svmattn.analysis.observables.register.", check=observables.check),
                F.List("norms", ("fro", "nuc"), "Att-SVMs solved at each run's selection: fro (Frobenius), nuc "
                       "(nuclear; the slower one). E.g. --params=W --norms=fro solves only W's own SVM.",
                       check=allowed.one_of(svm_lib.NORMS, "norms")),
                F.Enum("loss", "logistic", ["logistic", "exponential", "correlation"], "Loss."),
                F.Enum("attention", "cross", ["cross", "self"], "Cross-attention or self-attention."),
                F.Int("query_pos", 0, "Query position for self-attention (0 <= query_pos < T).", lower=0),
                F.Str("loss_scale", "default", "Loss scaling: 'auto' (rescale each step's gradient so that float32 "
                      "does not underflow; see BUILD.md), a number, or 'default' (auto in float32, 1 in float64).",
                      check=_loss_scale),
            ), (F.Rule(("query_pos", "T"), lambda v: None if v["query_pos"] < v["T"]
                       else "--query_pos must be below --T"),)))
"""E2's settings that the studies on its data sets share (Q1 adds its own)."""

SETTINGS = SHARED + F.Settings((
    F.Int("test_n", 0, "Test sequences per data set, drawn from the same generator with a key of their own (the "
          "training data are unchanged); 0: none. With --data, the file's X_test, Y_test, Z_test are the test "
          "set. Adds train_acc_P, test_acc_P, test_loss_P per snapshot and test_pred_P.", lower=0),))

EXPERIMENT = registry.Experiment(
    id="E2", name=NAME, title="Local convergence of normalized GD (W and (K,Q))",
    cost_s=2,
    claim="From a random start, normalized GD converges in direction to the Att-SVM of the tokens it selects: "
          "W to the Frobenius-norm one, (K,Q) to the nuclear-norm one (the authors: mean corr 0.996 and 0.997).",
    settings=SETTINGS, quick={"runs": 30},
    variants=(registry.Variant("authors", "Local convergence, the authors' numerics (g / (||g|| + eps), X^T s)",
                               {"numerics": "authors"}, cost_s=7),),
    key_numbers=(("mean corr(W, Frobenius SVM)", "final_corr.W_vs_fro.mean"),
                 ("mean corr(KQ^T, nuclear SVM)", "final_corr.KQ_vs_nuc.mean")),
    figures=figures.draw, report=report, one_cell=True)
