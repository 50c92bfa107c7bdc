"""E12: next-token prediction and its graph SVM (docs/science.md section 12), as a study.

Data: next-token data sets (``data.next_token``: the public code's generator, or a --data file
with E, tokens, labels). Model: the last token queries all T positions, itself included.
Settings (the public code's two notebooks, yixiao-huang/next-token-prediction):
  global  the prediction for a token is the attention mass on its positions, loss -log of the
          label's mass (model "next_token"); normalized GD, lr 0.01, 4000 steps. Prediction:
          W(tau) ~ C(tau) W^svm/||W^svm|| + W^fin with W^svm the graph SVM of the labels;
  local   the pooled token read out by the vocabulary, p = softmax(E X^T s), loss (1 - p_y)^2
          (model "next_token_lsq", non-convex); lr 0.1, 2000 steps. GD goes to the graph SVM of
          the tokens it selected (attention > 1e-2 at the end; tokens with attention in
          (9e-3, 1e-2] left out, as the public code does), not necessarily to the labels' one.

Host analysis per run and parameterization (W: Frobenius graph SVM, (K,Q): nuclear):
  corr_<p> (B,S)        corr(W(t), W^svm of the labels)
  resid_<p> (B,S)       ||W(t) - c W^svm - W^fin||_F / ||W(t)||_F, c the least-squares scale
  fin_gap_<p> (B,S)     ||P_fin W(t) - W^fin||_F (P_fin: projection on S_fin; the public code's metric
                        against a second descent, here against W^fin solved to the solver's accuracy)
  corr_local_<p> (B,S)  (local) corr(W(t), W^svm of the selected tokens)

``fl`` below is a dict of the experiment's settings (``SETTINGS``: the binary's flags or a
config's fields), or the "flags" of its summary.json: replay rebuilds the same study from it.
"""
from __future__ import annotations

import numpy as np

from svmattn import registry
from svmattn.analysis import health
from svmattn.analysis import metrics
from svmattn.config import allowed
from svmattn.config import common
from svmattn.config import fields as F
from svmattn.config import minibatch
from svmattn.data import next_token as next_token_data
from svmattn.figures import next_token as figures
from svmattn.execution import pipeline
from svmattn.execution import stages
from svmattn.svm import graph_svm
from svmattn.train import loop as train_lib

NAME = "next_token"
# the values of the setting "setting", with their model and their defaults of lr and steps
SETTING_DEFAULTS = {"global": {"model": "next_token", "lr": 0.01, "steps": 4000},
                    "local": {"model": "next_token_lsq", "lr": 0.1, "steps": 2000}}
SELECT = 1e-2     # local: a token is selected when its final attention exceeds this
BAND = 9e-3       # ... and left out of the local graph when its attention is in (BAND, SELECT]
# Training health (``analysis.health``) without the "unsaturated" label: the graph SVM's finite
# part W^fin keeps the attention spread over the tokens of a cyclic strongly connected component
# (and over a token's repeated positions), and the local setting selects several tokens, so a
# softmax that stays spread is the expected outcome (the defaults, 3 data sets: final corr with
# W^svm 0.989, final mean largest probability 0.83 in every run), not a run in progress; only
# "diverged" and "stalled" runs are labelled.
SATURATION = 0.0


def resolve(fl: dict) -> dict:
  fl = F.Values(fl)
  if fl.setting not in SETTING_DEFAULTS:
    raise ValueError(f"setting must be one of {sorted(SETTING_DEFAULTS)}, got {fl.setting!r}")
  for k in ("lr", "steps"):
    if fl[k] is None:
      fl[k] = SETTING_DEFAULTS[fl.setting][k]
  return fl


