"""E15: two-layer attention (docs/science.md section 13), as a study.

Layer 1 is self-attention over the tokens with a residual, x1_k = x_k + sum_t softmax_t(x_t^T W1 x_k) x_t; layer 2
is cross-attention of the query over layer 1's outputs, f = v^T X1^T softmax(X1 W2 z)
(``models.flax_models.TwoLayer``, W or (K,Q) in both layers). E2's generator and sizes by default.
No theorem predicts the limit; per layer the analysis reports the selected tokens, the sparsity
of its softmax, the Att-SVM at its selection and corr(W_l(t), that SVM):
  layer 1: the sequence-to-sequence Att-SVM of self-attention (every token a query; ``svm.seq2seq``)
           at its selection (n,T);
  layer 2: the single-query Att-SVM on layer 1's FINAL outputs X1 at layer 2's selection.
``fl`` below is a dict of the experiment's settings (``SETTINGS``: the binary's flags or a
config's fields), or the "flags" of its summary.json. The figure is ``svmattn.figures.two_layer``.
"""
from __future__ import annotations

import functools

import numpy as np

from svmattn import registry
from svmattn.config import fields as F
from svmattn.analysis import health
from svmattn.analysis import per_attention as heads_analysis
from svmattn.analysis import metrics
from svmattn.config import common
from svmattn.config import minibatch
from svmattn.data import datasets as data_lib
from svmattn.figures import two_layer as figures
from svmattn.models import flax_models
from svmattn.execution import pipeline
from svmattn.execution import stages
from svmattn.studies import local_convergence
from svmattn.studies import multi_head
from svmattn.train import loop as train_lib

NAME = "two_layer"


def configs(fl: dict) -> tuple:
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  return tuple((p, train_lib.TrainConfig(
      module=flax_models.TwoLayer(param_kind=p), lr=fl.lr, steps=fl.steps,
      snapshot_every=fl.snapshot_every, chunk_steps=fl.chunk_steps, block_size=fl.block_size,
      optimizer=fl.optimizer, numerics=fl.numerics,
      minibatch=fl.minibatch, sampling=fl.sampling).validate())
      for p in fl.params)


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  spec = data_lib.DataSpec(fl.n, fl.T, fl.d).validate()
  cfgs = configs(fl)
  file_data = data_lib.load_npz(fl.data) if fl.data else None
  if file_data is not None:
    minibatch.check_loaded(fl, file_data.X.shape[1])
  runs = file_data.X.shape[0] if file_data is not None else fl.runs

  load = local_convergence.batches(spec, fl.seed, np.float64, file_data)

  return pipeline.Study(NAME, (pipeline.Cell({}, int(runs)),), lambda cell, runs: load(runs),
                        lambda cell: tuple(stages.Train(p, c) for p, c in cfgs),
                        functools.partial(analyze, saturation=fl.saturation),
                        fl.batch_size, fl.seed, identity if identity is not None else fl)


def analyze(label: dict, data: dict, trajs: dict, saturation: float = health.SATURATION) -> dict:
  """Per run and parameterization: per layer the selection, the Att-SVM and corr; and the
  training health (``analysis.health``; the trajectory's max_prob is the last sown attention's,
  layer 2's, and its W the sum of the layers' kq)."""
  X, Z = np.asarray(data["X"], np.float64), np.asarray(data["Z"], np.float64)
  out = {"runs": np.asarray(data["runs"])}
  for name, t in trajs.items():
    norm = "nuc" if name == "KQ" else "fro"
    finite = np.asarray(t["finite"], bool)
    X1 = np.asarray(t["sown_outputs"], np.float64)                       # (B,n,T,d) layer 1's final outputs
    s1 = heads_analysis.attention_stats(t["sown_layer1_attention"])            # selected (B,n,T)
    s2 = heads_analysis.attention_stats(t["sown_layer2_attention"])            # selected (B,n)
    r1 = heads_analysis.svm_and_corr(X, None, s1["selected"], t["sown_layer1_kq"], norm, finite)
    r2 = heads_analysis.svm_and_corr(X1, Z, s2["selected"], t["sown_layer2_kq"], norm, finite)
    for layer, st, r in (("layer1", s1, r1), ("layer2", s2, r2)):
      heads_analysis.store(out, f"{name}_{layer}", st, r, np.asarray(t[f"sown_{layer}_kq"])[:, -1])
    # layer 1's diagonal: does each token attend to itself?
    sel1 = s1["selected"]
    out[f"{name}_layer1_self"] = np.mean(sel1 == np.arange(sel1.shape[-1]), axis=(1, 2))
    out[f"{name}_finite"] = finite
    health.add(out, name, t, saturation)
  return out


_stats = metrics.finite_stats


def reduce(fl: dict, arrays: dict) -> tuple[dict, dict]:
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  cfgs = configs(fl)
  arrays = {**arrays, "steps": train_lib.config_snapshot_steps(cfgs[0][1])}   # the same for every config
  rows = {}
  for name, _ in cfgs:
    rows[name] = {layer: heads_analysis.summary_row(arrays, f"{name}_{layer}") for layer in ("layer1", "layer2")}
    rows[name]["layer1"]["attends_to_itself"] = _stats(arrays[f"{name}_layer1_self"])
    rows[name]["diverged"] = int(np.sum(~arrays[f"{name}_finite"]))
  summary = {"experiment": "E15 two-layer attention", "data_sets": len(arrays["runs"]),
             "numerics": fl.numerics, "params": rows, "health": health.summary(arrays),
             "saturation_threshold": fl.saturation, "checks": []}
  return arrays, summary


def report(summary: dict, fl: dict) -> list[str]:
  """The terminal lines of a finished run (the checks follow)."""
  lines = [f"E15 two-layer attention: {summary['data_sets']} data sets"]
  f = lambda d: "-" if d is None else f"{d['mean']:.4f}"  # noqa: E731
  for p, row in summary["params"].items():
    for layer in ("layer1", "layer2"):
      e = row[layer]
      lines.append(f"  {p} {layer}: corr with its Att-SVM {f(e['corr_final'])} (solved {e['svm_solved']}, infeasible "
                   f"{e['svm_infeasible']}), mean max prob {f(e['max_prob'])}, tokens >= tau_H {f(e['tokens_above_tau'])}")
    lines.append(f"  {p} layer1: share of tokens attending to themselves {f(row['layer1']['attends_to_itself'])}")
  return lines


def key_numbers(summary: dict) -> list:
  """W's mean final corr with the Att-SVM at each layer's selection."""
  row = (summary.get("params") or {}).get("W") or {}
  return [(f"mean corr(W, Att-SVM), {k.replace('layer', 'layer ')}", (row[k].get("corr_final") or {}).get("mean"))
          for k in sorted(row) if k.startswith("layer")]


SETTINGS = common.base(runs=100) + common.pipeline(batch_size=1000) + common.numerics() + multi_head.training()

EXPERIMENT = registry.Experiment(
    id="E15", name=NAME, title="Two-layer attention: per-layer selections and SVMs",
    cost_s=87,
    claim="With two layers (no theorem), what does each layer select, and does it approach the Att-SVM of its "
          "selection?",
    beyond=True, settings=SETTINGS, quick={"runs": 20},
    key_numbers=key_numbers, figures=figures.draw, report=report, one_cell=True)
