"""Replay one data set of any study alone and compare it with the run's own record.

    study, source = replay.rebuild(OUT)             # from OUT/runs/study.json or OUT/work/run.json
    data, stage_arrays, result = replay.run_one(study, cell, run)
    report = replay.compare(result, replay.reference(OUT, study, cell, run))

A data set is rebuilt from the study's seed, its cell and its run index (``study.load``),
run through the cell's stages alone (a training stage trains it in a block of its block
size, copies of itself, so its arithmetic is the batch's) and analyzed alone; the per-run
arrays are then the batch's bit for bit. The reference is the finished run's per-run record
(OUT/runs/cell_CCCC.npz) or, for a partial run, its analyzed batch in OUT/work.
"""
from __future__ import annotations

import json
import os

import numpy as np

from svmattn import registry
from svmattn.config import fields as F
from svmattn.io import atomic_files as results_io
from svmattn.io import checkpoint as ckpt_lib
from svmattn.execution import run_experiment
from svmattn.execution import pipeline
from svmattn.execution import study_runner
from svmattn.execution import stages
from svmattn.train import loop as train_lib
from svmattn.train import native_kernel


class ReplayError(RuntimeError):
  """A run that cannot be replayed as asked, with the reason."""


def rebuild(out: str) -> tuple[pipeline.Study, str]:
  """(the study of the run in ``out``, the file it was read from): finished or partial run."""
  for path in (study_runner.record_path(out), os.path.join(out, "work", "run.json")):
    if os.path.exists(path):
      try:
        with open(path) as f:
          saved = json.load(f)
        name, ident = saved["study"], dict(saved["identity"])
      except (OSError, ValueError, KeyError, TypeError) as e:
        raise ReplayError(f"{path}: unreadable run description ({e})") from None
      try:
        experiment = registry.get(name)
        _same_kernel(saved, path)
        sweep = ident.pop("sweep", None)
        values = {**experiment.settings.defaults(), **ident}
        return run_experiment.build_any(experiment, values, sweep, saved["identity"]), path
      except (ValueError, OSError, F.ConfigError) as e:
        raise ReplayError(f"{path}: cannot rebuild study {name!r} ({e})") from None
  raise ReplayError(f"{out} holds no study run (neither runs/study.json nor work/run.json)")


def _same_kernel(saved: dict, path: str) -> None:
  """A replay on another GD kernel than the run's would not give its bits: refuse it in one line."""
  ran, here = saved.get("gd_kernel"), native_kernel.kernel_name()
  if ran is not None and ran != here:
    why = native_kernel.why_not()
    raise ReplayError(f"{path}: the run trained on the {ran} GD kernel, this process has the {here} one"
                      + (f" ({why})" if why else "") + ": replay it where the same kernel is available")


def find_cell(study: pipeline.Study, cell: str) -> int:
  """The index of a cell given as an index ("3") or a label ("n=5,d=3")."""
  if cell.strip().isdigit():
    c = int(cell)
    if c >= len(study.cells):
      raise ReplayError(f"--cell={cell}: the study has cells 0..{len(study.cells) - 1}")
    return c
  try:
    want = dict(item.split("=", 1) for item in cell.split(",") if item)
  except ValueError:
    raise ReplayError(f"--cell={cell!r}: expected an index or name=value pairs such as n=5,d=3") from None
  for c, x in enumerate(study.cells):
    if {k: str(v) for k, v in x.label.items()} == {k.strip(): v.strip() for k, v in want.items()}:
      return c
  raise ReplayError(f"--cell={cell!r}: no such cell; cells: "
                    + "; ".join(",".join(f"{k}={v}" for k, v in x.label.items()) or "(one cell)"
                                for x in study.cells[:12]))


def check_run(study: pipeline.Study, c: int, run: int) -> None:
  if not 0 <= run < study.cells[c].runs:
    raise ReplayError(f"--run={run}: the study's cell {c} has data sets 0..{study.cells[c].runs - 1}")


def run_one(study: pipeline.Study, c: int, run: int):
  """(data, {stage: arrays}, per-run results) of data set ``run`` of cell ``c``, alone."""
  check_run(study, c, run)
  cell, runs = study.cells[c], np.array([run])
  data = {**study.load(cell, runs), "runs": runs}
  arrays = {s.name: s.run(data, runs, study.seed, None, None)[0] for s in study.stages(cell)}
  return data, arrays, study.analyze(cell.label, data, arrays)


def _runs_kept(out: str) -> bool | None:
  """False when the finished run in ``out`` was made with --nokeep_runs (None: not finished)."""
  try:
    with open(study_runner.record_path(out)) as f:
      return bool(json.load(f).get("runs_kept", True))
  except (OSError, ValueError, AttributeError):
    return None


def runs_kept(out: str) -> bool:
  """Whether the run in ``out`` kept its per-run records (a partial run compares with work/)."""
  return _runs_kept(out) is not False


def _recorded_sha256(out: str, c: int) -> str | None:
  """The sha256 runs/study.json holds for cell ``c``'s record file (None: none recorded)."""
  try:
    with open(study_runner.record_path(out)) as f:
      cell = json.load(f)["cells"][c]
    return cell.get("sha256") if isinstance(cell, dict) else None
  except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
    return None


