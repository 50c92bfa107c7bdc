"""The studies of the experiments: one module per experiment, each a ``study.pipeline.Study``
built from the binary's flag values, its per-batch host analysis and its reduction.

    from svmattn import studies
    module = studies.get("overparam")          # svmattn.studies.overparam
    study = module.build(flag_values)          # what `experiments.overparam` runs

``build(flags)`` rebuilds a run's study from the "flags" of its summary.json alone, which is
what ``experiments.replay`` does for any single run of any study.
"""
from __future__ import annotations

import importlib
import json
import os

from svmattn.study import pipeline
from svmattn.study import replay
from svmattn.study import runner

NAMES = ("paths_2d", "local_convergence", "svm_rank", "overparam", "multi_token", "lambda_head", "reg_path",
         "seq_causal", "feasibility", "optimizer_geometry", "joint_training", "next_token", "real_data", "multi_head", "two_layer")
EXPERIMENT = {"paths_2d": "E1", "local_convergence": "E2", "svm_rank": "E3", "overparam": "E4",
              "multi_token": "E5", "lambda_head": "E6", "reg_path": "E7", "seq_causal": "E8", "feasibility": "E9",
              "optimizer_geometry": "E10", "joint_training": "E11", "next_token": "E12", "real_data": "E13", "multi_head": "E14",
              "two_layer": "E15"}


def get(name: str):
  """The study module ``name`` (one of ``NAMES``)."""
  if name not in NAMES:
    raise ValueError(f"unknown study {name!r}; known: {', '.join(NAMES)}")
  return importlib.import_module(f"svmattn.studies.{name}")


def rebuild(out: str) -> tuple[pipeline.Study, str]:
  """(the study of the run in ``out``, the file it was read from): finished or partial run."""
  for path in (runner.record_path(out), os.path.join(out, "work", "run.json")):
    if os.path.exists(path):
      try:
        with open(path) as f:
          saved = json.load(f)
        name, flags = saved["study"], saved["identity"]
      except (OSError, ValueError, KeyError, TypeError) as e:
        raise replay.ReplayError(f"{path}: unreadable run description ({e})") from None
      try:
        return get(name).build(dict(flags)), path
      except (ValueError, OSError) as e:
        raise replay.ReplayError(f"{path}: cannot rebuild study {name!r} ({e})") from None
  raise replay.ReplayError(f"{out} holds no study run (neither runs/study.json nor work/run.json)")
