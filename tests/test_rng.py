"""svmattn.rng's keys and coin flips on the host: JAX's threefry values, bit for bit.

Key derivation (fold_in, split) and fair coin flips are integer arithmetic, computed in NumPy
without a compiled program; each must equal what jax.random computes, on every key, size and
seed (the data sets and starting points of every version depend on them)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import needs_native

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
  np.testing.assert_array_equal(rng.split_host(keys, num), ref)


@pytest.mark.parametrize("size", [pytest.param(1, marks=SLOW), 6, pytest.param(64, marks=SLOW), pytest.param(129, marks=SLOW)])
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


# Draw sizes: one value, a few, and 70 keys x 1000 values (two calls of the draw program, rng.CALL =
# 65,536 elements each, a key's draw split between them).
DRAW_SIZES = [1, 7, 1000]


# (both with the slow tests: the fast set keeps test_data.py's flat draws against jax.random and the native
# uniforms against the draw program below)
@pytest.mark.parametrize("dtype", [pytest.param(np.float64, marks=SLOW), pytest.param(np.float32, marks=SLOW)])
def test_normals_and_uniforms_are_jax_draws(dtype):
  """rng.normals / rng.uniforms (one program, chunks of positions at an offset) equal
  jax.random.normal / uniform of each key, bit for bit, at sizes across chunk boundaries, for 70
  keys; a scaled normal equals scale * normal in a jitted program, and the uniform's bounds are
  values, as in jax.random.uniform called outside a program. Two keys' draws of CALL + 5 values
  (each longer than a call) too."""
  keys = rng.run_keys(21, RUNS[:70])
  for size in DRAW_SIZES:
    ref = jax.jit(jax.vmap(lambda k, lo, hi: (jax.random.normal(k, (size,), dtype),
                                              0.1 * jax.random.normal(k, (size,), dtype),
                                              jax.random.uniform(k, (size,), dtype, lo, hi)), (0, None, None)))(
        jnp.asarray(keys), -0.3, 0.7)
    got = (rng.normals(keys, size, dtype), rng.normals(keys, size, dtype, 0.1), rng.uniforms(keys, size, dtype, -0.3, 0.7))
    for g, r in zip(got, ref):
      assert g.dtype == np.dtype(dtype) and g.shape == (70, size)
      np.testing.assert_array_equal(g, np.asarray(r))
  long = rng.CALL + 5
  ref = jax.jit(jax.vmap(lambda k: jax.random.normal(k, (long,), dtype)))(jnp.asarray(keys[:2]))
  np.testing.assert_array_equal(rng.normals(keys[:2], long, dtype), np.asarray(ref))


@pytest.mark.parametrize("size,lo,hi", [(5, 0, 5), pytest.param(3, -4, 60, marks=SLOW), pytest.param(10, 0, 7, marks=SLOW),
                                         pytest.param(1, 0, 1, marks=SLOW), pytest.param(4, 0, 2**31 + 3, marks=SLOW)])
def test_randint_host_is_jax_randint(size, lo, hi):
  """rng.randint_host equals jax.random.randint (int64) on every key, for spans that are and are
  not powers of two, and a nonzero minval."""
  keys = rng.run_keys(8, RUNS)
  ref = np.asarray(jax.vmap(lambda k: jax.random.randint(k, (size,), lo, hi))(jnp.asarray(keys)))
  got = rng.randint_host(keys, size, lo, hi)
  assert got.dtype == np.int64
  np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("n", [6, 1, pytest.param(20, marks=SLOW), pytest.param(1700, marks=SLOW)])   # 1700: two rounds
def test_permutations_host_is_jax_permutation(n):
  """rng.permutations_host equals jax.random.permutation(key, n) on every key: one sort round below
  n = 1626, two at 1700."""
  keys = rng.run_keys(9, RUNS)
  ref = np.asarray(jax.vmap(lambda k: jax.random.permutation(k, n))(jnp.asarray(keys)))
  got = rng.permutations_host(keys, n)
  np.testing.assert_array_equal(got, ref)
  assert all(sorted(p) == list(range(n)) for p in got)


def test_randint_host_refuses_an_empty_span():
  with pytest.raises(ValueError, match="maxval - minval"):
    rng.randint_host(rng.run_keys(0, [1]), 2, 3, 3)


@needs_native
def test_the_native_uniforms_equal_the_draw_program(monkeypatch):
  """Where the host's C++ draws are built (this machine, CI's), rng's float64 draws compute the
  uniforms there and apply erfinv in a program of their own: normals, scaled normals and uniforms
  equal the XLA draw program's (the path without a compiler) bit for bit, for sizes across call
  boundaries and a draw of one value, whose erfinv runs in each of the program's sizes
  (rng.ERFINV_SIZES); the summary's environment says which ran."""
  from svmattn import rng_native
  assert rng_native.available(), rng_native.why_not()
  keys = rng.run_keys(5, RUNS[:40])
  cases = [(s, kind) for s in (1, 13, 200, 480, rng.CALL + 3) for kind in ("normal", "scaled", "uniform")]
  draw = {"normal": lambda k, s: rng.normals(k, s), "scaled": lambda k, s: rng.normals(k, s, np.float64, 0.1),
          "uniform": lambda k, s: rng.uniforms(k, s, np.float64, -0.3, 0.7)}
  native = [draw[kind](keys[:3] if s > 1000 else keys, s) for s, kind in cases]
  assert rng_native.report() == {"draws": "native-cpu"}
  monkeypatch.setattr(rng_native, "_state", {"fn": None, "why": "turned off by the test"})
  assert rng_native.report()["draws"] == "xla"
  for (s, kind), got in zip(cases, native):
    want = draw[kind](keys[:3] if s > 1000 else keys, s)
    assert got.dtype == want.dtype == np.float64 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64), err_msg=f"{kind} of size {s}")


