"""svmattn.train.host_init: the starting parameters drawn by ``rng``'s batched draws are the
parameterizations' own initializations, bit for bit, and shapes share a program per size bucket."""
import jax
import numpy as np
import pytest

from svmattn import rng
from svmattn.models import attention as model_lib
from svmattn.train import host_init
from svmattn.train import loop as train_lib


@pytest.mark.parametrize("param", ["W", "KQ", "p"])
@pytest.mark.parametrize("scheme", ["uniform", "normal", "zero"])
@pytest.mark.parametrize("dtype", [np.float64, pytest.param(np.float32, marks=pytest.mark.slow)])   # (float32: slow tests)
def test_the_start_is_the_parameterizations_init_bit_for_bit(param, scheme, dtype):
  """70 runs (two blocks, the second padded), (K,Q) rectangular: every leaf equals
  Parameterization.init of the run's key, the program each training chunk ran before."""
  d, m, runs = 5, 3, np.arange(70)
  keys = train_lib.init_keys(4, runs)
  init = model_lib.get_parameterization(param).init
  want = jax.jit(jax.vmap(lambda k: init(k, d, m, dtype, scheme)))(keys)
  got = host_init.init_params(param, scheme, np.asarray(keys), d, m, dtype)
  assert sorted(got) == sorted(want)
  for name in want:
    assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
    assert np.array_equal(got[name], np.asarray(want[name])), name
  if scheme != "zero":
    assert not np.array_equal(got[sorted(got)[0]][0], got[sorted(got)[0]][1])     # runs differ


def test_shapes_share_the_draw_programs(monkeypatch):
  """W's uniform and normal starts for d = 3..22 (9..484 values: the uniforms' size buckets 128, 256
  and 512, the normals' one, 512) and (K,Q)'s scaled normal share a program per kind and bucket,
  not one per shape."""
  monkeypatch.setattr(rng, "_PROGRAMS", {})
  keys = np.asarray(train_lib.init_keys(0, np.arange(3)))
  for d in range(3, 23):
    for scheme in ("uniform", "normal"):
      assert host_init.init_params("W", scheme, keys, d, d, np.float64)["W"].shape == (3, d, d)
  assert host_init.init_params("KQ", "zero", keys, 4, 2, np.float64)["K"].shape == (3, 4, 2)
  assert sorted(((p[0], p[1], p[3]) for p in rng.programs() if p[0] != "fold_in"), key=repr) == sorted([
      ("normal", 512, (0.1,)), ("normal", 512, (None,)),
      ("split", 4, ()), ("uniform", 128, ()), ("uniform", 256, ()), ("uniform", 512, ())], key=repr)


def test_training_starts_from_the_drawn_parameters(batch):
  """train() records the drawn start as its first snapshot, and the chunk programs no longer
  hold the initialization (``host_init.supports``)."""
  config = train_lib.TrainConfig(param="W", lr=0.1, steps=4, snapshot_every=2, chunk_steps=4).validate()
  assert host_init.supports(config)
  runs = np.arange(len(batch.X))
  keys = train_lib.init_keys(0, runs)
  traj = train_lib.train(config, batch, keys)
  start = host_init.init_params("W", config.init, np.asarray(keys), batch.X.shape[-1], batch.X.shape[-1], np.float64)
  assert np.array_equal(traj.W[:, 0], start["W"])
