"""E19: class imbalance in next-token prediction (docs/science.md section 24), as a study.

Data: E12's next-token data sets (``data.next_token``) with Zipf labels, pi_k proportional to 1/k
(``TokenSpec(labels="zipf")``). Model: E12's global setting (the last token queries all T
positions; loss -log of the label's attention mass). Stages: one training per entry NAME:LR of
``optimizers`` (gradient descent, sign descent, normalized GD and
Adam, each with and without momentum by default: gd, gd+mom0.9, sign_gd, signum0.9,
normalized_gd, normalized_gd+mom0.9, rmsprop (Adam without its first moment), adam).

Host analysis per run and optimizer O:
  bucket_loss_O (B,S,NB)  the mean loss of the sequences whose label falls in each frequency bucket
                          (label rank k = 1..K in bucket floor(log2 k)), at each snapshot
  t_half_O (B,NB)         the first snapshot step at which a bucket's loss is at most half its loss at
                          step 0 (NaN: not within the run)
  decay_O (B,)            the slope of log t_half against log(1/pi) over the buckets reached (the
                          bucket's pi: the mean frequency of its labels); Kunstner et al.'s analysis
                          of a linear model: 1 under gradient descent (the time to fit class k grows
                          like 1/pi_k), 0 under sign descent
  loss_O, max_prob_O (B,S), health
The per-sequence losses come from the model's own function (``models.attention.next_token_log_mass``).
"""
from __future__ import annotations

import functools
import warnings

import numpy as np

from svmattn import registry
from svmattn.analysis import health
from svmattn.analysis import metrics
from svmattn.config import allowed
from svmattn.config import common
from svmattn.config import fields as F
from svmattn.data import datasets as data_lib
from svmattn.data import next_token as next_token_data
from svmattn.execution import pipeline
from svmattn.execution import stages
from svmattn.figures import imbalance as figures
from svmattn.models import attention
from svmattn.studies import optimizer_rates
from svmattn.train import loop as train_lib

NAME = "imbalance"
OPTIMIZERS = ("gd:2", "gd+mom0.9:2", "sign_gd:0.005", "signum0.9:0.005", "normalized_gd:0.05",
              "normalized_gd+mom0.9:0.05", "rmsprop:0.005", "adam:0.005")
FIT = 0.5          # a bucket is fitted when its loss is at most this fraction of its loss at step 0
SATURATION = 0.0   # (E12's: a spread softmax over a label's repeated positions is not a run in progress)
# Kunstner et al. 2024 (arXiv 2402.19449), their linear model: the exponent of 1/pi_k in the time to fit class k
PREDICTED_DECAY = {"gd": 1.0, "sign_gd": 0.0}


def buckets(K: int) -> np.ndarray:
  """(K,) the frequency bucket of each token id: label rank k = id + 1 in bucket floor(log2 k)."""
  return np.floor(np.log2(np.arange(1, K + 1))).astype(np.int64)


def bucket_pi(K: int) -> np.ndarray:
  """(NB,) the mean Zipf frequency of each bucket's labels."""
  b, pi = buckets(K), next_token_data.zipf(K)
  return np.array([pi[b == j].mean() for j in range(b.max() + 1)])


def configs(fl: dict) -> tuple:
  """((stage name, optimizer, TrainConfig), ...) of the ``optimizers`` entries NAME or NAME:LR (E16's)."""
  out = []
  for entry in fl.optimizers:
    name, opt, lr = optimizer_rates.parse_entry(entry, fl.lr)
    out.append((name, opt, train_lib.TrainConfig(
        param="W", model="next_token", optimizer=opt, lr=lr, steps=fl.steps, snapshot_every=fl.snapshot_every,
        chunk_steps=fl.chunk_steps, init="uniform", block_size=fl.block_size, numerics=fl.numerics).validate()))
  return tuple(out)


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  cfgs = configs(fl)
  spec = next_token_data.TokenSpec(fl.K, fl.d, fl.n, fl.T, require_cycle=False, labels="zipf").validate()

  def load(cell, runs):
    tokens = next_token_data.generate(spec, fl.seed, runs)
    ds = next_token_data.to_dataset(tokens)
    return {**{f: np.asarray(a) for f, a in ds._asdict().items()},
            **{f: np.asarray(a) for f, a in tokens._asdict().items()}}

  return pipeline.Study(NAME, (pipeline.Cell({}, int(fl.runs)),), load,
                        lambda cell: tuple(stages.Train(name, c) for name, _, c in cfgs),
                        functools.partial(analyze, steps=train_lib.config_snapshot_steps(cfgs[0][2])),
                        fl.batch_size, fl.seed, identity if identity is not None else fl)


