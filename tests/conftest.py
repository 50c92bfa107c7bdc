"""Shared fixtures: small data sets and trajectories, built once per test session.

Compiling is the expensive part of the suite (about a second per training
configuration and shape), so every test module reuses these fixtures and the
jit caches of ``svmattn.data.datasets`` and ``svmattn.train.loop`` instead of building its own.
"""
import os
import sys

import numpy as np
import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

import svmattn  # noqa: E402

svmattn.configure()        # float64 and one CPU device per core, as the engine's programs set JAX up
from svmattn import native_build  # noqa: E402
from svmattn.data import datasets as data_lib  # noqa: E402
from svmattn.train import loop as train_lib  # noqa: E402

# Why this machine builds no native code (no C++ compiler, not x86-64, ...), or None. Tests of the
# native code itself skip with that reason; everything else runs on the JAX path there.
NO_NATIVE = native_build.why_unbuildable(native_build.compiler())
needs_native = pytest.mark.skipif(NO_NATIVE is not None, reason=f"the native code is not built here: {NO_NATIVE}")

# The shape of most tests: d >= max(T-1, n), so every Att-SVM is feasible.
SPEC = data_lib.DataSpec(n=3, T=4, d=6)
SEED = 0
RUNS = np.arange(4)

# A short run whose step count is not a multiple of snapshot_every, in chunks
# that are not a multiple of it either: schedule [(10, 2), (5, 1)].
SMALL = train_lib.TrainConfig(param="W", steps=25, snapshot_every=10, chunk_steps=20)
SMALL_STEPS = [0, 10, 20, 25]

# The convergence runs: 2000 normalized GD steps (lr 0.1), as in the paper.
CONVERGED = {p: train_lib.TrainConfig(param=p, steps=2000, snapshot_every=100, chunk_steps=1000)
             for p in ("W", "KQ")}


@pytest.fixture(scope="session")
def batch():
  """B=4 data sets (runs 0..3 of seed 0): X (4,3,4,6), Y (4,3), Z (4,3,6), v (4,6)."""
  return data_lib.generate(SPEC, SEED, RUNS)


@pytest.fixture(scope="session")
def batch32():
  """The same data sets drawn in float32."""
  return data_lib.generate(SPEC, SEED, RUNS, dtype=np.float32)


@pytest.fixture(scope="session")
def keys():
  """Initialization keys of runs 0..3 of seed 0."""
  return train_lib.init_keys(SEED, RUNS)


@pytest.fixture(scope="session")
def small_run(batch, keys):
  """SMALL trained on the batch (B=4)."""
  return train_lib.train(SMALL, batch, keys)


@pytest.fixture(scope="session")
def converged(batch, keys):
  """{"W": Trajectory, "KQ": Trajectory} after 2000 normalized GD steps on the batch."""
  return {p: train_lib.train(cfg, batch, keys) for p, cfg in CONVERGED.items()}


def host(batch_data):
  """A Dataset batch as float64 NumPy arrays."""
  return data_lib.Dataset(*(np.asarray(a, np.float64) for a in batch_data))


def run_binary(module, out, *flags):
  """Run ``python -m module --out=out flags`` (must succeed); returns (summary dict, results arrays)."""
  import json
  import subprocess
  env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  proc = subprocess.run([sys.executable, "-m", module, f"--out={out}", "--progress=false", *flags],
                        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(out, "summary.json")) as f:
    summary = json.load(f)
  with np.load(os.path.join(out, "results.npz")) as f:
    arrays = {k: f[k] for k in f.files}
  return summary, arrays


def record_matches(record: dict, key: str, want) -> bool:
  """A per-run record's array ``key`` equals ``want`` (B, ...): the array itself, or for a per-run
  matrix of a lean record (``execution.study_runner.lean``) its digests."""
  from svmattn.execution import study_runner
  want = np.asarray(want)
  if key in record:
    return bool(np.array_equal(record[key], want, equal_nan=want.dtype.kind in "fc"))
  return bool(np.array_equal(record[key + study_runner.DIGEST], study_runner.row_digests(want)))
