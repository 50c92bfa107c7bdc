"""E13: real data, offline (docs/science.md section 14), as a study.

Images become sequences of patch tokens (``data.images``: patch size p, an optional positional
encoding, unit norms); a class pair (or one class against the rest) gives labels +-1; the query
is the mean token (cross-attention) or a fixed [CLS] token (self-attention). The image pool is
split once into a training pool and a held-out pool (``test_fraction``, fixed by the seed). A
data set is a random subset of n training images: one cell per n of ``n_values``, ``runs`` data
sets each; data set r of cell n draws its subset from fold_in(run_key(seed, r), n).

Head (``head``): "fit" (default) the logistic-regression classifier of the data set's
mean-pooled tokens (uniform attention), unit norm, held fixed; "fixed" the unit class-mean
difference of those pooled tokens, held fixed; "joint" trained with the attention from "fit"
(``TrainConfig.train_head``).

Host analysis per data set and parameterization (W: Frobenius, (K,Q): nuclear):
  the selection alpha (argmax of the final softmax), Att-SVM(alpha): status (feasible or not) and
  corr(W, W^mm) per snapshot; (W) Gen-SVM (``svm.gensvm``): its status or discard reason and
  corr(W, W^SVMeq) where it is solved; sparsity: the mean largest probability and the mean number
  of tokens above tau_H per sequence; train accuracy and held-out accuracy on the held-out pool.

``fl`` below is a dict of the experiment's settings (``SETTINGS``: the binary's flags or a
config's fields), or the "flags" of its summary.json; an unset ``patch`` or ``n_values`` takes the
data set's default (``resolve``). The figures are ``svmattn.figures.real_data``.
"""
from __future__ import annotations

import os

import numpy as np

from svmattn import registry
from svmattn import rng
from svmattn.analysis import health
from svmattn.analysis import metrics
from svmattn.analysis import predictions
from svmattn.config import allowed
from svmattn.config import common
from svmattn.config import fields as F
from svmattn.config import minibatch
from svmattn.data import datasets as data_lib
from svmattn.data import images as images_lib
from svmattn.figures import real_data as figures
from svmattn.execution import pipeline
from svmattn.execution import stages
from svmattn.execution import sweep as sweep_lib
from svmattn.svm import att_svm as svm_lib
from svmattn.svm import gensvm
from svmattn.train import loop as train_lib

NAME = "real_data"
HEADS = ("fit", "fixed", "joint")
STATUS_DTYPE = "<U12"
# Training health (``analysis.health``) without the "unsaturated" label: E13 measures how many
# tokens a softmax keeps (multi-token selection, Gen-SVM), where a softmax spread over several
# tokens is an expected outcome, not a run in progress; only "diverged" and "stalled" runs are
# labelled.
SATURATION = 0.0
# The settings left unset (None) take the data set's own: its patch size and its sizes n.
DEFAULTS = {"digits": {"patch": 2, "n_values": [2, 4, 8, 16, 32, 64, 128, 240]},
            "fashion_mnist": {"patch": 7, "n_values": [4, 16, 64, 256, 1024]}}


def resolve(fl: dict) -> dict:
  """``fl`` with an unset patch / n_values at the data set's default (``DEFAULTS``) and n_values
  as integers (settings already resolved are returned as they are)."""
  fl = F.Values(fl)
  for k, v in DEFAULTS[fl.dataset].items():
    if fl[k] is None:
      fl[k] = v
  fl["n_values"] = [int(n) for n in fl.n_values]
  return fl


def pool(fl: dict):
  """(tokens X (N,T,D), queries Z (N,D), labels y (N,), image index (N,) into the dataset, train
  rows, test rows) of the class pair, from the flag values."""
  images, labels = images_lib.load_images(fl.dataset, root=fl.data_dir or None)
  index, y = images_lib.class_labels(labels, images_lib.parse_classes(fl.classes))
  tokens = images_lib.patch_tokens(images[index], fl.patch, fl.pos, fl.pos_scale)
  X, Z = images_lib.with_query(tokens, fl.query)
  train, test = images_lib.split_pool(len(index), fl.test_fraction, fl.seed)
  test = test[:fl.test_size]
  return X, Z, y, index, train, test


def _cell_keys(seed: int, n: int, runs: np.ndarray, half: int) -> np.ndarray:
  """(B, 2) fold_in(split_run_key(run_key(seed, r))[half], n) of every run r of ``runs``, on the host (``rng``)."""
  return rng.fold_in_keys(rng.split_keys(rng.run_keys(seed, np.asarray(runs, np.uint32)))[:, half], n)


