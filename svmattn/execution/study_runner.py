"""Run a study from start to results: pipeline, hosts, the results writer, clean-up.

    study_runner.run(study, out, write, Options(resume=True, workers=2))

``write(output)`` gets every cell whole (``pipeline.Output``) and writes the results files;
it runs on process 0 only, after the per-run record OUT/runs/ (``write_record``). The work
directory is removed after it returns, so a kill at any moment before leaves a run that
``resume`` finishes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Callable

import numpy as np

import svmattn
from svmattn.io import checkpoint as ckpt_lib
from svmattn.io import atomic_files as results_io
from svmattn.execution import hosts as hosts_lib
from svmattn.execution import metric_log
from svmattn.execution import pipeline
from svmattn.train import native_kernel


@dataclasses.dataclass(frozen=True)
class Options:
  resume: bool = False
  workers: int | None = None   # SVM worker processes (0: in the main process; None: pipeline.default_workers)
  progress: bool = True
  keep_checkpoints: int = 3
  checkpoint_every_s: float = 0.0   # (the binaries' default: --checkpoint_every_s)
  process_index: int = 0
  process_count: int = 1
  keep_runs: bool = True       # OUT/runs/cell_*.npz, every run's per-run arrays (what replay compares with)
  full_records: bool = False   # keep per-run matrices whole in OUT/runs/ (default: a digest of each run's)
  log: str = "none"            # per-snapshot scalars for TensorBoard or wandb (``metric_log``)
  cell_names: tuple = ()       # the metric log's name of each study cell


def record_path(out: str, cell: int | None = None) -> str:
  """OUT/runs/study.json (the study's name, identity and cells), or OUT/runs/cell_CCCC.npz."""
  return os.path.join(out, "runs", "study.json" if cell is None else f"cell_{cell:04d}.npz")


DIGEST = results_io.DIGEST_SUFFIX     # the record of a per-run matrix: KEY__digest, a 64-bit digest per run


def row_digests(a: np.ndarray) -> np.ndarray:
  """(B,) uint64: a digest of each run's row of ``a`` (B, ...): its dtype, shape and bytes (BLAKE2b),
  equal exactly when the rows are bit for bit the same."""
  a = np.ascontiguousarray(a)
  head = f"{a.dtype.str}{a.shape[1:]}".encode()
  return np.array([int.from_bytes(hashlib.blake2b(head + row.tobytes(), digest_size=8).digest(), "little")
                   for row in a], np.uint64)


def lean(arrays: dict) -> dict:
  """The per-run record of a cell: per-run values and per-snapshot curves (B,) and (B, S) whole, each
  per-run matrix or tensor (three or more axes: data, parameters, attention maps) as its digests
  (``row_digests``), what replay compares a replayed run with; results.npz keeps the final arrays."""
  out = {}
  for key, a in arrays.items():
    a = np.asarray(a)
    if a.ndim >= 3 and a.dtype.kind in "biufc":
      out[key + DIGEST] = row_digests(a)
    else:
      out[key] = a
  return out


def write_record(out: str, study: pipeline.Study, output: pipeline.Output, keep_runs: bool = True,
                 full: bool = False) -> None:
  """Every run's per-run arrays, one compressed file per cell, as the analysis returned them (replay
  compares a single run with its row; per-run matrices as digests unless ``full``: ``lean``),
  and the study's description (study.json, with each cell file's sha256: what ``results.load``
  checks a cell file against). Without ``keep_runs`` only the description is
  written ("runs_kept": false): replay still rebuilds and reruns any data set, with nothing to
  compare it with."""
  digests = []
  for c, arrays in enumerate(output.cells):
    if keep_runs:
      results_io.write_npz(record_path(out, c), arrays if full else lean(arrays), compressed=True)
      digests.append({"sha256": results_io.file_sha256(record_path(out, c))})
    else:
      digests.append({})
  results_io.write_json(record_path(out, None), {"study": study.name, "identity": study.identity,
                                              "numerics_version": svmattn.NUMERICS_VERSION,
                                              "gd_kernel": native_kernel.kernel_name(),
                                              "cells": [{"label": c.label, "runs": c.runs, **d}
                                                        for c, d in zip(study.cells, digests)],
                                              "batch_size": study.batch_size, "seed": study.seed,
                                              "runs_kept": bool(keep_runs), "full_records": bool(full)})


class AlreadyComplete(pipeline.StudyError):
  """``out`` holds this very run, finished: there is nothing to do (not an error)."""


_RECORDED = ("study", "numerics_version", "gd_kernel", "identity", "batch_size", "seed")


def finished_differences(out: str, study: pipeline.Study) -> list[str] | None:
  """None where ``out`` holds no finished run (no summary.json and runs/study.json, or a work
  directory still there); else how the finished run differs from ``study`` ([] for this very run:
  its settings, numerics version and GD kernel)."""
  record = record_path(out, None)
  if not (os.path.isfile(os.path.join(out, "summary.json")) and os.path.isfile(record)) or \
      os.path.isdir(pipeline.work_dir(out)):
    return None
  try:
    with open(record) as f:
      saved = json.load(f)
    cells = [[c["label"], c["runs"]] for c in saved["cells"]]
  except (OSError, ValueError, KeyError, TypeError) as e:   # (TypeError: a record that is not a mapping)
    return [f"its record {record} is unreadable ({type(e).__name__})"]
  wanted = pipeline.identity(study)
  old = ckpt_lib._normalize({**{k: saved.get(k) for k in _RECORDED}, "cells": cells})
  new = {k: wanted[k] for k in (*_RECORDED, "cells")}
  return ckpt_lib._differences(old, new, ("the finished run", "this command"))


def refuse_finished(out: str, study: pipeline.Study) -> None:
  """A finished run in ``out`` is never replaced: AlreadyComplete for this very run, else
  StudyError naming what differs (nothing in ``out`` is touched)."""
  diff = finished_differences(out, study)
  if diff is None:
    return
  if not diff:
    raise AlreadyComplete(f"{out}: already complete (a finished run of these settings); nothing to do")
  raise pipeline.StudyError(f"{out} holds a finished run with other settings: " + "; ".join(diff[:4])
                            + (f" (and {len(diff) - 4} more)" if len(diff) > 4 else "")
                            + ". Nothing was changed: choose another --out, or pass --overwrite (the new run replaces "
                            "that one once it is complete)")


def run(study: pipeline.Study, out: str, write: Callable[[pipeline.Output], None],
            options: Options = Options()) -> pipeline.Output:
  o = options
  refuse_finished(out, study)
  log = metric_log.open_log(o.log, out if o.process_count == 1 else os.path.join(out, f"process_{o.process_index}"),
                           study, list(o.cell_names) or [f"cell_{c:04d}" for c in range(len(study.cells))])
  try:
    output = pipeline.run(study, out, o.resume, o.workers, o.progress, o.keep_checkpoints, o.process_index,
                          o.process_count, checkpoint_every_s=o.checkpoint_every_s,
                          on_batch=None if log is None else log.batch)
  finally:
    if log is not None:
      log.close()
  output = hosts_lib.gather(output, study, o.process_index, o.process_count)
  if o.process_index == 0:
    write_record(out, study, output, o.keep_runs, o.full_records)
    write(output)
  if o.process_count > 1:
    hosts_lib.sync("results written")
  pipeline.finish(out, o.process_index, o.process_count)
  if o.process_count > 1:
    hosts_lib.sync("work removed")
    if o.process_index == 0:
      pipeline.finish_shared(out)
  return output
