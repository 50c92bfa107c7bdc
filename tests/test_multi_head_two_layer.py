"""E14 (experiments.multi_head) and E15 (experiments.two_layer) end to end at a tiny size, and their studies.

Checked:
  * both binaries (3 data sets, n=3, T=4, d=5, 150 steps in chunks of 50, W and (K,Q)) write
    results.npz, summary.json and their figure; every array has the shape the binary's docstring
    gives; correlations lie in [-1, 1] where finite (NaN exactly where the SVM was not solved);
    softmax statistics are in range; summary.json's numbers are the means / counts of the arrays;
  * E14: each head's share of sequences where the heads agree is the one recomputed from the heads'
    selections, and for H=2 "all the same" + "all different" is 1 for every data set (two heads
    either agree or not); the sum's W_final is the sum of the heads' and its selection is
    argmax_t x_t^T W_sum z of the regenerated data;
  * E15: layer 1's selection is (B,n,T) (every token a query), its "attends to itself" share is
    recomputed from it;
  * the shared-head variant of E14 (the study run in-process through svmattn.execution.pipeline, one
    head v (d,) per data set) and the per-head vectors (unit norm, the same for a run in any batch);
  * bad flags (E14 --heads=0 and --params=V, E15 --T=1) end the binaries before anything is written,
    naming the flag, with no traceback; e14.build refuses heads < 1.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT
from svmattn.data import datasets as data_lib
from svmattn.execution import pipeline
from svmattn.studies import multi_head
from svmattn.studies import two_layer as e15
from test_health_studies import check_summary
from test_sweep import ENV

# End to end through the binary (a few seconds to a minute each): with the slow tests, which CI runs;
# the README's test command keeps the library's own tests.
pytestmark = pytest.mark.slow

RUNS, N, T, D, STEPS, EVERY = 3, 3, 4, 5, 150, 10
S = STEPS // EVERY + 1
SIZES = [f"--runs={RUNS}", f"--n={N}", f"--T={T}", f"--d={D}", f"--steps={STEPS}", "--chunk_steps=50",
         f"--snapshot_every={EVERY}", "--block_size=4", "--noprogress"]
STATUSES = {"optimal", "infeasible", "failed", "diverged"}       # svm.att_svm.STATUSES and "diverged"


def _popen(module, out, *flags):
  return subprocess.Popen([sys.executable, "-m", module, f"--out={out}", *flags], cwd=REPO_ROOT, env=ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
  """{"multi_head": (out, stdout), "two_layer": (out, stdout)}: both binaries, run side by side."""
  procs = {}
  for module, extra in (("multi_head", ["--heads=2"]), ("two_layer", [])):
    out = tmp_path_factory.mktemp(module)
    procs[module] = (out, _popen(f"experiments.{module}", out, *SIZES, *extra))
  done = {}
  for module, (out, proc) in procs.items():
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    done[module] = (out, stdout)
  return done


def _load(out):
  with np.load(out / "results.npz") as f:
    arrays = {k: f[k] for k in f.files}
  return arrays, json.loads((out / "summary.json").read_text())


def _data():
  """The binaries' data sets (E2's generator, seed 0, runs 0..2)."""
  return data_lib.generate(data_lib.DataSpec(N, T, D), 0, np.arange(RUNS))


def _check_stats(row, x):
  """A summary entry {mean, min, median} is that of the finite values of x."""
  x = np.asarray(x, np.float64)
  x = x[np.isfinite(x)]
  if not x.size:
    assert row is None
    return
  assert row["mean"] == pytest.approx(np.mean(x), rel=1e-12, abs=1e-15)
  assert row["min"] == pytest.approx(np.min(x), rel=1e-12, abs=1e-15)
  assert row["median"] == pytest.approx(np.median(x), rel=1e-12, abs=1e-15)


def _check_attention(a, prefix, selected_shape=(RUNS, N)):
  """The per-attention arrays <prefix>_{selected, max_prob, above_tau, svm_status, corr, W_final}."""
  assert a[f"{prefix}_selected"].shape == selected_shape
  assert np.all((a[f"{prefix}_selected"] >= 0) & (a[f"{prefix}_selected"] < T))
  if not prefix.endswith("_sum"):      # the sum of the heads' matrices has no softmax of its own
    mp, above = a[f"{prefix}_max_prob"], a[f"{prefix}_above_tau"]
    assert mp.shape == above.shape == (RUNS,)
    assert np.all((mp >= 1.0 / T - 1e-12) & (mp <= 1 + 1e-12)) and np.all((above >= 1) & (above <= T))
  status, corr = a[f"{prefix}_svm_status"], a[f"{prefix}_corr"]
  assert status.shape == (RUNS,) and set(status.tolist()) <= STATUSES
  assert corr.shape == (RUNS, S)
  solved = status == "optimal"
  assert solved.any(), status
  assert np.all(np.isfinite(corr[solved])) and np.all(np.abs(corr[solved]) <= 1 + 1e-12)
  assert np.all(np.isnan(corr[~solved]))
  if f"{prefix}_W_final" in a:
    assert a[f"{prefix}_W_final"].shape == (RUNS, D, D)


# ----------------------------------------------------------------------------
# E14: multi-head attention
# ----------------------------------------------------------------------------

def test_multi_head_outputs(outputs):
  out, stdout = outputs["multi_head"]
  for name in ("results.npz", "summary.json", "heads.png"):
    assert os.path.getsize(out / name) > 0
  assert not (out / "work").exists()
  a, summary = _load(out)
  np.testing.assert_array_equal(a["steps"], np.arange(0, STEPS + 1, EVERY))
  np.testing.assert_array_equal(a["runs"], np.arange(RUNS))
  data = _data()
  X, Z = np.asarray(data.X), np.asarray(data.Z)
  assert summary["heads"] == 2 and summary["shared_head"] is False and summary["data_sets"] == RUNS
  assert sorted(summary["params"]) == ["KQ", "W"]
  for p in ("W", "KQ"):
    for h in ("head0", "head1"):
      _check_attention(a, f"{p}_{h}")
    _check_attention(a, f"{p}_sum")
    assert a[f"{p}_W_final"].shape == (RUNS, D, D) and a[f"{p}_finite"].shape == (RUNS,)
    assert np.all(a[f"{p}_finite"])
    np.testing.assert_allclose(a[f"{p}_W_final"], a[f"{p}_head0_W_final"] + a[f"{p}_head1_W_final"],
                               rtol=0, atol=1e-12)
    # the sum's selection: argmax_t x_t^T (W_0 + W_1) z
    logits = np.einsum("bntd,bde,bne->bnt", X, a[f"{p}_W_final"], Z)
    np.testing.assert_array_equal(a[f"{p}_sum_selected"], np.argmax(logits, axis=-1))
    # agreement of the two heads, per data set: a share of the n sequences
    same, different = a[f"{p}_all_same"], a[f"{p}_all_different"]
    assert same.shape == different.shape == (RUNS,)
    agree = a[f"{p}_head0_selected"] == a[f"{p}_head1_selected"]
    np.testing.assert_array_equal(same, agree.mean(axis=1))
    np.testing.assert_array_equal(different, (~agree).mean(axis=1))
    assert np.all((same >= 0) & (same <= 1)) and np.all((different >= 0) & (different <= 1))
    np.testing.assert_allclose(same + different, 1.0, rtol=0, atol=1e-15)   # H=2: equal or different
    # summary.json: the means and counts of these arrays
    row = summary["params"][p]
    assert sorted(row["heads"]) == ["head0", "head1"]
    for h, e in row["heads"].items():
      _check_stats(e["max_prob"], a[f"{p}_{h}_max_prob"])
      _check_stats(e["tokens_above_tau"], a[f"{p}_{h}_above_tau"])
      _check_stats(e["corr_final"], a[f"{p}_{h}_corr"][:, -1])
      assert e["svm_solved"] == int(np.sum(a[f"{p}_{h}_svm_status"] == "optimal"))
    _check_stats(row["all_heads_same_token"], same)
    _check_stats(row["all_heads_different_tokens"], different)
    assert row["sum"]["svm_norm"] == ("nuc" if p == "KQ" else "fro")
    assert row["sum"]["svm_solved"] == int(np.sum(a[f"{p}_sum_svm_status"] == "optimal"))
    _check_stats(row["sum"]["corr_final"], a[f"{p}_sum_corr"][:, -1])
    assert row["diverged"] == 0
  assert "E14 multi-head attention: 2 heads" in stdout
  check_summary(summary, a, {"W": RUNS, "KQ": RUNS})


def test_head_vectors_are_unit_and_do_not_depend_on_the_batch():
  v = multi_head.head_vectors(0, 3, D, np.arange(4))
  assert v.shape == (4, 3, D)
  np.testing.assert_allclose(np.linalg.norm(v, axis=-1), 1.0, rtol=0, atol=1e-14)
  np.testing.assert_array_equal(multi_head.head_vectors(0, 3, D, np.array([2])), v[2:3])
  assert np.abs(v[:, 0] - v[:, 1]).max() > 1e-3                       # heads differ
  assert np.abs(multi_head.head_vectors(1, 3, D, np.arange(4)) - v).max() > 1e-3   # seeds differ


def _flags(**kw):
  """E14's settings (the declared defaults, then these sizes; not validated: a bad one reaches build)."""
  fl = {**multi_head.SETTINGS.defaults(), "n": N, "T": T, "d": D, "runs": RUNS, "seed": 0, "heads": 2, "shared_head": True, "params": ["W"],
        "steps": STEPS, "lr": 0.1, "snapshot_every": EVERY, "chunk_steps": 50, "block_size": 4, "batch_size": 2,
        "optimizer": "normalized_gd", "numerics": "exact", "data": None}
  fl.update(kw)
  return fl


