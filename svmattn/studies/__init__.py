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

NAMES = ("paths_2d", "local_convergence", "svm_rank", "overparam", "multi_token", "lambda_head", "reg_path",
         "seq_causal", "feasibility")
EXPERIMENT = {"paths_2d": "E1", "local_convergence": "E2", "svm_rank": "E3", "overparam": "E4",
              "multi_token": "E5", "lambda_head": "E6", "reg_path": "E7", "seq_causal": "E8", "feasibility": "E9"}


def get(name: str):
  """The study module ``name`` (one of ``NAMES``)."""
  if name not in NAMES:
    raise ValueError(f"unknown study {name!r}; known: {', '.join(NAMES)}")
  return importlib.import_module(f"svmattn.studies.{name}")
