"""Is the token normalized GD selects already decided at initialization? (a question beyond the paper)

On E2's data sets and training (``studies.local_convergence``), for every sequence: the token with
the largest attention at step 0 (softmax(X_i W(0) z_i), W = K Q^T for (K,Q)), the token selected at
the end, and the optimal token (largest score). Per run: the share of sequences whose final token
is the one leading at initialization, and the share whose final token is optimal. No theorem
predicts the first; chance is 1/T. Written after the move to configs, as one file plus its test.
"""
from __future__ import annotations

import functools

import numpy as np

from svmattn import registry
from svmattn.analysis import metrics
from svmattn.config import fields as F
from svmattn.studies import local_convergence
from svmattn.execution import pipeline


def build(fl: dict, identity: dict | None = None) -> pipeline.Study:
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  spec, configs = local_convergence.setup(fl.replace(norms=None))
  load = local_convergence.batches(spec, fl.seed)
  return pipeline.Study("selection_at_init", (pipeline.Cell({}, int(fl.runs)),), lambda cell, runs: load(runs),
                        lambda cell: tuple(local_convergence.train_stage(p, c, fl) for p, c in configs),
                        functools.partial(analyze, params=tuple(fl.params)), fl.batch_size, fl.seed,
                        identity if identity is not None else fl)


def analyze(label: dict, data: dict, trajs: dict, params=("W", "KQ")) -> dict:
  """Per run and parameterization: share of sequences whose final token leads at step 0, and is optimal."""
  X, Z = np.asarray(data["X"], np.float64), np.asarray(data["Z"], np.float64)
  optimal = metrics.optimal_tokens(data["gamma"])                          # (B, n)
  out = {"runs": data["runs"]}
  for p in params:
    W0 = np.asarray(trajs[p]["W"][:, 0], np.float64)                       # (B, d, d)
    logits0 = np.einsum("bntd,bnd->bnt", X, np.einsum("bnd,bed->bne", Z, W0))
    first = np.argmax(logits0, axis=-1)
    final = np.asarray(trajs[p]["selected"])
    out[f"decided_at_init_{p}"] = np.mean(final == first, axis=-1)
    out[f"optimal_{p}"] = np.mean(final == optimal, axis=-1)
  return out


def reduce(fl: dict, arrays: dict) -> tuple[dict, dict]:
  fl = F.Values(fl)              # (any mapping of the settings, e.g. a summary's flags)
  T = int(fl.T)
  summary = {"experiment": "selection at initialization", "data_sets": int(len(arrays["runs"])),
             "chance": 1.0 / T, "params": {}, "checks": []}
  for p in fl.params:
    summary["params"][p] = {"decided_at_init": float(np.mean(arrays[f"decided_at_init_{p}"])),
                            "optimal": float(np.mean(arrays[f"optimal_{p}"]))}
  return arrays, summary


def report(summary: dict, fl: dict) -> list[str]:
  lines = [f"selection at initialization: {summary['data_sets']} data sets (chance {summary['chance']:.3f})"]
  for p, v in summary["params"].items():
    lines.append(f"  {p:<3} final token = leading token at step 0: {v['decided_at_init']:.3f}; "
                 f"= optimal token: {v['optimal']:.3f}")
  return lines


SETTINGS = local_convergence.SHARED + F.Settings((F.Int("runs", 100, "Number of random data sets.", lower=1),))

EXPERIMENT = registry.Experiment(
    id="Q1", name="selection_at_init", title="Is the selected token decided at initialization?",
    cost_s=2,
    claim="Does normalized GD end on the token that leads the attention at step 0, or does training change "
          "the selection (and how often does it end on the optimal token)?",
    beyond=True, settings=SETTINGS, quick={"runs": 30, "params": ["W"]}, one_cell=True, report=report,
    key_numbers=(("W: final = leading at init", "params.W.decided_at_init"),
                 ("KQ: final = leading at init", "params.KQ.decided_at_init"),
                 ("W: final = optimal", "params.W.optimal")))