def configs(fl: dict) -> tuple:
  fl = resolve(fl)
  return tuple((p, train_lib.TrainConfig(
      param=p, model=SETTING_DEFAULTS[fl.setting]["model"], optimizer=fl.optimizer,
      lr=fl.lr, steps=fl.steps, snapshot_every=fl.snapshot_every, chunk_steps=fl.chunk_steps,
      init=fl.init, block_size=fl.block_size,
      numerics=fl.numerics, minibatch=fl.minibatch,
      sampling=fl.sampling).validate()) for p in fl.params)


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  ident = identity if identity is not None else fl
  fl = resolve(fl)
  cfgs = configs(fl)
  spec = next_token_data.TokenSpec(fl.K, fl.d, fl.n, fl.T, fl.require_cycle).validate()
  file_data = next_token_data.load_npz(fl.data) if fl.data else None
  if file_data is not None:
    minibatch.check_loaded(fl, file_data.tokens.shape[1])
  runs = file_data.E.shape[0] if file_data is not None else fl.runs

  def load(cell, runs):
    tokens = next_token_data.take(file_data, runs) if file_data is not None else next_token_data.generate(spec, fl.seed, runs)
    ds = next_token_data.to_dataset(tokens)
    return {**{f: np.asarray(a) for f, a in ds._asdict().items()},
            **{f: np.asarray(a) for f, a in tokens._asdict().items()}, "setting": np.array(fl.setting)}

  return pipeline.Study(NAME, (pipeline.Cell({"setting": fl.setting}, int(runs)),), load,
                        lambda cell: tuple(stages.Train(p, c) for p, c in cfgs), analyze,
                        fl.batch_size, fl.seed, ident)


def decomposition(W: np.ndarray, W_svm: np.ndarray, W_fin: np.ndarray, basis: np.ndarray):
  """(resid (S,), fin_gap (S,), scale c (S,)) of snapshots W (S,d,d): W - c W^svm - W^fin with
  the least-squares c, relative to ||W||; and ||P_fin W - W^fin||."""
  S = W.shape[0]
  flat = W.reshape(S, -1)
  svm = W_svm.reshape(-1)
  fin = W_fin.reshape(-1)
  c = (flat - fin) @ svm / (svm @ svm)
  r = flat - c[:, None] * svm[None] - fin[None]
  with np.errstate(invalid="ignore", divide="ignore"):
    resid = np.linalg.norm(r, axis=1) / np.linalg.norm(flat, axis=1)
  proj = (flat @ basis) @ basis.T
  return resid, np.linalg.norm(proj - fin[None], axis=1), c


def analyze(label: dict, data: dict, trajs: dict) -> dict:
  E, tokens, labels = data["E"], data["tokens"], data["labels"]
  local = str(data["setting"]) == "local"
  B, n, T = tokens.shape
  d = E.shape[-1]
  out = {"runs": np.asarray(data["runs"]), "E": E, "tokens": tokens, "labels": labels}
  graph_of = [graph_svm.graphs(tokens[b], labels[b]) for b in range(B)]        # the data's, whatever the stage
  out["sccs"] = np.array([sum(len(g.components) for g in gs.values()) for gs in graph_of], np.int64)
  out["cyclic_sccs"] = np.array([sum(len(c) > 1 for g in gs.values() for c in g.components) for gs in graph_of],
                                np.int64)
  solved = {}
  for name, t in trajs.items():
    norm = "nuc" if name == "KQ" else "fro"
    W = np.asarray(t["W"], np.float64)                                # (B,S,d,d)
    S = W.shape[1]
    out[f"W_final_{name}"] = W[:, -1]
    out[f"selected_{name}"] = t["selected"]
    out[f"finite_{name}"] = t["finite"]
    out[f"loss_{name}"] = t["loss"]
    out[f"max_prob_{name}"] = t["max_prob"]
    health.add(out, name, t, SATURATION)
    W_svm, W_fin = np.full((B, d, d), np.nan), np.full((B, d, d), np.nan)
    status, fin_status = [], []
    resid, gap, scale = (np.full((B, S), np.nan) for _ in range(3))
    for b in range(B):
      key = (b, norm)
      if key not in solved:
        solved[key] = graph_svm.graph_svm(E[b], tokens[b], labels[b], norm)
      r = solved[key]
      status.append(r.status)
      fin_status.append(r.fin_status[:10])
      if r.ok:
        W_svm[b] = r.W
      if r.ok and r.W_fin is not None:
        W_fin[b] = r.W_fin
        resid[b], gap[b], scale[b] = decomposition(W[b], r.W, r.W_fin, r.fin_basis)
    out[f"svm_{name}_status"] = np.array(status, dtype="<U10")
    out[f"fin_{name}_status"] = np.array(fin_status, dtype="<U10")
    out[f"W_svm_{name}"] = W_svm
    out[f"W_fin_{name}"] = W_fin
    out[f"corr_{name}"] = metrics.corr(W, W_svm[:, None])
    out[f"resid_{name}"] = resid
    out[f"fin_gap_{name}"] = gap
    out[f"scale_{name}"] = scale
    if local:
      att = np.asarray(t["attention"], np.float64)                     # (B,n,T)
      W_loc = np.full((B, d, d), np.nan)
      loc_status = []
      for b in range(B):
        targets = att[b] > SELECT
        ignore = (att[b] > BAND) & ~targets
        r = graph_svm.graph_svm(E[b], tokens[b], targets, norm, finite_part=False, ignore=ignore)
        loc_status.append(r.status)
        if r.ok:
          W_loc[b] = r.W
      out[f"svm_local_{name}_status"] = np.array(loc_status, dtype="<U10")
      out[f"W_svm_local_{name}"] = W_loc
      out[f"corr_local_{name}"] = metrics.corr(W, W_loc[:, None])
      # (B,) the fraction of sequences whose label is among the selected tokens
      out[f"label_selected_{name}"] = np.mean(np.sum(att * data["Y"], axis=-1) > SELECT, axis=1)
  return out


