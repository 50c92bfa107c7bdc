"""Settings as code: typed fields per experiment, config files, flags and sweeps.

    from svmattn.config import defaults
    config = defaults("E2")        # an ml_collections ConfigDict of every E2 setting at its default
"""
from svmattn.config.config_file import defaults  # noqa: F401  (svmattn.config.defaults("E2"))
