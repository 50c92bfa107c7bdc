"""svmattn.data.datasets: the generator, DataSpec validation, .npz files and their errors."""
import os

import jax
import numpy as np
import pytest

from conftest import RUNS, SEED, SPEC, host
from svmattn import rng
from svmattn.data import datasets as data_lib
from svmattn.models import heads


# ----------------------------------------------------------------------------
# Generator
# ----------------------------------------------------------------------------

def test_generate_shapes_dtype_and_unit_norms(batch):
  B, (n, T, d) = len(RUNS), (SPEC.n, SPEC.T, SPEC.d)
  assert batch.X.shape == (B, n, T, d)
  assert batch.Y.shape == (B, n)
  assert batch.Z.shape == (B, n, d)
  assert batch.v.shape == (B, d)
  for a in batch:
    assert a.dtype == np.float64
  X, Y, Z, v = host(batch)
  np.testing.assert_allclose(np.linalg.norm(X, axis=-1), 1.0, rtol=0, atol=1e-14)
  np.testing.assert_allclose(np.linalg.norm(Z, axis=-1), 1.0, rtol=0, atol=1e-14)
  np.testing.assert_allclose(np.linalg.norm(v, axis=-1), 1.0, rtol=0, atol=1e-14)
  assert set(np.unique(Y)) <= {-1.0, 1.0}
  # different runs are different data sets
  assert not np.array_equal(X[0], X[1])


def test_generate_float32(batch32):
  for a in batch32:
    assert a.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(np.asarray(batch32.X, np.float64), axis=-1), 1.0, atol=1e-6)
  assert set(np.unique(np.asarray(batch32.Y))) <= {-1.0, 1.0}


def test_data_set_is_bit_identical_whatever_the_batch(batch):
  """Data set r of seed s does not depend on the batch it is drawn in (size or order)."""
  runs = [5, 2, 0]
  other = data_lib.generate(SPEC, SEED, runs)
  for j, r in enumerate(runs):
    if r < len(RUNS):
      for a, b in zip(other, batch):
        assert np.array_equal(np.asarray(a[j]), np.asarray(b[r]))
  # and it depends on the seed
  assert not np.array_equal(np.asarray(data_lib.generate(SPEC, SEED + 1, runs).X[2]), np.asarray(batch.X[0]))


def test_each_run_alone_equals_the_batch_bit_for_bit():
  """Numerics version 2: a batch (many runs per call of the draw program) and each run drawn alone, and
  two other batch sizes, give the same data sets bit for bit (linear and matrix heads, both dtypes)."""
  spec = data_lib.DataSpec(n=3, T=4, d=5)
  runs = np.arange(67)
  for head in (heads.LINEAR, heads.RELU):
    for dtype in (np.float64, np.float32):
      batch = host(data_lib.generate(spec, 11, runs, head, dtype=dtype))
      for r in (0, 5, 64, len(runs) - 1):
        alone = host(data_lib.generate(spec, 11, [r], head, dtype=dtype))
        for a, b in zip(alone, batch):
          assert a.dtype == b.dtype and np.array_equal(a[0], b[r])
      for size in (2, 7):
        other = host(data_lib.generate(spec, 11, runs[-size:][::-1], head, dtype=dtype))
        for a, b in zip(other, batch):
          assert np.array_equal(a, b[runs[-size:][::-1]])


def test_programs_per_size_bucket_not_per_shape(monkeypatch):
  """The generator's draws compile a program per kind and size bucket, not one per (n, T, d): ten
  shapes, draws of 1 to 64 values, share four (the keys' fold_in and split, the normals of up to 512
  values, the uniforms of the label bits); a draw of 1,600 values takes one more (its bucket, 2,048)."""
  shapes = [(4, 4, 4), (5, 3, 4), (4, 5, 3), (3, 4, 5), (5, 4, 3),
            (6, 2, 5), (2, 6, 5), (5, 5, 2), (10, 8, 20), (1, 2, 1)]
  monkeypatch.setattr(rng, "_PROGRAMS", {})
  for i, (n, T, d) in enumerate(shapes[:8] + shapes[9:]):
    ds = data_lib.generate(data_lib.DataSpec(n, T, d), 0, np.arange(1 + i))
    assert ds.X.shape == (1 + i, n, T, d)
  assert sorted((p[0], p[1]) for p in rng.programs()) == [("fold_in", 0), ("normal", 512), ("split", 4),
                                                          ("uniform", 128)]
  data_lib.generate(data_lib.DataSpec(*shapes[8]), 0, np.arange(3))        # 1,600 values: the 2,048 bucket
  assert ("normal", 2048) in [(p[0], p[1]) for p in rng.programs()]


