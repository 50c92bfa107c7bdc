"""The one pipeline every study runs on: batches, checkpoints, resume, workers, hosts.

    out = pipeline.run(study, OUT, resume=False, workers=None)
    out.cells[c]     # {name: per-run array} of cell c, in run order
    out.timings      # train / compile / svm / wall seconds

A study (``Study``) is a grid of cells, each a set of data sets (runs 0, 1, ... of the cell);
the cell's label ({"n": 5, "d": 3}, or {} without a grid) is part of each data set's
identity. Every cell is cut into batches of ``batch_size`` runs; for each batch (a "unit"):

  study.load(cell, runs) -> the batch's data (host arrays)    OUT/work/<unit>_data.arrays
  every stage of study.stages(cell), in chunks, checkpointing  OUT/work/ckpt_<unit>_<stage>/ (orbax)
  the stage's arrays                                           OUT/work/<unit>_<stage>.arrays
  study.analyze(label, data, {stage: arrays}) in a worker      OUT/work/<unit>.arrays (per-run arrays)

(.arrays: ``io.work_files``, the arrays' bytes after an index; no zip, no CRC.)

The next unit's data (and the next cell's first batch, whose load compiles a new shape's
generator) are loaded on a thread while the current unit trains or waits for its analysis.

Every file is written atomically; checkpoints of a stage are deleted once its arrays exist,
stage and data files once the unit's results exist. While the device runs unit u+1, a pool of
``workers`` processes analyzes unit u (0 workers: in the main process; None: ``default_workers``,
one beside training, one per core when the study trains nothing). With ``resume``,
finished units are read back, trained-but-unanalyzed ones analyzed, and the unit in progress
continues from its newest checkpoint: the results are bit for bit those of an uninterrupted
run (a stage saves after a chunk at most once per ``checkpoint_every_s`` seconds: which chunks
were saved never changes a result). The run's identity (``study.identity``) is stored in
OUT/work/run.json; resuming a different run is an error that names the differences.

A cell may stop early: ``study.enough(label, arrays)`` (arrays: the cell's results so far,
in run order) is asked after each analyzed batch, and the cell's results end at the first
batch after which it holds; batches trained beyond it are not used (so the results do not
depend on the workers' timing). While one of a cell's batches is being analyzed, the loop starts
another cell's batch rather than the cell's next one (``next_unit``), so little is solved beyond
what a cell needs. With ``study.grow`` such a cell's batches grow (``batch_starts``:
four batches of batch_size, then 2, 4, 8, ... times it, at most GROWTH_CAP times), so a cell
that draws many data sets to keep a few (E3's) costs tens of batches, not hundreds, while one
that needs few draws solves no more than before; every data set's results depend on it alone,
so the batching never changes them.

Several hosts: process p of P takes the p-th contiguous share of every cell's runs
(``hosts.gather`` joins them).
"""
from __future__ import annotations

import collections.abc
import concurrent.futures
import concurrent.futures.process
import contextlib
import dataclasses
import functools
import json
import logging
import os
import shutil
import threading
import time
import zipfile
from typing import Callable, Sequence

import numpy as np

import svmattn
from svmattn.io import checkpoint as ckpt_lib
from svmattn.io import progress as progress_lib
from svmattn.io import atomic_files as results_io
from svmattn.io import work_files
from svmattn.execution import workers as workers_lib
from svmattn.train import native_kernel

log = logging.getLogger(__name__)


MAX_POOL_RESTARTS = 3    # SVM worker pools replaced after a worker died, before the run gives up


class StudyError(RuntimeError):
  """A results directory that cannot be used as asked, with the reason."""


@dataclasses.dataclass(frozen=True)
class Cell:
  label: dict    # JSON-able; part of each data set's identity ({} for a study without a grid)
  runs: int      # data sets of the cell: runs 0 .. runs-1 (at most this many when it stops early)