_stats = metrics.finite_stats


def reduce(fl: dict, arrays: dict) -> tuple[dict, dict]:
  fl = resolve(fl)
  cfgs = configs(fl)
  arrays = {**arrays, "steps": train_lib.config_snapshot_steps(cfgs[0][1])}   # the same for every config
  rows = {}
  for name, _ in cfgs:
    row = {"corr_final": _stats(arrays[f"corr_{name}"][:, -1]),
           "resid_final": _stats(arrays[f"resid_{name}"][:, -1]),
           "fin_gap_final": _stats(arrays[f"fin_gap_{name}"][:, -1]),
           "svm_solved": int(np.sum(arrays[f"svm_{name}_status"] == "optimal")),
           "fin_solved": int(np.sum(arrays[f"fin_{name}_status"] == "optimal")),
           "nonzero_W_fin": int(np.sum(np.linalg.norm(np.nan_to_num(arrays[f"W_fin_{name}"]), axis=(1, 2)) > 1e-9)),
           "final_loss": _stats(arrays[f"loss_{name}"][:, -1]),
           "diverged": int(np.sum(~arrays[f"finite_{name}"]))}
    if fl.setting == "local":
      row["corr_local_final"] = _stats(arrays[f"corr_local_{name}"][:, -1])
      row["local_svm_solved"] = int(np.sum(arrays[f"svm_local_{name}_status"] == "optimal"))
      row["label_selected"] = _stats(arrays[f"label_selected_{name}"])
    rows[name] = row
  summary = {"experiment": "E12 next-token prediction", "setting": fl.setting,
             "numerics": fl.numerics, "data_sets": len(arrays["runs"]),
             "cyclic_sccs_per_set": _stats(arrays["cyclic_sccs"]), "params": rows,
             "public": PUBLIC[fl.setting], "health": health.summary(arrays),
             "saturation_threshold": SATURATION}
  summary["checks"] = checks(fl, rows)
  return arrays, summary


# The public code's printed final corr over its 10 trials (notebooks' cell 3).
PUBLIC = {"global": {"corr_final": {"min": 0.97615, "max": 0.99280, "mean": 0.9859},
                     "source": "mc_next_single_layer_global_converge.ipynb, corr(W, W^svm)"},
          "local": {"corr_local_final": {"min": 0.99210, "max": 0.99952, "mean": 0.9979},
                    "corr_global_final": {"min": 0.2638, "max": 0.9488},
                    "source": "mc_next_single_layer_local_converge.ipynb, corr(W, local W^svm)"}}


def checks(fl: dict, rows: dict) -> list:
  """The prediction: corr(W, the SVM) near 1 at the end (mean > 0.95 for the global SVM in the
  global setting, for the local SVM in the local one)."""
  out = []
  for name, row in rows.items():
    key = "corr_local_final" if fl.setting == "local" else "corr_final"
    m = None if row.get(key) is None else row[key]["mean"]
    what = "local graph SVM" if fl.setting == "local" else "graph SVM"
    out.append({"name": f"{name}: mean final corr(W, {what})", "value": m, "expected": "> 0.95",
                "ok": m is not None and m > 0.95})
  return out


