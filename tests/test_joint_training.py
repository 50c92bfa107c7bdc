"""E11 (experiments.joint_training) end to end: the public code's toy setting (its hand-solved
answers), a tiny e2 run from a --data file (v the initial head), and bad input."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT
from svmattn.data import datasets as data_lib
from test_health_studies import check_summary
from test_sweep import ENV

# End to end through the binary (a few seconds to a minute each): with the slow tests, which CI runs;
# the README's test command keeps the library's own tests.
pytestmark = pytest.mark.slow


def _run(out, *flags, timeout=600):
  return subprocess.run([sys.executable, "-m", "experiments.joint_training", f"--out={out}", "--noprogress", *flags],
                        cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
  out = tmp_path_factory.mktemp("e11toy")
  proc = _run(out, "--setting=toy", "--steps=600", "--snapshot_every=20", "--chunk_steps=300")
  assert proc.returncode == 0, proc.stderr[-3000:]
  return out, proc.stdout


def test_toy_matches_the_hand_solved_svms(toy):
  out, stdout = toy
  for name in ("results.npz", "summary.json", "joint.png", "toy.png"):
    assert os.path.getsize(out / name) > 0
  a = np.load(out / "results.npz")
  # tight: every sequence is a support vector, relaxed = full p^mm = (4/3, 1/3); non-tight: S = {0, 1},
  # relaxed p^mm = (1, 0); v^mm = (0, 1) in both (hand-solved, and the public code's cvxopt objectives)
  assert a["support_p"].tolist() == [[True, True, True], [True, True, False]]
  np.testing.assert_allclose(a["W_relaxed_p"][0], [4 / 3, 1 / 3], atol=1e-8)
  np.testing.assert_allclose(a["W_relaxed_p"][1], [1, 0], atol=1e-8)
  np.testing.assert_allclose(a["v_mm_p"], [[0, 1], [0, 1]], atol=1e-8)
  assert a["selected_p"].tolist() == [[1, 1, 1], [1, 1, 1]]
  assert a["W_final_p"].shape == (2, 2) and a["v_final_p"].shape == (2, 2)
  # the trained directions
  assert a["corr_v_p"][:, -1].min() > 0.999
  assert a["corr_relaxed_p"][1, -1] > 0.999 > a["corr_full_p"][1, -1]
  summary = json.loads((out / "summary.json").read_text())
  assert summary["toy"]["non-tight"]["p"]["relaxed"] == pytest.approx(float(a["corr_relaxed_p"][1, -1]))
  assert all(c["ok"] for c in summary["checks"]) and "E11 joint training (toy)" in stdout
  check_summary(summary, a, {"p": 2, "p_fixed": 2})


@pytest.mark.slow   # a second end-to-end run (.ci/run runs the slow tests too)
def test_e2_from_a_data_file(tmp_path):
  data = data_lib.generate(data_lib.DataSpec(n=3, T=4, d=5), 3, np.arange(3))
  path = tmp_path / "d.npz"
  data_lib.save_npz(path, data)
  proc = _run(tmp_path / "o", f"--data={path}", "--steps=200", "--chunk_steps=100", "--block_size=4",
              "--params=W")
  assert proc.returncode == 0, proc.stderr[-3000:]
  a = np.load(tmp_path / "o" / "results.npz")
  assert a["W_final_W"].shape == (3, 5, 5) and a["v_final_W"].shape == (3, 5) and a["selected_W"].shape == (3, 3)
  assert "corr_full_W_fixed" in a.files and "v_final_W_fixed" not in a.files
  # the trained head started at the file's v: moved, but the fixed-head run's v is the file's
  assert not np.allclose(a["v_final_W"], np.asarray(data.v))
  S = len(a["steps"])
  for k in ("corr_v_W", "corr_relaxed_W", "corr_full_W"):
    assert a[k].shape == (3, S) and np.all(np.abs(a[k][np.isfinite(a[k])]) <= 1 + 1e-12)
  ok = a["svm_relaxed_W_status"] == "optimal"
  # the relaxed constraints hold at the solution: >= 1 on support sequences, >= 0 elsewhere
  from svmattn.svm import joint as joint_lib
  for b in np.flatnonzero(ok):
    A, seq = joint_lib.margin_rows(np.asarray(data.X[b]), np.asarray(data.Z[b]), a["selected_W"][b])
    m = A @ a["W_relaxed_W"][b].reshape(-1)
    assert np.all(m >= a["support_W"][b][seq] - 1e-7)


@pytest.mark.parametrize("flags, needle", [
    (["--setting=toy", "--params=W"], "--params=p"),
    pytest.param(["--params=Q"], "--params", marks=pytest.mark.slow),
    pytest.param(["--setting=bogus"], "--setting", marks=pytest.mark.slow),
    pytest.param(["--lr=-1"], "--lr", marks=pytest.mark.slow),
])
def test_bad_flags(tmp_path, flags, needle):
  proc = _run(tmp_path / "o", *flags, timeout=120)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr and needle in proc.stderr
  assert not os.path.exists(tmp_path / "o" / "results.npz")


def test_bad_data_file(tmp_path):
  path = tmp_path / "bad.npz"
  np.savez(path, X=np.zeros((1, 2, 3, 4)), Y=np.ones((1, 2)))
  proc = _run(tmp_path / "o", f"--data={path}", timeout=120)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr and "missing array" in proc.stderr
