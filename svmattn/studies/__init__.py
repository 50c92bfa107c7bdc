"""The studies of the experiments: one module per experiment, each declaring its settings and its
registry entry (``EXPERIMENT``, see ``svmattn.registry``) next to the study they build: a
``study.pipeline.Study`` from the settings, its per-batch host analysis and its reduction.

    from svmattn import studies
    module = studies.get("overparam")          # svmattn.studies.overparam (or "E4")
    study = module.build(settings)             # what `svmattn E4` runs

``study.replay.rebuild(OUT)`` rebuilds a run's study (a sweep's too) from its record alone, which
is what replay does for any single data set of any study.
"""
from __future__ import annotations

from svmattn import registry


def get(name: str):
  """The study module of experiment ``name`` (an id like E4 or a name like overparam)."""
  return registry.get(name).study_module()