def report(summary: dict, fl: dict) -> list[str]:
  """The terminal lines of a finished run (the checks follow): the final corr, residual and finite-part
  gap per parameterization, beside the public code's printed numbers."""
  pub = summary["public"]
  lines = [f"E12 next-token prediction ({summary['setting']}): {summary['data_sets']} data sets"]
  for p, row in summary["params"].items():
    f = lambda d: "-" if d is None else f"mean {d['mean']:.4f} [{d['min']:.4f}, {d['max']:.4f}]"  # noqa: E731
    lines.append(f"  {p}: final corr(W, W^svm) {f(row['corr_final'])}; residual {f(row['resid_final'])}; "
                 f"finite-part gap {f(row['fin_gap_final'])}")
    if "corr_local_final" in row:
      lines.append(f"  {p}: final corr(W, local W^svm) {f(row['corr_local_final'])}")
  for k, v in pub.items():
    if k != "source":
      lines.append(f"  public code ({pub['source']}): {k} " + ", ".join(f"{a} {b}" for a, b in v.items()))
  return lines


def key_numbers(summary: dict) -> list:
  """The mean final corr(W, graph SVM) of every parameterization: the labels' graph SVM in the global
  setting, that of the selected tokens in the local one (what the checks test)."""
  local = summary.get("setting") == "local"
  key, what = ("corr_local_final", "local graph SVM") if local else ("corr_final", "graph SVM")
  return [(f"mean corr(W, {what}) {name}", None if row.get(key) is None else row[key]["mean"])
          for name, row in (summary.get("params") or {}).items()]


def _positive_lr(v):
  return None if v is None or (np.isfinite(v) and v > 0) else "must be positive"


SETTINGS = (common.base(runs=100, data=False, precision=False, saturation=False) + F.Settings((
    F.Str("data", None, "Run on the data sets of this .npz (E (B,K,d), tokens (B,n,T) int, labels (B,n) int) "
          "instead of generated ones.", check=allowed.existing_file),
    # (this binary's own help for --compilation_cache)
    F.Bool("compilation_cache", True, "Keep compiled XLA programs on disk.", operational=True, sweepable=False),
)) + common.pipeline(batch_size=1000) + common.numerics() + F.Settings((
    F.Enum("setting", "global", sorted(SETTING_DEFAULTS), "global or local (the public code's two notebooks)."),
    F.Int("K", 6, "Vocabulary size.", lower=2),
    F.Int("d", 8, "Embedding dimension.", lower=1),
    F.Int("n", 6, "Sequences per data set.", lower=1),
    F.Int("T", 4, "Tokens per sequence (distinct; T <= K).", lower=2),
    F.Bool("require_cycle", True, "Redraw a data set until some token graph has a cycle (the public code)."),
    F.List("params", ("W",), "Parameterizations: W (Frobenius graph SVM), KQ (nuclear).", check=allowed.params),
    F.Float("lr", None, "Step size (default 0.01 global, 0.1 local).", check=_positive_lr),
    F.Int("steps", None, "Steps (default 4000 global, 2000 local).", lower=0),
    F.Str("optimizer", "normalized_gd", "Optimizer (svmattn.optim.optimizers.get_optimizer names).",
          check=allowed.optimizer),
    F.Enum("init", "uniform", ["uniform", "normal", "zero"], "Initialization (uniform: +-1/sqrt(d))."),
    F.Int("snapshot_every", 10, "Record W every this many steps.", lower=1),
    F.Int("chunk_steps", 1000, "Steps per jitted chunk; a checkpoint is saved after each.", lower=1),
    F.Int("block_size", 64, "Data sets per vectorized block.", lower=1),
), (F.Rule(("K", "T"), lambda v: None if v["T"] <= v["K"] else "T distinct tokens per sequence need T <= K"),
    common.block_fits_batch())) + minibatch.settings())

EXPERIMENT = registry.Experiment(
    id="E12", name=NAME, title="Next-token prediction and its graph SVM (global setting)",
    cost_s=13,
    claim="Does next-token attention converge in direction to the graph SVM of the token graphs' strongly "
          "connected components, plus a finite part (Li, Huang, Ildiz, Rawat, Oymak 2024)?",
    beyond=True, settings=SETTINGS, quick={"runs": 20},
    variants=(registry.Variant("local", "Next-token prediction, local setting (vocabulary readout, squared loss)",
                               {"setting": "local"}, cost_s=14),),
    key_numbers=key_numbers, figures=figures.draw, report=report, one_cell=True)
