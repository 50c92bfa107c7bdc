"""E11: joint training of head and attention (docs/science.md section 11), as a study.

The head v is trained together with the attention weights (W, (K,Q), or the prompt p of prompt
attention softmax(X p)), each parameter's step normalized by its own gradient norm. At the
tokens alpha each run selected, the host analysis solves
  v^mm      the l2 max-margin classifier of the selected tokens, with its support vectors S;
  relaxed   the relaxed Att-SVM: >= 1 for the sequences of S, >= 0 for the others
            (Frobenius for W and p, nuclear for (K,Q));
  full      Att-SVM(alpha) itself (every sequence >= 1): the fixed-head SVM, for comparison;
and correlates every snapshot of v with v^mm and of W (K Q^T, p) with both SVMs. With
``fixed_head`` each attention parameterization also trains with the head held fixed, and its
corr with its Att-SVM is reported beside.

Settings (``fl["setting"]``):
  toy  the public code's joint setting (ucr-optml/max_margin_attention, joint_training.ipynb):
       n=3, T=2, d=2, prompt attention, p(0) = (0,-1), v(0) = (-1,0), lr 0.1, 1000 steps; its two
       data sets, "tight" (every sequence a support vector) and "non-tight" (x_32 = (0.5, 1.5):
       sequence 3 is not one, and p goes to the relaxed SVM);
  e2   E2's generator and sizes (or a --data file of E2's format, v the initial head).

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
from svmattn.config import minibatch
from svmattn.data import datasets as data_lib
from svmattn.figures import joint_training as figures
from svmattn.execution import pipeline
from svmattn.execution import stages
from svmattn.studies import local_convergence
from svmattn.svm import att_svm as svm_lib
from svmattn.svm import joint as joint_lib
from svmattn.train import loop as train_lib

NAME = "joint_training"
SETTING_NAMES = ("e2", "toy")     # the values of the setting "setting"
# The public code's two hand-built data sets (n=3, T=2, d=2; labels +1, -1, +1).
TOY_X = np.array([[[[0, 0], [1, 1]], [[0, 0], [1, -1]], [[0, 0], [0.5, 1.0]]],
                  [[[0, 0], [1, 1]], [[0, 0], [1, -1]], [[0, 0], [0.5, 1.5]]]], np.float64)
TOY_Y = np.array([[1, -1, 1], [1, -1, 1]], np.float64)
TOY_NAMES = ("tight", "non-tight")
TOY_START = (("p", (0.0, -1.0)),)     # and v(0) = (-1, 0): the data sets' v
TOY_V0 = (-1.0, 0.0)


def toy_data() -> data_lib.Dataset:
  """The public code's joint data sets (Z is unused by prompt attention; v is the start v(0))."""
  B = TOY_X.shape[0]
  return data_lib.Dataset(TOY_X, TOY_Y, np.zeros((B, 3, 2)), np.tile(np.array(TOY_V0), (B, 1)))


def stage_name(param: str, fixed: bool = False) -> str:
  return f"{param}_fixed" if fixed else param


DEFAULTS = {"e2": {"params": ["W", "KQ"], "steps": 2000}, "toy": {"params": ["p"], "steps": 1000}}


def resolve(fl: dict) -> dict:
  """The flag values with the setting's defaults for params and steps where they are None."""
  fl = F.Values(fl)
  setting = fl.setting
  if setting not in SETTING_NAMES:
    raise ValueError(f"setting must be one of {SETTING_NAMES}, got {setting!r}")
  for k, v in DEFAULTS[setting].items():
    if fl[k] is None:
      fl[k] = v
  if setting == "toy" and list(fl.params) != ["p"]:
    raise ValueError(f"--setting=toy trains prompt attention (--params=p), got --params={','.join(fl.params)}")
  return fl


