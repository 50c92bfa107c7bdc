"""E5 binary end to end at tiny size: kept runs pass the rules, the recorded Gen-SVM
objects and correlations are consistent with the recorded data, the counts add up,
and the kept set does not depend on the batch size."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT
from svmattn.data import datasets as data_lib
from svmattn.svm import gensvm
from svmattn.models import heads
from svmattn.analysis import metrics

FLAGS = ["--ds=4", "--runs=3", "--steps=300", "--snapshot_every=50", "--lr=0.5", "--noprogress"]


def _run(out, *args):
  env = dict(os.environ, PYTHONPATH=REPO_ROOT)
  return subprocess.run([sys.executable, "-m", "experiments.multi_token", f"--out={out}", *FLAGS, *args],
                        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
  out = {}
  for batch in (16, 5):
    path = tmp_path_factory.mktemp(f"e5_b{batch}")
    proc = _run(path, f"--batch={batch}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out[batch] = (path, proc.stdout)
  return out


def test_results_are_consistent(outputs):
  path, stdout = outputs[16]
  assert "E5 multi-token" in stdout
  r = np.load(path / "results.npz")
  summary = json.loads((path / "summary.json").read_text())
  runs = r["runs_d4"]
  assert len(runs) == 3 and np.all(np.diff(runs) > 0)
  np.testing.assert_array_equal(r["steps"], np.arange(0, 301, 50))
  # the recorded data are the generator's data sets of those runs, all with a negative label
  spec = data_lib.DataSpec(3, 4, 4)
  regen = data_lib.generate(spec, 0, runs, heads.RELU)
  for name, key in (("X", "X_d4"), ("Z", "Z_d4"), ("v", "V_d4"), ("Y", "Y_d4")):
    np.testing.assert_array_equal(np.asarray(getattr(regen, name)), r[key])
  assert np.all(np.any(r["Y_d4"] < 0, axis=1))
  for b in range(len(runs)):
    s, W = r["attention_d4"][b], r["W_gd_d4"][b]
    assert gensvm.discard_reason(s) == ""
    res = gensvm.gen_svm(r["X_d4"][b], r["Z_d4"][b], s, W)
    assert res.ok
    np.testing.assert_allclose(res.W_svmeq, r["W_svmeq_d4"][b], atol=1e-9)
    for obj in ("svmeq", "mm", "1token"):
      np.testing.assert_allclose(r[f"corr_{obj}_d4"][b, -1], metrics.corr(W, r[f"W_{obj}_d4"][b]), atol=1e-12)
  # counts: every drawn run is skipped or trained; every trained run has one outcome
  c = summary["per_d"]["4"]["counts"]
  assert c["drawn"] == runs[-1] + 1 == c["skipped_no_negative_label"] + c["trained"]
  assert c["trained"] == sum(c[k] for k in ("kept", "intermediate", "finite", "infeasible", "failed"))
  assert c["kept"] == 3
  outcomes = r["trained_outcome_d4"]
  np.testing.assert_array_equal(r["trained_runs_d4"][outcomes == "kept"], runs)
  for key in ("experiment", "flags", "timings_s", "environment", "checks"):
    assert key in summary
  for check in summary["checks"]:
    assert set(check) == {"name", "value", "expected", "ok"} and isinstance(check["ok"], bool)
  assert (path / "correlation.png").stat().st_size > 0 and (path / "scatter.png").stat().st_size > 0


def test_kept_runs_do_not_depend_on_the_batch_size(outputs):
  a, b = (np.load(outputs[k][0] / "results.npz") for k in (16, 5))
  np.testing.assert_array_equal(a["runs_d4"], b["runs_d4"])
  np.testing.assert_array_equal(a["trained_runs_d4"], b["trained_runs_d4"])
  np.testing.assert_array_equal(a["trained_outcome_d4"], b["trained_outcome_d4"])
  np.testing.assert_allclose(a["corr_svmeq_d4"], b["corr_svmeq_d4"], atol=1e-9)
