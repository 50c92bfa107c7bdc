"""End-to-end test of experiments/seq_causal.py (E8) at a tiny size, in a subprocess, and its flag checks."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import record_matches

# End to end through the binary (a few seconds to a minute each): with the slow tests, which CI runs;
# the README's test command keeps the library's own tests.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}


def test_seq_causal_binary_end_to_end(tmp_path):
  out = tmp_path / "e8"
  n, T, d, runs = 2, 3, 6, 3
  cmd = [sys.executable, "-m", "experiments.seq_causal", f"--out={out}", f"--runs={runs}", f"--n={n}",
         f"--T={T}", f"--d={d}", "--steps=2000", "--snapshot_every=100", "--chunk_steps=2000",
         "--batch_size=2", "--progress=false"]      # two pipeline batches (2 + 1 data sets)
  proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "E8 seq2seq / causal" in proc.stdout
  for name in ("results.npz", "summary.json", "correlation.png", "softmax.png", "runs/cell_0000.npz"):
    assert (out / name).stat().st_size > 0, name
  assert not (out / "work").exists()

  summary = json.loads((out / "summary.json").read_text())
  for key in ("experiment", "flags", "timings_s", "environment", "checks"):
    assert key in summary, key
  assert summary["flags"]["d"] == d and summary["data_sets"] == runs
  with np.load(out / "results.npz") as f:
    arrays = {k: f[k] for k in f.files}
  with np.load(out / "runs" / "cell_0000.npz") as f:
    record = {k: f[k] for k in f.files}
  np.testing.assert_array_equal(record["runs"], np.arange(runs))
  for key in ("token_scores", "W_final_seq2seq_W", "corr_causal_W", "selected_causal_W"):   # (matrices: digests)
    assert record_matches(record, key, arrays[key]), key
  gamma = arrays["token_scores"]
  assert gamma.shape == (runs, n, T, T)
  S = len(arrays["steps"])
  assert arrays["steps"][-1] == 2000
  checks = {c["name"]: c for c in summary["checks"]}
  for c in summary["checks"]:
    assert set(c) - {"note"} == {"name", "value", "expected", "ok"} and isinstance(c["ok"], bool)
  for mode in ("seq2seq", "causal"):
    name = f"{mode}_W"
    sel = arrays[f"selected_{name}"]
    assert sel.shape == (runs, n, T) and arrays[f"corr_{name}"].shape == (runs, S)
    if mode == "causal":
      assert np.all(sel <= np.arange(T))
    # the reported numbers are computed from the results
    final = arrays[f"corr_{name}"][:, -1]
    solved = arrays[f"svm_{name}_status"] == "optimal"
    np.testing.assert_array_equal(np.isfinite(final), solved)
    stats = summary["final_corr"][f"{name}_vs_fro"]
    assert stats["solved"] == solved.sum()
    np.testing.assert_allclose(stats["mean"], np.nanmean(final), rtol=1e-12)
    (check,) = [c for key, c in checks.items() if key.startswith(f"{mode}: final corr")]
    assert check["value"] == stats["mean"] and check["ok"] == (stats["mean"] >= 0.99)
    opt = arrays[f"optimal_{mode}"]
    visible = np.arange(T)[None, :] <= np.arange(T)[:, None] if mode == "causal" else np.ones((T, T), bool)
    np.testing.assert_array_equal(opt, np.argmax(np.where(visible, gamma, -np.inf), axis=-1))
    scored = slice(1, None) if mode == "causal" else slice(None)
    all_opt = np.all(sel[:, :, scored] == opt[:, :, scored], axis=(1, 2))
    np.testing.assert_array_equal(arrays[f"global_{name}"], all_opt)
    assert summary["global_selection"][name]["runs_all_positions_optimal"] == all_opt.mean()
    W, Wsvm = arrays[f"W_final_{name}"], arrays[f"svm_{name}"]
    direct = np.sum(W * Wsvm, axis=(1, 2)) / (np.linalg.norm(W, axis=(1, 2)) * np.linalg.norm(Wsvm, axis=(1, 2)))
    np.testing.assert_allclose(final, direct, rtol=1e-12)


BAD_FLAGS = ["--T=1", "--d=0", "--modes=seq2seq,bogus", "--params=W,W", "--optimizer=bogus", "--lr=-1"]


@pytest.mark.slow   # long (subprocesses); .ci/run runs the slow tests too
def test_bad_flags(tmp_path):
  """Each bad value: exit status != 0, one error naming the flag, no traceback, no --out directory."""
  procs = {flag: subprocess.Popen([sys.executable, "-m", "experiments.seq_causal", f"--out={tmp_path / str(i)}",
                                   flag], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
           for i, flag in enumerate(BAD_FLAGS)}
  for i, (flag, p) in enumerate(procs.items()):
    _, err = p.communicate(timeout=120)
    assert p.returncode != 0, flag
    assert "Traceback" not in err, (flag, err[-2000:])
    assert "FATAL Flags parsing error" in err and flag.split("=")[0] in err, (flag, err[-2000:])
    assert not os.path.exists(tmp_path / str(i)), flag


def test_data_file_of_another_kind(tmp_path):
  """A single-query data file (Y (B,n)) is not a seq2seq one: one error line naming the problem."""
  from svmattn.data import datasets as data_lib
  data = data_lib.generate(data_lib.DataSpec(2, 3, 4), 0, np.arange(2))
  path = tmp_path / "single_query.npz"
  data_lib.save_npz(path, data_lib.Dataset(*(np.asarray(a) for a in data)))
  out = tmp_path / "out"
  proc = subprocess.run([sys.executable, "-m", "experiments.seq_causal", f"--out={out}", f"--data={path}"],
                        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr
  assert f"error: --data: {path}: seq2seq labels Y must have shape" in proc.stderr, proc.stderr[-2000:]
  assert not out.exists()