def test_multi_head_shared_head_through_the_pipeline(tmp_path):
  """--shared_head: every head reads the data set's own v (d,); the study runs in-process (2 batches)."""
  fl = _flags()
  study = multi_head.build(fl)
  data = _data()
  loaded = study.load(study.cells[0], np.arange(2))
  np.testing.assert_array_equal(loaded["v"], np.asarray(data.v)[:2])                      # (B, d)
  per_head = multi_head.build(_flags(shared_head=False)).load(study.cells[0], np.arange(2))["v"]
  np.testing.assert_array_equal(per_head, multi_head.head_vectors(0, 2, D, np.arange(2)))         # (B, H, d)
  output = pipeline.run(study, str(tmp_path), workers=0, show_progress=False)
  arrays, summary = multi_head.reduce(fl, output.cells[0])
  np.testing.assert_array_equal(arrays["runs"], np.arange(RUNS))
  assert summary["shared_head"] is True and summary["heads"] == 2 and list(summary["params"]) == ["W"]
  for h in ("head0", "head1"):
    _check_attention(arrays, f"W_{h}")
  _check_attention(arrays, "W_sum")
  np.testing.assert_allclose(arrays["W_all_same"] + arrays["W_all_different"], 1.0, rtol=0, atol=1e-15)
  np.testing.assert_allclose(arrays["W_W_final"], arrays["W_head0_W_final"] + arrays["W_head1_W_final"],
                             rtol=0, atol=1e-12)
  # the two heads start apart (their own initializations), so they are two different matrices
  assert np.abs(arrays["W_head0_W_final"] - arrays["W_head1_W_final"]).max() > 1e-2
  _check_stats(summary["params"]["W"]["all_heads_same_token"], arrays["W_all_same"])


