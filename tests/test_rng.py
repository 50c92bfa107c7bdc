"""svmattn.rng's keys and coin flips on the host: JAX's threefry values, bit for bit.

Key derivation (fold_in, split) and fair coin flips are integer arithmetic, computed in NumPy
without a compiled program; each must equal what jax.random computes, on every key, size and
seed (the data sets and starting points of every version depend on them)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from svmattn import rng
from svmattn.data import datasets as data_lib
from svmattn.train import loop as train_lib

RUNS = np.concatenate([np.arange(0, 2000, 7), [2**31 - 1, 2**31, 2**32 - 1]]).astype(np.uint32)


SLOW = pytest.mark.slow   # (each case compiles JAX's reference; the siblings run with the slow tests)


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=SLOW), pytest.param(12345, marks=SLOW),
                                  pytest.param(2**31, marks=SLOW), 2**32 - 1])
def test_run_keys_are_jax_fold_in(seed):
  ref = np.asarray(jax.vmap(lambda r: rng.run_key(seed, r))(jnp.asarray(RUNS)))
  np.testing.assert_array_equal(rng.run_keys(seed, RUNS), ref)


@pytest.mark.parametrize("num", [pytest.param(1, marks=SLOW), 2, 4, pytest.param(5, marks=SLOW)])
def test_split_is_jax_split(num):
  keys = rng.run_keys(3, RUNS)
  ref = np.asarray(jax.vmap(lambda k: jax.random.split(k, num))(jnp.asarray(keys)))
  np.testing.assert_array_equal(rng.split_host(keys, num), ref)


@pytest.mark.parametrize("size", [pytest.param(1, marks=SLOW), 6, pytest.param(64, marks=SLOW), 129])
def test_coin_flips_are_jax_bernoulli(size):
  keys = rng.run_keys(5, RUNS)
  ref = np.asarray(jax.vmap(lambda k: jax.random.bernoulli(k, 0.5, (size,)))(jnp.asarray(keys)))
  got = rng.bits_host(keys, size)
  assert got.dtype == np.bool_
  np.testing.assert_array_equal(got, ref)
  assert 0.45 < got.mean() < 0.55          # (a fair coin over 3000+ flips: far from all-equal)


def test_init_keys_and_data_keys_are_the_run_keys_halves():
  """init_keys(seed, runs) is the second half of each run key's split; the data draws use the
  first half's four-way split (as data_lib.unit_gaussian draws them from the data key)."""
  runs = RUNS[:50]
  ref = np.asarray(jax.vmap(lambda r: data_lib.split_run_key(data_lib.run_key(9, r))[1])(jnp.asarray(runs)))
  np.testing.assert_array_equal(train_lib.init_keys(9, runs), ref)
  data_keys = jax.vmap(lambda r: jax.random.split(data_lib.split_run_key(data_lib.run_key(9, r))[0], 4))(
      jnp.asarray(runs))
  np.testing.assert_array_equal(rng.split_host(rng.split_host(rng.run_keys(9, runs))[:, 0], 4),
                                np.asarray(data_keys))