def subsets(seed: int, n: int, runs: np.ndarray, pool_size: int) -> np.ndarray:
  """(B, n) positions in the training pool of the data sets ``runs`` of cell n: data set r of
  cell n is the first n of ``jax.random.permutation`` drawn from fold_in(data key of run_key(seed, r),
  n), computed on the host (``rng.permutations``: the same integers, no program per cell)."""
  return rng.permutations(_cell_keys(seed, n, runs, 0), pool_size)[:, :n]


def random_selections(seed: int, n: int, runs: np.ndarray, T: int) -> np.ndarray:
  """(B, n) a uniformly random token per sequence (from the init half of the run key): the
  selection whose Att-SVM shows the counting transition n(T-1) = d^2. ``jax.random.randint``
  computed on the host (``rng.randints``)."""
  return rng.randints(_cell_keys(seed, n, runs, 1), n, 0, T)


def pooled_tokens(X: np.ndarray) -> np.ndarray:
  """The mean token of each sequence (uniform attention): (..., n, d)."""
  return np.asarray(X, np.float64).mean(axis=-2)


def fit_head(X: np.ndarray, Y: np.ndarray, kind: str) -> np.ndarray:
  """The head v (d,) of one data set (unit norm): "fixed" the class-mean difference of the
  mean-pooled tokens; "fit" / "joint" the logistic-regression classifier (no intercept) of
  them, or the class-mean difference when the subset holds one class only."""
  R = pooled_tokens(X)
  v = np.mean(Y[:, None] * R, axis=0)
  if kind != "fixed" and len(np.unique(Y)) == 2:
    from sklearn.linear_model import LogisticRegression
    model = LogisticRegression(C=1e4, fit_intercept=False, max_iter=5000, tol=1e-10)
    model.fit(R, Y)
    v = model.coef_[0]
  norm = np.linalg.norm(v)
  return v / norm if norm > 0 else v


def configs(fl: dict) -> tuple:
  return tuple((p, train_lib.TrainConfig(
      param=p, lr=fl.lr, steps=fl.steps, snapshot_every=fl.snapshot_every,
      chunk_steps=fl.chunk_steps, block_size=fl.block_size, init=fl.init,
      train_head=fl.head == "joint", numerics=fl.numerics,
      minibatch=fl.minibatch, sampling=fl.sampling).validate())
      for p in fl.params)


def check(fl: dict, train_pool: int) -> None:
  if fl.head not in HEADS:
    raise ValueError(f"head must be one of {HEADS}, got {fl.head!r}")
  too_big = [n for n in fl.n_values if n > train_pool]
  if too_big:
    raise ValueError(f"n = {too_big} exceeds the {train_pool} training images of classes {fl.classes} "
                     f"({fl.dataset}, test_fraction {fl.test_fraction})")


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  fl = resolve(fl)
  ident = identity if identity is not None else fl
  X_all, Z_all, y_all, index, train, test = pool(fl)
  check(fl, len(train))
  cfgs = configs(fl)
  held = {"X_test": X_all[test], "Z_test": Z_all[test], "Y_test": y_all[test],
          "tau_H": np.asarray(fl.tau_H), "tau_L": np.asarray(fl.tau_L)}

  def load(cell, runs):
    pos = train[subsets(fl.seed, cell.label["n"], runs, len(train))]             # (B, n) rows of the pool
    X, Z, Y = X_all[pos], Z_all[pos], y_all[pos]
    import threadpoolctl
    # One BLAS thread for the fits (d-dimensional, tiny): this load runs beside training, and there a
    # second OpenBLAS thread only spins against it (on 2 busy cores the fits took 27 s, not 13 s)
    with threadpoolctl.threadpool_limits(1):
      v = np.stack([fit_head(X[b], Y[b], fl.head) for b in range(len(runs))])
    alpha = random_selections(fl.seed, cell.label["n"], runs, X.shape[2])
    return {"X": X, "Y": Y, "Z": Z, "v": v, "image": index[pos], "random_alpha": alpha, **held}

  cells = tuple(pipeline.Cell(label, int(fl.runs)) for label in sweep_lib.grid({"n": fl.n_values}))
  return pipeline.Study(NAME, cells, load, lambda cell: tuple(stages.Train(p, c) for p, c in cfgs), analyze,
                        fl.batch_size, fl.seed, ident)