@needs_native
def test_the_native_unit_rows_equal_numpys(monkeypatch):
  """The generator's unit rows (datasets.unit_rows_host: Dot2 sums of squares, then a square root and
  a division) computed by rng_native's C loop are NumPy's bit for bit: Gaussian rows of lengths
  1 to 400, rows spanning many binades, a zero row (0/0: NaN in both) and an infinite entry."""
  from svmattn import rng_native
  from svmattn.data import datasets
  assert rng_native.available(), rng_native.why_not()
  gen = np.random.default_rng(3)
  cases = [gen.standard_normal((7, 5, d)) for d in (1, 2, 3, 10, 33, 400)]
  cases.append(gen.standard_normal((50, 12)) * 10.0 ** gen.integers(-150, 150, (50, 12)))
  edge = gen.standard_normal((4, 6))
  edge[1] = 0.0
  edge[2, 3] = np.inf
  edge[3] = np.nextafter(0.0, 1.0) * 2 ** 60
  cases.append(edge)
  native = [datasets.unit_rows_host(a) for a in cases]
  monkeypatch.setattr(rng_native, "_state", {"fn": None, "why": "turned off by the test"})
  for a, got in zip(cases, native):
    want = datasets.unit_rows_host(a)
    assert got.shape == want.shape == a.shape
    np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64), err_msg=f"rows of shape {a.shape}")


def test_the_erfinv_program_gives_the_same_bits_at_every_size():
  """rng applies erfinv to the last values of a draw in the smallest program of ERFINV_SIZES that
  holds them: every size gives each value the same bits as the CALL-sized program (element-wise
  code; a processor whose vector loop and remainder rounded differently would fail here), on
  uniforms across (-1, 1), both ends and the branches' boundaries included."""
  gen = np.random.default_rng(7)
  u = gen.uniform(-1.0, 1.0, rng.CALL)
  u[:12] = [np.nextafter(-1.0, 0.0), -0.999999999999, 1 - 2.0**-53, 0.0, -0.0, 5e-324, 1e-300, 0.5,
            -0.85, 0.99999, np.nextafter(1.0, 0.0), -0.3]
  c = np.sqrt(np.float64(2))
  fn = rng._erfinv_fn(np.dtype(np.float64))
  want = np.asarray(fn(u, c))
  for size in rng.ERFINV_SIZES:
    for start in (0, rng.CALL - size):
      got = np.asarray(fn(u[start:start + size], c))
      np.testing.assert_array_equal(got.view(np.uint64), want[start:start + size].view(np.uint64),
                                    err_msg=f"size {size} at {start}")


