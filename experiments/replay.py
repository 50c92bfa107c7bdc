r"""Replay one data set of any study alone, and check it against the run's own record.

    python -m experiments.replay --out=DIR --run=I                 # = svmattn replay --out=DIR --run=I
    python -m experiments.replay --out=DIR --cell=n=5,d=3 --run=I  # a cell by its label (or its index)

The command lives in svmattn.execution.replay_command.
"""
from svmattn.execution import replay_command

if __name__ == "__main__":
  replay_command.run()
