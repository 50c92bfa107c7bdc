"""E10: optimizer geometry: each optimizer's implicit bias against the attention SVM of every norm
(docs/science.md section 10), as a study.

One cell of ``runs`` data sets (E2's generator, or a data file); for every optimizer of
``optimizers`` and parameterization of ``params`` a training stage; the host analysis solves
Att-SVM in every norm of ``norms`` at the tokens each run selected (each distinct (data set,
selection, norm) once) and measures, per snapshot, corr(W, W^mm_norm) and, at the end, the
distance || W/||W|| - W^mm/||W^mm|| || in that norm and, for l_p norms, the Bregman divergence
of the l_p mirror map (the l_p mirror-descent paper's metric).

Predictions (for linear classifiers, or proved for attention where said): steepest descent in a
norm -> that norm's max-margin solution; l_p mirror descent -> the l_p Att-SVM (proved for
attention); Adam -> l_inf; Muon -> spectral. ``predicted_norm`` names them.

``fl`` below is a dict of the experiment's settings (``SETTINGS``: the binary's flags or a
config's fields), or the "flags" of its summary.json: replay rebuilds the same study from it.
"""
from __future__ import annotations

import functools

import numpy as np

from svmattn import registry
from svmattn.analysis import health
from svmattn.analysis import metrics
from svmattn.config import allowed
from svmattn.config import common
from svmattn.config import fields as F
from svmattn.data import datasets as data_lib
from svmattn.figures import optimizer_geometry as figures
from svmattn.optim import optimizers
from svmattn.execution import pipeline
from svmattn.studies import local_convergence
from svmattn.svm import att_svm as svm_lib
from svmattn.train import loop as train_lib

NAME = "optimizer_geometry"


def predicted_norm(optimizer: str) -> str | None:
  """The norm whose Att-SVM the optimizer is predicted to approach (None: no prediction)."""
  if optimizer in ("normalized_gd", "ngd", "gd", "sd_l2"):
    return "fro"
  if optimizer in ("sd_spectral", "sd_spectral_ns", "muon"):
    return "spectral"
  if optimizer == "sd_nuc":
    return "nuc"
  if optimizer == "adam":
    return "linf"
  for prefix in ("sd_", "md_"):
    if optimizer.startswith(prefix) and optimizer[len(prefix):].startswith("l"):
      norm = optimizer[len(prefix):]
      return "fro" if norm in ("l2", "l2.0") else norm
  return None


def lp_of(norm: str) -> float | None:
  """p of an entrywise l_p norm with 1 < p < inf ("fro" is p = 2), else None."""
  if norm in ("fro", "l2"):
    return 2.0
  if norm.startswith("l") and norm not in ("l1", "linf"):
    try:
      return float(norm[1:])
    except ValueError:
      return None
  return None


def stage_name(optimizer: str, param: str) -> str:
  return optimizer if param == "W" else f"{optimizer}_KQ"


def configs(fl: dict) -> tuple:
  """((stage name, optimizer, parameterization, TrainConfig), ...)."""
  out = []
  for opt in fl.optimizers:
    for p in fl.params:
      out.append((stage_name(opt, p), opt, p, train_lib.TrainConfig(
          param=p, optimizer=opt, lr=fl.lr, steps=fl.steps, snapshot_every=fl.snapshot_every,
          chunk_steps=fl.chunk_steps, init=local_convergence.init_scheme(fl), block_size=fl.block_size,
          numerics=fl.numerics, minibatch=fl.minibatch,
          sampling=fl.sampling).validate()))
  return tuple(out)


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  spec = data_lib.DataSpec(fl.n, fl.T, fl.d).validate()
  cfgs = configs(fl)
  dtype = np.float32 if fl.precision == "float32" else np.float64
  file_data = data_lib.load_npz(fl.data, dtype) if fl.data else None
  runs = file_data.X.shape[0] if file_data is not None else fl.runs
  norms = tuple(fl.norms)

  source = local_convergence.batches(spec, fl.seed, dtype, file_data)
  d = file_data.X.shape[-1] if file_data is not None else spec.d
  local_convergence.check_init(fl, {name: p for name, _, p, _ in cfgs}, runs, d, None, dtype)

  def load(cell, runs):
    return {**source(runs), "norms": np.array(norms)}

  return pipeline.Study(NAME, (pipeline.Cell({}, int(runs)),), load,
                        lambda cell: tuple(local_convergence.train_stage(name, c, fl) for name, _, _, c in cfgs),
                        functools.partial(analyze, saturation=fl.saturation),
                        fl.batch_size, fl.seed, identity if identity is not None else fl)