def test_flat_draws_are_each_runs_own_draws():
  """The draw program draws, for every run, the values of that run's own flat draws (jax.random on
  its keys, one run at a time): the random values of numerics versions 2 onwards. X's 300 values
  are drawn with the others'."""
  counts, runs = (3 * 4 * 25, 3 * 25, 3, 25), np.array([0, 9, 70, 4], np.uint32)
  draws = data_lib.flat_draws(counts, 7, runs, np.float64)
  for j, r in enumerate(runs):
    kx, kz, ky, kv = jax.random.split(rng.split_run_key(rng.run_key(7, int(r)))[0], 4)
    own = (jax.random.normal(kx, (counts[0],), np.float64), jax.random.normal(kz, (counts[1],), np.float64),
           jax.random.bernoulli(ky, 0.5, (counts[2],)), jax.random.normal(kv, (counts[3],), np.float64))
    for a, b, c in zip(draws, own, counts):
      assert np.array_equal(a[j, :c], np.asarray(b))


def _version1_generate(spec, seed, runs, head, dtype):
  """Numerics version 1's path (jnp on the device: keys split as now, arrays drawn at their shapes,
  normalized by XLA)."""
  import jax.numpy as jnp
  from svmattn import rng

  def one(r):
    kx, kz, ky, kv = jax.random.split(rng.split_run_key(rng.run_key(seed, r))[0], 4)
    unit = lambda a: a / jnp.linalg.norm(a, axis=-1, keepdims=True)
    X = unit(jax.random.normal(kx, (spec.n * spec.T * spec.d,), dtype).reshape(spec.n, spec.T, spec.d))
    Z = unit(jax.random.normal(kz, (spec.n * spec.d,), dtype).reshape(spec.n, spec.d))
    Y = jnp.where(jax.random.bernoulli(ky, 0.5, (spec.n,)), 1.0, -1.0).astype(dtype)
    return X, Y, Z, head.init(kv, spec.d, dtype)

  return [np.asarray(a) for a in jax.jit(lambda rs: jax.lax.map(one, rs))(jnp.asarray(runs, jnp.uint32))]


@pytest.mark.slow   # (CI runs the slow tests too)
def test_values_within_4_ulps_of_numerics_version_1():
  """The same random values as version 1; only the host normalization's rounding may differ."""
  for spec, head in ((data_lib.DataSpec(6, 8, 10), heads.LINEAR), (data_lib.DataSpec(5, 5, 3), heads.LINEAR),
                     (data_lib.DataSpec(3, 4, 7), heads.RELU)):
    runs = np.arange(20)
    new = host(data_lib.generate(spec, 3, runs, head))
    old = _version1_generate(spec, 3, runs, head, np.float64)
    for name, a, b in zip("XYZv", new, old):
      assert a.shape == b.shape and a.dtype == b.dtype
      ulps = np.abs(a - b) / np.spacing(np.maximum(np.abs(a), np.abs(b)))
      assert ulps.max() <= 4, (name, ulps.max())
    np.testing.assert_array_equal(new.Y, old[1])


def test_generate_self_attention_positive_labels():
  spec = data_lib.DataSpec(n=2, T=3, d=4, attention="self", query_pos=1, labels="positive")
  ds = host(data_lib.generate(spec, 7, [0, 1]))
  np.testing.assert_array_equal(ds.Z, ds.X[:, :, 1])
  np.testing.assert_array_equal(ds.Y, 1.0)


def test_run_key_is_fold_in():
  np.testing.assert_array_equal(np.asarray(data_lib.run_key(3, 5)),
                                np.asarray(jax.random.fold_in(jax.random.PRNGKey(3), 5)))


def test_take(batch):
  sub = data_lib.take(host(batch), [2, 0])
  np.testing.assert_array_equal(sub.X[1], np.asarray(batch.X[0]))
  assert sub.Y.shape == (2, SPEC.n)


# ----------------------------------------------------------------------------
# DataSpec.validate
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    ({"n": 0}, r"DataSpec\.n must be a positive integer"),
    ({"d": -2}, r"DataSpec\.d must be a positive integer"),
    ({"T": 2.5}, r"DataSpec\.T must be a positive integer"),
    ({"T": 1}, r"DataSpec\.T must be >= 2"),
    ({"attention": "causal"}, r"DataSpec\.attention must be 'cross' or 'self'"),
    ({"attention": "self", "query_pos": 4}, r"DataSpec\.query_pos must be in \[0, T=4\)"),
    ({"attention": "self", "query_pos": -1}, r"DataSpec\.query_pos"),
    ({"labels": "binary"}, r"DataSpec\.labels must be 'random' or 'positive'"),
])
def test_dataspec_validate_errors(kwargs, match):
  spec = data_lib.DataSpec(**{**dict(n=3, T=4, d=6), **kwargs})
  with pytest.raises(ValueError, match=match):
    spec.validate()