def reference(out: str, study: pipeline.Study, c: int, run: int) -> tuple[dict, str] | None:
  """(the run's per-run arrays in the run's own record, where) or None if not analyzed yet. A
  finished run's record file that is missing, or not the file its study.json names (its sha256),
  is a StudyError: there is a record, and it is not there."""
  path = study_runner.record_path(out, c)
  row = run
  if not os.path.exists(path) and _runs_kept(out) is False:
    return None
  want = _recorded_sha256(out, c)
  if want is not None and not os.path.exists(path):
    raise pipeline.StudyError(f"{path} is missing (the finished run recorded it in runs/study.json)")
  if want is not None and results_io.file_sha256(path) != want:
    raise pipeline.StudyError(f"{path}: damaged or replaced (its sha256 is not the one runs/study.json recorded)")
  if not os.path.exists(path):
    k, row = pipeline.unit_of(study, c, run)
    path = pipeline.work_path(os.path.join(out, "work"), pipeline.Unit(c, k, np.array([run])).tag)
    if not os.path.exists(path):
      return None
  arrays = pipeline.load_arrays(path)
  short = sorted(key for key, a in arrays.items() if np.ndim(a) == 0 or len(a) <= row)
  if short:
    raise pipeline.StudyError(f"{path}: damaged (its per-run array {short[0]!r} has no row {row}"
                              + (f", nor {len(short) - 1} more" if len(short) > 1 else "") + ")")
  return {key: a[row] for key, a in arrays.items()}, path


def compare(result: dict, ref: dict) -> dict:
  """{key: identical?} for every per-run array of the replay (result: leading axis 1), against the
  record's array or, for a per-run matrix of a lean record, its digest (``study_runner.row_digests``)."""
  same = {}
  for key, a in result.items():
    if key not in ref and key + study_runner.DIGEST in ref:
      same[key] = bool(study_runner.row_digests(np.asarray(a)[:1])[0] == ref[key + study_runner.DIGEST])
      continue
    if key not in ref:
      same[key] = False
      continue
    a, b = np.asarray(np.asarray(a)[0]), np.asarray(ref[key])     # (an array even for a string: <U0 vs <U1)
    if a.dtype.kind == "U" and b.dtype.kind == "U":   # a string's width depends on its array: compare values
      same[key] = bool(a.shape == b.shape and a.tolist() == b.tolist())
      continue
    nan = np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.complexfloating)
    same[key] = bool(a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=nan))
  return same


def every_step(study: pipeline.Study, c: int, data: dict, stage: stages.Train, start=None):
  """The trajectory of a training stage at every step (a ``train.loop.Trajectory``), from
  step 0 or from ``start`` = (step, State)."""
  # every step observed, on the run's own chunks (the native kernel's steps depend on where a call begins)
  config = train_lib.TrainConfig(**{**stage.config.__dict__, "snapshot_every": 1,
                                    "chunk_every": stage.config.chunk_every or stage.config.snapshot_every})
  runs = np.asarray(data["runs"])
  dataset = stage.dataset(data)
  if start is None:      # the stage's own starting point (a hand-set start, or --init=FILE.npz), if any
    start = stage.start_for(dataset, runs)
  return train_lib.train(config, dataset, train_lib.init_keys(study.seed, runs), start=start)


def start_from_checkpoint(out: str, study: pipeline.Study, c: int, run: int, data: dict,
                          stage: stages.Train, step: int):
  """(step, State of this run alone) from the newest checkpoint of its batch at or before
  ``step``, or None (a partial one-process run's checkpoints, OUT/work/ckpt_<unit>_<stage>)."""
  import jax
  k, j = pipeline.unit_of(study, c, run)
  unit = pipeline.Unit(c, k, np.array([run]))
  ckdir = os.path.join(out, "work", f"ckpt_{unit.tag}_{stage.name}")
  if not os.path.isdir(ckdir):
    return None
  ckpt = ckpt_lib.Checkpoints(ckdir, {"cell": c, "batch": k, "stage": stage.name,
                                      **ckpt_lib._normalize({"identity": study.identity})})
  config = stage.config
  plan = train_lib.schedule(config.steps, config.snapshot_every, config.chunk_steps)
  ends = np.cumsum([0] + [every * n for every, n in plan])      # training step at the end of chunk i
  usable = [i for i in ckpt.steps() if ends[i] <= step]
  if not usable:
    return None
  i = max(usable)
  tree = ckpt.restore(i)
  trainer = train_lib.make_trainer(config)
  one = jax.tree_util.tree_map(lambda a: a[0], stage.dataset(data))
  template = jax.eval_shape(lambda: trainer.init_one(jax.random.PRNGKey(0), one))
  treedef = jax.tree_util.tree_structure(template)
  leaves = [np.asarray(tree["state"][str(x)])[j:j + 1] for x in range(treedef.num_leaves)]
  return int(ends[i]), jax.tree_util.tree_unflatten(treedef, leaves)
