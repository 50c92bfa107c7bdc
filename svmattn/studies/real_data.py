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
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from svmattn import rng
from svmattn.analysis import health
from svmattn.analysis import metrics
from svmattn.data import images as images_lib
from svmattn.study import pipeline
from svmattn.study import stages
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


def pool(fl: dict):
  """(tokens X (N,T,D), queries Z (N,D), labels y (N,), image index (N,) into the dataset, train
  rows, test rows) of the class pair, from the flag values."""
  images, labels = images_lib.load_images(fl["dataset"], root=fl.get("data_dir") or None)
  index, y = images_lib.class_labels(labels, images_lib.parse_classes(fl["classes"]))
  tokens = images_lib.patch_tokens(images[index], fl["patch"], fl.get("pos", "onehot"), fl.get("pos_scale", 1.0))
  X, Z = images_lib.with_query(tokens, fl.get("query", "mean"))
  train, test = images_lib.split_pool(len(index), fl.get("test_fraction", 0.3), fl["seed"])
  test = test[:fl.get("test_size", 1000)]
  return X, Z, y, index, train, test


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _subsets(seed: int, n: int, pool_size: int, runs: jax.Array) -> jax.Array:
  def one(r):
    key = jax.random.fold_in(rng.split_run_key(rng.run_key(seed, r))[0], n)
    return jax.random.permutation(key, pool_size)[:n]
  return jax.vmap(one)(runs)


def subsets(seed: int, n: int, runs: np.ndarray, pool_size: int) -> np.ndarray:
  """(B, n) positions in the training pool of the data sets ``runs`` of cell n: data set r of
  cell n is the first n of a permutation drawn from fold_in(data key of run_key(seed, r), n)."""
  return np.asarray(_subsets(int(seed), int(n), int(pool_size), jnp.asarray(np.asarray(runs, np.uint32)))).astype(np.int64)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _random_selections(seed: int, n: int, T: int, runs: jax.Array) -> jax.Array:
  def one(r):
    key = jax.random.fold_in(rng.split_run_key(rng.run_key(seed, r))[1], n)
    return jax.random.randint(key, (n,), 0, T)
  return jax.vmap(one)(runs)


def random_selections(seed: int, n: int, runs: np.ndarray, T: int) -> np.ndarray:
  """(B, n) a uniformly random token per sequence (from the init half of the run key): the
  selection whose Att-SVM shows the counting transition n(T-1) = d^2."""
  return np.asarray(_random_selections(int(seed), int(n), int(T), jnp.asarray(np.asarray(runs, np.uint32)))).astype(np.int64)


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
      param=p, lr=fl["lr"], steps=fl["steps"], snapshot_every=fl["snapshot_every"],
      chunk_steps=fl["chunk_steps"], block_size=fl.get("block_size", 64), init=fl.get("init", "uniform"),
      train_head=fl.get("head", "fit") == "joint", numerics=fl.get("numerics", "exact")).validate())
      for p in fl["params"])


def check(fl: dict, train_pool: int) -> None:
  if fl.get("head", "fit") not in HEADS:
    raise ValueError(f"head must be one of {HEADS}, got {fl.get('head')!r}")
  too_big = [n for n in fl["n_values"] if n > train_pool]
  if too_big:
    raise ValueError(f"n = {too_big} exceeds the {train_pool} training images of classes {fl['classes']} "
                     f"({fl['dataset']}, test_fraction {fl.get('test_fraction', 0.3)})")


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  ident = identity if identity is not None else fl
  X_all, Z_all, y_all, index, train, test = pool(fl)
  check(fl, len(train))
  cfgs = configs(fl)
  held = {"X_test": X_all[test], "Z_test": Z_all[test], "Y_test": y_all[test],
          "tau_H": np.asarray(fl.get("tau_H", gensvm.TAU_H)), "tau_L": np.asarray(fl.get("tau_L", gensvm.TAU_L))}

  def load(cell, runs):
    pos = train[subsets(fl["seed"], cell.label["n"], runs, len(train))]             # (B, n) rows of the pool
    X, Z, Y = X_all[pos], Z_all[pos], y_all[pos]
    v = np.stack([fit_head(X[b], Y[b], fl.get("head", "fit")) for b in range(len(runs))])
    alpha = random_selections(fl["seed"], cell.label["n"], runs, X.shape[2])
    return {"X": X, "Y": Y, "Z": Z, "v": v, "image": index[pos], "random_alpha": alpha, **held}

  cells = tuple(pipeline.Cell({"n": int(n)}, int(fl["runs"])) for n in fl["n_values"])
  return pipeline.Study(NAME, cells, load, lambda cell: tuple(stages.Train(p, c) for p, c in cfgs), analyze,
                        fl.get("batch_size", 1000), fl["seed"], ident)


def predict(W: np.ndarray, v: np.ndarray, X: np.ndarray, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(f (m,), s (m,T)) of one model on sequences X (m,T,d), Z (m,d) (NumPy, float64)."""
  logits = np.einsum("mtd,md->mt", X, Z @ W.T)
  logits = logits - logits.max(axis=-1, keepdims=True)
  s = np.exp(logits)
  s /= s.sum(axis=-1, keepdims=True)
  return np.einsum("mt,mtd->md", s, X) @ v, s


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
    res = [svm_lib.att_svm(X[b], Z[b], sel[b], norm) if finite[b] else None for b in range(B)]
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
  cfgs = configs(fl)
  first = cfgs[0][1]
  arrays = {"steps": train_lib.config_snapshot_steps(first),
            "n_values": np.asarray(fl["n_values"])}
  per_n = {}
  T = d = None
  for n, cell in zip(fl["n_values"], cells):
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
    infeasible_n = [int(n) for n in fl["n_values"] if per_n[str(n)][p]["feasible_fraction"] < 0.5]
    opt_infeasible = [int(n) for n in fl["n_values"] if per_n[str(n)][p]["opt_feasible_fraction"] < 0.5]
    rand_infeasible = [int(n) for n in fl["n_values"] if per_n[str(n)][p]["random_feasible_fraction"] < 0.5]
    transition[p] = {"first_n_mostly_infeasible": infeasible_n[0] if infeasible_n else None,
                     "first_n_opt_mostly_infeasible": opt_infeasible[0] if opt_infeasible else None,
                     "first_n_random_mostly_infeasible": rand_infeasible[0] if rand_infeasible else None,
                     "n_at_counting_bound": (d * d) / (T - 1)}
  summary = {"experiment": "E13 real data", "dataset": fl["dataset"], "classes": fl["classes"],
             "patch": fl["patch"], "pos": fl.get("pos", "onehot"), "query": fl.get("query", "mean"),
             "head": fl.get("head", "fit"), "T": T, "d": d, "numerics": fl.get("numerics", "exact"),
             "per_n": per_n, "transition": transition,
             "health": health.summary(arrays),               # {<P>_n<n>: counts}
             "saturation_threshold": SATURATION}
  summary["checks"] = checks(fl, per_n, cfgs)
  return arrays, summary


def checks(fl: dict, per_n: dict, cfgs) -> list:
  """Where Att-SVM(alpha) is feasible at the smallest n, GD's direction approaches it (the
  synthetic prediction: mean final corr > 0.95)."""
  out = []
  n0 = str(fl["n_values"][0])
  for p, _ in cfgs:
    c = per_n[n0][p]["corr_svm_final"]
    m = None if c is None else c["mean"]
    out.append({"name": f"{p}, n={n0}: mean final corr(W, Att-SVM) where feasible", "value": m,
                "expected": "> 0.95 (as on synthetic data)", "ok": m is not None and m > 0.95})
  return out