def analyze(label: dict, data: dict, trajs: dict, saturation: float = health.SATURATION) -> dict:
  """Per run and stage: final W, selection, the training health (``analysis.health``), and per
  norm the SVM status, corr per snapshot, final distance in the norm and (l_p) final Bregman
  divergence."""
  X, Z = np.asarray(data["X"], np.float64), np.asarray(data["Z"], np.float64)
  norms = [str(x) for x in data["norms"]]
  B, d = X.shape[0], X.shape[-1]
  solved = svm_lib.at_selections(X, Z, [t["selected"] for t in trajs.values()], norms)
  out = {"runs": np.asarray(data["runs"]), "optimal_tokens": metrics.optimal_tokens(data["gamma"])}
  for name, t in trajs.items():
    W = np.asarray(t["W"], np.float64)                    # (B, S, d, d)
    out[f"W_final_{name}"] = W[:, -1]
    out[f"selected_{name}"] = t["selected"]
    out[f"finite_{name}"] = t["finite"]
    out[f"max_prob_{name}"] = t["max_prob"]
    health.add(out, name, t, saturation)
    for norm in norms:
      res = [solved[svm_lib.selection_key(b, t["selected"][b], norm)] for b in range(B)]
      W_svm = np.stack([r.W if r.ok else np.full((d, d), np.nan) for r in res])
      out[f"svm_{norm}_{name}_status"] = np.array([r.status for r in res], dtype="<U10")
      out[f"corr_{name}_{norm}"] = metrics.corr(W, W_svm[:, None])
      out[f"dist_{name}_{norm}"] = metrics.norm_distance(W[:, -1], W_svm, norm)
      p = lp_of(norm)
      if p is not None:
        out[f"bregman_{name}_{norm}"] = metrics.bregman_lp(W_svm, W[:, -1], p)
  return out


def _mean(x):
  x = np.asarray(x, np.float64)
  ok = np.isfinite(x)
  return float(np.mean(x[ok])) if ok.any() else None


def reduce(fl: dict, arrays: dict) -> tuple[dict, dict]:
  """(results.npz arrays, summary): the optimizer x norm tables of mean final corr, mean final
  distance and (l_p) mean Bregman divergence, the nearest norm of each optimizer, and checks."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  cfgs = configs(fl)
  arrays = {**arrays, "steps": train_lib.config_snapshot_steps(cfgs[0][3])}   # the same for every config
  norms = list(fl.norms)
  tables = {"corr": {}, "distance": {}, "bregman": {}, "svm_solved": {}}
  nearest = {}
  for name, opt, p, _ in cfgs:
    tables["corr"][name] = {n: _mean(arrays[f"corr_{name}_{n}"][:, -1]) for n in norms}
    tables["distance"][name] = {n: _mean(arrays[f"dist_{name}_{n}"]) for n in norms}
    tables["bregman"][name] = {n: _mean(arrays[f"bregman_{name}_{n}"]) for n in norms if lp_of(n) is not None}
    tables["svm_solved"][name] = {n: int(np.sum(arrays[f"svm_{n}_{name}_status"] == "optimal")) for n in norms}
    corr = {n: v for n, v in tables["corr"][name].items() if v is not None}
    if p == "W":
      pred = predicted_norm(opt)
    else:   # (K,Q): the paper's nuclear-norm result for gradient descent; open for the others
      pred = "nuc" if opt in ("normalized_gd", "ngd", "gd") else None
    nearest[name] = {"by_corr": max(corr, key=corr.get) if corr else None, "predicted": pred}
  summary = {"experiment": "E10 optimizer geometry", "numerics": fl.numerics,
             "data_sets": len(arrays["runs"]), "optimizers": list(fl.optimizers), "norms": norms,
             "params": list(fl.params), "tables": tables, "nearest": nearest,
             "diverged_runs": {name: int(np.sum(~arrays[f"finite_{name}"])) for name, *_ in cfgs},
             "health": health.summary(arrays), "saturation_threshold": fl.saturation}
  summary["checks"] = checks(fl, tables, nearest)
  return arrays, summary


def checks(fl: dict, tables: dict, nearest: dict) -> list:
  """For steepest-descent and mirror-descent optimizers on W whose predicted norm is among the
  norms: is that norm's Att-SVM the nearest (largest mean final corr)? A "no" is a finding."""
  out = []
  for name, v in nearest.items():
    pred = v["predicted"]
    if pred is None or pred not in fl.norms or name.endswith("_KQ") or v["by_corr"] is None:
      continue
    opt = name
    if not (opt.startswith("sd_") or opt.startswith("md_") or opt == "normalized_gd"):
      continue
    source = ("proved for attention (l_p mirror descent)" if opt.startswith("md_")
              else "the linear-classifier prediction")
    out.append({"name": f"{opt}: Att-SVM nearest by mean final corr", "value": v["by_corr"],
                "expected": f"{pred} ({source})", "ok": v["by_corr"] == pred, "runs": [name]})
  return out


