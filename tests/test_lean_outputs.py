"""Lean outputs: --nokeep_runs keeps no per-run records (replay still reruns a data set), --norms
limits the Att-SVMs solved."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT


def _run(*args):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-m", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=300, env=env)


@pytest.mark.slow   # two end-to-end runs of binaries (CI runs the slow tests too)
def test_nokeep_runs_and_norms(tmp_path):
  out = tmp_path / "e2"
  proc = _run("experiments.local_convergence", f"--out={out}", "--runs=4", "--steps=20", "--chunk_steps=20",
              "--params=W", "--norms=fro", "--nokeep_runs", "--noprogress")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert sorted(os.listdir(out / "runs")) == ["study.json"]
  with open(out / "runs" / "study.json") as f:
    assert json.load(f)["runs_kept"] is False
  with np.load(out / "results.npz") as a:
    assert "corr_W_fro" in a.files and not any("nuc" in k for k in a.files)
  with open(out / "summary.json") as f:
    assert set(json.load(f)["final_corr"]) == {"W_vs_fro"}
  proc = _run("experiments.replay", f"--out={out}", "--run=2")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "made with --nokeep_runs" in proc.stdout