_PROGRAM = []


def sequence_losses(W: np.ndarray, X: np.ndarray, Y: np.ndarray, Z: np.ndarray) -> np.ndarray:
  """(S, n) the loss -log(label's attention mass) of every sequence at every snapshot W (S,d,d):
  the model's own log mass, vmapped over the snapshots (one jitted program per shape)."""
  import jax
  if not _PROGRAM:
    def losses(W, X, Y, Z):
      one = data_lib.Dataset(X, Y, Z, None)
      return -jax.vmap(lambda w: attention.next_token_log_mass(w, one)[0])(W)
    _PROGRAM.append(jax.jit(losses))
  return np.asarray(_PROGRAM[0](W, X, Y, Z))


def fit_times(bucket_loss: np.ndarray, steps: np.ndarray) -> np.ndarray:
  """(NB,) the first snapshot step at which each bucket's loss is at most FIT times its step-0 loss."""
  reached = bucket_loss <= FIT * bucket_loss[:1]
  first = np.argmax(reached, axis=0)
  return np.where(reached.any(axis=0), steps[first].astype(np.float64), np.nan)


def decay(t_half: np.ndarray, pi: np.ndarray) -> float:
  """The least-squares slope of log t_half against log(1/pi) over the buckets fitted after step 0
  (NaN with fewer than 3 such buckets)."""
  ok = np.isfinite(t_half) & (t_half > 0)
  if ok.sum() < 3:
    return np.nan
  return float(np.polyfit(np.log(1 / pi[ok]), np.log(t_half[ok]), 1)[0])


def analyze(label: dict, data: dict, trajs: dict, steps=None) -> dict:
  X, Y, Z, labels = (np.asarray(data[k]) for k in ("X", "Y", "Z", "labels"))
  B, K = labels.shape[0], data["E"].shape[1]
  of, pi = buckets(K), bucket_pi(K)
  out = {"runs": np.asarray(data["runs"]), "labels": labels}
  for name, t in trajs.items():
    W = np.asarray(t["W"], np.float64)                                  # (B,S,d,d)
    S, NB = W.shape[1], len(pi)
    steps = np.arange(S) if steps is None else np.asarray(steps)
    bucket_loss = np.full((B, S, NB), np.nan)
    for b in range(B):
      L = sequence_losses(W[b], X[b], Y[b], Z[b])                        # (S, n)
      for j in range(NB):
        rows = of[labels[b]] == j
        if rows.any():
          bucket_loss[b, :, j] = L[:, rows].mean(axis=1)
    t_half = np.stack([fit_times(bucket_loss[b], steps) for b in range(B)])
    out[f"bucket_loss_{name}"] = bucket_loss
    out[f"t_half_{name}"] = t_half
    out[f"decay_{name}"] = np.array([decay(t_half[b], pi) for b in range(B)])
    out[f"loss_{name}"] = t["loss"]
    out[f"max_prob_{name}"] = t["max_prob"]
    out[f"finite_{name}"] = t["finite"]
    health.add(out, name, t, SATURATION)
  return out


def reduce(fl: dict, arrays: dict) -> tuple[dict, dict]:
  fl = F.Values(fl)
  cfgs = configs(fl)
  steps = train_lib.config_snapshot_steps(cfgs[0][2])
  arrays = {**arrays, "steps": steps, "bucket_pi": bucket_pi(fl.K)}
  rows = {}
  for name, opt, c in cfgs:
    with np.errstate(all="ignore"), warnings.catch_warnings():
      warnings.simplefilter("ignore", RuntimeWarning)     # (a bucket no data set fitted: its median is NaN)
      rows[name] = {"decay": metrics.finite_stats(arrays[f"decay_{name}"]),
                    "t_half_median": [None if not np.isfinite(v) else float(v)
                                      for v in np.nanmedian(arrays[f"t_half_{name}"], axis=0)],
                    "final_bucket_loss": [float(v) for v in np.nanmedian(arrays[f"bucket_loss_{name}"][:, -1], axis=0)],
                    "optimizer": opt, "lr": float(c.lr),
                    "final_loss": metrics.finite_stats(arrays[f"loss_{name}"][:, -1]),
                    "diverged": int(np.sum(~arrays[f"finite_{name}"]))}
  summary = {"experiment": "E19 class imbalance", "numerics": fl.numerics, "data_sets": len(arrays["runs"]),
             "bucket_pi": bucket_pi(fl.K).tolist(), "fit_fraction": FIT, "optimizers": rows,
             "health": health.summary(arrays),
             "saturation_threshold": SATURATION}
  summary["checks"] = checks(rows)
  return arrays, summary


