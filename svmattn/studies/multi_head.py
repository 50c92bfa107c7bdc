"""E14: multi-head attention (docs/science.md section 13), as a study.

f = sum_h v_h^T X^T softmax(X W_h z), each W_h or K_h Q_h^T (``models.flax_models.MultiHead``,
trained by the engine's loop through the flax protocol). E2's generator and sizes by default;
each data set gets H fixed unit heads v_h (drawn from the run's data key) or, with
``shared_head``, its own v for every head. No theorem predicts the limit; per head the analysis
reports the selected tokens, the sparsity of its softmax, the Att-SVM at its selection (Frobenius
for W, nuclear for (K,Q)) and corr(W_h(t), that SVM); for the sum sum_h W_h (sum_h K_h Q_h^T), the
SVM of the tokens the sum selects; and whether the heads select the same tokens or split them.

``fl`` below is a dict of the experiment's settings (``SETTINGS``: the binary's flags or a
config's fields), or the "flags" of its summary.json. The figure is ``svmattn.figures.multi_head``.
"""
from __future__ import annotations

import functools

import numpy as np

from svmattn import registry
from svmattn import rng
from svmattn.analysis import health
from svmattn.analysis import per_attention as heads_analysis
from svmattn.analysis import metrics
from svmattn.config import allowed
from svmattn.config import common
from svmattn.config import minibatch
from svmattn.config import fields as F
from svmattn.data import datasets as data_lib
from svmattn.figures import multi_head as figures
from svmattn.models import flax_models
from svmattn.execution import pipeline
from svmattn.execution import stages
from svmattn.studies import local_convergence
from svmattn.train import loop as train_lib

NAME = "multi_head"


def configs(fl: dict) -> tuple:
  return tuple((p, train_lib.TrainConfig(
      module=flax_models.MultiHead(heads=fl.heads, param_kind=p), lr=fl.lr, steps=fl.steps,
      snapshot_every=fl.snapshot_every, chunk_steps=fl.chunk_steps, block_size=fl.block_size,
      optimizer=fl.optimizer, numerics=fl.numerics,
      minibatch=fl.minibatch, sampling=fl.sampling).validate())
      for p in fl.params)


def head_vectors(seed: int, H: int, d: int, runs: np.ndarray) -> np.ndarray:
  """(B,H,d) unit Gaussian heads of the data sets ``runs``: the rows of normal(fold_in(data key of r,
  1000003), (H, d)) scaled to unit norm, on the host (``rng``'s flat draw and the generator's
  exact-sum norm; numerics version 9, before a compiled program per (seed, H, d) with XLA's norm)."""
  runs = np.asarray(runs, np.uint32).reshape(-1)
  data_keys = rng.split_keys(rng.run_keys(int(seed), runs))[:, 0]
  keys = rng.fold_in_keys(data_keys, np.full(len(runs), 1_000_003))
  v = rng.normals(keys, int(H) * int(d)).reshape(len(runs), int(H), int(d))
  return data_lib.unit_rows_host(v)


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  spec = data_lib.DataSpec(fl.n, fl.T, fl.d).validate()
  if fl.heads < 1:
    raise ValueError(f"heads must be positive, got {fl.heads}")
  cfgs = configs(fl)
  file_data = data_lib.load_npz(fl.data) if fl.data else None
  if file_data is not None:
    minibatch.check_loaded(fl, file_data.X.shape[1])
  runs = file_data.X.shape[0] if file_data is not None else fl.runs

  source = local_convergence.batches(spec, fl.seed, np.float64, file_data)

  def load(cell, runs):
    out = source(runs)
    if not fl.shared_head:
      out["v"] = head_vectors(fl.seed, fl.heads, out["X"].shape[-1], runs)
    return out

  return pipeline.Study(NAME, (pipeline.Cell({}, int(runs)),), load,
                        lambda cell: tuple(stages.Train(p, c) for p, c in cfgs),
                        functools.partial(analyze, saturation=fl.saturation),
                        fl.batch_size, fl.seed, identity if identity is not None else fl)