def configs(fl: dict) -> tuple:
  """((stage name, param, trained head?, TrainConfig), ...)."""
  fl = resolve(fl)
  out = []
  for p in fl.params:
    for fixed in ((False, True) if fl.fixed_head else (False,)):
      cfg = train_lib.TrainConfig(
          param=p, model="prompt" if p == "p" else "single_query", train_head=not fixed, lr=fl.lr,
          steps=fl.steps, snapshot_every=fl.snapshot_every, chunk_steps=fl.chunk_steps,
          init=fl.init, block_size=fl.block_size,
          numerics=fl.numerics, minibatch=fl.minibatch,
          sampling=fl.sampling).validate()
      out.append((stage_name(p, fixed), p, not fixed, cfg))
  return tuple(out)


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  ident = identity if identity is not None else fl
  fl = resolve(fl)
  setting = fl.setting
  cfgs = configs(fl)
  if setting == "toy":
    if fl.data:
      raise ValueError("--setting=toy runs the public code's own data sets; --data goes with --setting=e2")
    spec, file_data, start = None, toy_data(), TOY_START
  else:
    spec = data_lib.DataSpec(fl.n, fl.T, fl.d).validate()
    file_data = data_lib.load_npz(fl.data) if fl.data else None
    start = None
  if file_data is not None:
    minibatch.check_loaded(fl, file_data.X.shape[1], "--setting=toy" if setting == "toy" else "--data")
  runs = file_data.X.shape[0] if file_data is not None else fl.runs

  load = local_convergence.batches(spec, fl.seed, np.float64, file_data)

  def stage_list(cell):
    return tuple(stages.Train(name, c, start=start if p == "p" else None) for name, p, _, c in cfgs)

  return pipeline.Study(NAME, (pipeline.Cell({"setting": setting}, int(runs)),), lambda cell, runs: load(runs),
                        stage_list, functools.partial(analyze, saturation=fl.saturation),
                        fl.batch_size, fl.seed, ident)


def _nan(shape):
  return np.full(shape, np.nan)


