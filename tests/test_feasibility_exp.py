"""End-to-end test of experiments/feasibility.py (E9) at a tiny size, in a subprocess."""
import os

import jax
import numpy as np

from conftest import run_binary

import svmattn  # noqa: F401  (float64)
from svmattn.data import datasets as data_lib
from svmattn.svm import feasibility as feas_lib
from svmattn.models import heads
from svmattn.analysis import metrics
import pytest

# End to end through the binary (a few seconds to a minute each): with the slow tests, which CI runs;
# the README's test command keeps the library's own tests.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_feasibility_experiment_end_to_end(tmp_path):
  n, T, runs, seed = 3, 3, 40, 2
  summary, a = run_binary("experiments.feasibility", tmp_path, f"--runs={runs}", f"--shapes={n}:{T}",
                          "--d_min=1", "--d_max=3", "--batch=16", f"--seed={seed}")
  for key in ("experiment", "flags", "timings_s", "environment", "checks"):
    assert key in summary
  for c in summary["checks"]:
    assert set(c) - {"note"} == {"name", "value", "expected", "ok"} and isinstance(c["ok"], bool)
  assert os.path.getsize(tmp_path / "feasibility.png") > 0
  feasible = a["feasible"]
  assert feasible.shape == (1, 2, 3, runs)
  np.testing.assert_allclose(a["fraction"], feasible.mean(-1))
  assert list(a["alphas"]) == ["opt", "random"]
  # replay d = 2 (two batches of 16 and one of 8): opt and the run's random alpha
  spec = data_lib.DataSpec(n, T, 2)
  ds = data_lib.generate(spec, seed, np.arange(runs))
  gamma = np.asarray(jax.vmap(lambda v, X, Y: heads.token_scores(heads.LINEAR, v, X, Y))(ds.v, ds.X, ds.Y))
  X, Z = np.asarray(ds.X), np.asarray(ds.Z)
  rand = np.stack([np.asarray(jax.random.randint(data_lib.split_run_key(data_lib.run_key(seed, r))[1], (n,), 0, T))
                   for r in range(runs)])
  np.testing.assert_array_equal(feasible[0, 0, 1], feas_lib.is_feasible(X, Z, metrics.optimal_tokens(gamma)))
  np.testing.assert_array_equal(feasible[0, 1, 1], feas_lib.is_feasible(X, Z, rand))
  # d = 3 = max(T-1, n): always feasible; d = 1 (unit tokens are +-1, often tied): mostly not
  assert np.all(feasible[0, :, 2])
  assert np.all(a["fraction"][0, :, 0] < 0.5)
  checks = {c["name"]: c for c in summary["checks"]}
  key = f"feasible fraction at d >= max(T-1,n)=3, n={n} T={T}, alpha=opt (min)"
  assert checks[key]["value"] == 1.0 and checks[key]["ok"]


def test_bad_flags_fail_cleanly(tmp_path):
  from test_svm_rank import bad_flags_fail_cleanly
  bad_flags_fail_cleanly("experiments.feasibility", ("--runs=2", "--shapes=3:3", "--d_max=3"), [
      ("--runs=0", "runs"), ("--shapes=5:1", "shapes"), ("--d_min=3 --d_max=2", "flags d_min=3, d_max=2"),
      ("--alphas=opt,best", "alphas"), ("--batch=0", "batch_size")], tmp_path / "out")
