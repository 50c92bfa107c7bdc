"""E6 binary end to end at tiny size: orthonormal tokens, the predicted optimum, the
selected sets and the Gen-SVM objects recorded for each lambda, the same data sets at
every lambda, float32, the study rebuilt from its summary's flags; and bad flags."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT, record_matches
from svmattn.analysis import metrics
from svmattn.studies import lambda_head as e6
from svmattn.svm import gensvm
from test_health_studies import check_summary

# End to end through the binary (a few seconds to a minute each): with the slow tests, which CI runs;
# the README's test command keeps the library's own tests.
pytestmark = pytest.mark.slow

LAMS = [0.0, 0.4]
FLAGS = ["--runs=3", "--lams=0,0.4", "--n=2", "--T=3", "--d=5", "--steps=300", "--snapshot_every=100",
         "--lr=0.5", "--batch_size=2", "--noprogress"]   # 2 batches per lambda


def _run(*args):
  env = dict(os.environ, PYTHONPATH=REPO_ROOT)
  return subprocess.run([sys.executable, "-m", "experiments.lambda_head", *args], cwd=REPO_ROOT, env=env,
                        capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def output(tmp_path_factory):
  path = tmp_path_factory.mktemp("e6")
  proc = _run(f"--out={path}", *FLAGS)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return path, np.load(path / "results.npz"), json.loads((path / "summary.json").read_text())


def test_tokens_are_orthonormal_and_the_optimum_is_predicted(output):
  _, r, summary = output
  X = r["X"]
  assert X.shape == (3, 2, 3, 5)
  np.testing.assert_allclose(np.einsum("bntd,bnud->bntu", X, X), np.broadcast_to(np.eye(3), (3, 2, 3, 3)),
                             atol=1e-12)
  np.testing.assert_array_equal(r["lams"], LAMS)
  sizes = []
  for i, lam in enumerate(LAMS):
    s, s_star, O = r[f"attention_l{i}"], r[f"s_star_l{i}"], r[f"selected_l{i}"]
    np.testing.assert_allclose(s_star.sum(-1), 1, atol=1e-12)
    np.testing.assert_array_equal(O, s >= gensvm.TAU_H)
    np.testing.assert_array_equal(r[f"predicted_l{i}"], s_star > 0)
    sizes.append((s_star > 0).sum(-1))
    p = summary["per_lambda"][repr(lam)]
    assert p["mean_selected_all_runs"] == pytest.approx(O.sum(-1).mean())
    assert sum(p["thresholds_rule"].values()) == 3
  assert np.all(sizes[0] == 1) and np.all(sizes[1] >= sizes[0])


def test_gen_svm_objects_are_consistent(output):
  _, r, _ = output
  for i in range(len(LAMS)):
    kept = r[f"kept_l{i}"]
    assert np.any(kept)
    for b in np.flatnonzero(kept):
      W = r[f"W_gd_l{i}"][b]
      res = gensvm.gen_svm(r["X"][b], r["Z"][b], r[f"attention_l{i}"][b], W, apply_discard=False)
      assert res.ok, res.reason
      for obj, key in (("svmeq", "W_svmeq"), ("mm", "W_mm"), ("1token", "W_1token")):
        np.testing.assert_allclose(r[f"W_{obj}_l{i}"][b], getattr(res, key), atol=1e-9)
        np.testing.assert_allclose(r[f"final_{obj}_l{i}"][b], 1 - metrics.corr(W, getattr(res, key)), atol=1e-12)
    assert np.all(np.isnan(r[f"final_svmeq_l{i}"][~kept]))
  np.testing.assert_array_equal(r["Y"], 1.0)
  np.testing.assert_allclose(np.linalg.norm(r["Z"], axis=-1), 1, atol=1e-12)
  np.testing.assert_allclose(np.linalg.norm(r["v"], axis=-1), 1, atol=1e-12)


def test_summary_and_figures(output):
  path, _, summary = output
  for key in ("experiment", "flags", "timings_s", "environment", "checks"):
    assert key in summary
  for check in summary["checks"]:
    assert set(check) - {"note"} == {"name", "value", "expected", "ok"} and isinstance(check["ok"], bool)
  assert (path / "tokens.png").stat().st_size > 0 and (path / "correlation.png").stat().st_size > 0
  check_summary(summary, np.load(path / "results.npz"), {f"l{i}": 3 for i in range(len(LAMS))}, threshold=0.0)


def test_every_lambda_sees_the_same_data_sets_and_the_study_is_rebuilt_from_its_flags(output):
  path, r, summary = output
  study = e6.build(summary["flags"])
  saved = json.loads((path / "runs" / "study.json").read_text())
  assert [[c.label, c.runs] for c in study.cells] == [[c["label"], c["runs"]] for c in saved["cells"]]
  assert [c.label for c in study.cells] == [{"lam": lam} for lam in LAMS]
  assert (study.batch_size, study.seed) == (saved["batch_size"], saved["seed"]) == (2, 0)
  records = [np.load(path / "runs" / f"cell_{c:04d}.npz") for c in range(len(LAMS))]
  for rec in records:
    np.testing.assert_array_equal(rec["runs"], np.arange(3))
    for key in ("X", "Z", "v", "Y"):                   # (matrices: as digests)
      assert record_matches(rec, key, r[key]), key
  # the data sets of the study rebuilt from the flags are the run's
  data = study.load(study.cells[1], np.arange(3))
  np.testing.assert_array_equal(data["X"], r["X"])


def test_float32_runs(tmp_path):
  """Rounded to float32 the tokens are orthonormal to about 1e-6 only: the analysis accepts that."""
  proc = _run(f"--out={tmp_path}", "--runs=2", "--lams=0.4", "--n=2", "--T=3", "--d=5", "--steps=100",
              "--snapshot_every=50", "--lr=0.5", "--precision=float32", "--noprogress")
  assert proc.returncode == 0, proc.stderr[-3000:]
  r = np.load(tmp_path / "results.npz")
  assert r["X"].dtype == np.float64 and r["attention_l0"].shape == (2, 2, 3)
  np.testing.assert_allclose(np.einsum("bntd,bnud->bntu", r["X"], r["X"]), np.broadcast_to(np.eye(3), (2, 2, 3, 3)),
                             atol=1e-5)


def test_more_tokens_than_dimensions_is_a_usage_error(tmp_path):
  out = tmp_path / "out"
  proc = _run(f"--out={out}", "--T=6", "--d=5", "--runs=1", "--lams=0")
  assert proc.returncode != 0 and "T=6" in proc.stderr and "d=5" in proc.stderr
  assert "Traceback" not in proc.stderr
  assert not out.exists()


@pytest.mark.parametrize("flag", ["--lams=-1", "--lams=0,x", "--T=1"])
def test_bad_flags_end_before_anything_is_written(tmp_path, flag):
  out = tmp_path / "out"
  proc = _run(f"--out={out}", "--noprogress", flag)
  assert proc.returncode != 0
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert flag.split("=")[0] in proc.stderr, proc.stderr[-3000:]
  assert not out.exists()
