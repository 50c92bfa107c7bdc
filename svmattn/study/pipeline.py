"""Long runs in batches that survive interruption: checkpoints, resume, overlapped SVM work.

    arrays, timings = sweep.run(plan, out, load_batch, analyze, resume=False, workers=1)

For each batch k of ``plan.batch_size`` data sets (runs k*batch_size, ...):

  load_batch(k) -> (Dataset, runs, extra arrays)          data, on device
  train every configuration in chunks, checkpointing       OUT/work/ckpt_k_P/  (orbax)
  the trained trajectory                                   OUT/work/batch_k_P.npz
  the batch's data                                         OUT/work/batch_k_data.npz
  analyze(data path, {P: trajectory path}) in a worker     host (SVM solves)
  per-run results                                          OUT/work/batch_k.npz

Every file is written atomically; checkpoints of a configuration are deleted once its
trajectory file exists, trajectory files once the batch's results exist. While the
device trains batch k+1, a pool of ``workers`` processes analyzes batch k (0 workers:
in the main process, no overlap). With ``resume``, finished batches are read back,
trained-but-unanalyzed ones are analyzed, and the batch in progress continues from its
newest checkpoint: the results are bit for bit those of an uninterrupted run. The run's
identity (``plan.identity``) is stored in OUT/work/run.json; resuming a different run is
an error that names the differences.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import multiprocessing
import os
import shutil
import time
from typing import Any, Callable

import numpy as np

from svmattn.io import checkpoint as ckpt_lib
from svmattn.io import progress as progress_lib
from svmattn.io import results
from svmattn.svm import att_svm as svm_lib
from svmattn.train import loop as train_lib

log = logging.getLogger(__name__)


class SweepError(RuntimeError):
  """A results directory that cannot be used as asked, with the reason."""


@dataclasses.dataclass(frozen=True)
class Plan:
  configs: tuple[tuple[str, train_lib.TrainConfig], ...]   # (name, config) trained on every batch
  runs: int                                              # data sets in all
  batch_size: int
  seed: int
  identity: dict = dataclasses.field(default_factory=dict, compare=False, hash=False)  # flags etc.
  process_index: int = 0                                 # multi-host: this process takes the
  process_count: int = 1                                 # process_index-th contiguous share of the runs

  @property
  def share(self) -> tuple[int, int]:
    """[lo, hi): the runs of this process."""
    per = -(-self.runs // self.process_count)
    return min(self.process_index * per, self.runs), min((self.process_index + 1) * per, self.runs)

  @property
  def batches(self) -> int:
    lo, hi = self.share
    return -(-(hi - lo) // self.batch_size)

  def batch_runs(self, k: int) -> np.ndarray:
    lo, hi = self.share
    return np.arange(lo + k * self.batch_size, min(lo + (k + 1) * self.batch_size, hi))


def work_dir(out: str, plan: Plan) -> str:
  work = os.path.join(out, "work")
  return work if plan.process_count == 1 else os.path.join(work, f"process_{plan.process_index}")


def _paths(out, k, name=None, work=None):
  work = work or os.path.join(out, "work")
  if name is None:
    return os.path.join(work, f"batch_{k:05d}.npz")
  return os.path.join(work, f"batch_{k:05d}_{name}.npz")


def _prepare(out: str, plan: Plan, resume: bool) -> str:
  work = work_dir(out, plan)
  meta_path = os.path.join(work, "run.json")
  identity = ckpt_lib._normalize({"identity": plan.identity, "runs": plan.runs, "batch_size": plan.batch_size,
                                  "seed": plan.seed, "process": [plan.process_index, plan.process_count]})
  if os.path.isdir(work):
    if not resume:
      raise SweepError(f"{out} holds an unfinished run ({work}): pass --resume to continue it, "
                       "or choose another --out")
    try:
      with open(meta_path) as f:
        saved = json.load(f)
    except (OSError, ValueError) as e:
      raise SweepError(f"{meta_path}: cannot read the run's identity ({e}); remove {work} to start afresh") from e
    diff = ckpt_lib._differences(saved, identity, ("the run in " + out, "this command"))
    if diff:
      raise SweepError(f"--resume: {out} holds another run: " + "; ".join(diff[:6]))
  else:
    if resume:
      log.warning("--resume: nothing to resume in %s; starting afresh", out)
    # created whole or not at all: a kill here never leaves a work directory without run.json
    os.makedirs(os.path.dirname(work), exist_ok=True)
    tmp = f"{work}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    results.write_json(os.path.join(tmp, "run.json"), identity)
    os.replace(tmp, work)
  return work


def _load_npz(path):
  with np.load(path, allow_pickle=False) as f:
    return {k: f[k] for k in f.files}


def _one_thread_per_worker():
  """The worker processes already run in parallel: one SVM solve at a time in each."""
  svm_lib.THREADS = 1


def _analyze_and_save(analyze, data_path, traj_paths, target):
  t0 = time.perf_counter()
  arrays = analyze(data_path, traj_paths)
  results.write_npz(target, arrays)
  return time.perf_counter() - t0


def run(plan: Plan, out: str, load_batch: Callable[[int], tuple[Any, np.ndarray, dict]],
        analyze: Callable[[str, dict], dict], resume: bool = False, workers: int = 1,
        show_progress: bool = True, keep_checkpoints: int = 3):
  """Run every batch of ``plan``; returns (per-run arrays concatenated over batches, timings).

  load_batch(k) -> (data batch, runs (B_k,), extra arrays to store with the data, e.g. token scores).
  analyze(data_path, {name: trajectory_path}) -> dict of per-run arrays (leading axis B_k);
    a module-level function (it runs in worker processes).
  """
  work = _prepare(out, plan, resume)
  total_steps = plan.batches * sum(c.steps for _, c in plan.configs)
  lo, hi = plan.share
  bar = progress_lib.MultiProgress({"train": (total_steps, "steps"), "svm": (hi - lo, "sets")},
                                   enabled=show_progress)
  pool = None
  if workers > 0 and plan.batches > 1:  # with one batch there is nothing to overlap: skip the pool's start-up
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=_one_thread_per_worker)
  pending: dict[int, concurrent.futures.Future] = {}
  timings = {"train_s": 0.0, "compile_s": 0.0, "svm_s": 0.0, "svm_wait_s": 0.0}
  t_start = time.perf_counter()

  def collect(block: bool):
    for k in sorted(pending):
      fut = pending[k]
      if not block and not fut.done():
        continue
      t0 = time.perf_counter()
      timings["svm_s"] += fut.result()
      timings["svm_wait_s"] += time.perf_counter() - t0
      _cleanup(k)
      bar.update("svm", len(plan.batch_runs(k)))
      del pending[k]

  def _cleanup(k):
    for name in [n for n, _ in plan.configs] + ["data"]:
      path = _paths(out, k, name, work)
      if os.path.exists(path):
        os.remove(path)

  try:
    for k in range(plan.batches):
      if os.path.exists(_paths(out, k, None, work)):
        bar.update("train", sum(c.steps for _, c in plan.configs))
        bar.update("svm", len(plan.batch_runs(k)))
        _cleanup(k)
        continue
      data_path = _paths(out, k, "data", work)
      traj_paths = {}
      loaded = None
      for name, config in plan.configs:
        path = traj_paths[name] = _paths(out, k, name, work)
        ckdir = os.path.join(work, f"ckpt_{k:05d}_{name}")
        if os.path.exists(path):
          shutil.rmtree(ckdir, ignore_errors=True)  # killed between writing the trajectory and this
          bar.update("train", config.steps)
          continue
        if loaded is None:
          loaded = load_batch(k)
          batch, runs, extra = loaded
          if not os.path.exists(data_path):
            results.write_npz(data_path, {**{f: np.asarray(a) for f, a in batch._asdict().items()},
                                          "runs": runs, **extra})
        batch, runs, _ = loaded
        checkpoints = ckpt_lib.Checkpoints(ckdir, {"batch": k, "config": name, **ckpt_lib._normalize(
            {"identity": plan.identity})}, keep=keep_checkpoints)
        t0 = time.perf_counter()
        traj = train_lib.train(config, batch, train_lib.init_keys(plan.seed, runs),
                               lambda s: bar.update("train", s), checkpoints)
        timings["train_s"] += time.perf_counter() - t0
        timings["compile_s"] += traj.compile_seconds
        results.write_npz(path, {"W": traj.W, "max_prob": traj.max_prob, "loss": traj.loss,
                                 "attention": traj.attention, "selected": traj.selected,
                                 "finite": traj.finite, "steps": traj.steps})
        checkpoints.remove()
      if not os.path.exists(data_path):  # trained earlier, data file lost: rebuild it
        batch, runs, extra = load_batch(k)
        results.write_npz(data_path, {**{f: np.asarray(a) for f, a in batch._asdict().items()},
                                      "runs": runs, **extra})
      if pool is None:
        timings["svm_s"] += _analyze_and_save(analyze, data_path, traj_paths, _paths(out, k, None, work))
        _cleanup(k)
        bar.update("svm", len(plan.batch_runs(k)))
      else:
        pending[k] = pool.submit(_analyze_and_save, analyze, data_path, traj_paths, _paths(out, k, None, work))
        collect(block=False)
        while len(pending) > workers:   # bounded memory and disk: at most workers + 1 batches in flight
          collect(block=True)
    while pending:
      collect(block=True)
  finally:
    if pool is not None:
      pool.shutdown(wait=True, cancel_futures=True)
    bar.close()

  parts = [_load_npz(_paths(out, k, None, work)) for k in range(plan.batches)]
  arrays = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
  timings["wall_s"] = time.perf_counter() - t_start
  timings["overlap"] = (timings["train_s"] + timings["svm_s"]) / max(timings["wall_s"], 1e-9)
  return arrays, timings


def finish(out: str, plan: Plan | None = None) -> None:
  """Delete this process's work directory (OUT/work) once the run's results are written."""
  work = os.path.join(out, "work") if plan is None else work_dir(out, plan)
  if os.path.isdir(work):
    trash = f"{work}.done-{os.getpid()}"
    os.replace(work, trash)  # atomic: a kill mid-delete leaves no half-deleted run behind
    shutil.rmtree(trash, ignore_errors=True)


def finish_shared(out: str) -> None:
  """Multi-host, process 0, after every process's ``finish``: remove the empty OUT/work."""
  try:
    os.rmdir(os.path.join(out, "work"))
  except OSError:
    pass


