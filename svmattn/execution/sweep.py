"""A sweep: the studies of every combination of settings, run as the cells of one study.

    study = sweep.combine("local_convergence", [({"lr": 0.01, "d": 4}, study_1), ...], identity)

Cell k of combination j is labelled {**combination j, **its own label}: the swept settings are part of
each data set's identity, so ``pipeline.run`` resumes a sweep cell by cell, shares the cells out across
hosts and shows one progress display, and ``replay`` finds any cell by its settings. Each combination's
load, stages and analysis are its own study's; the data set r of a cell is the one the combination's
study alone would draw (same seed, same index), so every cell's per-run arrays equal those of a run
with its settings alone.
"""
from __future__ import annotations

import dataclasses
import functools
import json

from svmattn.execution import pipeline


def key(combination: dict) -> str:
  return json.dumps(combination, sort_keys=True)


@dataclasses.dataclass(frozen=True)
class Seeded:
  """A stage run with its own study's seed (a sweep over the seed)."""
  stage: object
  seed: int

  @property
  def name(self):
    return self.stage.name

  @property
  def steps(self):
    return self.stage.steps

  def run(self, batch, runs, seed, progress, checkpoints):
    return self.stage.run(batch, runs, self.seed, progress, checkpoints)


def _split(label: dict, swept: tuple[str, ...]) -> tuple[str, dict]:
  combination = {k: label[k] for k in swept}
  return key(combination), {k: v for k, v in label.items() if k not in swept}


def _analyze(label, data, arrays, swept=(), analyzers=None):
  # module-level (it runs in the SVM worker processes)
  k, own = _split(label, swept)
  return analyzers[k](own, data, arrays)


def _enough(label, arrays, swept=(), enough=None):
  k, own = _split(label, swept)
  return enough[k](own, arrays) if enough.get(k) else False


class SweepError(ValueError):
  pass


def combine(name: str, parts: list[tuple[dict, pipeline.Study]], identity: dict) -> pipeline.Study:
  """One study whose cells are those of every part, each labelled with its part's settings."""
  swept = tuple(parts[0][0])
  cells, owner = [], {}
  for combination, study in parts:
    for cell in study.cells:
      clash = set(combination) & set(cell.label)
      if clash:
        raise SweepError(f"config.sweep.{sorted(clash)[0]}: the experiment varies it in its own grid already; "
                         "set its own list setting instead")
      label = {**combination, **cell.label}
      cells.append(pipeline.Cell(label, cell.runs))
      owner[key(label)] = (study, cell)
  first = parts[0][1]
  for _, study in parts:
    if study.batch_size != first.batch_size:
      raise SweepError("config.sweep: every combination must have the same batch_size")

  def load(cell, runs):
    study, own = owner[key(cell.label)]
    return study.load(own, runs)

  def stages(cell):
    study, own = owner[key(cell.label)]
    found = study.stages(own)
    return found if study.seed == first.seed else tuple(Seeded(s, study.seed) for s in found)

  analyzers = {key(c): s.analyze for c, s in parts}
  enough = {key(c): s.enough for c, s in parts}
  return pipeline.Study(name, tuple(cells), load, stages,
                        functools.partial(_analyze, swept=swept, analyzers=analyzers),
                        first.batch_size, first.seed, identity,
                        functools.partial(_enough, swept=swept, enough=enough) if any(enough.values()) else None,
                        grow=first.grow)


def cells_of(study: pipeline.Study, combination: dict) -> list[int]:
  """The indices of the cells of one combination, in order."""
  return [i for i, c in enumerate(study.cells) if all(c.label.get(k) == v for k, v in combination.items())]


def grid(sweep: dict) -> list[dict]:
  """Every combination of a sweep {name: [values]}: the product, the first name varying slowest."""
  names = list(sweep)
  combos = [{}]
  for name in names:
    combos = [{**c, name: v} for c in combos for v in sweep[name]]
  return combos