@dataclasses.dataclass(frozen=True)
class Study:
  """A data source, device stages, a host analysis per batch and the grid they run over.

  load(cell, runs (B,)) -> {name: array (B, ...)}: the batch's data; X, Y, Z, v for a
    training stage (main process; must draw run r of a cell the same way in any batch).
  stages(cell) -> tuple of device stages (``study.stages``), () for a host-only study.
  analyze(label, data, {stage name: arrays}) -> {name: array (B, ...)}: per-run results;
    a module-level function (it runs in worker processes).
  enough(label, arrays) -> bool: optional early stop of a cell (see the module docstring).
  light_analysis: a batch's analysis takes milliseconds, so without a worker count asked for it
    runs in this process (``default_workers``: a worker's start alone costs 1-1.5 s of a core).
  """
  name: str
  cells: tuple[Cell, ...]
  load: Callable[[Cell, np.ndarray], dict]
  stages: Callable[[Cell], tuple]
  analyze: Callable[[dict, dict, dict], dict]
  batch_size: int = 1000
  seed: int = 0
  identity: dict = dataclasses.field(default_factory=dict, compare=False, hash=False)
  enough: Callable[[dict, dict], bool] | None = None
  grow: bool = False       # with enough: the cell's batches grow (``batch_starts``)
  light_analysis: bool = False


@dataclasses.dataclass(frozen=True)
class Unit:
  cell: int
  batch: int
  runs: np.ndarray = dataclasses.field(compare=False)

  @property
  def tag(self) -> str:
    return f"c{self.cell:04d}_b{self.batch:05d}"


