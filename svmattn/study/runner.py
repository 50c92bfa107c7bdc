"""Run a study from start to results: pipeline, hosts, the results writer, clean-up.

    runner.execute(study, out, write, Options(resume=True, workers=2))

``write(output)`` gets every cell whole (``pipeline.Output``) and writes the results files;
it runs on process 0 only, after the per-run record OUT/runs/ (``write_record``). The work
directory is removed after it returns, so a kill at any moment before leaves a run that
``resume`` finishes.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable

import svmattn
from svmattn.io import results as results_io
from svmattn.study import hosts as hosts_lib
from svmattn.study import pipeline
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


def record_path(out: str, cell: int | None = None) -> str:
  """OUT/runs/study.json (the study's name, identity and cells), or OUT/runs/cell_CCCC.npz."""
  return os.path.join(out, "runs", "study.json" if cell is None else f"cell_{cell:04d}.npz")


def write_record(out: str, study: pipeline.Study, output: pipeline.Output, keep_runs: bool = True) -> None:
  """Every run's per-run arrays, one file per cell, as the analysis returned them (replay
  compares a single run with its row), and the study's description (study.json). Without
  ``keep_runs`` only the description is written ("runs_kept": false): replay still rebuilds
  and reruns any data set, with nothing to compare it with."""
  for c, arrays in enumerate(output.cells):
    if keep_runs:
      results_io.write_npz(record_path(out, c), arrays)
  results_io.write_json(record_path(out, None), {"study": study.name, "identity": study.identity,
                                              "numerics_version": svmattn.NUMERICS_VERSION,
                                              "gd_kernel": native_kernel.kernel_name(),
                                              "cells": [{"label": c.label, "runs": c.runs} for c in study.cells],
                                              "batch_size": study.batch_size, "seed": study.seed,
                                              "runs_kept": bool(keep_runs)})


def execute(study: pipeline.Study, out: str, write: Callable[[pipeline.Output], None],
            options: Options = Options()) -> pipeline.Output:
  o = options
  output = pipeline.run(study, out, o.resume, o.workers, o.progress, o.keep_checkpoints, o.process_index,
                        o.process_count, checkpoint_every_s=o.checkpoint_every_s)
  output = hosts_lib.gather(output, study, o.process_index, o.process_count)
  if o.process_index == 0:
    write_record(out, study, output, o.keep_runs)
    write(output)
  if o.process_count > 1:
    hosts_lib.sync("results written")
  pipeline.finish(out, o.process_index, o.process_count)
  if o.process_count > 1:
    hosts_lib.sync("work removed")
    if o.process_index == 0:
      pipeline.finish_shared(out)
  return output
