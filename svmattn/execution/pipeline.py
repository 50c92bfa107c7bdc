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
from typing import Any, Callable, Sequence

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
  os.makedirs(tmp)
  results_io.write_json(os.path.join(tmp, "run.json"), ident)
  lock = _lock(tmp)        # the lock file moves with the directory
  os.replace(tmp, work)
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
        checkpoint_every_s: float = 0.0) -> Output:
  """Run every unit of ``study`` (this process's share); see the module docstring."""
  if study.enough is not None and process_count > 1:
    raise StudyError(f"{study.name}: a study whose cells stop early runs on one process")
  work, lock = _prepare(out, study, resume, process_index, process_count)
  todo = units(study, process_index, process_count)
  stages = {c: tuple(study.stages(cell)) for c, cell in enumerate(study.cells)}
  sets = sum(len(u.runs) for u in todo)
  steps = sum(sum(s.steps for s in stages[u.cell]) for u in todo)
  counters = {"svm": (sets, "sets")}
  if steps:
    counters = {"train": (steps, "steps"), **counters}
  bar = progress_lib.MultiProgress(counters, enabled=show_progress)
  if workers is None:
    workers = default_workers(steps > 0, study.light_analysis)
  pool = workers_lib.pool(workers) if workers > 0 and len(todo) > 1 else None
  pending: dict[Unit, concurrent.futures.Future] = {}
  # data_s: the loads' seconds, on this thread or the prefetch thread (beside training and the SVM
  # workers); data_wait_s: the seconds this thread waited for data, what the loads added to the wall
  timings = {"data_s": 0.0, "data_wait_s": 0.0, "train_s": 0.0, "compile_s": 0.0, "svm_s": 0.0, "svm_wait_s": 0.0}
  # the work this run did (resumed units excluded): the floors of its stages (benchmark --suites=stages)
  counts = {"cells": len({u.cell for u in todo}), "sets_loaded": 0, "data_bytes": 0, "dataset_steps": 0,
            "sets_analyzed": 0}

  tally = threading.Lock()      # loads also run on the prefetch thread

  def timed_load(cell, runs):
    t0 = time.perf_counter()
    data = study.load(cell, runs)
    with tally:
      timings["data_s"] += time.perf_counter() - t0
      counts["sets_loaded"] += len(runs)
      counts["data_bytes"] += sum(int(np.asarray(a).nbytes) for a in data.values())
    return data

  # The next unit's data is loaded on a thread while this unit trains or waits for its analysis:
  # a new shape's first load compiles its generator (about a second, on one core), which then
  # runs beside the device or the SVM worker instead of before them. Loads are deterministic,
  # so the data are the same as loaded in turn.
  prefetcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="prefetch") if len(todo) > 1 else None
  prefetched: dict[str, concurrent.futures.Future] = {}

  def load(cell, runs, u=None):
    t0 = time.perf_counter()
    fut = prefetched.pop(u.tag, None) if u is not None else None
    data = fut.result() if fut is not None else timed_load(cell, runs)
    timings["data_wait_s"] += time.perf_counter() - t0
    return data

  def prefetch_after(u):
    """Start loading the next unit that needs data and the first one of the next cell (whose
    load compiles; a cell stopping early skips its remaining units)."""
    if prefetcher is None:
      return
    wanted = []
    for later in queue:
      if later.cell in stopped or os.path.exists(path(later)) or os.path.exists(path(later, "data")):
        continue
      if not wanted or later.cell != wanted[0].cell:
        wanted.append(later)
      if len(wanted) == 2 or later.cell != u.cell:
        break
    for later in wanted:
      if later.tag not in prefetched:
        prefetched[later.tag] = prefetcher.submit(timed_load, study.cells[later.cell], later.runs)
  t_start = time.perf_counter()
  path = lambda u, name=None: work_path(work, u.tag + (f"_{name}" if name else ""))  # noqa: E731
  if pool is not None and not all(os.path.exists(path(u)) for u in todo):
    workers_lib.start(pool, workers, study.analyze)    # their imports beside the first batch's data and training
  finished: dict[int, list] = {c: [] for c in range(len(study.cells))}   # analyzed units per cell, in order
  stopped: set[int] = set()
  started: set[str] = set()     # units the loop has reached
  prefix: dict[int, list] = {c: [] for c in range(len(study.cells))}   # early stop: analyzed batches 0..k-1
  enough_at: dict[int, int] = {}  # early stop: the number of a cell's batches that suffice

  def cleanup(u):
    for name in [s.name for s in stages[u.cell]] + ["data"]:
      if os.path.exists(path(u, name)):
        os.remove(path(u, name))

  def note_done(u):
    finished[u.cell].append(u)
    c = u.cell
    if study.enough is None or c in stopped:
      return
    have = {x.batch: x for x in finished[c]}
    while len(prefix[c]) in have:       # extend the cell's contiguous prefix of analyzed batches
      prefix[c].append(_Analyzed(path(have[len(prefix[c])])))
      if study.enough(study.cells[c].label, _Joined(prefix[c])):
        stopped.add(c)
        enough_at[c] = len(prefix[c])
        prefix[c] = []
        for later in todo:     # the display counts only what will still run
          if later.cell == c and later.tag not in started:
            bar.total["svm"] -= len(later.runs)
            if "train" in bar.total:
              bar.total["train"] -= sum(s.steps for s in stages[later.cell])
        return

  restarts = [0]
  bar_lock = threading.Lock()

  def update_train(steps):
    with bar_lock:
      bar.update("train", steps)

  def submit(u):
    nonlocal pool
    args = (study.analyze, study.cells[u.cell].label, path(u, "data"),
            {s.name: path(u, s.name) for s in stages[u.cell]}, path(u))
    try:
      pending[u] = pool.submit(_analyze_and_save, *args)
    except concurrent.futures.process.BrokenProcessPool:
      replace_pool(u)
      pending[u] = pool.submit(_analyze_and_save, *args)

  def replace_pool(u):
    """A worker died (killed, out of memory): start new workers and redo every unit in flight."""
    nonlocal pool
    restarts[0] += 1
    if restarts[0] > MAX_POOL_RESTARTS:
      raise StudyError(f"the SVM worker processes died {restarts[0]} times (last while analyzing batch {u.tag}); "
                       "see the system log (out of memory?), or pass --svm_workers=0; then the same command "
                       "with --resume continues")
    log.warning("an SVM worker process died while analyzing %s; replacing the workers and redoing %d batch(es)",
                u.tag, len(pending))
    pool.shutdown(wait=False, cancel_futures=True)
    pool = workers_lib.pool(workers)
    for w in list(pending):
      pending.pop(w)
      submit(w)

  def collect(block: bool):
    for u in list(pending):
      if u not in pending:      # redone after a worker died
        continue
      fut = pending[u]
      if not block and not fut.done():
        continue
      t0 = time.perf_counter()
      try:
        seconds = fut.result()
      except concurrent.futures.process.BrokenProcessPool:
        replace_pool(u)
        continue
      timings["svm_s"] += seconds
      timings["svm_wait_s"] += time.perf_counter() - t0
      cleanup(u)
      bar.update("svm", len(u.runs))
      del pending[u]
      note_done(u)

  def write_data(u, data):
    """Write the unit's data file unless it is there; returns what it wrote (None: nothing)."""
    if not readable(path(u, "data")):
      written = {**data, "runs": u.runs}
      work_files.write(path(u, "data"), written)
      return written
    return None

  queue = list(todo)     # the units not yet reached, in order

  def next_unit():
    """The first unit of the queue, except in a study whose cells stop early: a cell's next batch
    does not start while one of its batches is being analyzed (that batch may complete the cell,
    and the next one would be solved for nothing), as long as another cell's batch can start
    instead; when none can, the loop waits for an analysis. Each batch's results depend on it
    alone and a cell ends at the first batch that suffices, so the order changes no result."""
    while study.enough is not None and pending:
      busy = {w.cell for w in pending}
      for k, u in enumerate(queue):
        if u.cell not in busy or u.cell in stopped:
          return queue.pop(k)
      concurrent.futures.wait(list(pending.values()), return_when=concurrent.futures.FIRST_COMPLETED)
      collect(block=False)
    return queue.pop(0)

  try:
    while queue:
      u = next_unit()
      cell = study.cells[u.cell]
      started.add(u.tag)
      if readable(path(u)):
        for s in stages[u.cell]:
          bar.update("train", s.steps)
        bar.update("svm", len(u.runs))
        cleanup(u)
        note_done(u)
        continue
      if u.cell in stopped:
        continue
      stage_paths, data, to_run, data_written, stage_written = {}, None, [], None, {}
      for stage in stages[u.cell]:
        target = stage_paths[stage.name] = path(u, stage.name)
        ckdir = os.path.join(work, f"ckpt_{u.tag}_{stage.name}")
        if readable(target):
          shutil.rmtree(ckdir, ignore_errors=True)  # killed between writing the arrays and this
          bar.update("train", stage.steps)
          continue
        to_run.append(stage)
      if to_run:
        data = load(cell, u.runs, u)
        data_written = write_data(u, data)
        prefetch_after(u)

      def run_stage(stage):
        ckdir = os.path.join(work, f"ckpt_{u.tag}_{stage.name}")
        checkpoints = ckpt_lib.Checkpoints(ckdir, {"cell": u.cell, "batch": u.batch, "stage": stage.name,
                                                   **ckpt_lib._normalize({"identity": study.identity})},
                                           keep=keep_checkpoints, every_s=checkpoint_every_s)
        arrays, compile_s = stage.run(data, u.runs, study.seed, update_train, checkpoints)
        work_files.write(stage_paths[stage.name], arrays)
        if pool is None:       # analyzed here next: kept for it (a worker reads the file; memory stays one batch's)
          stage_written[stage.name] = arrays
        checkpoints.remove()
        return compile_s

      t0 = time.perf_counter()
      if len(to_run) > 1 and all(getattr(s, "concurrent", False) for s in to_run):
        compile_times = _on_devices([functools.partial(run_stage, s) for s in to_run])
      else:
        compile_times = [run_stage(s) for s in to_run]
      timings["train_s"] += time.perf_counter() - t0
      timings["compile_s"] += sum(compile_times)
      for stage in to_run:
        if getattr(stage, "gradient_steps", True):       # E7's path points are no GD steps
          counts["dataset_steps"] += stage.steps * len(u.runs)
      if not readable(path(u, "data")):  # no stage, or trained earlier and the data file lost
        write_data(u, load(cell, u.runs, u))
        prefetch_after(u)
      if pool is None:
        whole = data_written is not None and len(stage_written) == len(stage_paths)   # every file written now
        timings["svm_s"] += _analyze_and_save(study.analyze, cell.label, path(u, "data"), stage_paths, path(u),
                                              (data_written, stage_written) if whole else None)
        cleanup(u)
        bar.update("svm", len(u.runs))
        note_done(u)
      else:
        submit(u)
        collect(block=False)
        # Bounded memory and disk: at most workers + 1 units in flight. Beside training the loop
        # waits for all of them, so that the next unit trains on every core alone (the devices'
        # threads meet after every chunk, and a worker on one of their cores stalls both: E5
        # measured 4-7% slower otherwise). A study that trains nothing (E3, E9: one worker per
        # core) waits for the first one done: the others keep the workers busy meanwhile, and the
        # prefetched loads stay ahead of the loop (E3 16.0 -> 12.4 s).
        while len(pending) > workers:
          if steps:
            collect(block=True)
          else:
            t0 = time.perf_counter()
            concurrent.futures.wait(list(pending.values()), return_when=concurrent.futures.FIRST_COMPLETED)
            timings["svm_wait_s"] += time.perf_counter() - t0
            collect(block=False)
    while pending:
      collect(block=True)
  except BaseException:
    if pool is not None:        # interrupted or failed: the workers' current jobs are not waited for
      workers_lib.terminate(pool)
    raise
  finally:
    if prefetcher is not None:
      prefetcher.shutdown(wait=True, cancel_futures=True)
    if pool is not None:
      pool.shutdown(wait=True, cancel_futures=True)
    bar.close()
    os.close(lock)       # finish() removes the directory; a kill releases the lock by itself

  cells = []
  for c in range(len(study.cells)):
    done = sorted(finished[c], key=lambda x: x.batch)[:enough_at.get(c)]
    cells.append(_concat([load_arrays(path(u)) for u in done]))
  counts["sets_analyzed"] = sum(len(u.runs) for c in finished for u in finished[c])
  timings["wall_s"] = time.perf_counter() - t_start
  timings["overlap"] = (timings["train_s"] + timings["svm_s"]) / max(timings["wall_s"], 1e-9)
  return Output(cells, timings, counts)


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
