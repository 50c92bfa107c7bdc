"""Settings as code: typed fields per experiment, config files, flags and sweeps.

    from svmattn.config import defaults
    config = defaults("E2")        # an ml_collections ConfigDict of every E2 setting at its default
"""
from svmattn import registry


def defaults(experiment: str):
  """The ConfigDict of every default of ``experiment`` (an id like "E2" or a name)."""
  return registry.get(experiment).config()