def _vcorr(a, b):
  """Cosine of vectors over the last axis (NaN where either is zero or NaN)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  num = np.sum(a * b, axis=-1)
  den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def analyze(label: dict, data: dict, trajs: dict, saturation: float = health.SATURATION) -> dict:
  """Per run and stage: final W (p) and v, the selection, the training health
  (``analysis.health``), v^mm and S, the relaxed and the full Att-SVM at the selection, and per
  snapshot corr(v, v^mm), corr(W, relaxed), corr(W, full)."""
  X, Y, Z = (np.asarray(data[k], np.float64) for k in ("X", "Y", "Z"))
  B, n, T, d = X.shape
  out = {"runs": np.asarray(data["runs"]), "optimal_tokens": metrics.optimal_tokens(data["gamma"])}
  for name, t in trajs.items():
    param = name.split("_")[0]
    prompt = param == "p"
    norm = "nuc" if param == "KQ" else "fro"
    W = np.asarray(t["W"], np.float64)                                  # (B,S,d,d) or (B,S,d)
    sel = np.asarray(t["selected"], np.int64)
    shape = (d,) if prompt else (d, d)
    out[f"W_final_{name}"] = W[:, -1]
    out[f"selected_{name}"] = sel
    out[f"finite_{name}"] = t["finite"]
    out[f"max_prob_{name}"] = t["max_prob"]
    health.add(out, name, t, saturation)
    full = _nan((B,) + shape)
    full_status = []
    if prompt:
      solved = [joint_lib.relaxed_att_svm(X[b], Z[b], sel[b], np.ones(n, bool), "fro", prompt=True) for b in range(B)]
    else:
      solved = svm_lib.att_svm_many([(X[b], Z[b], sel[b], norm) for b in range(B)], threads=1)
    for b, r in enumerate(solved):
      full_status.append(r.status)
      if r.ok:
        full[b] = r.w if prompt else r.W
    out[f"svm_full_{name}_status"] = np.array(full_status, dtype="<U10")
    out[f"W_full_{name}"] = full
    corr = _vcorr if prompt else metrics.corr
    out[f"corr_full_{name}"] = corr(W, full[:, None])
    if "V" not in t:                      # a fixed head: the fixed-head comparison only
      continue
    V = np.asarray(t["V"], np.float64)                                  # (B,S,d)
    out[f"v_final_{name}"] = V[:, -1]
    if prompt:                            # the whole (small) paths, for the trajectory figure
      out[f"p_path_{name}"], out[f"v_path_{name}"] = W, V
    v_mm, support = _nan((B, d)), np.zeros((B, n), bool)
    relaxed = _nan((B,) + shape)
    head_status, relaxed_status = [], []
    for b in range(B):
      h = joint_lib.max_margin_head(X[b], Y[b], sel[b])
      head_status.append(h.status)
      if not h.ok:
        relaxed_status.append("no v^mm")
        continue
      v_mm[b], support[b] = h.w, h.support
      r = joint_lib.relaxed_att_svm(X[b], Z[b], sel[b], h.support, norm, prompt=prompt)
      relaxed_status.append(r.status)
      if r.ok:
        relaxed[b] = r.w.reshape(shape)
    out[f"v_mm_{name}"] = v_mm
    out[f"support_{name}"] = support
    out[f"svm_head_{name}_status"] = np.array(head_status, dtype="<U10")
    out[f"svm_relaxed_{name}_status"] = np.array(relaxed_status, dtype="<U10")
    out[f"W_relaxed_{name}"] = relaxed
    out[f"corr_v_{name}"] = _vcorr(V, v_mm[:, None])
    # v against the max-margin classifier of the final pooled tokens X_i^T s_i: the same as v^mm
    # once the softmax saturates; what v follows when the attention selects nothing
    att = np.asarray(t["attention"], np.float64)
    pooled = np.einsum("bnt,bntd->bnd", att, X)
    v_pool = _nan((B, d))
    for b in range(B):
      h = joint_lib.max_margin_classifier(pooled[b], Y[b])
      if h.ok:
        v_pool[b] = h.w
    out[f"corr_v_pooled_{name}"] = _vcorr(V[:, -1], v_pool)
    out[f"corr_relaxed_{name}"] = corr(W, relaxed[:, None])
  return out


def _mean(x):
  x = np.asarray(x, np.float64)
  ok = np.isfinite(x)
  return float(np.mean(x[ok])) if ok.any() else None


def _min(x):
  x = np.asarray(x, np.float64)
  ok = np.isfinite(x)
  return float(np.min(x[ok])) if ok.any() else None


def reduce(fl: dict, arrays: dict) -> tuple[dict, dict]:
  """(results.npz arrays, summary): per stage the mean and min final corr(v, v^mm),
  corr(W, relaxed) and corr(W, full Att-SVM), how many data sets have sequences outside S, and
  where W sits (nearer the relaxed or the full SVM)."""
  fl = resolve(fl)
  cfgs = configs(fl)
  arrays = {**arrays, "steps": train_lib.config_snapshot_steps(cfgs[0][3])}   # the same for every config
  stages_summary = {}
  for name, p, joint, _ in cfgs:
    row = {"param": p, "head": "trained" if joint else "fixed",
           "corr_full_final": {"mean": _mean(arrays[f"corr_full_{name}"][:, -1]),
                               "min": _min(arrays[f"corr_full_{name}"][:, -1])},
           "svm_full_solved": int(np.sum(arrays[f"svm_full_{name}_status"] == "optimal")),
           "max_prob_final": _mean(arrays[f"max_prob_{name}"][:, -1]),
           "diverged": int(np.sum(~arrays[f"finite_{name}"]))}
    if joint:
      cv, cr, cf = (arrays[f"corr_{k}_{name}"][:, -1] for k in ("v", "relaxed", "full"))
      outside = ~arrays[f"support_{name}"].all(axis=1) & (arrays[f"svm_head_{name}_status"] == "optimal")
      cp = arrays[f"corr_v_pooled_{name}"]
      row.update({
          "corr_v_final": {"mean": _mean(cv), "min": _min(cv)},
          "corr_v_pooled_final": {"mean": _mean(cp), "min": _min(cp)},
          "corr_relaxed_final": {"mean": _mean(cr), "min": _min(cr)},
          "v_mm_solved": int(np.sum(arrays[f"svm_head_{name}_status"] == "optimal")),
          "relaxed_solved": int(np.sum(arrays[f"svm_relaxed_{name}_status"] == "optimal")),
          "sets_with_non_support_sequences": int(np.sum(outside)),
          "mean_support_vectors": _mean(arrays[f"support_{name}"].sum(axis=1)),
          # on the data sets where the relaxed and the full SVM differ: which is W nearer?
          "nearer_relaxed": int(np.sum(outside & (cr > cf))),
          "nearer_full": int(np.sum(outside & (cf > cr))),
          "corr_relaxed_final_where_different": _mean(cr[outside]) if outside.any() else None,
          "corr_full_final_where_different": _mean(cf[outside]) if outside.any() else None,
      })
    stages_summary[name] = row
  summary = {"experiment": "E11 joint training", "setting": fl.setting,
             "numerics": fl.numerics, "data_sets": len(arrays["runs"]),
             "stages": stages_summary, "health": health.summary(arrays),
             "saturation_threshold": fl.saturation}
  if fl.setting == "toy":
    summary["toy"] = {TOY_NAMES[i]: {name: {k: float(arrays[f"corr_{k}_{name}"][i, -1])
                                            for k in ("v", "relaxed", "full") if f"corr_{k}_{name}" in arrays}
                                     for name, *_ in cfgs}
                      for i in range(len(arrays["runs"]))}
  summary["checks"] = checks(fl, arrays, cfgs)
  return arrays, summary


def checks(fl: dict, arrays: dict, cfgs) -> list:
  """The predictions that can fail: v -> v^mm (mean final corr > 0.99) for every jointly trained
  parameterization; in the toy setting, p -> the full SVM on the tight data set and -> the
  relaxed SVM on the non-tight one (corr > 0.99, and nearer it than the other SVM)."""
  out = []
  for name, p, joint, _ in cfgs:
    if not joint:
      continue
    m = _mean(arrays[f"corr_v_{name}"][:, -1])
    out.append({"name": f"{name}: mean final corr(v, v^mm)", "value": m, "expected": "> 0.99",
                "ok": m is not None and m > 0.99})
  if fl.setting == "toy":
    for name, p, joint, _ in cfgs:
      if not joint or p != "p":
        continue
      tight_full = float(arrays[f"corr_full_{name}"][0, -1])
      loose_rel = float(arrays[f"corr_relaxed_{name}"][1, -1])
      loose_full = float(arrays[f"corr_full_{name}"][1, -1])
      out.append({"name": "toy tight: final corr(p, p^mm)", "value": tight_full, "expected": "> 0.99",
                  "ok": tight_full > 0.99})
      out.append({"name": "toy non-tight: final corr(p, relaxed p^mm)", "value": loose_rel,
                  "expected": f"> 0.99 and > corr with the full p^mm ({loose_full:.4f})",
                  "ok": loose_rel > 0.99 and loose_rel > loose_full})
  return out


def report(summary: dict, fl: dict) -> list[str]:
  """The terminal lines of a finished run (the checks follow): per stage the mean (min) final corrs."""
  lines = [f"E11 joint training ({summary['setting']}): {summary['data_sets']} data sets; mean (min) final corr"]
  for name, row in summary["stages"].items():
    f = lambda d: "-" if d["mean"] is None else f"{d['mean']:.4f} ({d['min']:.4f})"  # noqa: E731
    if row["head"] == "trained":
      lines.append(f"  {name:<9} v~v^mm {f(row['corr_v_final'])}  W~relaxed {f(row['corr_relaxed_final'])}  "
                   f"W~full {f(row['corr_full_final'])}  non-support sequences in {row['sets_with_non_support_sequences']} "
                   f"sets: nearer relaxed {row['nearer_relaxed']}, nearer full {row['nearer_full']}")
      lines.append(f"  {'':<9} mean max softmax {row['max_prob_final']:.3f}; v~max-margin classifier of the pooled "
                   f"tokens X^T s {f(row['corr_v_pooled_final'])}")
    else:
      lines.append(f"  {name:<9} (head fixed) W~Att-SVM {f(row['corr_full_final'])}")
  for k, v in summary.get("toy", {}).items():
    lines.append(f"  toy {k}: " + "  ".join(f"{s}: " + ", ".join(f"{c} {x:.5f}" for c, x in d.items())
                                            for s, d in v.items()))
  return lines


def key_numbers(summary: dict) -> list:
  """The mean final corr(v, v^mm) of every jointly trained parameterization."""
  return [(f"corr(v, v^mm) {name}", row["corr_v_final"]["mean"])
          for name, row in (summary.get("stages") or {}).items() if row.get("head") == "trained"]


def _params(values):
  if values is None or (bool(values) and len(set(values)) == len(values) and all(p in ("W", "KQ", "p") for p in values)):
    return None
  return "must list distinct parameterizations among W, KQ, p"


def _toy_without_data(v):
  if v["setting"] == "toy" and v["data"]:
    return "--data goes with --setting=e2 (--setting=toy runs the public code's own data sets)"
  return None


def _minibatch_limit(v):
  """(sequences per data set, named) of --setting=toy (its data sets' 3) or e2 (--n; a --data file's
  n is checked when it is loaded)."""
  if v["setting"] == "toy":
    return TOY_X.shape[1], f"the n={TOY_X.shape[1]} sequences of --setting=toy's data sets"
  return None if v["data"] else (v["n"], f"--n={v['n']}")


def _toy_trains_prompt(v):
  if v["setting"] == "toy" and v["params"] not in (None, ("p",)):
    return "--setting=toy trains prompt attention: --params=p (or leave --params out)"
  return None


SETTINGS = (common.base(runs=100) + common.pipeline(batch_size=1000) + common.numerics() + F.Settings((
    F.Enum("setting", "e2", SETTING_NAMES, "e2: E2's sizes and generator (or --data); toy: the public code's "
           "n=3, T=2, d=2 prompt-attention setting."),
    F.Int("n", 6, "Sequences per data set (e2).", lower=1),
    F.Int("T", 8, "Tokens per sequence (e2).", lower=2),
    F.Int("d", 10, "Embedding dimension (e2).", lower=1),
    F.List("params", None, "Attention parameterizations: W, KQ, p (prompt attention). Default: W,KQ for e2, p for "
           "toy.", check=_params),
    F.Int("steps", None, "Steps (default 2000 for e2, 1000 for toy).", lower=0),
    F.Float("lr", 0.1, "Step size of the per-parameter normalized GD.", check=allowed.positive),
    F.Bool("fixed_head", True, "Also train each parameterization with the head held fixed (comparison)."),
    F.Enum("init", "uniform", ["uniform", "normal", "zero"], "Initialization of the attention weights (toy: p(0) = "
           "(0,-1) always)."),
    F.Int("snapshot_every", 10, "Record the parameters every this many steps.", lower=1),
    F.Int("chunk_steps", 1000, "Steps per jitted chunk; a checkpoint is saved after each.", lower=1),
    F.Int("block_size", 64, "Data sets per vectorized block.", lower=1),
), (common.block_fits_batch(),
    # (the toy setting's own data and model: what the binary's main refused before the run)
    F.Rule(("setting", "data"), _toy_without_data),
    F.Rule(("setting", "params"), _toy_trains_prompt)))
    + minibatch.settings(("n", "setting", "data"), _minibatch_limit))

EXPERIMENT = registry.Experiment(
    id="E11", name=NAME, title="Joint training of head and attention (E2's sizes)",
    cost_s=34,
    claim="Trained jointly, does the head go to v^mm, the max-margin classifier of the selected tokens, and the "
          "attention to the relaxed Att-SVM (Tarzanagh, Li, Zhang, Oymak 2023)?",
    beyond=True, settings=SETTINGS, quick={"runs": 20},
    variants=(registry.Variant("toy", "Joint training, the public code's setting (n=3, T=2, d=2, prompt attention)",
                               {"setting": "toy"}, cost_s=6),),
    key_numbers=key_numbers, figures=figures.draw, report=report, one_cell=True)
