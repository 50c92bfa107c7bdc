"""E2 local convergence: the library claim at small size, and the binary end to end.

Claim (docs/science.md section 4): after 2000 normalized GD steps the direction of W
is that of the Frobenius Att-SVM at the selected tokens, and K Q^T that of the
nuclear-norm Att-SVM.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT, RUNS, SPEC, host
from svmattn.data import datasets as data_lib
from svmattn.models import heads
from svmattn.analysis import metrics
from svmattn.svm import att_svm as svm_lib


@pytest.mark.parametrize("param, norm", [("W", "fro"), ("KQ", "nuc")])
def test_gd_direction_converges_to_the_svm(batch, converged, param, norm):
  tr = converged[param]
  ds = host(batch)
  assert np.all(tr.finite)
  np.testing.assert_array_equal(tr.steps[[0, -1]], [0, 2000])
  for b in range(len(RUNS)):
    r = svm_lib.att_svm(ds.X[b], ds.Z[b], tr.selected[b], norm)
    assert r.ok, r.message
    c = metrics.corr(tr.W[b], r.W)  # along the trajectory
    assert c[-1] >= 0.99, (param, b, c[-1])
    assert c[-1] > c[0]
  # the softmax saturates and the norm grows: for W by about lr per step; for (K,Q) until the
  # eps ridge balances the (exponentially small) loss gradient
  assert np.all(tr.max_prob[:, -1] > 0.99)
  norms = np.linalg.norm(tr.W, axis=(-2, -1))
  if param == "W":
    assert np.all(np.diff(norms[:, 1:], axis=1) > 0)
    assert np.all(norms[:, -1] > 0.9 * 0.1 * 2000)
  else:
    assert np.all(norms[:, -1] > 20 * norms[:, 0])


# ----------------------------------------------------------------------------
# The binary, end to end
# ----------------------------------------------------------------------------

E2E_SPEC = data_lib.DataSpec(n=3, T=4, d=5)
E2E_FLAGS = ["--runs=3", "--steps=200", "--n=3", "--T=4", "--d=5"]
S = 200 // 10 + 1  # snapshots: every 10 steps, and step 0


def _run(*args):
  env = dict(os.environ, PYTHONPATH=REPO_ROOT)
  return subprocess.run([sys.executable, "-m", "experiments.local_convergence", *args], cwd=REPO_ROOT, env=env,
                        capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def generated_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("e2_generated")
  proc = _run(f"--out={out}", *E2E_FLAGS)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return out, proc


@pytest.fixture(scope="module")
def e2e_data(tmp_path_factory):
  """The data sets the generated run draws (runs 0..2 of seed 0), saved with data.save_npz."""
  path = tmp_path_factory.mktemp("e2_data") / "sets.npz"
  data_lib.save_npz(path, data_lib.generate(E2E_SPEC, 0, np.arange(3)))
  return path


def _load(out):
  with np.load(out / "results.npz", allow_pickle=False) as f:
    arrays = {k: f[k] for k in f.files}
  with open(out / "summary.json") as f:
    summary = json.load(f)
  return arrays, summary


def _check_outputs(out, B):
  assert sorted(os.listdir(out)) == ["correlation.png", "results.npz", "runs", "softmax.png", "summary.json"]
  for png in ("softmax.png", "correlation.png"):
    assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  arrays, summary = _load(out)
  np.testing.assert_array_equal(arrays["steps"], np.arange(0, 201, 10))
  for p, own in (("W", "fro"), ("KQ", "nuc")):
    assert arrays[f"W_final_{p}"].shape == (B, 5, 5)
    assert arrays[f"selected_{p}"].shape == (B, 3)
    np.testing.assert_array_equal(arrays[f"selected_{p}"], np.argmax(arrays[f"attention_{p}"], -1))
    for norm in ("fro", "nuc"):
      curve = arrays[f"corr_{p}_{norm}"]
      assert curve.shape == (B, S) and np.all(np.abs(curve) <= 1)
      np.testing.assert_allclose(curve[:, -1], metrics.corr(arrays[f"W_final_{p}"], arrays[f"svm_{norm}_{p}"]),
                                 rtol=1e-12)
      assert arrays[f"svm_{norm}_{p}_status"].tolist() == ["optimal"] * B
    assert arrays[f"max_prob_{p}"].shape == (B, S)
  assert {"svm_fro_W", "svm_nuc_KQ"} <= set(arrays)
  assert summary["experiment"] and summary["environment"]["jax"]
  assert summary["flags"]["steps"] == 200 and summary["flags"]["d"] == 5
  assert summary["data_sets"] == B and summary["timings_s"]["total"] > 0
  assert summary["final_corr"]["W_vs_fro"]["solved"] == B
  np.testing.assert_allclose(summary["final_corr"]["W_vs_fro"]["mean"], np.mean(arrays["corr_W_fro"][:, -1]),
                             rtol=1e-12)
  return arrays, summary


def test_binary_generated(generated_run):
  out, proc = generated_run
  _check_outputs(out, 3)
  assert "progress label=train " in proc.stderr and "progress label=svm " in proc.stderr  # structured lines
  assert "corr W_vs_fro" in proc.stdout


def test_summary_has_checks_and_only_the_binarys_flags(generated_run):
  """The project's summary.json contract: a list of checks computed from the results, and flags
  (common.flag_values()) without absl's own help flags."""
  _, summary = _load(generated_run[0])
  assert "help" not in summary["flags"] and "?" not in summary["flags"]
  checks = summary.get("checks")
  assert isinstance(checks, list) and checks, "summary.json has no 'checks' list"
  for c in checks:
    assert set(c) >= {"name", "value", "expected", "ok"} and isinstance(c["ok"], bool)


