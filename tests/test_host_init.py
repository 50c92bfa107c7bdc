"""svmattn.train.host_init: the starting parameters drawn by ``rng``'s one draw program are the
parameterizations' own initializations, bit for bit, and every shape shares that program."""
import jax
import numpy as np
import pytest

from conftest import needs_native

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


@pytest.mark.parametrize("native", [pytest.param(True, marks=needs_native), False])
def test_shapes_share_the_draw_program(native, monkeypatch):
  """W's uniform and normal starts for d = 3..20 (9..400 values, one or two chunks), and (K,Q)'s
  scaled normal: where the draws are computed on the host (rng_native) no program at all, and
  without it one program (float64, the draw program) serves them all."""
  from svmattn import rng_native
  if native:
    assert rng_native.available(), rng_native.why_not()
  else:
    monkeypatch.setattr(rng_native, "_state", {"fn": None, "why": "turned off by the test"})
  rng._draw_fn.cache_clear()
  rng._erfinv_fn.cache_clear()
  keys = np.asarray(train_lib.init_keys(0, np.arange(3)))
  for d in range(3, 21):
    for scheme in ("uniform", "normal"):
      assert host_init.init_params("W", scheme, keys, d, d, np.float64)["W"].shape == (3, d, d)
  assert host_init.init_params("KQ", "zero", keys, 4, 2, np.float64)["K"].shape == (3, 4, 2)
  infos = rng._draw_fn.cache_info(), rng._erfinv_fn.cache_info()
  assert sum(i.misses for i in infos) == sum(i.currsize for i in infos) == (0 if native else 1)


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


def test_one_program_whatever_the_dtype_spelling(monkeypatch):
  """np.float64, jnp.float64 and np.dtype("float64") draw in one program (the cache key is the dtype;
  the draw program, with the host's draws turned off)."""
  import jax.numpy as jnp
  from svmattn import rng_native
  monkeypatch.setattr(rng_native, "_state", {"fn": None, "why": "turned off by the test"})
  rng._draw_fn.cache_clear()
  rng._erfinv_fn.cache_clear()
  keys = np.asarray(train_lib.init_keys(0, np.arange(2)))
  for dtype in (np.float64, jnp.float64, np.dtype("float64")):
    rng.normals(keys, 5, dtype)
    rng.uniforms(keys, 5, dtype, -1.0, 1.0)
  assert rng._draw_fn.cache_info().misses == 1 and rng._erfinv_fn.cache_info().misses == 0