def predict(W: np.ndarray, v: np.ndarray, X: np.ndarray, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(f (m,), s (m,T)) of one model on sequences X (m,T,d), Z (m,d) (NumPy, float64)."""
  return predictions.single_query(W, v, X, Z)


def analyze(label: dict, data: dict, trajs: dict) -> dict:
  X, Y, Z, v0 = (np.asarray(data[k], np.float64) for k in ("X", "Y", "Z", "v"))
  Xt, Zt, Yt = (np.asarray(data[k], np.float64) for k in ("X_test", "Z_test", "Y_test"))
  tau_H, tau_L = float(data["tau_H"]), float(data["tau_L"])
  B, n, T, d = X.shape
  out = {"runs": np.asarray(data["runs"]), "image": np.asarray(data["image"]), "Y": Y}
  # Att-SVM at the optimal tokens (the head's token scores Y_i v^T x_it): a selection GD did not
  # choose, feasible generically only while n(T-1) <= d^2 (GD's own selection is feasible whenever
  # its softmax is strictly peaked: W_GD itself satisfies the constraints up to scale)
  gamma = Y[:, :, None] * np.einsum("bntd,bd->bnt", X, v0)
  opt = np.argmax(gamma, axis=-1)
  out["optimal_tokens"] = opt
  out["svm_opt_status"] = np.array([svm_lib.att_svm(X[b], Z[b], opt[b], "fro").status for b in range(B)],
                                   dtype=STATUS_DTYPE)
  rand = np.asarray(data["random_alpha"], np.int64)
  out["svm_random_status"] = np.array([svm_lib.att_svm(X[b], Z[b], rand[b], "fro").status for b in range(B)],
                                      dtype=STATUS_DTYPE)
  for name, t in trajs.items():
    norm = "nuc" if name == "KQ" else "fro"
    W = np.asarray(t["W"], np.float64)                                 # (B,S,d,d)
    s = np.asarray(t["attention"], np.float64)                         # (B,n,T)
    V = np.asarray(t["V"], np.float64)[:, -1] if "V" in t else v0
    sel = np.argmax(s, axis=-1)
    finite = np.asarray(t["finite"], bool)
    res = [None] * B
    for b, r in zip(np.flatnonzero(finite), svm_lib.att_svm_many([(X[b], Z[b], sel[b], norm) for b in np.flatnonzero(finite)])):
      res[b] = r
    status = np.array([r.status if r is not None else "diverged" for r in res], dtype=STATUS_DTYPE)
    W_mm = np.stack([r.W if r is not None and r.ok else np.full((d, d), np.nan) for r in res])
    out[f"W_final_{name}"] = W[:, -1]
    out[f"v_final_{name}"] = V
    out[f"attention_{name}"] = s
    out[f"selected_{name}"] = sel
    out[f"svm_{name}_status"] = status
    out[f"selected_opt_{name}"] = np.mean(sel == opt, axis=1)     # share of sequences where GD picked opt
    out[f"corr_{name}"] = metrics.corr(W, W_mm[:, None])
    out[f"max_prob_{name}"] = s.max(axis=-1).mean(axis=-1)
    out[f"above_tau_{name}"] = (s >= tau_H).sum(axis=-1).mean(axis=-1)
    out[f"several_{name}"] = ((s >= tau_H).sum(axis=-1) > 1).mean(axis=-1)   # fraction of sequences
    acc, held = np.full(B, np.nan), np.full(B, np.nan)
    for b in range(B):
      if finite[b]:
        f, _ = predict(W[b, -1], V[b], X[b], Z[b])
        acc[b] = np.mean(np.sign(f) == Y[b])
        ft, _ = predict(W[b, -1], V[b], Xt, Zt)
        held[b] = np.mean(np.sign(ft) == Yt)
    out[f"train_acc_{name}"], out[f"test_acc_{name}"] = acc, held
    health.add(out, name, t, SATURATION)
    if name == "W":
      # the discard rule of E5 (intermediate probabilities, no vanishing token) is recorded, but the
      # Gen-SVM objects are solved for every run (the rule is how E5 keeps clean runs, not a failure)
      reasons = [gensvm.discard_reason(s[b], tau_L, tau_H) if finite[b] else "diverged" for b in range(B)]
      gen = [gensvm.gen_svm(X[b], Z[b], s[b], W[b, -1], tau_L, tau_H, apply_discard=False) if finite[b] else None
             for b in range(B)]
      out["gensvm_status"] = np.array([
          "diverged" if g is None else g.status if g.status != "optimal" or not r else r.split(":")[0]
          for g, r in zip(gen, reasons)], dtype=STATUS_DTYPE)
      W_eq = np.stack([g.W_svmeq if g is not None and g.ok else np.full((d, d), np.nan) for g in gen])
      out["corr_svmeq_W"] = metrics.corr(W[:, -1], W_eq)
  return out


_stats = metrics.finite_stats


def reduce(fl: dict, cells: list) -> tuple[dict, dict]:
  """(results.npz arrays: per cell n the per-run arrays with the key suffix _n<n>, and the
  per-n tables; summary: per n and parameterization the feasibility, correlations, sparsity,
  accuracies, and where Att-SVM stops being feasible against n(T-1) = d^2)."""
  fl = resolve(fl)
  cfgs = configs(fl)
  first = cfgs[0][1]
  arrays = {"steps": train_lib.config_snapshot_steps(first),
            "n_values": np.asarray(fl.n_values)}
  per_n = {}
  T = d = None
  for n, cell in zip(fl.n_values, cells):
    for k, a in cell.items():
      arrays[f"{k}_n{n}"] = a
    row = {}
    for p, _ in cfgs:
      W = cell[f"W_final_{p}"]
      T = cell[f"attention_{p}"].shape[-1]
      d = W.shape[-1]
      feasible = cell[f"svm_{p}_status"] == "optimal"
      entry = {"feasible_fraction": float(np.mean(feasible)),
               "opt_feasible_fraction": float(np.mean(cell["svm_opt_status"] == "optimal")),
               "random_feasible_fraction": float(np.mean(cell["svm_random_status"] == "optimal")),
               "selected_opt": _stats(cell[f"selected_opt_{p}"]),
               "corr_svm_final": _stats(cell[f"corr_{p}"][feasible, -1]),
               "max_prob": _stats(cell[f"max_prob_{p}"]),
               "tokens_above_tau": _stats(cell[f"above_tau_{p}"]),
               "sequences_on_several_tokens": _stats(cell[f"several_{p}"]),
               "train_acc": _stats(cell[f"train_acc_{p}"]),
               "test_acc": _stats(cell[f"test_acc_{p}"]),
               "diverged": int(np.sum(cell[f"svm_{p}_status"] == "diverged"))}
      if p == "W":
        st = cell["gensvm_status"]
        entry["gensvm"] = {str(k): int(np.sum(st == k)) for k in np.unique(st)}
        entry["corr_svmeq_final"] = _stats(cell["corr_svmeq_W"])
      row[p] = entry
    per_n[str(n)] = {"constraints": int(n * (T - 1)), "unknowns": int(d * d), **row}
  transition = {}
  for p, _ in cfgs:
    infeasible_n = [int(n) for n in fl.n_values if per_n[str(n)][p]["feasible_fraction"] < 0.5]
    opt_infeasible = [int(n) for n in fl.n_values if per_n[str(n)][p]["opt_feasible_fraction"] < 0.5]
    rand_infeasible = [int(n) for n in fl.n_values if per_n[str(n)][p]["random_feasible_fraction"] < 0.5]
    transition[p] = {"first_n_mostly_infeasible": infeasible_n[0] if infeasible_n else None,
                     "first_n_opt_mostly_infeasible": opt_infeasible[0] if opt_infeasible else None,
                     "first_n_random_mostly_infeasible": rand_infeasible[0] if rand_infeasible else None,
                     "n_at_counting_bound": (d * d) / (T - 1)}
  summary = {"experiment": "E13 real data", "dataset": fl.dataset, "classes": fl.classes,
             "patch": fl.patch, "pos": fl.pos, "query": fl.query,
             "head": fl.head, "T": T, "d": d, "numerics": fl.numerics,
             "per_n": per_n, "transition": transition,
             "health": health.summary(arrays),               # {<P>_n<n>: counts}
             "saturation_threshold": SATURATION}
  summary["checks"] = checks(fl, per_n, cfgs)
  return arrays, summary


def checks(fl: dict, per_n: dict, cfgs) -> list:
  """Where Att-SVM(alpha) is feasible at the smallest n, GD's direction approaches it (the
  synthetic prediction: mean final corr > 0.95)."""
  out = []
  n0 = str(fl.n_values[0])
  for p, _ in cfgs:
    c = per_n[n0][p]["corr_svm_final"]
    m = None if c is None else c["mean"]
    out.append({"name": f"{p}, n={n0}: mean final corr(W, Att-SVM) where feasible", "value": m,
                "expected": "> 0.95 (as on synthetic data)", "ok": m is not None and m > 0.95})
  return out


def report(summary: dict, fl: dict) -> list[str]:
  """The terminal lines of a finished run (the checks follow)."""
  lines = [f"E13 real data: {summary['dataset']} classes {summary['classes']}, patch {summary['patch']} "
           f"(T={summary['T']}, d={summary['d']}, pos {summary['pos']}, query {summary['query']}, head {summary['head']})",
           "     n  n(T-1)  d^2  P   feasible  (at opt) (random)  corr(Att-SVM)  corr(SVMeq)  max prob  >1 token  train  held-out"]
  f = lambda d, k="mean": "   -  " if d is None else f"{d[k]:.4f}"  # noqa: E731
  for n, row in summary["per_n"].items():
    for p, e in row.items():
      if not isinstance(e, dict):
        continue
      lines.append(f"  {int(n):>4}  {row['constraints']:>6}  {row['unknowns']:>4} {p:<3} {e['feasible_fraction']:>8.2f}  {e['opt_feasible_fraction']:>8.2f} {e['random_feasible_fraction']:>8.2f}"
                   f"  {f(e['corr_svm_final']):>13}  {f(e.get('corr_svmeq_final')):>11}  {f(e['max_prob']):>8}"
                   f"  {f(e['sequences_on_several_tokens']):>8}  {f(e['train_acc']):>5}  {f(e['test_acc']):>8}")
  for p, t in summary["transition"].items():
    lines.append(f"  {p}: Att-SVM at GD's selection mostly infeasible from n = {t['first_n_mostly_infeasible']}, at the "
                 f"optimal tokens from n = {t['first_n_opt_mostly_infeasible']}, at random tokens from n = "
                 f"{t['first_n_random_mostly_infeasible']}; counting bound n(T-1) = d^2 at "
                 f"n = {t['n_at_counting_bound']:.1f}")
  return lines


def export(fl: dict, study: pipeline.Study) -> None:
  """--export=PREFIX: each n's data sets to PREFIX_n<n>.npz (the --data format of the other experiments)."""
  if not fl.export:
    return
  for cell in study.cells:
    batch = study.load(cell, np.arange(cell.runs))
    path = f"{fl.export}_n{cell.label['n']}.npz"
    data_lib.save_npz(path, data_lib.Dataset(batch["X"], batch["Y"], batch["Z"], batch["v"]))
    print(f"exported {cell.runs} data sets with n={cell.label['n']} to {path}")


