"""E17: benign overfitting of token selection under label noise (docs/science.md section 21).

The data model of Sakamoto & Sato 2024 (``data.label_noise``): a relevant token carrying the
class signal s e_1 or s e_2, two weakly relevant tokens, Gaussian noise tokens, a share eta of the
training labels flipped. The prompt p of f(X) = sum_t softmax(X p)_t nu^T x_t trains from p = 0
by full-batch gradient descent on the logistic loss, with the head nu fixed (the public code's
model with W = I). A grid of cells over the signal norm s and the sequences n, many data sets per
cell where the public code ran one.

Per data set and snapshot: train accuracy on the labels training saw (flipped ones included), the
share of flipped labels fitted, accuracy on the clean labels of the training sequences, test
accuracy and loss on ``test_n`` clean sequences drawn from the run's own test key (regenerated
here, never stored: at the paper's d = 2000 a test set is 128 MB), and the alignment of p with e_1
and e_2. At the end: the attention on the relevant token (the ground truth) of clean and of
flipped sequences, and whether it is their largest. The max-margin interpolator as a predictor:
the prompt Att-SVM at the tokens GD selected, in the limit of a large norm (all attention on the
token that maximizes x^T p_svm), scored on the same sequences.

``fl`` below is a dict of the experiment's settings (``SETTINGS``), or the "flags" of its
summary.json: replay rebuilds the same study from it.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from svmattn import registry
from svmattn.analysis import health
from svmattn.analysis import predictions
from svmattn.config import allowed
from svmattn.config import common
from svmattn.config import fields as F
from svmattn.data import datasets as data_lib
from svmattn.data import label_noise
from svmattn.execution import pipeline
from svmattn.execution import stages
from svmattn.execution import sweep as sweep_lib
from svmattn.figures import benign_overfitting as figures
from svmattn.svm import joint as joint_lib
from svmattn.train import loop as train_lib

NAME = "benign_overfitting"
BENIGN = 0.9          # "generalizes": mean final test accuracy at least this (and fits: flipped fitted share)
MAGEN_EXPONENT = -0.5  # Magen et al. 2024: the SNR threshold scales as n^(-1/2)
EXPONENT_TOLERANCE = 0.25
PROJECTED = 100        # test sequences whose selected token is kept for the projection figure


def config(fl: dict) -> train_lib.TrainConfig:
  fl = F.Values(fl)
  return train_lib.TrainConfig(param="p", model="prompt", train_head=False, optimizer=fl.optimizer, lr=fl.lr,
                               steps=fl.steps, snapshot_every=fl.snapshot_every, chunk_steps=fl.chunk_steps,
                               init=fl.init, init_scale=fl.init_scale, block_size=fl.block_size).validate()


FILE_EXTRAS = ("Y_clean", "flipped", "relevant_tokens")   # optional arrays of a --data file, (B, n) each


def labels(fl: dict) -> list[dict]:
  """The cells' labels: every (signal, n) of the grid, or with --data one cell {"signal": 0, "n": its n}."""
  fl = F.Values(fl)
  if fl.data:
    return [{"signal": 0.0, "n": int(data_lib.load_npz(fl.data).X.shape[1])}]
  return sweep_lib.grid({"signal": [float(s) for s in fl.signal_norms], "n": [int(n) for n in fl.n_values]})


def load_file(path: str) -> dict:
  """Another code's data sets (the engine's --data format: X, Y, Z, v, with X_test, Y_test, Z_test and
  optionally Y_clean, flipped, relevant_tokens (B, n)): {name: array}. Raises DataError."""
  data = data_lib.load_npz(path)
  test = data_lib.load_test_npz(path, data)
  if test is None:
    raise data_lib.DataError(f"{path}: E17 scores a test set: the file needs X_test, Y_test and Z_test")
  out = {**data._asdict(), **test}
  with np.load(path, allow_pickle=False) as f:
    extra = data_lib.npz_arrays(f, [k for k in FILE_EXTRAS if k in f.files], path)
  for k, a in extra.items():
    if a.shape != data.Y.shape:
      raise data_lib.DataError(f"{path}: {k} must have shape {data.Y.shape} (one value per training sequence), "
                               f"got {a.shape}")
  out["Y_clean"] = np.asarray(extra.get("Y_clean", data.Y), np.float64)
  out["flipped"] = np.asarray(extra.get("flipped", out["Y_clean"] != data.Y), bool)
  out["relevant_tokens"] = np.asarray(extra.get("relevant_tokens", np.full(data.Y.shape, -1)), np.int64)
  return out


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  cfg = config(fl)
  file = load_file(fl.data) if fl.data else None

  def load(cell, runs):
    if file is not None:
      return {k: v[np.asarray(runs)] for k, v in file.items()}
    lab = cell.label
    return label_noise.train(fl.seed, runs, int(lab["n"]), fl.T, fl.d, float(lab["signal"]), fl.rho, fl.eta)

  runs = file["X"].shape[0] if file is not None else int(fl.runs)
  if file is not None and file["X"].shape[2:] != (fl.T, fl.d):
    raise ValueError(f"--data: its sequences have T, d = {file['X'].shape[2:]}; pass --T and --d to match")
  cells = tuple(pipeline.Cell(label, runs) for label in labels(fl))
  analysis = functools.partial(analyze, seed=fl.seed, test_n=fl.test_n, T=fl.T, d=fl.d, rho=fl.rho,
                               saturation=fl.saturation)
  return pipeline.Study(NAME, cells, load, lambda cell: (stages.Train("p", cfg),), analysis, fl.batch_size,
                        fl.seed, identity if identity is not None else fl)


