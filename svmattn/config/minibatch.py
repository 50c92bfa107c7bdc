"""--minibatch and --sampling (``common.minibatch_fields``) for a study whose data sets' size is not
simply the field --n, or that takes a --data file:

    SETTINGS = ... + minibatch.settings()                                   # --n, unknown with --data
    SETTINGS = ... + minibatch.settings(("n_values",), lambda v: (min(v["n_values"]), "..."))
    minibatch.check_loaded(fl, file_data.X.shape[1])                       # in build, once loaded

The rule refuses a --minibatch larger than the sequences of a data set (of its smallest cell) in
one line naming the flag; the flags it reads are listed in the rule, so the binary's flag
validator sees them all (a --data file's n is checked by ``check_loaded`` when it is loaded).
"""
from __future__ import annotations

from typing import Callable

from svmattn.config import common
from svmattn.config import fields as F


def _n_unless_data(v: dict):
  return None if v.get("data") else (v["n"], f"--n={v['n']}")


def settings(names: tuple[str, ...] = ("n", "data"),
             limit: Callable[[dict], "tuple[int, str] | None"] = _n_unless_data) -> F.Settings:
  """--minibatch --sampling with the rule --minibatch <= limit(values)[0]; ``limit`` reads the flags
  ``names`` and returns (the smallest number of sequences of a data set, how the message names it),
  or None where it is known only once the data are loaded. Default: --n, unless --data."""
  def check(v):
    got = limit(v)
    if got is None or v["minibatch"] <= got[0]:
      return None
    return f"--minibatch={v['minibatch']} exceeds {got[1]}: a step draws at most the n sequences of a data set"
  return F.Settings(common.minibatch_fields().fields, (F.Rule(("minibatch",) + tuple(names), check),))


def check_loaded(fl: dict, n: int, where: str = "--data") -> None:
  """ValueError (one line) when fl["minibatch"] exceeds the n sequences of each loaded data set."""
  if fl.minibatch > n:
    raise ValueError(f"--minibatch={fl.minibatch} exceeds the n={n} sequences of each data set of {where}")
