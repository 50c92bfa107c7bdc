"""E1 2-D paths: the binary end to end (on the study pipeline), its data sampler (two_clusters)
and its flag checks."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT, record_matches
from svmattn.analysis import metrics
from test_health_studies import check_summary

# End to end through the binary (a few seconds to a minute each): with the slow tests, which CI runs;
# the README's test command keeps the library's own tests.
pytestmark = pytest.mark.slow

RUNS, STEPS = 24, 300
ENV = dict(os.environ, PYTHONPATH=REPO_ROOT)


@pytest.fixture(scope="module")
def e1(tmp_path_factory):
  out = tmp_path_factory.mktemp("e1")
  # three pipeline batches (10, 10, 4 data sets), analyzed by two worker processes
  proc = subprocess.run([sys.executable, "-m", "experiments.paths_2d", f"--out={out}", f"--runs={RUNS}",
                         f"--steps={STEPS}", "--snapshot_every=10", "--batch_size=10", "--svm_workers=2",
                         "--noprogress"],
                        cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(out / "summary.json") as f:
    summary = json.load(f)
  with np.load(out / "results.npz", allow_pickle=False) as r:
    arrays = dict(r)
  return out, proc, summary, arrays


def test_outputs(e1):
  out, proc, summary, arrays = e1
  assert (out / "paths.png").stat().st_size > 0
  assert "E1 2-D paths" in proc.stdout
  assert not (out / "work").exists() and (out / "runs" / "cell_0000.npz").exists()
  for key in ("experiment", "flags", "timings_s", "environment", "checks", "final_corr"):
    assert key in summary
  assert arrays["X"].shape == (RUNS, 2, 3, 2)
  assert arrays["W_W"].shape == arrays["W_KQ"].shape == (RUNS, STEPS // 10 + 1, 2, 2)
  np.testing.assert_array_equal(arrays["steps"], np.arange(0, STEPS + 1, 10))
  # W(0) = 0; K(0) Q(0)^T = 0 since Q(0) = 0 (init scheme "zero")
  assert np.all(arrays["W_W"][:, 0] == 0) and np.all(arrays["W_KQ"][:, 0] == 0)
  check_summary(summary, arrays, {"W": RUNS, "KQ": RUNS})


def test_sampler_statistics(e1):
  """Tokens 0.3 N(0,1) around (-1,0) (sequence 1) and (+1,0) (sequence 2); unit z and v; Y = +1."""
  _, _, _, arrays = e1
  X = arrays["X"]
  for i, centre in enumerate(([-1.0, 0.0], [1.0, 0.0])):
    tokens = X[:, i].reshape(-1, 2)                                   # 72 tokens
    np.testing.assert_allclose(tokens.mean(0), centre, atol=4 * 0.3 / np.sqrt(len(tokens)))
    np.testing.assert_allclose(tokens.std(0), 0.3, rtol=0.25)
  np.testing.assert_allclose(np.linalg.norm(arrays["Z"], axis=-1), 1.0, rtol=1e-12)
  np.testing.assert_allclose(np.linalg.norm(arrays["v"], axis=-1), 1.0, rtol=1e-12)
  assert np.all(arrays["Y"] == 1.0)
  assert len({arrays["X"][b].tobytes() for b in range(RUNS)}) == RUNS   # distinct data sets


def test_checks_are_computed_from_the_results(e1):
  _, _, summary, arrays = e1
  checks = summary["checks"]
  assert len(checks) == 4
  for c in checks:
    assert set(c) - {"note"} == {"name", "value", "expected", "ok"}
  opt = arrays["optimal_tokens"]
  for k, (p, norm) in enumerate((("W", "fro"), ("KQ", "nuc"))):
    corr = metrics.corr(arrays[f"W_{p}"][:, -1], arrays[f"svm_{norm}"])
    np.testing.assert_allclose(corr, arrays[f"corr_{p}_{norm}"], rtol=1e-12)
    assert checks[2 * k]["value"] == pytest.approx(np.min(corr), rel=1e-12)
    assert checks[2 * k]["ok"] == bool(np.min(corr) >= 0.99)
    share = np.mean(np.all(arrays[f"selected_{p}"] == opt, axis=1))
    assert checks[2 * k + 1]["value"] == pytest.approx(share)
  # the direction moves toward the SVM during training (300 steps already)
  first = metrics.corr(arrays["W_W"][:, 1], arrays["svm_fro"])
  assert np.mean(arrays["corr_W_fro"]) > np.mean(first)
  assert summary["drawn_data_set"] in range(RUNS)


def test_record_holds_every_run(e1):
  """OUT/runs/cell_0000.npz: the per-run arrays of every data set, in run order, as in results.npz."""
  out, _, _, arrays = e1
  with np.load(out / "runs" / "cell_0000.npz", allow_pickle=False) as f:
    record = dict(f)
  np.testing.assert_array_equal(record["runs"], np.arange(RUNS))
  for key in ("X", "W_W", "W_KQ", "corr_W_fro", "svm_nuc", "selected_KQ"):   # (matrices: as digests)
    assert record_matches(record, key, arrays[key]), key


BAD_FLAGS = ["--d=0", "--T=1", "--lr=0", "--snapshot_every=0", "--draw_run=16"]


@pytest.mark.slow   # long (subprocesses); .ci/run runs the slow tests too
def test_bad_flags(tmp_path):
  """Each bad value: exit status != 0, one error naming the flag, no traceback, no --out directory."""
  procs = {flag: subprocess.Popen([sys.executable, "-m", "experiments.paths_2d", f"--out={tmp_path / str(i)}",
                                   flag], cwd=REPO_ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
           for i, flag in enumerate(BAD_FLAGS)}
  for i, (flag, p) in enumerate(procs.items()):
    _, err = p.communicate(timeout=120)
    assert p.returncode != 0, flag
    assert "Traceback" not in err, (flag, err[-2000:])
    assert flag.split("=")[0].lstrip("-") in err, (flag, err[-2000:])
    assert not os.path.exists(tmp_path / str(i)), flag


def test_draw_run_beyond_the_data_file(e1, tmp_path):
  """--draw_run is checked against the data sets of a --data file too (known only once it is read)."""
  _, _, _, arrays = e1
  data = tmp_path / "data.npz"
  np.savez(data, **{k: arrays[k][:3] for k in ("X", "Y", "Z", "v")})
  out = tmp_path / "out"
  proc = subprocess.run([sys.executable, "-m", "experiments.paths_2d", f"--out={out}", f"--data={data}",
                         "--draw_run=3"], cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr
  assert "--draw_run must be -1 (auto) or in [0, 3), got 3" in proc.stderr
  assert not out.exists()
