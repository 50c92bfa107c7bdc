"""Every experiment, declared once next to its study.

A study module of ``svmattn.studies`` (or any module a config names) holds

    EXPERIMENT = registry.Experiment(
        id="E2", name="local_convergence", title="Local convergence of normalized GD (W and (K,Q))",
        claim="...", settings=SETTINGS, quick={"runs": 30},
        key_numbers=(("corr(W, W^mm)", "final_corr.W_vs_fro.mean"),))

and ``registry.experiments()`` finds it: ``svmattn list``, the command's aliases (``svmattn E2``),
``svmattn reproduce`` and the report's summary and contents are built from these entries. A new
experiment is its study module (plus its test, and its figures if it draws its own): nothing
central is edited.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pkgutil
from typing import Any, Callable

from svmattn.config import fields as F


@dataclasses.dataclass(frozen=True)
class Variant:
  """The same experiment with other settings, run and reported apart (e.g. the authors' numerics)."""
  name: str                 # "authors": its directory is <experiment>_<name>, its key E2-authors
  title: str
  settings: dict            # {field: value}
  cost_s: float | None = None   # its wall like Experiment.cost_s (None: the experiment's)


@dataclasses.dataclass(frozen=True)
class Experiment:
  id: str                   # "E2"
  name: str                 # "local_convergence": the study module, the binary and the command
  title: str
  settings: F.Settings
  claim: str = ""           # the paper's claim it checks, or (beyond) the question it asks
  beyond: bool = False      # a question after the paper (its own part of the report)
  quick: dict = dataclasses.field(default_factory=dict)    # small settings: reproduce --quick, tests
  variants: tuple[Variant, ...] = ()
  key_numbers: Any = ()     # ((label, dotted path of a summary.json field), ...) or fn(summary) -> [(label, value)]
  figures: Callable | None = None      # draw(arrays, summary, out, flags, extras) -> None
  report: Callable | None = None       # report(summary, flags) -> lines for the terminal
  one_cell: bool = False               # reduce takes the one cell's arrays rather than the list of cells
  prepare: Callable | None = None      # prepare(flags, study): checks needing the built study (ConfigError)
  timing_names: dict | None = None     # the pipeline's timings under the experiment's own names
  cost_s: float = 0.0       # its wall at the paper's counts on a 2-core CPU beside another experiment (rounded
                            # seconds): reproduce starts the longest first, so the last to end are short
  calibrated_for: tuple[str, ...] = ("runs", "steps")   # the size settings whose defaults (the paper's
                            # counts) the checks' thresholds are calibrated at: see ``below_calibration``
  module: str = ""                     # filled in by ``experiments()``: where it is declared

  def config(self, **overrides):
    """The experiment's default config (ml_collections), with ``overrides``."""
    return self.settings.config(self.name, **overrides)

  def study_module(self):
    return importlib.import_module(self.module)

  def below_calibration(self, values: dict) -> str | None:
    """Where a run is smaller than the run size its checks were calibrated at, say so in words.

    The checks' thresholds (``>= 0.99`` and the like) are the paper's, for the paper's run size: the
    defaults of the fields named in ``calibrated_for``. For a run with fewer of any of them this returns,
    e.g., ``"calibrated for 100 runs and 2000 steps; this run has 20 runs and 500 steps"``, which every
    check line of that run carries (its ``note`` in summary.json); ``None`` at or above that size.
    """
    defaults = self.settings.defaults()
    paper, this = [], []
    for name in self.calibrated_for:
      want, got = defaults.get(name), values.get(name)
      if isinstance(want, int) and isinstance(got, int) and not isinstance(want, bool) and got < want:
        paper.append(f"{want} {name}")
        this.append(f"{got} {name}")
    if not paper:
      return None
    return f"calibrated for {' and '.join(paper)}; this run has {' and '.join(this)}"


class UnknownExperiment(ValueError):
  pass


# The package whose modules declare the experiments, found by name: the study modules import the
# registry (for ``Experiment``), so the registry imports them only when asked, as it does a user's.
STUDIES = "svmattn.studies"


def _modules():
  package = importlib.import_module(STUDIES)
  for m in pkgutil.iter_modules(package.__path__):
    yield f"{STUDIES}.{m.name}"


def experiments() -> list[Experiment]:
  """Every experiment of ``svmattn.studies``, in id order (E1, E2, ..., E10, ...)."""
  found = [_load(name) for name in _modules()]
  found = [e for e in found if e is not None]
  return sorted(found, key=lambda e: (_id_number(e.id), e.id))


def _id_number(eid: str) -> int:
  digits = "".join(ch for ch in eid if ch.isdigit())
  return int(digits) if digits else 10 ** 6


def _load(module_name: str) -> Experiment | None:
  module = importlib.import_module(module_name)
  exp = getattr(module, "EXPERIMENT", None)
  if exp is None:
    return None
  return dataclasses.replace(exp, module=module_name)


def get(name: str) -> Experiment:
  """An experiment by id (E2), name (local_convergence, or local-convergence) or module path
  (my_study or mypackage.my_study: a module on the Python path holding an EXPERIMENT of its own).

  Raises ``UnknownExperiment`` (one line naming the known ones) for anything else."""
  key = str(name).strip()
  module = key.replace("-", "_")
  if module.isidentifier():          # a name: import that study alone (not every study's module)
    if importlib.util.find_spec(f"{STUDIES}.{module}") is not None:
      found = _load(f"{STUDIES}.{module}")
      if found is not None and found.name == module:
        return found
  every = experiments()
  for e in every:
    if key in (e.id, e.name, e.name.replace("_", "-")) or key.upper() == e.id:
      return e
  if "." in key or (module.isidentifier() and _importable(key)):
    try:
      found = _load(key)
    except ImportError as err:
      raise UnknownExperiment(f"unknown experiment {name!r}: cannot import {key} ({err})") from None
    if found is not None:
      return found
  raise UnknownExperiment(f"unknown experiment {name!r}; known: "
                          + ", ".join(f"{e.id}={e.name}" for e in every))


def _importable(name: str) -> bool:
  """Whether ``name`` is a module on the path (a study module of the user's, outside the package)."""
  try:
    return importlib.util.find_spec(name) is not None
  except (ImportError, ValueError):
    return False


def lookup(summary: dict, path: str) -> Any:
  """The value at a dotted ``path`` of a summary (None where it is absent)."""
  value = summary
  for part in path.split("."):
    if isinstance(value, dict) and part in value:
      value = value[part]
    else:
      return None
  return value


def key_numbers(summary: dict, experiment: Experiment) -> list[tuple[str, Any]]:
  """[(label, value)] of an experiment's key numbers read from its summary; a number the run did not
  compute (a parameterization or SVM not asked for: its value None) is left out."""
  if callable(experiment.key_numbers):
    pairs = experiment.key_numbers(summary)
  else:
    pairs = [(label, lookup(summary, path)) for label, path in experiment.key_numbers]
  return [(label, value) for label, value in pairs if value is not None]


def of_summary(summary: dict) -> Experiment | None:
  """The experiment a summary.json belongs to (by its "config"/"flags" experiment, else its title)."""
  name = (summary.get("config") or {}).get("experiment") or summary.get("name")
  if name:
    try:
      return get(name)
    except UnknownExperiment:
      pass
  title = str(summary.get("experiment", ""))
  head = title.split(" ", 1)[0]
  try:
    return get(head)
  except UnknownExperiment:
    return None