def analyze(label: dict, data: dict, trajs: dict, saturation: float = health.SATURATION) -> dict:
  """Per run and parameterization: per head and for the sum of the heads the selection, the
  Att-SVM and corr; and the training health (``analysis.health``; the trajectory's max_prob is
  the last sown attention's)."""
  X, Z = np.asarray(data["X"], np.float64), np.asarray(data["Z"], np.float64)
  out = {"runs": np.asarray(data["runs"])}
  for name, t in trajs.items():
    norm = "nuc" if name == "KQ" else "fro"
    finite = np.asarray(t["finite"], bool)
    heads = sorted(k[len("sown_"):-len("_kq")] for k in t if k.startswith("sown_") and k.endswith("_kq"))
    sels = []
    for h in heads:
      st = heads_analysis.attention_stats(t[f"sown_{h}_attention"])
      W = np.asarray(t[f"sown_{h}_kq"], np.float64)                  # (B,S,d,d)
      res = heads_analysis.svm_and_corr(X, Z, st["selected"], W, norm, finite)
      sels.append(st["selected"])
      heads_analysis.store(out, f"{name}_{h}", st, res, W[:, -1])
    agree = heads_analysis.agreement(sels)
    out[f"{name}_all_same"], out[f"{name}_all_different"] = agree["all_same"], agree["all_different"]
    Wsum = np.asarray(t["W"], np.float64)                             # (B,S,d,d) sum of the heads
    sel_sum = heads_analysis.summed_selection(X, Z, Wsum[:, -1])
    res = heads_analysis.svm_and_corr(X, Z, sel_sum, Wsum, norm, finite)
    out[f"{name}_sum_selected"] = sel_sum
    out[f"{name}_sum_svm_status"] = res["status"]
    out[f"{name}_sum_corr"] = res["corr"]
    out[f"{name}_W_final"] = Wsum[:, -1]
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
    heads = sorted(k[len(name) + 1:-len("_selected")] for k in arrays
                   if k.startswith(f"{name}_head") and k.endswith("_selected"))
    per_head = {h: heads_analysis.summary_row(arrays, f"{name}_{h}") for h in heads}
    rows[name] = {"heads": per_head,
                  "all_heads_same_token": _stats(arrays[f"{name}_all_same"]),
                  "all_heads_different_tokens": _stats(arrays[f"{name}_all_different"]),
                  "sum": {"svm_norm": "nuc" if name == "KQ" else "fro",
                          "svm_solved": int(np.sum(arrays[f"{name}_sum_svm_status"] == "optimal")),
                          "corr_final": _stats(arrays[f"{name}_sum_corr"][:, -1])},
                  "diverged": int(np.sum(~arrays[f"{name}_finite"]))}
  summary = {"experiment": "E14 multi-head attention", "heads": fl.heads,
             "shared_head": bool(fl.shared_head), "data_sets": len(arrays["runs"]),
             "numerics": fl.numerics, "params": rows, "health": health.summary(arrays),
             "saturation_threshold": fl.saturation, "checks": []}
  return arrays, summary


def report(summary: dict, fl: dict) -> list[str]:
  """The terminal lines of a finished run (the checks follow)."""
  lines = [f"E14 multi-head attention: {summary['heads']} heads "
           f"({'shared head' if summary['shared_head'] else 'a fixed head per attention head'}), "
           f"{summary['data_sets']} data sets; mean final corr with the Att-SVM at each selection"]
  f = lambda d: "-" if d is None else f"{d['mean']:.4f}"  # noqa: E731
  for p, row in summary["params"].items():
    for h, e in row["heads"].items():
      lines.append(f"  {p} {h}: corr {f(e['corr_final'])} (SVM solved {e['svm_solved']}), mean max prob "
                   f"{f(e['max_prob'])}, tokens >= tau_H {f(e['tokens_above_tau'])}")
    lines.append(f"  {p} sum of heads: corr with its {row['sum']['svm_norm']} SVM {f(row['sum']['corr_final'])}; "
                 f"sequences where every head picks the same token {f(row['all_heads_same_token'])}, "
                 f"each a different one {f(row['all_heads_different_tokens'])}")
  return lines


def _mean(entry):
  return None if not entry else entry.get("mean")


def key_numbers(summary: dict) -> list:
  """W's mean final corr with the Att-SVM at each head's selection, and the sum's with the SVM of its own."""
  row = (summary.get("params") or {}).get("W") or {}
  out = [(f"mean corr(W_h, Att-SVM), {h.replace('head', 'head ')}", _mean(row["heads"][h].get("corr_final")))
         for h in sorted(row.get("heads") or {})]
  if "sum" in row:
    out.append(("mean corr(W_h, Att-SVM), their sum", _mean(row["sum"].get("corr_final"))))
  return out


def training() -> F.Settings:
  """The sizes and normalized-GD fields of E14 and E15 (``config.common.training`` without --init, with
  their own help texts) and --minibatch --sampling (``config.minibatch``)."""
  return common.training(init=False) + F.Settings((
      F.Int("steps", 2000, "Normalized-GD steps.", lower=0),
      F.Str("optimizer", "normalized_gd", "Optimizer (each parameter normalized by its own norm).",
            check=allowed.optimizer),
      F.Int("block_size", 64, "Data sets per vectorized block.", lower=1))) + minibatch.settings()


SETTINGS = (common.base(runs=100) + common.pipeline(batch_size=1000) + common.numerics() + F.Settings((
    F.Int("heads", 2, "Number of attention heads H.", lower=1),
    F.Bool("shared_head", False, "One head v (the data set's) for every attention head."),
)) + training())

EXPERIMENT = registry.Experiment(
    id="E14", name=NAME, title="Multi-head attention (2 heads): per-head selections and SVMs",
    cost_s=38,
    claim="With several heads (no theorem), which tokens does each head select, and does each approach the "
          "Att-SVM of its selection?",
    beyond=True, settings=SETTINGS, quick={"runs": 20},
    key_numbers=key_numbers, figures=figures.draw, report=report, one_cell=True)
