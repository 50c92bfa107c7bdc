"""absl binaries, one per experiment: ``python -m experiments.NAME --help``."""
