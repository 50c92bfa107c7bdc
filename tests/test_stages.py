"""Stages of a reproduce run and their floors: report.stages and report.stage_floors."""
import pytest

from svmattn import report as report_lib

RATES = {"kernel_dataset_steps_per_s": 1e6, "nnls_solves_per_s": 1e4, "bandwidth_bytes_per_s": 1e10,
         "generator_first_call_s": 1.0, "generator_run_s": 0.01}


def test_stages_cut_the_wall_time():
  t = {"data": 2.0, "compile": 3.0, "train": 10.0, "svm": 4.0, "pipeline_wall": 14.0, "write": 1.0, "total": 16.0}
  st = report_lib.stages(t, wall=18.0)
  assert st == pytest.approx({"startup": 2.0, "compile": 3.0, "data": 2.0, "train": 7.0, "svm_analysis": 4.0,
                              "write": 1.0, "other": 1.0})
  # E7 names its training "paths", E9 its analysis "feasibility"; a binary without a pipeline has no stages
  assert report_lib.stages({"paths": 5.0, "total": 5.0}, 6.0)["train"] == 5.0
  assert report_lib.stages({"feasibility": 2.0, "total": 2.0}, 2.5)["svm_analysis"] == 2.0
  table = report_lib.stage_table([{"id": "E2", "wall_s": 18.0, "stages_s": st, "beyond": False}])
  assert "paper E1-E9" in table and "beyond" not in table


def test_floors_and_causes():
  record = {"id": "E4", "stages_s": {"train": 20.0, "data": 40.0, "svm_analysis": 1.0},
            "work": {"cells": 38, "dataset_steps": 10_000_000, "data_bytes": 10**9, "sets_analyzed": 10_000}}
  rows = {r["stage"]: r for r in report_lib.stage_floors(record, RATES)}
  assert rows["train"]["floor_s"] == pytest.approx(10.0) and rows["train"]["over_floor"] == pytest.approx(2.0)
  assert rows["data"]["floor_s"] == pytest.approx(0.1) and rows["data"]["over_floor"] == pytest.approx(400.0)
  assert "38 shapes" in rows["data"]["cause"]
  assert rows["svm_analysis"]["floor_s"] == pytest.approx(1.0)
  # no work recorded (an older reproduce.json, or a binary without the pipeline): no rows
  assert report_lib.stage_floors({"id": "E7", "stages_s": {"train": 5.0}}, RATES) == []


def test_report_shows_the_stages():
  record = {"stages_s": {"startup": 1.5, "compile": 2.25, "data": 0.0, "train": 1.0, "svm_analysis": 0.6,
                         "write": 0.2, "other": 0.0}}
  assert report_lib.stage_words(record) == (" (startup 1.5 s, compile 2.2 s, train 1.0 s, SVMs and analysis 0.6 s, "
                                         "write 0.2 s)")
  assert report_lib.stage_words({}) == ""


def test_table_counts_compiled_programs():
  from svmattn.report.stages import STAGES
  st = {s: 1.0 for s in STAGES}
  records = [{"id": "E2", "wall_s": 9.0, "stages_s": st, "beyond": False, "work": {"xla_programs_compiled": 7}},
             {"id": "E4", "wall_s": 9.0, "stages_s": st, "beyond": False, "work": {"xla_programs_compiled": 5}}]
  lines = report_lib.stage_table(records).splitlines()
  assert lines[0].split()[-1] == "programs"
  assert [line.split()[-1] for line in lines[1:]] == ["7", "5", "12"]
  del records[1]["work"]                       # an older record: no count, and no total
  assert [line.split()[-1] for line in report_lib.stage_table(records).splitlines()[1:]] == ["7", "-", "-"]


def test_the_compile_counter_counts_compiles_not_calls():
  import jax
  import jax.numpy as jnp
  import numpy as np
  from svmattn import xla_cache
  xla_cache.count_compiles()
  before = xla_cache.compile_stats()["xla_programs_compiled"]
  f = jax.jit(lambda x: jnp.sin(x) * 3.0 + 0.123)
  f(np.ones(7)).block_until_ready()
  f(np.ones(7)).block_until_ready()            # the same program: no compile
  mid = xla_cache.compile_stats()["xla_programs_compiled"]
  f(np.ones(9)).block_until_ready()            # a new shape: one more
  after = xla_cache.compile_stats()
  assert mid - before >= 1 and after["xla_programs_compiled"] - mid == 1 and after["xla_compile_s"] > 0