def _share(mask: np.ndarray, values: np.ndarray) -> float:
  """mean of values over mask (NaN where the mask is empty)."""
  return float(np.mean(values[mask])) if np.any(mask) else float("nan")


def analyze(label: dict, data: dict, trajs: dict, seed: int = 0, test_n: int = 1000, T: int = 8, d: int = 2000,
            rho: float = 0.1, saturation: float = health.SATURATION) -> dict:
  X, Y, clean, v = (np.asarray(data[k], np.float64) for k in ("X", "Y", "Y_clean", "v"))
  flipped, relevant = np.asarray(data["flipped"], bool), np.asarray(data["relevant_tokens"])
  runs = np.asarray(data["runs"])
  t = trajs["p"]
  P = np.asarray(t["W"], np.float64)                                      # (B, S, d)
  B, n = Y.shape
  S = P.shape[1]
  signal = float(label["signal"])
  out = {"runs": runs, "flips": flipped.sum(axis=1)}
  health.add(out, "p", t, saturation)
  keys = ("train_acc", "clean_train_acc", "fitted_flipped", "test_acc", "test_loss", "align_e1", "align_e2")
  curves = {k: np.full((B, S), np.nan) for k in keys}
  finals = {k: np.full(B, np.nan) for k in ("attn_relevant_clean", "attn_relevant_flipped", "selects_relevant_clean",
                                            "selects_relevant_flipped", "svm_train_acc", "svm_fitted_flipped",
                                            "svm_test_acc", "svm_align_e1", "svm_align_e2")}
  status = []
  attention = np.full((B, 2, T), np.nan)                                  # a clean and a flipped sequence, final
  shown = min(PROJECTED, test_n if "X_test" not in data else np.asarray(data["X_test"]).shape[1])
  projected = np.full((B, n, 2), np.nan)           # the selected token's (mu_-1, mu_+1)-coordinates, training
  projected_test = np.full((B, shown, 2), np.nan)  # and of the first test sequences
  labels_test = np.full((B, shown), np.nan)
  for b in range(B):
    f, s = predictions.prompt(P[b], v[b], X[b])                           # (S, n), (S, n, T)
    fit = Y[b] * f > 0
    curves["train_acc"][b] = fit.mean(axis=1)
    curves["clean_train_acc"][b] = predictions.accuracy(f, clean[b])
    if flipped[b].any():
      curves["fitted_flipped"][b] = fit[:, flipped[b]].mean(axis=1)
    if "X_test" in data:                      # a --data file's own test set
      Xt, yt = np.asarray(data["X_test"][b], np.float64), np.asarray(data["Y_test"][b], np.float64)
    else:
      Xt, yt = label_noise.test(seed, int(runs[b]), test_n, T, d, signal, rho)
    ft, _ = predictions.prompt(P[b], v[b], Xt)
    curves["test_acc"][b] = predictions.accuracy(ft, yt)
    curves["test_loss"][b] = predictions.logistic_loss(ft, yt)
    norm = np.linalg.norm(P[b], axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
      curves["align_e1"][b], curves["align_e2"][b] = P[b, :, 0] / norm, P[b, :, 1] / norm
    final = s[-1]                                                         # (n, T)
    chosen = X[b, np.arange(n), np.argmax(final, axis=1)]                  # (n, d)
    projected[b] = chosen[:, [1, 0]]
    _, st = predictions.prompt(P[b, -1:], v[b], Xt[:shown])
    projected_test[b] = Xt[np.arange(shown), np.argmax(st[0], axis=1)][:, [1, 0]]
    labels_test[b] = yt[:shown]
    known = relevant[b] >= 0                   # (a --data file without relevant_tokens: -1, unknown)
    on = np.where(known, np.take_along_axis(final, np.maximum(relevant[b], 0)[:, None], axis=1)[:, 0], np.nan)
    top = np.where(known, np.argmax(final, axis=1) == relevant[b], np.nan)
    finals["attn_relevant_clean"][b], finals["attn_relevant_flipped"][b] = _share(~flipped[b], on), _share(flipped[b], on)
    finals["selects_relevant_clean"][b] = _share(~flipped[b], top)
    finals["selects_relevant_flipped"][b] = _share(flipped[b], top)
    for k, mask in enumerate((~flipped[b], flipped[b])):
      if mask.any():
        attention[b, k] = final[np.flatnonzero(mask)[0]]
    # the max-margin interpolator: the prompt Att-SVM at GD's final selection, in its large-norm limit
    r = joint_lib.relaxed_att_svm(X[b], np.zeros((n, d)), np.argmax(final, axis=1), np.ones(n, bool), "fro",
                                  prompt=True)
    status.append(r.status)
    if r.ok:
      fs, _ = predictions.hard_attention(r.w, v[b], X[b])
      finals["svm_train_acc"][b] = predictions.accuracy(fs, Y[b])
      if flipped[b].any():
        finals["svm_fitted_flipped"][b] = predictions.accuracy(fs[flipped[b]], Y[b][flipped[b]])
      finals["svm_test_acc"][b] = predictions.accuracy(predictions.hard_attention(r.w, v[b], Xt)[0], yt)
      w = r.w / np.linalg.norm(r.w)
      finals["svm_align_e1"][b], finals["svm_align_e2"][b] = w[0], w[1]
  out.update(curves)
  out.update(finals)
  out["svm_status"] = np.array(status, dtype="<U12")
  out["attention_examples"] = attention
  out["selected_projection"], out["test_projection"], out["test_labels_shown"] = projected, projected_test, labels_test
  out["p_final"] = P[:, -1]
  out["train_labels"] = Y
  out["loss"] = np.asarray(t["loss"], np.float64)
  out["steps"] = np.tile(np.asarray(t["steps"]), (B, 1))
  return out


def _mean(a) -> float | None:
  a = np.asarray(a, np.float64)
  a = a[np.isfinite(a)]
  return float(np.mean(a)) if a.size else None


def threshold(signals: list, test_acc: list, level: float = BENIGN) -> float | None:
  """The signal norm at which the mean final test accuracy first reaches ``level`` (linear
  interpolation between grid points); None where it never does, or already does at the smallest."""
  for k in range(1, len(signals)):
    a, b = test_acc[k - 1], test_acc[k]
    if a is not None and b is not None and a < level <= b:
      return float(signals[k - 1] + (level - a) * (signals[k] - signals[k - 1]) / (b - a))
  return None


def reduce(fl: dict, cells: list) -> tuple[dict, dict]:
  fl = F.Values(fl)
  arrays, rows = {}, []
  for label, a in zip(labels(fl), cells):
    tag = f"s{label['signal']:g}_n{label['n']}"
    for k, v in a.items():
      arrays[f"{k}_{tag}"] = v
    row = {"signal": label["signal"], "n": label["n"], "snr": label["signal"] / math.sqrt(fl.d),
           "data_sets": int(len(a["runs"])), "svm_solved": int(np.sum(a["svm_status"] == "optimal")),
           "health": health.counts(a["health_p"])}
    for k in ("train_acc", "clean_train_acc", "fitted_flipped", "test_acc", "test_loss", "align_e1", "align_e2"):
      row[k] = _mean(a[k][:, -1])
    for k in ("attn_relevant_clean", "attn_relevant_flipped", "selects_relevant_clean", "selects_relevant_flipped",
              "svm_train_acc", "svm_fitted_flipped", "svm_test_acc", "svm_align_e1", "svm_align_e2"):
      row[k] = _mean(a[k])
    row["test_acc_curve"] = [_mean(c) for c in a["test_acc"].T]
    row["train_acc_curve"] = [_mean(c) for c in a["train_acc"].T]
    row["steps"] = [int(s) for s in a["steps"][0]] if len(a["steps"]) else []
    rows.append(row)
  thresholds = {}
  for n in ([] if fl.data else fl.n_values):
    mine = [r for r in rows if r["n"] == int(n)]
    thresholds[str(int(n))] = threshold([r["signal"] for r in mine], [r["test_acc"] for r in mine])
  summary = {"experiment": "E17 benign overfitting", "T": fl.T, "d": fl.d, "rho": fl.rho, "eta": fl.eta,
             "test_n": fl.test_n, "cells": rows, "thresholds": thresholds,
             "threshold_exponent": exponent(thresholds),
             # Sakamoto & Sato's Figure 1: harmful below SNR ~ d^(-1/4), not overfitting above SNR ~ n^(-1/2), with
             # SNR = s / sqrt(d): in signal norms, s = d^(1/4) and s = sqrt(d / n) (orders, no constants)
             "sakamoto_harmful_below": fl.d ** 0.25,
             "sakamoto_not_overfitting_above": {str(int(n)): math.sqrt(fl.d / int(n)) for n in fl.n_values}}
  summary["checks"] = [] if fl.data else checks(fl, rows, summary["threshold_exponent"])
  if fl.data:
    summary["data"], summary["test_n"] = fl.data, "the file's"
  return arrays, summary


def exponent(thresholds: dict) -> float | None:
  """The least-squares slope of log threshold against log n, where at least two n have one."""
  pts = [(math.log(int(n)), math.log(s)) for n, s in thresholds.items() if s is not None and s > 0]
  if len(pts) < 2:
    return None
  x, y = np.array(pts).T
  return float(np.polyfit(x, y, 1)[0])


def checks(fl: dict, rows: list, slope: float | None) -> list:
  """The papers' claims (section 21), with thresholds fixed before any run: at the largest signal
  norm GD fits the flipped labels by attending to other tokens than the relevant one and still
  generalizes (>= 0.9 of flipped labels fitted, test accuracy >= 0.9, at most half of the flipped
  sequences attend most to the relevant token); at the smallest it does not generalize (test
  accuracy < 0.9); the threshold between them scales as n^(-1/2) (Magen et al.) within 0.25."""
  out = []
  signals = sorted({r["signal"] for r in rows})
  for n in fl.n_values:
    mine = {r["signal"]: r for r in rows if r["n"] == int(n)}
    hi, lo = mine[signals[-1]], mine[signals[0]]
    if len(signals) > 1 and None not in (hi["fitted_flipped"], hi["test_acc"], hi["selects_relevant_flipped"]):
      ok = hi["fitted_flipped"] >= BENIGN and hi["test_acc"] >= BENIGN and hi["selects_relevant_flipped"] <= 0.5
      out.append({"name": f"n={n}, s={signals[-1]:g}: fits the flipped labels through other tokens and generalizes",
                  "value": f"flipped fitted {hi['fitted_flipped']:.3f}, test acc {hi['test_acc']:.3f}, flipped on "
                           f"the relevant token {hi['selects_relevant_flipped']:.3f}",
                  "expected": f"fitted >= {BENIGN}, test acc >= {BENIGN}, on the relevant token <= 0.5 "
                              "(benign overfitting)", "ok": bool(ok)})
    if len(signals) > 1 and lo["test_acc"] is not None:
      out.append({"name": f"n={n}, s={signals[0]:g}: does not generalize", "value": lo["test_acc"],
                  "expected": f"test acc < {BENIGN}", "ok": bool(lo["test_acc"] < BENIGN)})
  if len(fl.n_values) > 1:
    if slope is None:
      out.append({"name": "SNR threshold against n", "value": None, "expected": "slope -0.5 (Magen et al.)",
                  "ok": None, "reason": "fewer than two n with a threshold inside the grid of signal norms"})
    else:
      out.append({"name": "SNR threshold against n: slope of log threshold on log n", "value": slope,
                  "expected": f"{MAGEN_EXPONENT} +- {EXPONENT_TOLERANCE} (Magen et al.: threshold ~ n^-1/2)",
                  "ok": bool(abs(slope - MAGEN_EXPONENT) <= EXPONENT_TOLERANCE)})
  return out


def report(summary: dict, fl: dict) -> list[str]:
  lines = [f"E17 benign overfitting: T={summary['T']} d={summary['d']} rho={summary['rho']} eta={summary['eta']}, "
           f"{summary['test_n']} test sequences per data set",
           f"  {'s':>6} {'n':>4} {'train':>6} {'flipped':>8} {'test':>6} {'on rel.':>8} {'flip rel.':>9} "
           f"{'svm test':>9}"]

  def fmt(x):
    return "     -" if x is None else f"{x:6.3f}"

  for r in summary["cells"]:
    lines.append(f"  {r['signal']:6g} {r['n']:4d} {fmt(r['train_acc'])} {fmt(r['fitted_flipped']):>8} "
                 f"{fmt(r['test_acc'])} {fmt(r['selects_relevant_clean']):>8} {fmt(r['selects_relevant_flipped']):>9} "
                 f"{fmt(r['svm_test_acc']):>9}")
  th = ", ".join(f"n={n}: {'-' if s is None else f'{s:.3g}'}" for n, s in summary["thresholds"].items())
  lines.append(f"  signal norm where test acc reaches {BENIGN}: {th} (Sakamoto & Sato's order d^(1/4) = "
               f"{summary['sakamoto_harmful_below']:.3g})")
  return lines


def key_numbers(summary: dict) -> list:
  out = []
  for r in summary.get("cells") or []:
    if r is (summary.get("cells") or [None])[-1] and r.get("test_acc") is not None:
      out.append((f"test acc at s={r['signal']:g}, n={r['n']}", r["test_acc"]))
  for n, s in (summary.get("thresholds") or {}).items():
    if s is not None:
      out.append((f"threshold signal norm, n={n}", s))
  return out


def _ascending(values):
  message = allowed.float_list(minimum=0.0)(values)
  if message is None and [float(v) for v in values] != sorted(float(v) for v in values):
    message = "must be in ascending order (the threshold is read along it)"
  return message


SETTINGS = (common.base(runs=3, data=False, precision=False) + F.Settings((
    F.Int("runs", 3, "Data sets per cell (signal norm, n).", lower=1),
    F.List("signal_norms", (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0), "Signal norms s, ascending (the public "
           "code's multirun: 5, 10, ..., 100; the default spans it on a log scale and goes below it).",
           item=float, check=_ascending),
    F.List("n_values", (10, 20, 40), "Training sequences per data set (the public code: 20).", item=int,
           check=allowed.int_list(minimum=1)),
    F.Int("T", 8, "Tokens per sequence (0: relevant, 1 and 2: weakly relevant, the rest noise).", lower=3),
    F.Int("d", 2000, "Embedding dimension.", lower=2),
    F.Float("rho", 0.1, "Weight of the weakly relevant tokens' signal.", lower=0.0),
    F.Float("eta", 0.2, "Share of training labels flipped (ceil(eta n) of them).", lower=0.0, upper=1.0),
    F.Int("test_n", 1000, "Clean test sequences per data set (drawn from the run's own key).", lower=1),
    F.Float("lr", 5e-3, "Step size (the public code's).", check=allowed.positive),
    F.Str("optimizer", "gd", "gd (the public code's SGD, full batch), normalized_gd, or an optax optimizer name.",
          check=allowed.optimizer),
    F.Int("steps", 1000, "Gradient steps.", lower=0),
    F.Int("snapshot_every", 50, "Score the model every this many steps.", lower=1),
    F.Int("chunk_steps", 500, "Steps per jitted chunk; a checkpoint is saved after each.", lower=1),
    F.Enum("init", "zero", ["zero", "uniform", "normal"], "Initialization of p (the public code: zero)."),
    common.init_scale_field(),
    F.Str("data", None, "Another code's data sets instead of the generator (the engine's --data format X, Y, Z, v "
          "with X_test, Y_test, Z_test, and optionally Y_clean, flipped, relevant_tokens (B, n)): one cell, "
          "reported without checks; with --init=zero and that code's --optimizer and --lr, p_final sits beside "
          "its parameters.", check=allowed.existing_file),
    F.Int("block_size", 4, "Data sets per vectorized block (a batch is padded to a multiple of it; results are "
          "bit-identical for a fixed block size). The prompt model trains by autodiff, so padding costs steps.",
          lower=1),
), (common.block_fits_batch(default=4),)) + common.pipeline(batch_size=64))

EXPERIMENT = registry.Experiment(
    id="E17", name=NAME, title="Benign overfitting of token selection under label noise",
    cost_s=240,
    claim="With a share of labels flipped, does gradient descent on the prompt fit the flipped labels by "
          "attending to noise tokens and still generalize at high SNR, fail to at low SNR, and where is the "
          "threshold (Sakamoto & Sato 2024; Magen et al. 2024)?",
    beyond=True, settings=SETTINGS,
    quick={"runs": 2, "d": 200, "test_n": 200, "signal_norms": [1.0, 3.0, 10.0, 30.0], "n_values": [10, 40]},
    key_numbers=key_numbers, figures=figures.draw, report=report, calibrated_for=("runs",))