def test_dataspec_validate_ok_and_generate_checks():
  assert SPEC.validate() is SPEC
  with pytest.raises(ValueError, match="DataSpec.T"):
    data_lib.generate(data_lib.DataSpec(n=2, T=1, d=3), 0, [0])


# ----------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------

def test_save_load_round_trip(batch, tmp_path):
  path = tmp_path / "sets.npz"
  data_lib.save_npz(path, batch)
  assert sorted(os.listdir(tmp_path)) == ["sets.npz"]  # no temporary files left
  loaded = data_lib.load_npz(path)
  for a, b in zip(loaded, batch):
    assert a.dtype == np.float64
    assert np.array_equal(a, np.asarray(b))
  loaded32 = data_lib.load_npz(path, np.float32)
  assert all(a.dtype == np.float32 for a in loaded32)


def _write_arrays(path, **arrays):
  with open(path, "wb") as f:
    np.savez(f, **arrays)
  return str(path)


def _arrays(batch):
  return dict(host(batch)._asdict())


def test_load_missing_file(tmp_path):
  path = tmp_path / "nope.npz"
  with pytest.raises(data_lib.DataError, match="no such data file") as e:
    data_lib.load_npz(path)
  assert str(path) in str(e.value)


def test_load_not_an_npz(tmp_path):
  path = tmp_path / "text.npz"
  path.write_text("X,Y,Z\n1,2,3\n")
  with pytest.raises(data_lib.DataError, match="not a readable .npz data file"):
    data_lib.load_npz(path)


