"""The ``svmattn`` program's start: the interrupt handler first (``interrupts``), then the engine.

    svmattn ...                  # setup.cfg's console script: svmattn.launch:main
    python -m svmattn ...        # svmattn/__main__.py (also each experiment reproduce forks)
"""
from svmattn import interrupts

interrupts.install()            # before JAX is imported: Ctrl-C is one line at any moment

from svmattn import cli  # noqa: E402
from svmattn.execution import workers  # noqa: E402


def main() -> None:
  interrupts.install()                 # (a fork of reproduce starts from Python's default handlers)
  workers.die_with_parent_from_env()   # started by reproduce: end with it, even if it is killed
  cli.main()