def key_numbers(summary: dict) -> list:
  """Mean final corr(W, Att-SVM) at each n (where solved)."""
  out = []
  for n, row in sorted((summary.get("per_n") or {}).items(), key=lambda item: int(item[0])):
    corr = (row.get("W") or {}).get("corr_svm_final") if isinstance(row, dict) else None
    if corr is not None and corr.get("mean") is not None:
      out.append((f"mean corr(W, Att-SVM), n={int(n)}", corr["mean"]))
  return out


def _classes(text):
  try:
    images_lib.parse_classes(text)
  except ValueError:
    return "must be a,b (two class labels, e.g. 0,1) or a,rest"
  return None


def _n_values(values):
  if values is None:
    return None
  try:
    ns = [int(v) for v in values]
  except (TypeError, ValueError):
    ns = []
  return None if ns and min(ns) >= 1 and len(set(ns)) == len(ns) else "must list distinct positive integers, e.g. 4,16,64"


def _taus(v):
  return None if 0 < v["tau_L"] < v["tau_H"] < 1 else "need 0 < tau_L < tau_H < 1"


def _fashion_installed(v):
  """Fashion-MNIST's directory must exist (what ``data.images.load_images`` reads), named before anything runs."""
  if v["dataset"] != "fashion_mnist":
    return None
  root = os.path.abspath(v["data_dir"] or images_lib.FASHION_DIR)
  if os.path.isdir(root):
    return None
  return (f"--dataset=fashion_mnist: Fashion-MNIST not found in {root}: the package is not installed; install "
          f"Debian's package with `{images_lib.FASHION_INSTALL}` (see BUILD.md), or name its directory with --data_dir")


