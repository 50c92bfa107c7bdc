"""absl binaries, one per experiment: ``python -m experiments.NAME --help``.

Importing this package installs the programs' interrupt handler (``svmattn.interrupts``) before
the binary imports JAX: only the binaries import it.
"""
from svmattn import interrupts

interrupts.install()
