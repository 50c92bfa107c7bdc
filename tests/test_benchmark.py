"""The benchmark binary end to end at toy sizes: every figure present, ratios consistent."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow   # 45 s: the benchmark binary end to end (.ci/run runs it)
def test_gd_and_floor_suites(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "benchmarks.benchmark", f"--out={tmp_path}", "--suites=gd,floor",
                         "--batch_sizes=1,70", "--gd_steps=5", "--repeats=1", "--naive_sets=1",
                         "--scaling_batch=4", "--block_size=8", "--floor_batch=64"],
                        cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads((tmp_path / "benchmark.json").read_text())
  gd = report["gd"]
  naive = gd["naive"]["dataset_steps_per_s"]
  assert naive > 0
  for row in gd["batched"]:
    unit = gd["block_size"] * row["devices_used"]
    assert 1 <= row["devices_used"] <= gd["devices"]
    assert row["padded_batch"] % unit == 0 and row["batch"] <= row["padded_batch"] < row["batch"] + unit
    for mode in ("engine", "engine_1dev", "vmap"):
      r = row[mode]
      assert r["dataset_steps_per_s"] > 0 and r["compile_s"] > 0
      np.testing.assert_allclose(r["dataset_steps_per_s"], row["batch"] * row["steps"] / r["run_s"])
      np.testing.assert_allclose(r["vs_naive"], r["dataset_steps_per_s"] / naive)
    assert row["dataset_steps_per_s"] == row["engine"]["dataset_steps_per_s"]
  assert [s["value"] for s in gd["scaling"]["d"]] == [5, 10, 20, 40]
  assert (tmp_path / "gd_scaling.png").stat().st_size > 0
  floor = report["floor"]
  # the matmuls alone: logits (x W z) and gradient (sum delta x z^T) need 2(2nd^2 + 2nTd) flops at E2 sizes
  n, T, d = 6, 8, 10
  assert floor["flops_per_dataset_step"] >= 2 * (2 * n * d * d + 2 * n * T * d)
  assert floor["streaming_bytes_per_dataset_step"] == 8 * (n * T * d + n * d + n + d + 2 * d * d)
  assert floor["min_bytes_per_dataset_step"] == floor["streaming_bytes_per_dataset_step"] / 5   # --gd_steps
  np.testing.assert_allclose(floor["achieved_over_floor"],
                             floor["achieved_s_per_dataset_step"] / floor["floor_s_per_dataset_step"])
  assert floor["achieved_over_floor"] > 1   # nothing beats the physical floor
  for row in report["floor_table"]:   # the floor measured between the kernel's timed repeats (--repeats=1)
    assert len(row["matmul_rates_between_repeats"]) == 1
    assert row["machine_float64_matmul_flops"] == row["matmul_rates_between_repeats"][0] > 0
    # one repeat: its time is the best, its rate the best, so the pair is the row's ratio
    assert len(row["repeat_seconds"]) == len(row["paired_over_floor"]) == 1
    np.testing.assert_allclose(row["repeat_seconds"][0], row["achieved_s_per_dataset_step"] * row["batch"] * 5)
    np.testing.assert_allclose(row["paired_over_floor"][0], row["achieved_over_floor"])
    assert row["paired_over_floor_median"] == row["paired_over_floor"][0]


@pytest.mark.slow   # (its fast neighbours: test_gd_and_floor_suites, and --floor_kernels' validator in test_bad_input)
def test_the_floor_suite_runs_the_kernels_asked_for(tmp_path):
  """--floor_kernels=native: one row per parameterization and batch size (the default's three
  kernels give three times as many), each against a floor measured in the same run (6 s)."""
  proc = subprocess.run([sys.executable, "-m", "benchmarks.benchmark", f"--out={tmp_path}", "--suites=floor",
                         "--floor_kernels=native", "--repeats=1", "--gd_steps=5", "--floor_batch=64"],
                        cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = json.loads((tmp_path / "benchmark.json").read_text())["floor_table"]
  assert [(r["param"], r["batch"]) for r in rows] == [("W", 64), ("KQ", 64)]
  for r in rows:
    assert r["floor_s_per_dataset_step"] > 0 and r["achieved_over_floor"] > 1


# benchmarks.benchmark defines absl flags (--out, ...) that other modules of the suite define too, so
# it is imported in a fresh interpreter
_PAIRS_CHECK = """
from benchmarks import benchmark as bm
events = []
bm.matmul_rate = lambda repeats=5: events.append("rate") or float(len(events))
paired = bm._BETWEEN = bm.Paired()
best = bm.best_time(lambda: events.append("call") or 0, 3)
assert events == ["rate", "call"] * 3, events         # each timed call right after its own rate
assert paired.rates == [1.0, 3.0, 5.0] and len(paired.seconds) == 3, (paired.rates, paired.seconds)
assert best == min(paired.seconds)
bm.best_time(lambda: 0, 2, between=False)
assert len(paired.rates) == len(paired.seconds) == 3
print("pairs ok")
"""


def test_best_time_pairs_each_repeat_with_the_measurement_before_it():
  """The floor suite's pairs: one rate measured before each timed repeat, that repeat's seconds
  after it, in order; best_time returns the shortest, and between=False measures nothing."""
  proc = subprocess.run([sys.executable, "-c", _PAIRS_CHECK], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and "pairs ok" in proc.stdout, proc.stderr[-3000:]