def gather(arrays: dict[str, np.ndarray], plan: Plan) -> dict[str, np.ndarray]:
  """Multi-host: every process's per-run arrays, concatenated in run order, on every process.

  Uses jax's collectives (process_allgather); string arrays travel as their code points."""
  if plan.process_count == 1:
    return arrays
  from jax.experimental import multihost_utils
  per = -(-plan.runs // plan.process_count)
  lo, hi = plan.share
  counts = [min((p + 1) * per, plan.runs) - min(p * per, plan.runs) for p in range(plan.process_count)]
  out = {}
  for key in sorted(arrays):
    a = np.asarray(arrays[key])
    kind = a.dtype.kind
    if kind == "U":
      width = max(int(multihost_utils.process_allgather(np.array([a.dtype.itemsize // 4]), tiled=True).max()), 1)
      a = a.astype(f"<U{width}").view(np.uint32).reshape(len(a), width)
    elif kind == "b":
      a = a.astype(np.uint8)
    padded = np.zeros((per,) + a.shape[1:], a.dtype)
    padded[:hi - lo] = a
    full = np.asarray(multihost_utils.process_allgather(padded, tiled=True))
    full = np.concatenate([full[p * per:p * per + c] for p, c in enumerate(counts)])
    if kind == "U":
      full = full.astype(np.uint32).reshape(-1).view(f"<U{width}").reshape(len(full))
    elif kind == "b":
      full = full.astype(bool)
    out[key] = full
  return out