@needs_native
def test_the_native_normals_equal_the_erfinv_program():
  """rng_native's c erfinv(u) (the C source's copy of XLA's erfinv program) gives the program's bits:
  on 2^20 uniforms across (-1, 1), dense grids across the three places where the program switches
  formula (its log1p's |u^2| = sqrt(2) - 1, and w = -log1p(-u^2) = 6.25 and 16), tails up to
  w = 36, both ends, +-0, subnormals, and the scale of a scaled normal. A fused multiply-add moved
  or left out, or a coefficient off by one ulp, differs on thousands of these values."""
  from svmattn import rng_native
  assert rng_native.available(), rng_native.why_not()
  gen = np.random.default_rng(11)
  grid = np.linspace(-1.0, 1.0, 20001)
  near = lambda x0, span: np.concatenate([x0 + span * grid, -(x0 + span * grid)])  # noqa: E731
  top = np.nextafter(1.0, 0.0)
  u = np.concatenate([
      gen.uniform(-1.0, 1.0, 1 << 20),
      near(np.sqrt(np.sqrt(2.0) - 1.0), 1e-10), near(np.sqrt(-np.expm1(-6.25)), 1e-11),
      near(np.sqrt(-np.expm1(-16.0)), 1e-13),
      np.minimum(-np.expm1(-gen.uniform(0.0, 36.0, 50000)), top) * gen.choice([-1.0, 1.0], 50000),
      [np.nextafter(-1.0, 0.0), -top, top, 1.0, -1.0, 0.0, -0.0, 5e-324, -1e-310, 1e-300, 0.5]])
  fn = rng._erfinv_fn(np.dtype(np.float64))
  for c in (np.sqrt(2.0), 0.1 * np.sqrt(2.0)):
    want = np.concatenate([np.asarray(fn(part, np.float64(c))) for part in np.array_split(u, 32)])
    got = u.copy()
    rng_native.normals_of_uniforms(got, c)
    differ = got.view(np.uint64) != want.view(np.uint64)
    assert not differ.any(), f"{differ.sum()} values differ at c={c}, e.g. u={u[differ][:5]}"


def test_normals_many_equal_one_draw_at_a_time(monkeypatch):
  """rng.normals_many (the erfinv of several draws in one pass) gives each draw's rng.normals bit
  for bit, with and without the native draws, an empty draw included."""
  from svmattn import rng_native
  keys = rng.run_keys(9, RUNS[:50])
  draws = [(keys, 37), (keys[:7], 0), (keys[:3], rng.CALL + 11), (keys, 4)]
  got = rng.normals_many(draws)
  monkeypatch.setattr(rng_native, "_state", {"fn": None, "why": "turned off by the test"})
  for (k, size), g in zip(draws, got):
    want = rng.normals(k, size)
    assert g.shape == want.shape == (len(k), size)
    np.testing.assert_array_equal(g.view(np.uint64), want.view(np.uint64))


@needs_native
def test_the_native_threefry_equals_numpys(monkeypatch):
  """The host's threefry2x32 in C (rng_native) computes NumPy's integers, on random keys and counters
  and with broadcasting (one key, many counters)."""
  from svmattn import rng_native
  assert rng_native.available(), rng_native.why_not()
  gen = np.random.default_rng(5)
  k1, k2, x1, x2 = gen.integers(0, 2**32, (4, 1000), dtype=np.uint64).astype(np.uint32)
  cases = [(k1, k2, x1, x2), (k1[:1, None], k2[:1, None], np.zeros((1, 9), np.uint32), np.arange(9, dtype=np.uint32)[None])]
  native = [rng.threefry2x32(*case) for case in cases]
  monkeypatch.setattr(rng_native, "_state", {"fn": None, "why": "turned off by the test"})
  for case, (a, b) in zip(cases, native):
    want_a, want_b = rng.threefry2x32(*case)
    assert a.shape == want_a.shape and a.dtype == want_a.dtype == np.uint32
    np.testing.assert_array_equal(a, want_a)
    np.testing.assert_array_equal(b, want_b)
