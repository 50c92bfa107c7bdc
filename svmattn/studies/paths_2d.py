"""E1: the 2-D picture of global convergence (docs/science.md section 8, the paper's Figure 1), as a study.

One cell of ``runs`` data sets (``two_clusters``: n=2 sequences of T=3 tokens in d=2, labels
+1, tokens 0.3 N(0,1) around (-1,0) and (+1,0); or the rows of a data file). W and (K,Q) are
trained with normalized GD from W(0)=0 / Q(0)=0 (init scheme "zero"), every snapshot kept;
the host analysis solves the Frobenius and the nuclear Att-SVM at the OPTIMAL tokens and
correlates the final directions with them. The reduction picks the data set drawn in the
figure (``pick_drawn``) and computes the checks.

``fl`` below is a dict of the experiment's settings (``SETTINGS``: the binary's flags or a
config's fields), or the "flags" of its summary.json: ``build`` rebuilds the same study from it.
"""
from __future__ import annotations

import functools

from absl import logging
import numpy as np

from svmattn import registry
from svmattn import rng
from svmattn.analysis import health
from svmattn.analysis import metrics
from svmattn.config import allowed
from svmattn.config import common
from svmattn.config import fields as F
from svmattn.config import minibatch
from svmattn.data import datasets as data_lib
from svmattn.models import attention as model_lib
from svmattn.models import heads
from svmattn.execution import pipeline
from svmattn.execution import stages
from svmattn.studies import local_convergence
from svmattn.svm import att_svm as svm_lib
from svmattn.train import loop as train_lib
from svmattn.figures import paths_2d as figures

NAME = "paths_2d"
PARAMS = ("W", "KQ")
NOISE = 0.3      # token noise scale
SHIFT = 1.0      # |cluster centre|
NORM_NAME = {"fro": "Frobenius", "nuc": "nuclear"}
OWN_NORM = {name: p.svm_norm for name, p in model_lib.PARAMETERIZATIONS.items()}


@data_lib.host_sampler
def two_clusters(spec: data_lib.DataSpec, seed: int, runs, head: heads.Head, dtype=np.float64) -> tuple[np.ndarray, ...]:
  """E1 generator (on the host, every run at once: ``data.datasets.host_sampler``): x_it = 0.3 N(0, I_d)
  + c_i with cluster centres c_i = (-1 + 2 i / (n - 1), 0, ..., 0) ((-1,0) and (+1,0) for n=2; c = 0
  for n=1); z_i and v unit Gaussian; Y = +1. X (n,T,d), Y (n,), Z (n,d), v from the head's flat draw.
  Run r draws from split(data key of r, 3) = (kx, kz, kv). (Numerics version 9; before, a compiled
  program per shape, with XLA's norms of z and v.)"""
  n, T, d = spec.n, spec.T, spec.d
  dt = np.dtype(dtype)
  kx, kz, kv = np.moveaxis(rng.split_keys(rng.split_keys(rng.run_keys(seed, runs))[:, 0], 3), 1, 0)
  B = len(kx)
  X = rng.normals(kx, n * T * d, dt, NOISE).reshape(B, n, T, d)     # NOISE * normal, as a program rounds it
  centre = np.linspace(-SHIFT, SHIFT, n).astype(dt) if n > 1 else np.zeros((1,), dt)
  X[:, :, :, 0] += centre[None, :, None]
  fz, fv = rng.normals(kz, n * d, dt), rng.normals(kv, data_lib.head_size(head, d), dt)
  Z = data_lib.unit_rows_host(fz.reshape(B, n, d))
  return X, np.ones((B, n), dt), Z, data_lib.flat_head(fv, head, d)


def spec(fl: dict) -> data_lib.DataSpec:
  return data_lib.DataSpec(fl.n, fl.T, fl.d, labels="positive").validate()


def configs(fl: dict) -> tuple:
  """((parameterization, TrainConfig), ...): normalized GD from zero, every snapshot_every steps."""
  return tuple((p, train_lib.TrainConfig(param=p, lr=fl.lr, steps=fl.steps,
                                         snapshot_every=fl.snapshot_every,
                                         chunk_steps=max(fl.snapshot_every, 500), init="zero",
                                         numerics=fl.numerics, minibatch=fl.minibatch,
                                         sampling=fl.sampling).validate())
               for p in PARAMS)