def test_load_corrupt_bytes(batch, tmp_path):
  path = tmp_path / "cut.npz"
  data_lib.save_npz(path, batch)
  raw = path.read_bytes()
  path.write_bytes(raw[: len(raw) // 2])  # truncated: no zip directory
  with pytest.raises(data_lib.DataError, match="not a readable .npz data file"):
    data_lib.load_npz(path)
  path.write_bytes(bytes(range(256)) * 4)
  with pytest.raises(data_lib.DataError, match="not a readable .npz data file"):
    data_lib.load_npz(path)


def test_load_pickled_object_array(tmp_path):
  arrays = {"X": np.empty((1,), object), "Y": np.ones((1, 2)), "Z": np.ones((1, 2, 2)), "v": np.ones((1, 2))}
  path = _write_arrays(tmp_path / "pickle.npz", **arrays)
  with pytest.raises(data_lib.DataError, match="not a readable .npz data file"):
    data_lib.load_npz(path)


def test_load_missing_array(batch, tmp_path):
  arrays = _arrays(batch)
  del arrays["v"]
  path = _write_arrays(tmp_path / "nov.npz", **arrays)
  with pytest.raises(data_lib.DataError, match=r"missing array\(s\) \['v'\]") as e:
    data_lib.load_npz(path)
  assert path in str(e.value)


@pytest.mark.parametrize("field, change, match", [
    ("X", lambda a: a[0], r"X must have shape \(B, n, T, d\)"),
    ("X", lambda a: a[:, :, :1], r"at least T=2 tokens"),
    ("Y", lambda a: a[:, :-1], r"Y must have shape \(4, 3\)"),
    ("Z", lambda a: a[..., :-1], r"Z must have shape \(4, 3, 6\)"),
    ("v", lambda a: a[:, :-1], r"v must have shape \(4, 6\)"),
    ("X", lambda a: np.where(np.arange(a.size).reshape(a.shape) == 5, np.nan, a), r"'X' has 1 non-finite"),
    ("Z", lambda a: np.where(np.arange(a.size).reshape(a.shape) < 2, np.inf, a), r"'Z' has 2 non-finite"),
    ("Y", lambda a: np.where(a > 0, 1.0, 0.0), r"labels Y must be -1 or \+1"),
    ("Y", lambda a: 2 * a, r"labels Y must be -1 or \+1"),
])
def test_load_bad_contents(batch, tmp_path, field, change, match):
  arrays = _arrays(batch)
  arrays[field] = change(arrays[field])
  path = _write_arrays(tmp_path / "bad.npz", **arrays)
  with pytest.raises(data_lib.DataError, match=match) as e:
    data_lib.load_npz(path)
  assert path in str(e.value)
  assert isinstance(e.value, ValueError)


def test_load_integer_labels_accepted(batch, tmp_path):
  arrays = _arrays(batch)
  arrays["Y"] = arrays["Y"].astype(np.int64)
  loaded = data_lib.load_npz(_write_arrays(tmp_path / "int.npz", **arrays))
  assert loaded.Y.dtype == np.float64
  np.testing.assert_array_equal(loaded.Y, np.asarray(batch.Y))


def test_save_invalid_data_raises_and_writes_nothing(batch, tmp_path):
  bad = host(batch)._replace(Y=np.zeros_like(np.asarray(batch.Y)))
  with pytest.raises(data_lib.DataError, match="labels Y"):
    data_lib.save_npz(tmp_path / "bad.npz", bad)
  assert os.listdir(tmp_path) == []


def test_validate_unbatched(batch):
  one = data_lib.take(host(batch), 0)
  out = data_lib.validate(one, batched=False)
  assert out.X.shape == (SPEC.n, SPEC.T, SPEC.d)
  with pytest.raises(data_lib.DataError, match=r"X must have shape \(n, T, d\)"):
    data_lib.validate(host(batch), batched=False)
  with pytest.raises(data_lib.DataError, match="'v' is missing"):
    data_lib.validate(one._replace(v=None), batched=False)


def test_flat_draws_equal_jax_multidimensional_draws():
  # data.normal / data.uniform draw flat (faster to compile) and must give jax.random's values
  key = jax.random.PRNGKey(11)
  np.testing.assert_array_equal(data_lib.normal(key, (3, 4, 5)), jax.random.normal(key, (3, 4, 5), np.float64))
  np.testing.assert_array_equal(data_lib.uniform(key, (7, 6), np.float64, -0.5, 0.5),
                                jax.random.uniform(key, (7, 6), np.float64, -0.5, 0.5))


def test_heads_with_one_init_share_the_generator_and_its_data():
  """A sampler reads only the head's init: E6's lambda heads (the linear head's init) draw the same
  data sets, bit for bit, whatever lambda, on the host (E6's sampler compiles no program: it
  compiled one per shape, about 2 s in a fresh process, before numerics version 9)."""
  from svmattn.studies import lambda_head as e6
  spec = data_lib.DataSpec(n=2, T=3, d=4, labels="positive")
  data_lib._generate_fn.cache_clear()
  draws = [data_lib.generate_host(spec, 5, np.arange(3), heads.lambda_head(lam), e6.orthonormal_tokens)
           for lam in (0.0, 0.3, 1.5)]
  assert data_lib._generate_fn.cache_info().misses == 0
  for other in draws[1:]:
    for a, b in zip(draws[0], other):
      assert np.array_equal(a, b)
  assert not np.array_equal(draws[0].X[0], draws[0].X[1])


def test_orthonormal_columns_is_the_q_factor_with_positive_diagonal():
  """datasets.orthonormal_columns (E6's frames: Gram-Schmidt twice, plain IEEE operations) is LAPACK's
  Q with its signs fixed by diag R > 0, to rounding: Gaussian d x T matrices (condition numbers below
  about 100, so the two differ by at most about 100 d eps = 2e-13; the bound 1e-11 fails for any
  wrong column or sign), orthonormal to a few eps, and each matrix's Q the same bits whatever the
  matrices around it."""
  gen = np.random.default_rng(4)
  for d, T in ((8, 4), (5, 5), (20, 3), (3, 1)):
    G = gen.standard_normal((30, 2, d, T))
    Q = data_lib.orthonormal_columns(G)
    ref, R = np.linalg.qr(G)
    ref = ref * np.sign(np.diagonal(R, axis1=-2, axis2=-1))[..., None, :]
    assert Q.shape == G.shape
    assert np.max(np.abs(Q - ref)) < 1e-11
    gram = np.einsum("...kt,...ku->...tu", Q, Q)
    assert np.max(np.abs(gram - np.eye(T))) < 1e-14
    alone = data_lib.orthonormal_columns(G[7:8, 1:])
    np.testing.assert_array_equal(alone[0, 0], Q[7, 1])
  with pytest.raises(ValueError, match="T <= d"):
    data_lib.orthonormal_columns(np.ones((4, 5)))


def test_a_host_sampler_draws_the_heads_it_knows():
  """A host sampler (E6's) draws unit-vector and unit-Frobenius heads; another head is one clear
  ValueError, not a wrong draw."""
  from svmattn.studies import lambda_head as e6
  spec = data_lib.DataSpec(n=2, T=3, d=4, labels="positive")
  bogus = heads.Head("bogus", lambda key, d, dtype: np.zeros(d), None)
  with pytest.raises(ValueError, match="bogus"):
    data_lib.generate_host(spec, 0, np.arange(2), bogus, e6.orthonormal_tokens)
  relu = data_lib.generate_host(spec, 0, np.arange(2), heads.RELU, e6.orthonormal_tokens)
  assert relu.v.shape == (2, 4, 4)
  # (each v_k^2 within 1.5 eps of exact, a sum of 16 within a few eps more: 4e-15 is about 18 eps)
  np.testing.assert_allclose(np.sum(relu.v ** 2, axis=(1, 2)), 1.0, rtol=4e-15)