@pytest.mark.slow   # (the fast set keeps a sibling of this check; CI runs the slow ones too)
def test_binary_with_data_file(generated_run, e2e_data, tmp_path):
  """--data=FILE with the very data sets the generated run drew gives the same results."""
  proc = _run(f"--out={tmp_path}", f"--data={e2e_data}", *E2E_FLAGS)
  assert proc.returncode == 0, proc.stderr[-3000:]
  arrays, summary = _check_outputs(tmp_path, 3)
  assert summary["flags"]["data"] == str(e2e_data)
  reference, _ = _load(generated_run[0])
  for key in ("W_final_W", "W_final_KQ", "corr_W_fro", "corr_KQ_nuc", "svm_fro_W", "svm_nuc_KQ"):
    np.testing.assert_allclose(arrays[key], reference[key], rtol=1e-10, atol=1e-12, err_msg=key)
  for key in ("selected_W", "selected_KQ", "optimal_tokens"):
    np.testing.assert_array_equal(arrays[key], reference[key])
  # the SVMs are those of the file's data at the selected tokens
  ds = data_lib.load_npz(e2e_data)
  for b in range(3):
    r = svm_lib.att_svm(ds.X[b], ds.Z[b], arrays["selected_W"][b])
    np.testing.assert_allclose(arrays["svm_fro_W"][b], r.W, rtol=1e-12, atol=1e-12)
    gamma = np.asarray(heads.token_scores(heads.LINEAR, ds.v[b], ds.X[b], ds.Y[b]))
    np.testing.assert_array_equal(arrays["optimal_tokens"][b], metrics.optimal_tokens(gamma))


@pytest.mark.slow   # (test_bad_input.py keeps a bad data file in the fast set; CI runs the slow ones too)
def test_binary_bad_data_file(e2e_data, tmp_path):
  """A truncated .npz: non-zero exit, the file and the problem named, no results written.
  (Every other kind of bad file goes through the same data.load_npz, see test_data.py.)"""
  bad = tmp_path / "bad.npz"
  bad.write_bytes(e2e_data.read_bytes()[:300])
  out = tmp_path / "out"
  proc = _run(f"--out={out}", f"--data={bad}", *E2E_FLAGS)
  assert proc.returncode != 0
  assert f"{bad}: not a readable .npz data file" in proc.stderr
  assert not os.path.exists(out / "results.npz") and not os.path.exists(out / "summary.json")


@pytest.mark.slow   # (CI runs it with the slow tests: the test command stays under 5 minutes)
def test_identical_tokens_are_ties_not_global(tmp_path):
  """A data file whose tokens are all identical: every optimal token is tied, every SVM is
  infeasible, and the runs are counted as ties (never as global convergence)."""
  D = data_lib.generate(data_lib.DataSpec(3, 4, 5), 0, np.arange(3))
  X = np.repeat(np.asarray(D.X)[:, :, :1], 4, axis=2)          # token 0 copied to every position
  path = tmp_path / "ties.npz"
  data_lib.save_npz(path, data_lib.Dataset(X, np.asarray(D.Y), np.asarray(D.Z), np.asarray(D.v)))
  out = tmp_path / "out"
  proc = subprocess.run([sys.executable, "-m", "experiments.local_convergence", f"--out={out}", f"--data={path}",
                         "--steps=20", "--chunk_steps=20", "--noprogress"], cwd=REPO_ROOT, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(out / "summary.json") as f:
    summary = json.load(f)
  for p in ("W", "KQ"):
    assert summary["convergence_types"][p]["tie"] == 1.0 and summary["convergence_types"][p]["global"] == 0.0
    assert summary["svm_status"][f"fro_{p}"]["infeasible"] == 3
  with np.load(out / "results.npz") as a:
    assert set(a["convergence_type_W"]) == {"tie"}
