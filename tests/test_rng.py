"""svmattn.rng: its batched draws are jax.random's own values, bit for bit.

rng calls jax.random's public functions, vmapped over keys, with keys drawn in calls of a fixed
size and draws cut from the draw of their size's bucket; each function must equal a direct call of
jax.random on every key, size and seed (the data sets and starting points of every version depend
on them). The two properties of JAX that the buckets rest on are tested here too."""
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


@pytest.mark.parametrize("num", [pytest.param(1, marks=SLOW), 2, pytest.param(4, marks=SLOW), pytest.param(5, marks=SLOW)])
def test_split_is_jax_split(num):
  keys = rng.run_keys(3, RUNS)
  ref = np.asarray(jax.vmap(lambda k: jax.random.split(k, num))(jnp.asarray(keys)))
  np.testing.assert_array_equal(rng.split_keys(keys, num), ref)


@pytest.mark.parametrize("size", [pytest.param(1, marks=SLOW), 6, pytest.param(64, marks=SLOW), pytest.param(129, marks=SLOW)])
def test_coin_flips_are_jax_bernoulli(size):
  keys = rng.run_keys(5, RUNS)
  ref = np.asarray(jax.vmap(lambda k: jax.random.bernoulli(k, 0.5, (size,)))(jnp.asarray(keys)))
  got = rng.coin_flips(keys, size)
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
  np.testing.assert_array_equal(rng.split_keys(rng.split_keys(rng.run_keys(9, runs))[:, 0], 4),
                                np.asarray(data_keys))


# Draw sizes: one value, a few, a bucket's edge and past it, and more than one call's keys
# (rng.CALL_VALUES // bucket keys a call).
DRAW_SIZES = [1, 7, 128, 129, 513, 1000]


@pytest.mark.parametrize("dtype", [np.float64, pytest.param(np.float32, marks=SLOW)])
def test_normals_and_uniforms_are_jax_draws(dtype):
  """rng.normals / rng.uniforms equal jax.random.normal / uniform of each key, bit for bit, for 70
  keys at sizes inside and across buckets; a scaled normal equals scale * normal in a jitted
  program, and the uniform's bounds are values, as in jax.random.uniform called outside a program;
  200 keys of 1000 values take more than one call."""
  keys = rng.run_keys(21, RUNS[:200])
  for size in DRAW_SIZES:
    ref = jax.jit(jax.vmap(lambda k, lo, hi: (jax.random.normal(k, (size,), dtype),
                                              0.1 * jax.random.normal(k, (size,), dtype),
                                              jax.random.uniform(k, (size,), dtype, lo, hi)), (0, None, None)))(
        jnp.asarray(keys), -0.3, 0.7)
    got = (rng.normals(keys, size, dtype), rng.normals(keys, size, dtype, 0.1), rng.uniforms(keys, size, dtype, -0.3, 0.7))
    for g, r in zip(got, ref):
      assert g.dtype == np.dtype(dtype) and g.shape == (200, size)
      np.testing.assert_array_equal(g, np.asarray(r))


def test_jax_draws_are_prefixes_of_longer_draws():
  """The property the size buckets rest on (JAX's partitionable threefry): value i of a flat draw,
  and key i of a split, depend on the key and i alone, so a draw of n values is the first n values
  of a longer draw. If a JAX release breaks it, this test says so first."""
  key = jax.random.PRNGKey(3)
  for n, m in ((1, 2), (7, 512), (513, 1024)):
    for draw in (lambda k, s: jax.random.normal(k, (s,)), lambda k, s: jax.random.uniform(k, (s,)),
                 lambda k, s: jax.random.randint(k, (s,), 0, 9), lambda k, s: jax.random.split(k, s)):
      np.testing.assert_array_equal(np.asarray(draw(key, n)), np.asarray(draw(key, m))[:n])


def test_bernoulli_is_a_uniform_below_p():
  """The property coin_flips rests on: jax.random.bernoulli(key, p, shape) is uniform(key, shape) < p."""
  keys = jnp.asarray(rng.run_keys(5, RUNS[:50]))
  flips = jax.vmap(lambda k: jax.random.bernoulli(k, 0.5, (40,)))(keys)
  below = jax.vmap(lambda k: jax.random.uniform(k, (40,)) < 0.5)(keys)
  np.testing.assert_array_equal(np.asarray(flips), np.asarray(below))


def test_a_key_draws_the_same_values_in_any_batch():
  """A key's values do not depend on the keys drawn with it (padding, calls, batch size)."""
  keys = rng.run_keys(2, RUNS[:300])
  whole = rng.normals(keys, 300)
  for part in (slice(0, 1), slice(5, 6), slice(17, 250)):
    np.testing.assert_array_equal(rng.normals(keys[part], 300), whole[part])
  assert rng.normals(keys[:0], 300).shape == (0, 300)


def test_one_program_per_bucket(monkeypatch):
  """Sizes 1 to 128 share one normal program (up to rng.LEAST_NORMALS) and one uniform program (up to
  rng.LEAST_SIZE), whatever the number of keys or the spelling of the dtype; a normal of 513 to 1024
  values takes one more."""
  monkeypatch.setattr(rng, "_PROGRAMS", {})
  for B in (1, 3, 70):
    keys = rng.run_keys(0, np.arange(B))
    for size in (1, 5, 100, 128):
      for dtype in (np.float64, jnp.float64, np.dtype("float64")):
        rng.normals(keys, size, dtype)
        rng.uniforms(keys, size, dtype, -1.0, 1.0)
  kinds = lambda: sorted(p[0] for p in rng.programs())  # noqa: E731
  assert kinds() == ["fold_in", "normal", "uniform"]
  rng.normals(rng.run_keys(0, [1]), 700)
  assert kinds() == ["fold_in", "normal", "normal", "uniform"]


@pytest.mark.parametrize("size,lo,hi", [(5, 0, 5), pytest.param(3, -4, 60, marks=SLOW), pytest.param(10, 0, 7, marks=SLOW),
                                         pytest.param(1, 0, 1, marks=SLOW), pytest.param(4, 0, 2**31 + 3, marks=SLOW)])
def test_randints_are_jax_randint(size, lo, hi):
  """rng.randints equals jax.random.randint (int64) on every key, for spans that are and are
  not powers of two, and a nonzero minval."""
  keys = rng.run_keys(8, RUNS)
  ref = np.asarray(jax.vmap(lambda k: jax.random.randint(k, (size,), lo, hi))(jnp.asarray(keys)))
  got = rng.randints(keys, size, lo, hi)
  assert got.dtype == np.int64
  np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("n", [6, 1, pytest.param(20, marks=SLOW), pytest.param(1700, marks=SLOW)])
def test_permutations_are_jax_permutation(n):
  """rng.permutations equals jax.random.permutation(key, n) on every key."""
  keys = rng.run_keys(9, RUNS)
  ref = np.asarray(jax.vmap(lambda k: jax.random.permutation(k, n))(jnp.asarray(keys)))
  got = rng.permutations(keys, n)
  np.testing.assert_array_equal(got, ref)
  assert all(sorted(p) == list(range(n)) for p in got)


def test_bad_draws_are_refused():
  with pytest.raises(ValueError, match="minval < maxval"):
    rng.randints(rng.run_keys(0, [1]), 2, 3, 3)
  with pytest.raises(ValueError, match="run indices"):
    rng.run_keys(0, [-1])
  with pytest.raises(TypeError, match="key data"):
    rng.normals(np.zeros((2, 2)), 3)