def _minibatch_limit(v):
  """(the smallest n of --n_values or of the dataset's default n_values, named)."""
  if v["n_values"]:
    return min(v["n_values"]), f"--n_values' smallest n={min(v['n_values'])}"
  n = min(DEFAULTS[v["dataset"]]["n_values"])
  return n, f"--n_values' smallest n={n} (the default of --dataset={v['dataset']})"


SETTINGS = (common.base(runs=20, data=False, precision=False, saturation=False) + F.Settings((
    F.Int("runs", 20, "Data sets (random subsets of n images) per n.", lower=1),
    F.Int("seed", 0, "Seed: the train/held-out split and every subset.", check=allowed.seed),
    F.Bool("compilation_cache", True, "Keep compiled XLA programs on disk.", operational=True, sweepable=False),
)) + common.pipeline(batch_size=1000) + common.numerics() + F.Settings((
    F.Enum("dataset", "digits", ["digits", "fashion_mnist"], "Image data: digits (scikit-learn, bundled) or "
           "fashion_mnist (Debian's dataset-fashion-mnist)."),
    F.Str("data_dir", None, "fashion_mnist: the directory of its IDX files (default: Debian's "
          "/usr/share/datasets/fashion-mnist)."),
    F.Str("classes", "0,1", "A class pair a,b (+1 for a, -1 for b) or a,rest (one class against the rest).",
          check=_classes),
    F.Int("patch", None, "Patch size p: tokens of p*p pixels (default 2 for digits, 7 for fashion_mnist).", lower=1),
    F.Enum("pos", "onehot", ["none", "onehot", "sincos"], "Positional encoding: none, onehot (a scaled one-hot "
           "of the position appended), sincos (2-D sinusoids added)."),
    F.Float("pos_scale", 1.0, "Scale of the positional encoding before unit normalization.",
            check=lambda v: None if v > 0 else "must be positive"),
    F.Enum("query", "mean", ["mean", "cls"], "mean: cross-attention with the mean token as query; cls: "
           "self-attention from a fixed [CLS] token."),
    F.Enum("head", "fit", list(HEADS), "fit: logistic regression on the mean-pooled tokens, fixed; "
           "fixed: their class-mean difference; joint: trained with the attention from fit."),
    F.List("n_values", None, "Sequences (images) per data set (default 2,4,8,16,32,64,128,240 for digits, "
           "4,16,64,256,1024 for fashion_mnist).", item=int, check=_n_values),
    F.Float("test_fraction", 0.3, "Share of the class pair's images held out (accuracy).",
            check=lambda v: None if 0 < v < 1 else "must be in (0, 1)"),
    F.Int("test_size", 1000, "At most this many held-out images are scored.", lower=1),
    F.List("params", ("W",), "Parameterizations: W (Frobenius Att-SVM, Gen-SVM), KQ (nuclear Att-SVM).",
           check=allowed.params),
    F.Int("steps", 2000, "Normalized-GD steps.", lower=0),
    F.Float("lr", 0.1, "Step size.", check=allowed.positive),
    F.Enum("init", "uniform", ["uniform", "normal", "zero"], "Initialization of W (K,Q)."),
    F.Float("tau_H", 1e-3, "A token is selected when its final probability is >= tau_H (Gen-SVM)."),
    F.Float("tau_L", 1e-6, "Gen-SVM's lower threshold."),
    F.Int("snapshot_every", 20, "Record W every this many steps.", lower=1),
    F.Int("chunk_steps", 1000, "Steps per jitted chunk; a checkpoint is saved after each.", lower=1),
    F.Int("block_size", 16, "Data sets per vectorized block.", lower=1),
    F.Str("export", None, "Also write each n's data sets to PREFIX_n<n>.npz (the --data format).",
          operational=True, sweepable=False),
), (F.Rule(("tau_L", "tau_H"), _taus), common.block_fits_batch(default=16),
    F.Rule(("dataset", "data_dir"), _fashion_installed)))
    + minibatch.settings(("n_values", "dataset"), _minibatch_limit))

EXPERIMENT = registry.Experiment(
    id="E13", name=NAME, title="Real data: digits 0 vs 1 as patch-token sequences, across n",
    cost_s=285,
    claim="On real images as patch tokens, does attention head for the Att-SVM at small n, and where does "
          "the Gen-SVM take over as n grows?",
    beyond=True, settings=SETTINGS, quick={"runs": 5, "n_values": [2, 8, 32, 128]},
    key_numbers=key_numbers, figures=figures.draw, report=report, prepare=export)