def checks(rows: dict) -> list:
  """Kunstner et al.'s analysis, carried to attention: the median decay of GD near 1 (within 0.5),
  that of sign descent near 0 (within 0.5), and GD's above sign descent's; each only where both
  optimizers were trained ("runs" tagged: not evaluated when most runs diverged or stalled)."""
  out = []
  stage = {r["optimizer"]: name for name, r in reversed(list(rows.items()))}     # (the first entry of each)
  med = {o: (rows[name]["decay"] or {}).get("median") for o, name in stage.items()}
  unmeasured = "fewer than 3 buckets halved their loss within the run in every data set: no decay to measure"
  for o, want in PREDICTED_DECAY.items():
    if o in med:
      m = med[o]
      out.append({"name": f"{o}: median decay of the time to fit a bucket with 1/pi", "value": m,
                  "expected": f"{want:g} +- 0.5 (Kunstner et al. 2024's linear model)",
                  "ok": None if m is None else abs(m - want) <= 0.5, "runs": [stage[o]],
                  **({"reason": unmeasured} if m is None else {})})
  if all(o in med for o in PREDICTED_DECAY):
    a, b = med["gd"], med["sign_gd"]
    both = a is not None and b is not None
    out.append({"name": "rare classes: GD's decay above sign descent's", "value": a - b if both else None,
                "expected": "> 0", "ok": a > b if both else None, "runs": [stage["gd"], stage["sign_gd"]],
                **({} if both else {"reason": unmeasured})})
  return out


def report(summary: dict, fl: dict) -> list[str]:
  pi = summary["bucket_pi"]
  lines = [f"E19 class imbalance: {summary['data_sets']} data sets, buckets of 1/pi "
           + ", ".join(f"{1 / p:.0f}" for p in pi) + "; time to halve each bucket's loss (median steps)"]
  for o, r in summary["optimizers"].items():
    d = r["decay"]
    t = ", ".join("-" if v is None else f"{v:.0f}" for v in r["t_half_median"])
    lines.append(f"  {o:<22} t_half [{t}]  decay " + ("-" if d is None else f"{d['median']:.2f}")
                 + f"  final loss per bucket [{', '.join(f'{v:.3f}' for v in r['final_bucket_loss'])}]")
  return lines


def key_numbers(summary: dict) -> list:
  """The median decay (exponent of 1/pi in the time to fit a bucket) of every optimizer."""
  return [(f"{o}: decay", None if r.get("decay") is None else r["decay"]["median"])
          for o, r in (summary.get("optimizers") or {}).items()]


SETTINGS = (common.base(runs=10, data=False, precision=False, saturation=False) + common.pipeline(batch_size=1000)
            + common.numerics() + F.Settings((
                F.Int("K", 16, "Vocabulary size (labels pi_k proportional to 1/k).", lower=4),
                F.Int("d", 32, "Embedding dimension.", lower=1),
                F.Int("n", 128, "Sequences per data set.", lower=1),
                F.Int("T", 4, "Tokens per sequence (distinct; T <= K).", lower=2),
                F.List("optimizers", OPTIMIZERS, "Optimizer entries NAME or NAME:LR (E16's syntax; a training "
                       "each).", check=optimizer_rates._known_entries),
                F.Float("lr", 0.01, "Step size of the entries without their own.", check=allowed.positive),
                F.Int("steps", 3000, "Steps.", lower=1),
                F.Int("snapshot_every", 20, "Record W every this many steps.", lower=1),
                F.Int("chunk_steps", 1000, "Steps per jitted chunk; a checkpoint is saved after each.", lower=1),
                F.Int("block_size", 64, "Data sets per vectorized block.", lower=1),
            ), (F.Rule(("K", "T"), lambda v: None if v["T"] <= v["K"] else "T distinct tokens per sequence need T <= K"),
                common.block_fits_batch())))

EXPERIMENT = registry.Experiment(
    id="E19", name=NAME, title="Class imbalance in next-token prediction: rare labels under GD and sign descent",
    cost_s=150,
    claim="With Zipf-distributed labels, is GD slow on rare labels while sign descent and Adam are not (Kunstner, "
          "Yadav, Milligan, Schmidt, Bietti 2024), in next-token attention?",
    beyond=True, settings=SETTINGS, quick={"runs": 2, "optimizers": ("gd:2", "sign_gd:0.005", "adam:0.005")},
    key_numbers=key_numbers, figures=figures.draw, report=report, one_cell=True)