def share(runs: int, process_index: int = 0, process_count: int = 1) -> tuple[int, int]:
  """[lo, hi): the runs of a cell that process ``process_index`` of ``process_count`` takes."""
  per = -(-runs // process_count)
  return min(process_index * per, runs), min((process_index + 1) * per, runs)


GROWTH_START = 4      # a growing cell's batches of batch_size before they double
GROWTH_CAP = 16       # the largest batch of a growing cell, in batch_size


def batch_starts(study: Study, lo: int, hi: int) -> list[int]:
  """The first run of every batch of the runs [lo, hi) of a cell: every batch_size runs, or with
  ``study.grow`` (a study whose cells stop early) GROWTH_START batches of batch_size, then 2, 4,
  8, ... times batch_size, at most GROWTH_CAP times."""
  if not study.grow:
    return list(range(lo, hi, study.batch_size))
  starts, start, k = [], lo, 0
  while start < hi:
    starts.append(start)
    start += study.batch_size * min(1 << max(k - GROWTH_START + 1, 0), GROWTH_CAP)
    k += 1
  return starts


def units(study: Study, process_index: int = 0, process_count: int = 1) -> list[Unit]:
  out = []
  for c, cell in enumerate(study.cells):
    lo, hi = share(cell.runs, process_index, process_count)
    starts = batch_starts(study, lo, hi)
    for k, start in enumerate(starts):
      out.append(Unit(c, k, np.arange(start, starts[k + 1] if k + 1 < len(starts) else hi)))
  return out


def unit_of(study: Study, cell: int, run: int) -> tuple[int, int]:
  """(batch, position in it) of ``run`` of ``cell`` in a one-process run."""
  starts = batch_starts(study, 0, study.cells[cell].runs)
  k = int(np.searchsorted(starts, run, side="right")) - 1
  return k, run - starts[k]


def work_dir(out: str, process_index: int = 0, process_count: int = 1) -> str:
  work = os.path.join(out, "work")
  return work if process_count == 1 else os.path.join(work, f"process_{process_index}")


def identity(study: Study, process_index: int = 0, process_count: int = 1) -> dict:
  """What a run's work directory must match to be resumed: the study, its settings, the numerics
  version and the GD kernel that trains it (``native_kernel.kernel_name``: the kernel decides the
  rounding, so a resume on another kernel is refused, naming both)."""
  return ckpt_lib._normalize({"study": study.name, "numerics_version": svmattn.NUMERICS_VERSION,
                              "gd_kernel": native_kernel.kernel_name(),
                              "identity": study.identity,
                              "cells": [[c.label, c.runs] for c in study.cells],
                              "batch_size": study.batch_size, "seed": study.seed,
                              "process": [process_index, process_count],
                              **({"grow": [GROWTH_START, GROWTH_CAP]} if study.grow else {})})


def _lock(work: str):
  """An exclusive lock on ``work`` for this process's lifetime (released by the kernel when it
  dies, even by SIGKILL): two processes never run the same study in one directory."""
  import fcntl
  fd = os.open(os.path.join(work, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    os.close(fd)
    raise StudyError(f"{work} is in use by another running process: wait for it to end (or kill it) "
                     "before --resume") from None
  return fd


def _discard(directory: str) -> None:
  """Remove ``directory`` whole: renamed away first (atomic, so a kill never leaves half of it
  in place), then deleted."""
  trash = f"{directory}.discarded-{os.getpid()}"
  os.replace(directory, trash)
  shutil.rmtree(trash, ignore_errors=True)


def _prepare(out: str, study: Study, resume: bool, process_index: int, process_count: int) -> str:
  """Open (resume) or create this process's work directory; returns (work, lock).

  A work directory left by a run with other settings (or one whose identity cannot be read) is
  replaced by a fresh start (without --resume) with a notice, and refused by --resume; one of
  this very run needs --resume (or it would be lost by accident). A fresh start also removes
  the records (OUT/runs/) of the run that finished in ``out`` before."""
  work = work_dir(out, process_index, process_count)
  meta_path = os.path.join(work, "run.json")
  ident = identity(study, process_index, process_count)
  if os.path.isdir(work):
    lock = _lock(work)
    try:
      with open(meta_path) as f:
        saved = json.load(f)
      diff = ckpt_lib._differences(saved, ident, ("the run in " + out, "this command"))
    except (OSError, ValueError, AttributeError) as e:
      saved, diff = None, [f"its identity {meta_path} is unreadable ({type(e).__name__})"]
    if not diff:
      if resume:
        return work, lock
      os.close(lock)
      raise StudyError(f"{out} holds an unfinished run of these settings ({work}): pass --resume to continue it, "
                       "or choose another --out")
    if resume:
      os.close(lock)
      raise StudyError(f"--resume: {out} holds another run: " + "; ".join(diff[:6])
                       + ". Drop --resume to replace it with this run, or choose another --out")
    log.warning("%s held an unfinished run with other settings (%s); replacing it with this run", work,
                "; ".join(diff[:2]))
    _discard(work)
    os.close(lock)
  elif resume:
    log.warning("--resume: nothing to resume in %s; starting afresh", out)
  if process_index == 0:
    # the records of a run that finished here before: a fresh start must not leave them beside its own
    old = os.path.join(out, "runs")
    if os.path.isdir(old):
      _discard(old)
  # created whole or not at all: a kill here never leaves a work directory without run.json
  os.makedirs(os.path.dirname(work), exist_ok=True)
  tmp = f"{work}.tmp-{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  try:
    os.makedirs(tmp)
    results_io.write_json(os.path.join(tmp, "run.json"), ident)
    lock = _lock(tmp)        # the lock file moves with the directory
  except BaseException:      # a full disk, an interrupt: no half-made directory left behind
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  try:
    os.replace(tmp, work)
  except OSError:
    os.close(lock)
    shutil.rmtree(tmp, ignore_errors=True)
    if os.path.isdir(work):     # another run created it since the check above: it runs, this one stops
      raise StudyError(f"{out}: another run started in it at the same moment and is running there; this one "
                       "stops (nothing was written)") from None
    raise
  return work, lock


WORK_EXT = ".arrays"     # a work file (io.work_files)


def work_path(work: str, tag: str) -> str:
  """The work file of a unit (tag ``Unit.tag``) or of its data or stage (tag ``Unit.tag + "_" + name``)."""
  return os.path.join(work, tag + WORK_EXT)


@contextlib.contextmanager
def _failing_as_study_error(path: str):
  try:
    yield
  except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
    raise StudyError(f"{path}: unreadable ({type(e).__name__}: {e})") from None


def load_arrays(path: str, only=None) -> dict:
  """{name: array} of a work file, or of an .npz (a run's record); any failure a StudyError."""
  with _failing_as_study_error(path):
    if not path.endswith(".npz"):
      return work_files.read(path, only)
    with np.load(path, allow_pickle=False) as f:
      return {k: f[k] for k in (f.files if only is None else only)}


class _Analyzed:
  """An analyzed batch's work file, each array read when first asked for (an early stop reads one
  or two of a batch's arrays, not its trajectories)."""

  def __init__(self, path: str):
    self.path, self._arrays = path, {}
    with _failing_as_study_error(path):
      self.files = work_files.names(path)

  def __getitem__(self, key: str) -> np.ndarray:
    if key not in self._arrays:
      self._arrays[key] = load_arrays(self.path, [key])[key]
    return self._arrays[key]


class _Joined(collections.abc.Mapping):
  """The arrays of consecutive analyzed batches joined in run order (``_concat``'s values), each
  joined when first asked for: what ``Study.enough`` reads of a cell's results so far."""

  def __init__(self, parts: Sequence[_Analyzed]):
    self._parts, self._joined = list(parts), {}

  def __getitem__(self, key: str) -> np.ndarray:
    if key not in self._joined:
      if not self._parts or key not in self._parts[0].files:
        raise KeyError(key)
      self._joined[key] = np.concatenate([p[key] for p in self._parts])
    return self._joined[key]

  def __iter__(self):
    return iter(self._parts[0].files if self._parts else ())

  def __len__(self) -> int:
    return len(self._parts[0].files) if self._parts else 0


def readable(path: str) -> bool:
  """Whether the work file ``path`` exists and is whole (``work_files.check``: its header, index
  and size); a damaged one (truncated, overwritten) is removed with a warning, so that what it
  held is computed again."""
  if not os.path.exists(path):
    return False
  try:
    work_files.check(path)
    return True
  except Exception as e:  # noqa: BLE001 - WorkFileError, OSError, ...: any damage
    log.warning("%s is damaged (%s: %s); computing it again", path, type(e).__name__, str(e)[:120])
    os.remove(path)
    return False


def _as_loaded(arrays: dict) -> dict:
  """Copies of ``arrays`` as ``load_arrays`` reads them back after ``work_files.write``: the same
  values and dtypes, in Fortran order where an array is Fortran- but not C-contiguous (the .npy
  format's rule), else in C order."""
  out = {}
  for k, v in arrays.items():
    v = np.asarray(v)
    fortran = v.flags.f_contiguous and not v.flags.c_contiguous
    out[k] = np.array(v, order="F" if fortran else "C", copy=True)
  return out


def _analyze_and_save(analyze, label, data_path, stage_paths, target, written=None):
  """Analyze a unit from its data and stage files and write its work file; ``written``: (data, {stage:
  arrays}) as this process has just written them to those files (an analysis in this process then
  reads nothing back: E2's 33 MB of trajectories took 0.45 s to read)."""
  t0 = time.perf_counter()
  if written is None:
    data, stage_arrays = load_arrays(data_path), {name: load_arrays(p) for name, p in stage_paths.items()}
  else:
    data, stage_arrays = _as_loaded(written[0]), {name: _as_loaded(a) for name, a in written[1].items()}
  arrays = analyze(label, data, stage_arrays)
  work_files.write(target, arrays)
  return time.perf_counter() - t0


@dataclasses.dataclass
class Output:
  cells: list          # per cell: {name: per-run array}, in run order (this process's share)
  timings: dict
  work: dict = dataclasses.field(default_factory=dict)   # cells, sets_loaded, data_bytes, dataset_steps, sets_analyzed
  per_cell: list = dataclasses.field(default_factory=list)   # per cell: CELL_TIMINGS seconds and CELL_COUNTS


# What a cell's own units took (a unit belongs to one cell): the seconds of its loads, training (compile
# included), compiles and analyses, and its counts. Resumed units count nothing, as in Output.timings.
CELL_TIMINGS = ("data_s", "train_s", "compile_s", "svm_s")
CELL_COUNTS = ("sets_loaded", "dataset_steps", "sets_analyzed")


def _cell_tally() -> dict:
  return {**dict.fromkeys(CELL_TIMINGS, 0.0), **dict.fromkeys(CELL_COUNTS, 0)}


def _concat(parts: Sequence[dict]) -> dict:
  if not parts:
    return {}
  return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


MAX_DEFAULT_WORKERS = 8


def default_workers(trains: bool, light_analysis: bool = False) -> int:
  """SVM worker processes when none are asked for: none for a light analysis (``Study``; E6 and
  E7: a worker's start, importing NumPy, SciPy, JAX and the engine, took 1.2-1.9 s of a core
  and its analyses a few ms a batch, so the run took 1.2-1.8 s more CPU with it), 1 beside
  training (on the CPU the device's programs use the cores), else one per core this process may
  count on (``svmattn.core_share``), at most ``MAX_DEFAULT_WORKERS`` (each holds up to one batch in
  flight), and none where that is one core: this process then analyzes its batches itself, as
  fast as one worker would without a worker's start (under `svmattn reproduce`, two experiments
  to two cores: E3 and E9 started two workers each). Every solve depends
  on its data set alone, so the count never changes the results."""
  if light_analysis:
    return 0
  if trains:
    return 1
  cores = min(svmattn.core_share(), MAX_DEFAULT_WORKERS)
  return cores if cores > 1 else 0


def _on_devices(jobs: list) -> list:
  """Run ``jobs`` (callables) at once, job j on a thread with local device j (mod the device count)
  as JAX's default device; their results in order. For stages marked ``concurrent`` (E7's W and
  (K,Q) paths: one XLA program each, which XLA:CPU runs on little more than one core): each computes what it would
  alone (the same program on the same kind of device), so the results are the same bits."""
  import jax
  devices = jax.local_devices()

  def call(j, job):
    with jax.default_device(devices[j % len(devices)]):
      return job()

  with concurrent.futures.ThreadPoolExecutor(len(jobs), thread_name_prefix="stage") as ex:
    return list(ex.map(call, range(len(jobs)), jobs))


def run(study: Study, out: str, resume: bool = False, workers: int | None = None, show_progress: bool = True,
        keep_checkpoints: int = 3, process_index: int = 0, process_count: int = 1,
        checkpoint_every_s: float = 0.0, on_batch: Callable[[int, int, str], None] | None = None) -> Output:
  """Run every unit of ``study`` (this process's share); see the module docstring. ``on_batch(cell,
  batch, path)`` is called in this process after each batch's host analysis (also for a batch
  analyzed before a resume), with the path of its analyzed arrays (``load_arrays``)."""
  if study.enough is not None and process_count > 1:
    raise StudyError(f"{study.name}: a study whose cells stop early runs on one process")
  work, lock = _prepare(out, study, resume, process_index, process_count)
  run_ = _Run(study, work, lock, workers, show_progress, keep_checkpoints, checkpoint_every_s,
              units(study, process_index, process_count))
  run_.on_batch = on_batch
  return run_.run()


class _Prefetch:
  """The next unit's data loaded on a thread while this unit trains or waits for its analysis: a
  new shape's first load compiles its generator (about a second, on one core), which then runs
  beside the device or the SVM worker instead of before them. Loads are deterministic, so the
  data are the same as loaded in turn."""

  def __init__(self, study: Study, timings: dict, counts: dict, per_cell: list, threaded: bool):
    self.study, self.timings, self.counts, self.per_cell = study, timings, counts, per_cell
    self.tally = threading.Lock()      # loads also run on the prefetch thread
    self.thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="prefetch") if threaded else None
    self.futures: dict[str, concurrent.futures.Future] = {}

  def timed_load(self, c: int, runs):
    t0 = time.perf_counter()
    data = self.study.load(self.study.cells[c], runs)
    with self.tally:
      seconds = time.perf_counter() - t0
      self.timings["data_s"] += seconds
      self.per_cell[c]["data_s"] += seconds
      self.per_cell[c]["sets_loaded"] += len(runs)
      self.counts["sets_loaded"] += len(runs)
      self.counts["data_bytes"] += sum(int(np.asarray(a).nbytes) for a in data.values())
    return data

  def load(self, u: Unit) -> dict:
    t0 = time.perf_counter()
    fut = self.futures.pop(u.tag, None)
    data = fut.result() if fut is not None else self.timed_load(u.cell, u.runs)
    self.timings["data_wait_s"] += time.perf_counter() - t0
    return data

  def start(self, wanted: list[Unit]) -> None:
    for later in wanted:
      if later.tag not in self.futures:
        self.futures[later.tag] = self.thread.submit(self.timed_load, later.cell, later.runs)

  def close(self) -> None:
    if self.thread is not None:
      self.thread.shutdown(wait=True, cancel_futures=True)


class _Run:
  """One process's run of a study's units (``run``): the loop over the queue of units, each loaded,
  trained stage by stage and analyzed here or in a worker; the early stop of a cell; the worker
  pool and its replacement after a worker died."""

  def __init__(self, study, work, lock, workers, show_progress, keep_checkpoints, checkpoint_every_s, todo):
    self.study, self.work, self.lock, self.todo = study, work, lock, todo
    self.keep_checkpoints, self.checkpoint_every_s = keep_checkpoints, checkpoint_every_s
    self.stages = {c: tuple(study.stages(cell)) for c, cell in enumerate(study.cells)}
    sets = sum(len(u.runs) for u in todo)
    self.steps = sum(sum(s.steps for s in self.stages[u.cell]) for u in todo)
    counters = {"svm": (sets, "sets")}
    if self.steps:
      counters = {"train": (self.steps, "steps"), **counters}
    self.bar = progress_lib.MultiProgress(counters, enabled=show_progress)
    if workers is None:
      workers = default_workers(self.steps > 0, study.light_analysis)
    self.workers = workers
    self.pool = workers_lib.pool(workers) if workers > 0 and len(todo) > 1 else None
    self.pending: dict[Unit, concurrent.futures.Future] = {}
    # data_s: the loads' seconds, on this thread or the prefetch thread (beside training and the SVM
    # workers); data_wait_s: the seconds this thread waited for data, what the loads added to the wall
    self.timings = {"data_s": 0.0, "data_wait_s": 0.0, "train_s": 0.0, "compile_s": 0.0, "svm_s": 0.0,
                    "svm_wait_s": 0.0}
    # the work this run did (resumed units excluded): the floors of its stages (benchmark --suites=stages)
    self.counts = {"cells": len({u.cell for u in todo}), "sets_loaded": 0, "data_bytes": 0, "dataset_steps": 0,
                   "sets_analyzed": 0}
    self.per_cell = [_cell_tally() for _ in study.cells]
    self.prefetch = _Prefetch(study, self.timings, self.counts, self.per_cell, threaded=len(todo) > 1)
    self.finished: dict[int, list] = {c: [] for c in range(len(study.cells))}   # analyzed units per cell, in order
    self.stopped: set[int] = set()
    self.started: set[str] = set()     # units the loop has reached
    self.prefix: dict[int, list] = {c: [] for c in range(len(study.cells))}   # early stop: analyzed batches 0..k-1
    self.enough_at: dict[int, int] = {}  # early stop: the number of a cell's batches that suffice
    self.restarts = 0
    self.bar_lock = threading.Lock()
    self.queue = list(todo)     # the units not yet reached, in order
    self.on_batch = None        # (``run``'s on_batch)

  def path(self, u: Unit, name: str | None = None) -> str:
    return work_path(self.work, u.tag + (f"_{name}" if name else ""))

  # -- the loop ---------------------------------------------------------------------------------

  def run(self) -> Output:
    t_start = time.perf_counter()
    if self.pool is not None and not all(os.path.exists(self.path(u)) for u in self.todo):
      workers_lib.start(self.pool, self.workers, self.study.analyze)  # their imports beside the first batch
    try:
      while self.queue:
        self.run_unit(self.next_unit())
      while self.pending:
        self.collect(block=True)
    except BaseException:
      if self.pool is not None:        # interrupted or failed: the workers' current jobs are not waited for
        workers_lib.terminate(self.pool)
      raise
    finally:
      self.prefetch.close()
      if self.pool is not None:
        self.pool.shutdown(wait=True, cancel_futures=True)
      self.bar.close()
      os.close(self.lock)       # finish() removes the directory; a kill releases the lock by itself
    cells = []
    for c in range(len(self.study.cells)):
      done = sorted(self.finished[c], key=lambda x: x.batch)[:self.enough_at.get(c)]
      cells.append(_concat([load_arrays(self.path(u)) for u in done]))
    self.counts["sets_analyzed"] = sum(len(u.runs) for c in self.finished for u in self.finished[c])
    for c in self.finished:
      self.per_cell[c]["sets_analyzed"] = sum(len(u.runs) for u in self.finished[c])
    timings = self.timings
    timings["wall_s"] = time.perf_counter() - t_start
    timings["overlap"] = (timings["train_s"] + timings["svm_s"]) / max(timings["wall_s"], 1e-9)
    return Output(cells, timings, self.counts, self.per_cell)

  def next_unit(self) -> Unit:
    """The first unit of the queue, except in a study whose cells stop early: a cell's next batch
    does not start while one of its batches is being analyzed (that batch may complete the cell,
    and the next one would be solved for nothing), as long as another cell's batch can start
    instead; when none can, the loop waits for an analysis. Each batch's results depend on it
    alone and a cell ends at the first batch that suffices, so the order changes no result."""
    while self.study.enough is not None and self.pending:
      busy = {w.cell for w in self.pending}
      for k, u in enumerate(self.queue):
        if u.cell not in busy or u.cell in self.stopped:
          return self.queue.pop(k)
      concurrent.futures.wait(list(self.pending.values()), return_when=concurrent.futures.FIRST_COMPLETED)
      self.collect(block=False)
    return self.queue.pop(0)

  def run_unit(self, u: Unit) -> None:
    """Train what is left of unit ``u`` and analyze it (here, or submitted to a worker)."""
    cell, stages, path = self.study.cells[u.cell], self.stages[u.cell], self.path
    self.started.add(u.tag)
    if readable(path(u)):
      for s in stages:
        self.bar.update("train", s.steps)
      self.bar.update("svm", len(u.runs))
      self.cleanup(u)
      self.note_done(u)
      return
    if u.cell in self.stopped:
      return
    stage_paths, data, to_run, data_written, stage_written = {}, None, [], None, {}
    for stage in stages:
      target = stage_paths[stage.name] = path(u, stage.name)
      if readable(target):
        shutil.rmtree(self.checkpoint_dir(u, stage), ignore_errors=True)  # killed between the arrays and this
        self.bar.update("train", stage.steps)
        continue
      to_run.append(stage)
    if to_run:
      data = self.prefetch.load(u)
      data_written = self.write_data(u, data)
      self.prefetch_after(u)
    t0 = time.perf_counter()
    run_stage = functools.partial(self.run_stage, u, data, stage_paths, stage_written)
    if len(to_run) > 1 and all(getattr(s, "concurrent", False) for s in to_run):
      compile_times = _on_devices([functools.partial(run_stage, s) for s in to_run])
    else:
      compile_times = [run_stage(s) for s in to_run]
    mine, seconds = self.per_cell[u.cell], time.perf_counter() - t0
    self.timings["train_s"] += seconds
    mine["train_s"] += seconds
    self.timings["compile_s"] += sum(compile_times)
    mine["compile_s"] += sum(compile_times)
    for stage in to_run:
      if getattr(stage, "gradient_steps", True):       # E7's path points are no GD steps
        self.counts["dataset_steps"] += stage.steps * len(u.runs)
        mine["dataset_steps"] += stage.steps * len(u.runs)
    if not readable(path(u, "data")):  # no stage, or trained earlier and the data file lost
      self.write_data(u, self.prefetch.load(u))
      self.prefetch_after(u)
    if self.pool is None:
      whole = data_written is not None and len(stage_written) == len(stage_paths)   # every file written now
      seconds = _analyze_and_save(self.study.analyze, cell.label, path(u, "data"), stage_paths, path(u),
                                  (data_written, stage_written) if whole else None)
      self.timings["svm_s"] += seconds
      mine["svm_s"] += seconds
      self.cleanup(u)
      self.bar.update("svm", len(u.runs))
      self.note_done(u)
    else:
      self.submit(u)
      self.collect(block=False)
      self.bound_in_flight()

  def checkpoint_dir(self, u: Unit, stage) -> str:
    return os.path.join(self.work, f"ckpt_{u.tag}_{stage.name}")

  def run_stage(self, u: Unit, data, stage_paths: dict, stage_written: dict, stage) -> float:
    checkpoints = ckpt_lib.Checkpoints(self.checkpoint_dir(u, stage),
                                       {"cell": u.cell, "batch": u.batch, "stage": stage.name,
                                        **ckpt_lib._normalize({"identity": self.study.identity})},
                                       keep=self.keep_checkpoints, every_s=self.checkpoint_every_s)
    arrays, compile_s = stage.run(data, u.runs, self.study.seed, self.update_train, checkpoints)
    work_files.write(stage_paths[stage.name], arrays)
    if self.pool is None:       # analyzed here next: kept for it (a worker reads the file; memory stays one batch's)
      stage_written[stage.name] = arrays
    checkpoints.remove()
    return compile_s

  def update_train(self, steps) -> None:
    with self.bar_lock:
      self.bar.update("train", steps)

  def write_data(self, u: Unit, data):
    """Write the unit's data file unless it is there; returns what it wrote (None: nothing)."""
    if not readable(self.path(u, "data")):
      written = {**data, "runs": u.runs}
      work_files.write(self.path(u, "data"), written)
      return written
    return None

  def prefetch_after(self, u: Unit) -> None:
    """Start loading the next unit that needs data and the first one of the next cell (whose
    load compiles; a cell stopping early skips its remaining units)."""
    if self.prefetch.thread is None:
      return
    wanted = []
    for later in self.queue:
      if later.cell in self.stopped or os.path.exists(self.path(later)) or \
          os.path.exists(self.path(later, "data")):
        continue
      if not wanted or later.cell != wanted[0].cell:
        wanted.append(later)
      if len(wanted) == 2 or later.cell != u.cell:
        break
    self.prefetch.start(wanted)

  def cleanup(self, u: Unit) -> None:
    for name in [s.name for s in self.stages[u.cell]] + ["data"]:
      if os.path.exists(self.path(u, name)):
        os.remove(self.path(u, name))

  def note_done(self, u: Unit) -> None:
    """Record an analyzed unit; in a study whose cells stop early, ask whether its cell has enough."""
    c = u.cell
    self.finished[c].append(u)
    if self.on_batch is not None:
      self.on_batch(c, u.batch, self.path(u))
    if self.study.enough is None or c in self.stopped:
      return
    have = {x.batch: x for x in self.finished[c]}
    prefix = self.prefix[c]
    while len(prefix) in have:       # extend the cell's contiguous prefix of analyzed batches
      prefix.append(_Analyzed(self.path(have[len(prefix)])))
      if self.study.enough(self.study.cells[c].label, _Joined(prefix)):
        self.stopped.add(c)
        self.enough_at[c] = len(prefix)
        self.prefix[c] = []
        for later in self.todo:     # the display counts only what will still run
          if later.cell == c and later.tag not in self.started:
            self.bar.total["svm"] -= len(later.runs)
            if "train" in self.bar.total:
              self.bar.total["train"] -= sum(s.steps for s in self.stages[later.cell])
        return

  # -- the SVM workers --------------------------------------------------------------------------

  def submit(self, u: Unit) -> None:
    args = (self.study.analyze, self.study.cells[u.cell].label, self.path(u, "data"),
            {s.name: self.path(u, s.name) for s in self.stages[u.cell]}, self.path(u))
    try:
      self.pending[u] = self.pool.submit(_analyze_and_save, *args)
    except concurrent.futures.process.BrokenProcessPool:
      self.replace_pool(u)
      self.pending[u] = self.pool.submit(_analyze_and_save, *args)

  def replace_pool(self, u: Unit) -> None:
    """A worker died (killed, out of memory): start new workers and redo every unit in flight."""
    self.restarts += 1
    if self.restarts > MAX_POOL_RESTARTS:
      raise StudyError(f"the SVM worker processes died {self.restarts} times (last while analyzing batch {u.tag}); "
                       "see the system log (out of memory?), or pass --svm_workers=0; then the same command "
                       "with --resume continues")
    log.warning("an SVM worker process died while analyzing %s; replacing the workers and redoing %d batch(es)",
                u.tag, len(self.pending))
    self.pool.shutdown(wait=False, cancel_futures=True)
    self.pool = workers_lib.pool(self.workers)
    for w in list(self.pending):
      self.pending.pop(w)
      self.submit(w)

  def collect(self, block: bool) -> None:
    for u in list(self.pending):
      if u not in self.pending:      # redone after a worker died
        continue
      fut = self.pending[u]
      if not block and not fut.done():
        continue
      t0 = time.perf_counter()
      try:
        seconds = fut.result()
      except concurrent.futures.process.BrokenProcessPool:
        self.replace_pool(u)
        continue
      self.timings["svm_s"] += seconds
      self.per_cell[u.cell]["svm_s"] += seconds
      self.timings["svm_wait_s"] += time.perf_counter() - t0
      self.cleanup(u)
      self.bar.update("svm", len(u.runs))
      del self.pending[u]
      self.note_done(u)

  def bound_in_flight(self) -> None:
    """Bounded memory and disk: at most workers + 1 units in flight. Beside training the loop
    waits for all of them, so that the next unit trains on every core alone (the devices'
    threads meet after every chunk, and a worker on one of their cores stalls both: E5
    measured 4-7% slower otherwise). A study that trains nothing (E3, E9: one worker per
    core) waits for the first one done: the others keep the workers busy meanwhile, and the
    prefetched loads stay ahead of the loop (E3 16.0 -> 12.4 s)."""
    while len(self.pending) > self.workers:
      if self.steps:
        self.collect(block=True)
      else:
        t0 = time.perf_counter()
        concurrent.futures.wait(list(self.pending.values()), return_when=concurrent.futures.FIRST_COMPLETED)
        self.timings["svm_wait_s"] += time.perf_counter() - t0
        self.collect(block=False)


def finish(out: str, process_index: int = 0, process_count: int = 1) -> None:
  """Delete this process's work directory once the run's results are written."""
  work = work_dir(out, process_index, process_count)
  if os.path.isdir(work):
    trash = f"{work}.done-{os.getpid()}"
    os.replace(work, trash)  # atomic: a kill mid-delete leaves no half-deleted run behind
    shutil.rmtree(trash, ignore_errors=True)


def finish_shared(out: str) -> None:
  """Several hosts, process 0, after every process's ``finish``: remove the empty OUT/work."""
  try:
    os.rmdir(os.path.join(out, "work"))
  except OSError:
    pass