def test_build_refuses_no_heads():
  with pytest.raises(ValueError, match="heads must be positive"):
    multi_head.build(_flags(heads=0))


# ----------------------------------------------------------------------------
# E15: two-layer attention
# ----------------------------------------------------------------------------

def test_two_layer_outputs(outputs):
  out, stdout = outputs["two_layer"]
  for name in ("results.npz", "summary.json", "layers.png"):
    assert os.path.getsize(out / name) > 0
  assert not (out / "work").exists()
  a, summary = _load(out)
  np.testing.assert_array_equal(a["steps"], np.arange(0, STEPS + 1, EVERY))
  np.testing.assert_array_equal(a["runs"], np.arange(RUNS))
  assert summary["data_sets"] == RUNS and sorted(summary["params"]) == ["KQ", "W"]
  for p in ("W", "KQ"):
    _check_attention(a, f"{p}_layer1", selected_shape=(RUNS, N, T))
    _check_attention(a, f"{p}_layer2")
    assert np.all(a[f"{p}_finite"])
    share = a[f"{p}_layer1_self"]
    assert share.shape == (RUNS,) and np.all((share >= 0) & (share <= 1))
    np.testing.assert_array_equal(share, np.mean(a[f"{p}_layer1_selected"] == np.arange(T), axis=(1, 2)))
    assert np.abs(a[f"{p}_layer1_W_final"] - a[f"{p}_layer2_W_final"]).max() > 1e-2   # two matrices
    row = summary["params"][p]
    for layer in ("layer1", "layer2"):
      e = row[layer]
      _check_stats(e["max_prob"], a[f"{p}_{layer}_max_prob"])
      _check_stats(e["tokens_above_tau"], a[f"{p}_{layer}_above_tau"])
      _check_stats(e["corr_final"], a[f"{p}_{layer}_corr"][:, -1])
      assert e["svm_solved"] == int(np.sum(a[f"{p}_{layer}_svm_status"] == "optimal"))
      assert e["svm_infeasible"] == int(np.sum(a[f"{p}_{layer}_svm_status"] == "infeasible"))
    _check_stats(row["layer1"]["attends_to_itself"], share)
    assert row["diverged"] == 0
  assert "E15 two-layer attention: 3 data sets" in stdout
  check_summary(summary, a, {"W": RUNS, "KQ": RUNS})


def test_two_layer_study_configs():
  cfgs = e15.configs({**e15.SETTINGS.defaults(), **_flags(params=["W", "KQ"])})
  assert [p for p, _ in cfgs] == ["W", "KQ"]
  assert [c.module.param_kind for _, c in cfgs] == ["W", "KQ"]
  assert all(c.steps == STEPS and c.block_size == 4 for _, c in cfgs)


# ----------------------------------------------------------------------------
# Bad flags
# ----------------------------------------------------------------------------

BAD = [("multi_head", "--heads=0"), ("multi_head", "--params=V"), ("two_layer", "--T=1")]


def test_bad_flags_fail_before_anything_is_written(tmp_path):
  procs = [(module, flag, tmp_path / str(i), _popen(f"experiments.{module}", tmp_path / str(i), flag))
           for i, (module, flag) in enumerate(BAD)]
  for module, flag, out, proc in procs:
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, (module, flag)
    assert "Traceback" not in err, (module, flag, err[-2000:])
    assert flag.split("=")[0] in err, (module, flag, err[-2000:])
    assert not os.path.exists(out), (module, flag)
