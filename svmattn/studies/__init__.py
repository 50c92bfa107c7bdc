"""The studies of the experiments: one module per experiment, each declaring its settings and its
registry entry (``EXPERIMENT``, see ``svmattn.registry``) next to the study they build: a
``study.pipeline.Study`` from the settings, its per-batch host analysis and its reduction.

    from svmattn import studies
    module = studies.get("overparam")          # svmattn.studies.overparam (or "E4")
    study = module.build(settings)             # what `svmattn E4` runs

``rebuild(OUT)`` rebuilds a run's study (a sweep's too) from its record alone, which is what
replay does for any single data set of any study.
"""
from __future__ import annotations

import json
import os

from svmattn.study import pipeline
from svmattn.study import replay
from svmattn.train import native_kernel
from svmattn.study import runner


def get(name: str):
  """The study module of experiment ``name`` (an id like E4 or a name like overparam)."""
  from svmattn import registry
  return registry.get(name).study_module()


def rebuild(out: str) -> tuple[pipeline.Study, str]:
  """(the study of the run in ``out``, the file it was read from): finished or partial run."""
  from svmattn import registry
  from svmattn.config import fields as F
  from svmattn.study import execute
  for path in (runner.record_path(out), os.path.join(out, "work", "run.json")):
    if os.path.exists(path):
      try:
        with open(path) as f:
          saved = json.load(f)
        name, ident = saved["study"], dict(saved["identity"])
      except (OSError, ValueError, KeyError, TypeError) as e:
        raise replay.ReplayError(f"{path}: unreadable run description ({e})") from None
      try:
        experiment = registry.get(name)
        _same_kernel(saved, path)
        sweep = ident.pop("sweep", None)
        values = {**experiment.settings.defaults(), **ident}
        return execute.build_any(experiment, values, sweep, saved["identity"]), path
      except (ValueError, OSError, F.ConfigError) as e:
        raise replay.ReplayError(f"{path}: cannot rebuild study {name!r} ({e})") from None
  raise replay.ReplayError(f"{out} holds no study run (neither runs/study.json nor work/run.json)")


def _same_kernel(saved: dict, path: str) -> None:
  """A replay on another GD kernel than the run's would not give its bits: refuse it in one line."""
  ran, here = saved.get("gd_kernel"), native_kernel.kernel_name()
  if ran is not None and ran != here:
    why = native_kernel.why_not()
    raise replay.ReplayError(f"{path}: the run trained on the {ran} GD kernel, this process has the {here} one"
                             + (f" ({why})" if why else "") + ": replay it where the same kernel is available")
