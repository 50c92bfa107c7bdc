"""Q1 (svmattn.studies.selection_at_init): is the selected token decided at initialization?"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT
from svmattn import registry
from svmattn.studies import selection_at_init as q1

ENV = dict(os.environ, JAX_PLATFORMS="cpu")
SMALL = {"n": 3, "T": 4, "d": 5, "runs": 3, "chunk_steps": 100, "batch_size": 3, "block_size": 3}


def _values(**change):
  return q1.SETTINGS.validate({**q1.SETTINGS.defaults(), **SMALL, **change})


def _run(values):
  study = q1.build(values)
  cell = study.cells[0]
  runs = np.arange(cell.runs)
  data = {**study.load(cell, runs), "runs": runs}
  arrays = {s.name: s.run(data, runs, study.seed, None, None)[0] for s in study.stages(cell)}
  return study.analyze(cell.label, data, arrays)


def test_without_training_the_final_token_is_the_leading_one():
  out = _run(_values(steps=0))
  for p in ("W", "KQ"):
    np.testing.assert_array_equal(out[f"decided_at_init_{p}"], 1.0)


def test_shares_are_fractions_of_the_sequences():
  out = _run(_values(steps=200))
  for p in ("W", "KQ"):
    for k in (f"decided_at_init_{p}", f"optimal_{p}"):
      assert out[k].shape == (3,) and np.all((out[k] >= 0) & (out[k] <= 1))
      assert np.all(np.isclose(out[k] * 3, np.round(out[k] * 3)))      # multiples of 1/n


@pytest.mark.slow
def test_it_is_registered_and_runs_from_the_command(tmp_path):
  assert registry.get("Q1").name == "selection_at_init"
  out = tmp_path / "q1"
  proc = subprocess.run([sys.executable, "-m", "svmattn", "selection_at_init", f"--out={out}", "--runs=2",
                         "--steps=50", "--n=3", "--T=4", "--d=4", "--noprogress"], cwd=REPO_ROOT, env=ENV,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.load(open(out / "summary.json"))
  assert set(summary["params"]) == {"W", "KQ"} and summary["chance"] == 0.25
  assert "final token = leading token at step 0" in proc.stdout