def _dtype(fl: dict):
  return np.float32 if fl.precision == "float32" else np.float64


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  """The E1 study of flag values ``fl``: the data sets of fl["data"] (a .npz file; raises
  ``data.datasets.DataError`` for a bad one) or fl["runs"] generated ones (``two_clusters``)."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  sp, cfgs = spec(fl), configs(fl)
  dtype = _dtype(fl)
  file_data = data_lib.load_npz(fl.data, dtype) if fl.data else None
  if file_data is not None:
    minibatch.check_loaded(fl, file_data.X.shape[1])
  runs = file_data.X.shape[0] if file_data is not None else fl.runs

  def load(cell, runs):
    if file_data is not None:
      batch = data_lib.take(file_data, runs)
    else:   # drawn in the run's precision, as the E1 binary always did
      batch = data_lib.generate_host(sp, fl.seed, runs, heads.LINEAR, sampler=two_clusters, dtype=dtype)
    batch = data_lib.Dataset(*(np.asarray(a) for a in batch))
    return {**batch._asdict(), "gamma": local_convergence.token_scores(batch)}

  return pipeline.Study(NAME, (pipeline.Cell({}, int(runs)),), load,
                        lambda cell: tuple(stages.Train(p, c) for p, c in cfgs),
                        functools.partial(analyze, saturation=fl.saturation),
                        fl.batch_size, fl.seed, identity if identity is not None else fl)


def analyze(label: dict, data: dict, trajs: dict, saturation: float = health.SATURATION) -> dict:
  """Per run: the data (X, Z in float64), optimal tokens, the Frobenius and nuclear Att-SVM of
  the optimal tokens, and per parameterization P every snapshot W_P, the selections, the loss
  curve, the final correlations corr_P_norm and the training health (``analysis.health``)."""
  del label
  X, Z = np.asarray(data["X"], np.float64), np.asarray(data["Z"], np.float64)
  gamma = data["gamma"]
  opt = metrics.optimal_tokens(gamma)
  B, d = X.shape[0], X.shape[-1]
  out = {"runs": data["runs"], "X": X, "Y": data["Y"], "Z": Z, "v": data["v"], "optimal_tokens": opt,
         "token_scores": gamma}
  svms = {norm: svm_lib.stack(svm_lib.att_svm_batch(X, Z, opt, norm, threads=1), d) for norm in svm_lib.NORMS}
  for norm in svm_lib.NORMS:
    out[f"svm_{norm}"] = svms[norm]["W"]
    out[f"svm_{norm}_status"] = svms[norm]["status"]
  for p, t in trajs.items():
    out[f"W_{p}"] = t["W"]
    out[f"selected_{p}"] = t["selected"]
    out[f"loss_{p}"] = t["loss"]
    for norm in svm_lib.NORMS:
      out[f"corr_{p}_{norm}"] = metrics.corr(t["W"][:, -1], svms[norm]["W"])
    health.add(out, p, t, saturation)
  return out


def steps(fl: dict) -> np.ndarray:
  """(S,) the snapshot steps (the same for W and (K,Q))."""
  c = configs(fl)[0][1]
  return train_lib.config_snapshot_steps(c)


KEYS = ("runs", "X", "Y", "Z", "v", "optimal_tokens", "token_scores")


def reduce(fl: dict, cells: list) -> tuple[dict, dict]:
  """(results.npz arrays, summary) from the per-run arrays of the one cell; the summary holds
  the data set drawn in the figure ("drawn_data_set") and the checks."""
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  a = cells[0]
  opt = a["optimal_tokens"]
  B, n, T, d = a["X"].shape
  arrays = {k: a[k] for k in KEYS}
  arrays["steps"] = steps(fl)
  for norm in svm_lib.NORMS:
    arrays[f"svm_{norm}"] = a[f"svm_{norm}"]
    arrays[f"svm_{norm}_status"] = a[f"svm_{norm}_status"]
  draw_run = fl.draw_run
  drawn = draw_run if draw_run >= 0 else pick_drawn(arrays["Z"], a["svm_fro"], a["svm_nuc"])
  summary = {"experiment": "E1 2-D paths", "numerics": fl.numerics,
             "data_sets": int(B), "shape": {"n": int(n), "T": int(T), "d": int(d)},
             "drawn_data_set": int(drawn), "final_corr": {}, "selected_opt": {},
             "svm_status": {norm: {s: int(np.sum(a[f"svm_{norm}_status"] == s)) for s in svm_lib.STATUSES}
                            for norm in svm_lib.NORMS}}
  for p in PARAMS:
    arrays[f"W_{p}"] = a[f"W_{p}"]
    arrays[f"selected_{p}"] = a[f"selected_{p}"]
    arrays[f"loss_{p}"] = a[f"loss_{p}"]
    summary["selected_opt"][p] = float(np.mean(np.all(a[f"selected_{p}"] == opt, axis=1)))
    for norm in svm_lib.NORMS:
      final = arrays[f"corr_{p}_{norm}"] = a[f"corr_{p}_{norm}"]
      ok = np.isfinite(final)
      summary["final_corr"][f"{p}_vs_{norm}"] = {
          "mean": float(np.mean(final[ok])) if ok.any() else None,
          "min": float(np.min(final[ok])) if ok.any() else None, "solved": int(ok.sum())}
  for p in PARAMS:
    if f"health_{p}" in a:       # (a per-run record written before the health labels has none)
      arrays[f"health_{p}"] = a[f"health_{p}"]
      arrays[f"stalled_step_{p}"] = a[f"stalled_step_{p}"]
  summary["health"] = health.summary(arrays)
  summary["saturation_threshold"] = fl.saturation
  summary["checks"] = checks(arrays, opt)
  return arrays, summary


def pick_drawn(Z: np.ndarray, fro: np.ndarray, nuc: np.ndarray, max_cos: float = 0.5,
               max_corr: float = 0.98) -> int:
  """The first data set whose picture separates the predictions: queries far apart in
  direction (max_{i<j} |cos(z_i, z_j)| <= max_cos; when z_1 ~ z_2 the rays W z_i
  coincide) and Frobenius and nuclear SVMs of distinct directions (corr <= max_corr;
  otherwise solid and dashed rays coincide, e.g. for a rank-one W^mm). Z (B,n,d),
  fro / nuc (B,d,d) (NaN where unsolved). 0 if no data set qualifies. The rule looks
  at the data and the SVMs only, never at the trained paths."""
  Zn = Z / np.linalg.norm(Z, axis=-1, keepdims=True)
  n = Z.shape[1]
  distinct = metrics.corr(fro, nuc) <= max_corr          # NaN (unsolved) -> False
  for b in range(len(Z)):
    cos = np.abs(Zn[b] @ Zn[b].T)[np.triu_indices(n, 1)]
    if distinct[b] and (cos.size == 0 or np.max(cos) <= max_cos):
      return b
  return 0


def checks(arrays, opt) -> list:
  """Final-direction correlations with the SVMs of the optimal tokens, and global selection."""
  out = []
  for p, what in (("W", "W"), ("KQ", "K Q^T")):
    norm = OWN_NORM[p]
    corr = arrays[f"corr_{p}_{norm}"]
    ok = np.isfinite(corr)
    value = float(np.min(corr[ok])) if ok.all() else float("nan")
    out.append({"name": f"min over data sets of corr(final {what}, {NORM_NAME[norm]} W^mm(opt))",
                "value": value, "expected": ">= 0.99 (converges to the SVM direction)",
                "ok": bool(ok.all() and value >= 0.99)})
    share = float(np.mean(np.all(arrays[f"selected_{p}"] == opt, axis=1)))
    out.append({"name": f"{p}: share of data sets whose final attention selects the optimal tokens",
                "value": share, "expected": "1 (global convergence from W(0)=0 / Q(0)=0)",
                "ok": bool(share == 1.0)})
  return out


def report(summary: dict, fl: dict) -> list[str]:
  """The terminal lines of a finished run (the checks follow)."""
  lines = [f"E1 2-D paths: {summary['data_sets']} data set(s)"]
  for key, v in summary["final_corr"].items():
    if v["mean"] is not None:
      lines.append(f"  final corr {key:<10} {v['mean']:.5f} (min {v['min']:.5f})")
  return lines


def prepare(fl: dict, study: pipeline.Study) -> None:
  """--draw_run against the data sets of the built study (a --data file's are known only once read)."""
  B = study.cells[0].runs
  if not -1 <= fl.draw_run < B:
    raise F.ConfigError(f"--draw_run must be -1 (auto) or in [0, {B}), got {fl.draw_run}")
  logging.info("E1: %d data sets, n=%d T=%d d=%d, %d steps", B, fl.n, fl.T, fl.d, fl.steps)


def _draw_run_rule(v):
  return None if v["data"] is not None or v["draw_run"] < v["runs"] else "--draw_run must be -1 (auto) or below --runs"


SETTINGS = (common.base(runs=16) + common.pipeline(batch_size=1000) + common.numerics() + F.Settings((
    F.Int("n", 2, "Sequences per data set (cluster centres spread evenly over [-1, 1] x {0}).", lower=1),
    F.Int("T", 3, "Tokens per sequence.", lower=2),
    F.Int("d", 2, "Embedding dimension (the picture needs d = 2).", lower=1),
    F.Int("steps", 2000, "Normalized GD steps.", lower=0),
    F.Float("lr", 0.1, "Learning rate (step size eta).", check=allowed.positive),
    F.Int("snapshot_every", 1, "Record W every this many steps (the drawn path).", lower=1),
    F.Int("draw_run", -1, "Index (into the data sets) of the data set drawn in paths.png; -1: the first whose "
          "picture can separate the predictions (see pick_drawn), else data set 0.", lower=-1),
), (F.Rule(("draw_run", "runs", "data"), _draw_run_rule),)) + minibatch.settings())

EXPERIMENT = registry.Experiment(
    id="E1", name=NAME, title="2-D picture of global convergence",
    cost_s=1,
    claim="From W(0)=0 (and Q(0)=0), normalized GD selects the optimal tokens and its direction converges to "
          "the Att-SVM: W to the Frobenius-norm W^mm, K Q^T to the nuclear-norm W^mm_*.",
    settings=SETTINGS,
    key_numbers=(("min corr(W, W^mm)", "final_corr.W_vs_fro.min"),
                 ("min corr(KQ^T, W^mm_*)", "final_corr.KQ_vs_nuc.min")),
    figures=figures.draw, report=report, prepare=prepare)