def report(summary: dict, fl: dict) -> list[str]:
  """The terminal lines of a finished run (the checks follow): the mean final corr table, each
  optimizer's nearest norm starred and its predicted norm bracketed."""
  norms = summary["norms"]
  lines = [f"E10 optimizer geometry: {summary['data_sets']} data sets; mean final corr(W, Att-SVM in each norm) "
           "at each optimizer's selection; * nearest, [] predicted",
           "  " + " " * 16 + "".join(f"{n:>11}" for n in norms)]
  for o, row in summary["tables"]["corr"].items():
    near, pred = summary["nearest"][o]["by_corr"], summary["nearest"][o]["predicted"]
    cells = []
    for n in norms:
      v = row[n]
      text = "-" if v is None else f"{v:.4f}"
      text = (text + "*") if n == near else text
      text = f"[{text}]" if n == pred else text
      cells.append(f"{text:>11}")
    lines.append(f"  {o:<16}" + "".join(cells))
  return lines


def key_numbers(summary: dict) -> list:
  """How many optimizers end nearest (mean final corr) to the Att-SVM of their predicted norm, of
  those with a nearest norm, and the nearest norm of every optimizer."""
  pairs = [(o, v["by_corr"], v.get("predicted")) for o, v in (summary.get("nearest") or {}).items()
           if isinstance(v, dict) and v.get("by_corr")]
  out = [("optimizers nearest to the Att-SVM of their predicted norm", sum(n == p for _, n, p in pairs)),
         ("optimizers compared", len(pairs))]
  return out + [(f"{o}: nearest norm" + (f" (predicted {p})" if p else ""), n) for o, n, p in pairs]


MAX_P = 100   # l<p> norms: |W|^p of larger p overflows (l1e400 is p = inf)


def _known_optimizers(values):
  message = ("must list distinct optimizer names such as normalized_gd, sd_l1, sd_linf, sd_l3, sd_spectral, sd_nuc, "
             "md_l1.75, adam, muon")
  try:
    for v in values:
      optimizers.get_optimizer(v, 0.1)
  except (ValueError, KeyError, TypeError, AttributeError):
    return message
  return None if bool(values) and len(set(values)) == len(values) else message


def _known_norms(values):
  message = f"must list distinct norms among fro, nuc, spectral, l1, linf and l<p> with 1 < p <= {MAX_P}"
  try:
    for v in values:
      metrics.norm_value(np.eye(2), v)
      if v.startswith("l") and v not in ("l1", "linf") and not 1 < float(v[1:]) <= MAX_P:
        return message
  except ValueError:
    return message
  return None if bool(values) and len(set(values)) == len(values) else message


SETTINGS = (common.base(runs=100) + common.pipeline(batch_size=1000) + common.numerics() + F.Settings((
    F.Int("n", 6, "Sequences per data set.", lower=1),
    F.Int("T", 8, "Tokens per sequence.", lower=2),
    F.Int("d", 10, "Embedding dimension.", lower=1),
    F.List("optimizers", ("normalized_gd", "sd_l1", "sd_linf", "sd_spectral", "md_l1.75", "md_l3", "adam", "muon"),
           "Optimizers (names of svmattn.optim.optimizers.get_optimizer).", check=_known_optimizers),
    F.List("norms", ("fro", "l1", "linf", "spectral", "nuc", "l1.75", "l3"),
           "Att-SVM norms: fro, nuc, spectral, l1, linf, l<p> (p > 1).", check=_known_norms),
    F.List("params", ("W",), "Parameterizations to train: W, KQ.", check=allowed.params),
    F.Int("steps", 2000, "Optimizer steps.", lower=0),
    F.Float("lr", 0.1, "Learning rate (step size eta).", check=allowed.positive),
    F.Str("init", "uniform", "Initialization: uniform, normal (the l_p mirror-descent paper starts from N(0,1) "
          "entries), zero, or FILE.npz holding every data set's start: W (runs,d,d) and/or K, Q (runs,d,d); row r "
          "starts data set r.", check=allowed.init),
    F.Int("snapshot_every", 10, "Record W every this many steps.", lower=1),
    F.Int("chunk_steps", 1000, "Steps per jitted chunk; a checkpoint is saved after each.", lower=1),
    F.Int("block_size", 64, "Data sets per vectorized block.", lower=1),
))) + common.minibatch_fields()     # (stochastic optimizers: e.g. per-sample Adam is --optimizers=adam --minibatch=1)

EXPERIMENT = registry.Experiment(
    id="E10", name=NAME, title="Optimizer geometry: each optimizer against the Att-SVM of every norm",
    cost_s=112,
    claim="Does each optimizer take attention to the Att-SVM of its own norm, as it takes linear classifiers to "
          "their max-margin solution (steepest descent, l_p mirror descent, Adam -> l_inf, Muon -> spectral)?",
    beyond=True, settings=SETTINGS, quick={"runs": 20, "steps": 1000},
    key_numbers=key_numbers, figures=figures.draw, report=report, one_cell=True)
