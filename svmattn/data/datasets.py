"""Data sets: the paper's random generator, and user data sets in .npz files.

One data set is a :class:`Dataset` with fields
  X (n, T, d) tokens, Y (n,) labels in {-1, +1}, Z (n, d) queries,
  v head parameters (``(d,)`` for the linear head; the head decides).
A batch of data sets has the same fields with a leading axis B.

Randomness: data set ``r`` of seed ``s`` is drawn from
``jax.random.fold_in(jax.random.PRNGKey(s), r)``, so it is the same data set
whatever the batch it is drawn in. The paper's generator (``unit_gaussian``) draws its arrays flat in
one compiled program that serves every size (``rng.normals``) rather than one per (n, T, d), and
normalizes on the host (see ``_unit_gaussian_flat``).
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from svmattn.io import atomic_files as results_io
from svmattn.models import heads
import svmattn
from svmattn import rng
from svmattn.rng import normal, run_key, split_run_key, uniform  # noqa: F401  (part of this module's API)


class Dataset(NamedTuple):
  """One data set (or a batch of them, with a leading axis B on every field)."""
  X: jax.Array  # (n, T, d)
  Y: jax.Array  # (n,)
  Z: jax.Array  # (n, d)
  v: jax.Array  # head parameters, e.g. (d,)


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """Sizes and kind of the generated data sets.

  attention: "cross" (a separate query z_i) or "self" (z_i = x_{i, query_pos}).
  labels: "random" (uniform +-1) or "positive" (all +1).
  """
  n: int = 6
  T: int = 8
  d: int = 10
  attention: str = "cross"
  query_pos: int = 0
  labels: str = "random"

  def validate(self) -> "DataSpec":
    check_sizes(self)
    if self.attention not in ("cross", "self"):
      raise ValueError(f"DataSpec.attention must be 'cross' or 'self', got {self.attention!r}")
    if self.attention == "self" and not 0 <= self.query_pos < self.T:
      raise ValueError(f"DataSpec.query_pos must be in [0, T={self.T}), got {self.query_pos}")
    return self


def check_sizes(spec) -> None:
  """n, T, d of a spec: positive integers, T >= 2; labels "random" or "positive" if it has them."""
  kind = type(spec).__name__
  for name in ("n", "T", "d"):
    value = getattr(spec, name)
    if not isinstance(value, (int, np.integer)) or value < 1:
      raise ValueError(f"{kind}.{name} must be a positive integer, got {value!r}")
  if spec.T < 2:
    raise ValueError(f"{kind}.T must be >= 2 (token selection needs two tokens), got {spec.T}")
  if getattr(spec, "labels", "random") not in ("random", "positive"):
    raise ValueError(f"{kind}.labels must be 'random' or 'positive', got {spec.labels!r}")


def _unit_rows(a: jax.Array) -> jax.Array:
  return a / jnp.linalg.norm(a, axis=-1, keepdims=True)


def unit_gaussian(key: jax.Array, spec: DataSpec, head: heads.Head,
                  dtype=jnp.float64) -> Dataset:
  """The paper's E2 generator for one data set: unit-normalized Gaussian tokens,
  queries and head vector; labels +-1."""
  kx, kz, ky, kv = jax.random.split(key, 4)
  X = _unit_rows(normal(kx, (spec.n, spec.T, spec.d), dtype))
  if spec.attention == "self":
    Z = X[:, spec.query_pos]
  else:
    Z = _unit_rows(normal(kz, (spec.n, spec.d), dtype))
  if spec.labels == "positive":
    Y = jnp.ones((spec.n,), dtype)
  else:
    Y = jnp.where(jax.random.bernoulli(ky, 0.5, (spec.n,)), 1.0, -1.0).astype(dtype)
  v = head.init(kv, spec.d, dtype)
  return Dataset(X, Y, Z, v)


# A sampler: a JAX function of one data set's key (compiled per shape by ``generate_host``, a data set
# at a time), or a ``host_sampler`` of every run of a batch at once (no program); either reads the
# head's init alone.
Sampler = Callable[..., Dataset]


def generate(spec: DataSpec, seed: int, runs: Sequence[int] | np.ndarray,
             head: heads.Head = heads.LINEAR, sampler: Sampler = unit_gaussian,
             dtype=jnp.float64) -> Dataset:
  """A batch of data sets: entry b is run ``runs[b]`` of ``seed`` (leading axis B), as jax
  arrays on the host CPU (``generate_host`` gives the same values as NumPy arrays)."""
  data = generate_host(spec, seed, runs, head, sampler, dtype)
  with jax.default_device(_host_device()):
    return Dataset(*(jnp.asarray(a) for a in data))


def generate_host(spec: DataSpec, seed: int, runs: Sequence[int] | np.ndarray,
                  head: heads.Head = heads.LINEAR, sampler: Sampler = unit_gaussian,
                  dtype=jnp.float64) -> Dataset:
  """``generate`` as NumPy arrays: what the studies load, store and analyze on the host
  (training moves them to its devices), without a round trip through device buffers."""
  spec.validate()
  svmattn.require_x64(dtype)
  runs = np.asarray(runs, dtype=np.uint32).reshape(-1)
  with jax.default_device(_host_device()):   # drawn on the host CPU: the same bits on every backend
    if sampler is unit_gaussian and head.init in _FLAT_HEADS:
      return Dataset(*_unit_gaussian_flat(spec, seed, runs, head, jnp.dtype(dtype)))
    if getattr(sampler, "on_host", False):
      if head.init not in _FLAT_HEADS:
        raise ValueError(f"the host sampler {sampler.__name__} draws a head with a unit vector or unit Frobenius "
                         f"matrix init (the linear, lambda and ReLU heads), not {head.name}")
      return Dataset(*sampler(spec, seed, runs, head, jnp.dtype(dtype)))
    # Pad the run list to a power of two so that a few compiled generators serve every
    # batch size (data set r does not depend on the length of the list it is drawn in).
    size = 1 << max(int(len(runs)) - 1, 0).bit_length()
    padded = np.concatenate([runs, np.full(size - len(runs), runs[-1] if len(runs) else 0, np.uint32)])
    # keyed on the head's init, all a sampler reads of the head: E6's lambda heads share one program
    out = _generate_fn(spec, head.init, sampler, jnp.dtype(dtype))(jnp.asarray(seed, jnp.uint32), jnp.asarray(padded))
    # sliced on the host (an eager slice would compile a program per shape)
    return jax.tree_util.tree_map(lambda a: np.asarray(a)[:len(runs)], out)


def generate_test_host(spec: DataSpec, seed: int, runs, size: int, dtype=np.float64) -> dict:
  """Run r's test set: ``size`` sequences from the paper's generator (``spec`` with n = size) on
  the run's test key (``flat_draws(test=True)``): {"X_test" (B,size,T,d), "Y_test" (B,size),
  "Z_test" (B,size,d)}. The head stays the training set's v."""
  test_spec = dataclasses.replace(spec, n=int(size)).validate()
  svmattn.require_x64(dtype)
  X, Y, Z, _ = _unit_gaussian_flat(test_spec, seed, np.asarray(runs, np.uint32).reshape(-1), heads.LINEAR,
                                   np.dtype(dtype), test=True)
  return {"X_test": X, "Y_test": Y, "Z_test": Z}


TEST_FIELDS = ("X_test", "Y_test", "Z_test")


def load_test_npz(path, data: Dataset, dtype=np.float64) -> dict | None:
  """The test arrays of a --data file (X_test (B,m,T,d), Y_test (B,m), Z_test (B,m,d), all or none),
  checked against its data sets ``data``; None where it has none. Raises DataError."""
  path = os.fspath(path)
  try:
    with np.load(path, allow_pickle=False) as f:
      present = [k for k in TEST_FIELDS if k in f.files]
      if not present:
        return None
      if len(present) < len(TEST_FIELDS):
        raise DataError(f"{path}: a test set needs X_test, Y_test and Z_test; found only {present}")
      arrays = npz_arrays(f, TEST_FIELDS, path)
  except DataError:
    raise
  except Exception as e:  # noqa: BLE001 - unreadable: one line
    raise DataError(f"{path}: not a readable .npz data file ({type(e).__name__}: {e})") from e
  B, _, T, d = data.X.shape
  X, Y, Z = arrays["X_test"], arrays["Y_test"], arrays["Z_test"]
  m = X.shape[1] if X.ndim == 4 else -1
  for name, a, shape in (("X_test", X, (B, m, T, d)), ("Y_test", Y, (B, m)), ("Z_test", Z, (B, m, d))):
    if a.shape != shape or m < 1:
      raise DataError(f"{path}: {name} must have shape {shape if m >= 1 else '(B, m, T, d)'} (B={B} data sets, "
                      f"T={T}, d={d}), got {a.shape}")
    if a.dtype.kind not in "fiu" or not np.all(np.isfinite(a)):
      raise DataError(f"{path}: {name} must hold finite real numbers")
  if not np.all(np.isin(Y, (-1, 1))):
    raise DataError(f"{path}: test labels Y_test must be -1 or +1")
  check_magnitudes(arrays, dtype, path)
  return {k: np.asarray(v, dtype) for k, v in arrays.items()}


# ----------------------------------------------------------------------------
# unit_gaussian without a program per shape
# ----------------------------------------------------------------------------
#
# With JAX's partitionable threefry (its default), element i of a flat draw is a function of the
# key and i alone. So the paper's generator draws its four flat arrays (tokens, queries, label
# bits, head) with ``rng.normals`` and ``rng.coin_flips`` (jax.random's own functions, one program
# per kind and bucket of sizes, not per shape). The drawn values are those of ``unit_gaussian``'s
# own draws, bit for bit. The shape work (reshape, unit
# rows, signs of the labels, the head's scaling) is done on the host in NumPy, one data set at a
# time, so a data set is the same whatever the batch it is drawn in. NumPy's norms may round
# differently from XLA's: values move at the rounding level from numerics version 1
# (``_generate_fn`` with ``unit_gaussian``).

def head_size(head: heads.Head, d: int) -> int:
  """The number of normals ``flat_head`` reads for ``head`` in dimension d."""
  return d if head.init is heads._unit_vector else d * d


_FLAT_HEADS = (heads._unit_vector, heads._unit_frobenius_matrix)   # head inits drawn as one flat normal


TEST_SALT = 0x7E57        # a test set's key: fold_in(the data key of r, TEST_SALT), split in four as the data's


def flat_draws(counts: tuple[int, int, int, int], seed: int, runs: np.ndarray, dtype,
               test: bool = False) -> list[np.ndarray]:
  """The four flat draws of run r's data set, for every run of ``runs``, as NumPy arrays (B, count
  each): normals of the keys kx, kz and kv and label bits of ky, where (kx, kz, ky, kv) = split(data
  key of r, 4) (``unit_gaussian``'s keys; the host samplers draw with it too); ``counts`` the number
  of values of each (``rng.run_keys``, ``rng.split_keys``, ``rng.normals``, ``rng.coin_flips``).
  ``test``: the draws of run r's test set instead, from fold_in(data key, TEST_SALT): a key of its own,
  so the training draw does not depend on whether or how large a test set is drawn."""
  runs = np.asarray(runs, np.uint32).reshape(-1)
  nx, nz, ny, nv = (int(c) for c in counts)
  if not len(runs):
    return [np.zeros((0, c), np.bool_ if i == 2 else dtype) for i, c in enumerate((nx, nz, ny, nv))]
  # the keys of the four draws: split(split_run_key(run_key(seed, r))[0], 4), on the host (rng)
  data_keys = rng.split_keys(rng.run_keys(seed, runs))[:, 0]
  if test:
    data_keys = rng.fold_in_keys(data_keys, TEST_SALT)
  kx, kz, ky, kv = np.moveaxis(rng.split_keys(data_keys, 4), 1, 0)
  fx, fz, fv = (rng.normals(k, count, dtype) for k, count in ((kx, nx), (kz, nz), (kv, nv)))
  return [fx, fz, rng.coin_flips(ky, ny), fv]


def host_sampler(fn):
  """Mark ``fn(spec, seed, runs, head, dtype) -> (X, Y, Z, v)`` (NumPy arrays with a leading axis, one
  data set per run) as a sampler computed on the host: ``generate_host`` calls it with every run at
  once instead of compiling a program per shape. It must draw with ``flat_draws`` (or ``rng``'s flat
  draws of each run's keys) and compute every data set on its own, so that data set r is the same
  whatever the runs drawn with it; its head must be one ``flat_head`` draws."""
  fn.on_host = True
  return fn


def flat_head(fv: np.ndarray, head: heads.Head, d: int) -> np.ndarray:
  """The head parameters of a flat draw ``fv`` (B, d or d * d) of ``head_size(head, d)`` normals:
  scaled to unit norm (a vector head, (B, d)) or unit Frobenius norm (a matrix head, (B, d, d))."""
  v = unit_rows_host(fv)   # a matrix head: unit Frobenius norm, the flat draw's norm
  return v if head.init is heads._unit_vector else v.reshape(len(fv), d, d)


def orthonormal_columns(G: np.ndarray) -> np.ndarray:
  """Q of G = Q R with diag R > 0, for every d x T matrix of G (..., d, T), T <= d: the Q factor of
  a QR decomposition with its signs fixed (a Haar-random orthonormal frame when G is Gaussian).

  Gram-Schmidt twice per column (Giraud, Langou and Rozloznik, 2005: orthonormal to about the
  machine epsilon for a numerically full-rank G), vectorized over the leading axes, every dot
  product summed in index order with plain IEEE operations (no BLAS or LAPACK), so a matrix's Q
  depends on that matrix alone, the same bits on every processor."""
  G = np.asarray(G)
  d, T = G.shape[-2:]
  if T > d:
    raise ValueError(f"orthonormal_columns: need T <= d, got a {d} x {T} matrix")
  cols = np.moveaxis(G, (-2, -1), (1, 0)).reshape(T, d, -1)        # cols[j][k]: entry k of column j

  def dot(a, b):
    s = a[0] * b[0]
    for k in range(1, d):
      s = s + a[k] * b[k]
    return s

  Q = []
  for j in range(T):
    v = cols[j].copy()
    for _ in range(2):                                                # classical Gram-Schmidt, twice
      coefs = [dot(q, v) for q in Q]
      for q, c in zip(Q, coefs):
        v = v - q * c
    Q.append(v / np.sqrt(dot(v, v)))
  out = np.stack(Q).reshape((T, d) + G.shape[:-2])
  return np.moveaxis(out, (0, 1), (-1, -2))


def unit_rows_host(a: np.ndarray) -> np.ndarray:
  """Rows of ``a`` (last axis) scaled to unit norm, on the host.

  The sum of squares is computed element-wise, one column at a time (so a row's result does
  not depend on the other rows: NumPy's own reductions may order a sum differently for different
  array shapes), with error-free transformations (Ogita, Rump and Oishi's Dot2: as accurate as
  twice the working precision, plain IEEE operations, the same bits on every platform), so the
  norm is within about an ulp of the exact one."""
  split = np.asarray(2.0 ** ((np.finfo(a.dtype).nmant + 2) // 2) + 1, a.dtype)   # Dekker's splitter

  def two_square(x):
    p = x * x
    c = split * x
    hi = c - (c - x)
    lo = x - hi
    return p, lo * lo - (((p - hi * hi) - lo * hi) - hi * lo)

  cols = np.ascontiguousarray(np.moveaxis(a, -1, 0))   # column k: cols[k], contiguous
  total, err = two_square(cols[0])
  for k in range(1, a.shape[-1]):
    h, r = two_square(cols[k])
    t = total + h
    z = t - total
    q = (total - (t - z)) + (h - z)
    total, err = t, err + (q + r)
  return a / np.sqrt(total + err)[..., None]


def _unit_gaussian_flat(spec: DataSpec, seed: int, runs: np.ndarray, head: heads.Head,
                        dtype, test: bool = False) -> tuple[np.ndarray, ...]:
  """``unit_gaussian`` for every run of ``runs`` (NumPy arrays X, Y, Z, v with a leading axis)."""
  n, T, d = spec.n, spec.T, spec.d
  counts = (n * T * d, n * d, n, head_size(head, d))
  fx, fz, fy, fv = flat_draws(counts, seed, runs, dtype, test)
  B = len(runs)
  X = unit_rows_host(fx[:, :counts[0]].reshape(B, n, T, d))
  Z = X[:, :, spec.query_pos] if spec.attention == "self" else unit_rows_host(fz[:, :counts[1]].reshape(B, n, d))
  nd = np.dtype(dtype)
  Y = np.ones((B, n), nd) if spec.labels == "positive" else np.where(fy[:, :n], 1.0, -1.0).astype(nd)
  return X, Y, Z, flat_head(fv[:, :counts[3]], head, d)


def _host_device():
  """The first local CPU device (None, the default device, where JAX has no CPU backend).
  A TPU has no float64 and emulates it slowly, so data sets are drawn on the host whatever
  the default backend; float32 runs round the float64 draw there, as on a CPU."""
  try:
    return jax.local_devices(backend="cpu")[0]
  except RuntimeError:
    return None


@functools.lru_cache(maxsize=32)
def _generate_fn(spec, init, sampler, dtype):
  """One jitted generator per (spec, head init, sampler, dtype); seed and runs are traced. A
  sampler reads only the head's init (``Sampler``), so heads that share their init (the linear
  head and every lambda head) share the program and draw the same data sets.

  lax.map (not vmap) compiles the body for ONE data set, so data set r comes out
  bit for bit the same whatever the number of runs drawn with it.
  """

  head = heads.Head(f"init:{init.__name__}", init, None)

  def gen(seed, runs):
    return jax.lax.map(lambda r: sampler(split_run_key(run_key(seed, r))[0], spec, head, dtype), runs)

  return jax.jit(gen)


# ----------------------------------------------------------------------------
# Validation and files
# ----------------------------------------------------------------------------

class DataError(ValueError):
  """A data set or data file that cannot be used, with the reason."""


def validate(data: Dataset, batched: bool = True, where: str = "data") -> Dataset:
  """Check shapes, finiteness and labels; returns the data as NumPy float arrays.

  batched: True for X (B,n,T,d), Y (B,n), Z (B,n,d), v (B, ...).
  """
  arrays = {}
  for name in Dataset._fields:
    a = getattr(data, name)
    if a is None:
      raise DataError(f"{where}: array '{name}' is missing")
    a = np.asarray(a)
    if a.dtype.kind not in "fiu":
      raise DataError(f"{where}: array '{name}' must be numeric, got dtype {a.dtype}")
    arrays[name] = a
  X, Y, Z, v = (arrays[k] for k in Dataset._fields)
  lead = 1 if batched else 0
  expect = "(B, n, T, d)" if batched else "(n, T, d)"
  if X.ndim != 3 + lead:
    raise DataError(f"{where}: X must have shape {expect}, got {X.shape}")
  B = X.shape[0] if batched else None
  n, T, d = X.shape[lead:]
  if T < 2:
    raise DataError(f"{where}: X must have at least T=2 tokens per sequence, got T={T}")
  if min(n, d) < 1:
    raise DataError(f"{where}: X has an empty axis: {X.shape}")
  pre = (B,) if batched else ()
  if Y.shape != pre + (n,):
    raise DataError(f"{where}: Y must have shape {pre + (n,)} to match X {X.shape}, got {Y.shape}")
  if Z.shape != pre + (n, d):
    raise DataError(f"{where}: Z must have shape {pre + (n, d)} to match X {X.shape}, got {Z.shape}")
  if v.shape not in (pre + (d,), pre + (d, d)):
    raise DataError(f"{where}: v must have shape {pre + (d,)} (or {pre + (d, d)} for a matrix head) to match X "
                    f"{X.shape}, got {v.shape}")
  if batched and B < 1:
    raise DataError(f"{where}: holds no data set (X has shape {X.shape})")
  for name, a in arrays.items():
    if not np.all(np.isfinite(a)):
      bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
      raise DataError(f"{where}: array '{name}' has {bad} non-finite values (NaN or inf)")
  if not np.all(np.isin(Y, (-1.0, 1.0))):
    raise DataError(f"{where}: labels Y must be -1 or +1, got values {np.unique(Y)[:6].tolist()}")
  return Dataset(*(a.astype(np.float64) if a.dtype.kind != "f" else a for a in (X, Y, Z, v)))


def save_npz(path: str | os.PathLike, data: Dataset) -> None:
  """Write a batch of data sets as .npz with arrays X, Y, Z, v (atomically)."""
  data = validate(data, batched=True, where=str(path))
  results_io.write_npz(path, data._asdict())


def load_npz(path: str | os.PathLike, dtype=np.float64) -> Dataset:
  """Read a batch of data sets from .npz (arrays X (B,n,T,d), Y (B,n), Z (B,n,d), v (B,d)).

  Raises DataError naming the file and the problem (missing file, not an npz,
  missing array, bad shape, non-finite values, labels not in {-1, +1}).
  """
  path = os.fspath(path)
  if not os.path.exists(path):
    raise DataError(f"{path}: no such data file")
  try:
    with np.load(path, allow_pickle=False) as f:
      missing = [k for k in Dataset._fields if k not in f.files]
      if missing:
        raise DataError(f"{path}: missing array(s) {missing}; a data file needs X (B,n,T,d), "
                        f"Y (B,n), Z (B,n,d) and v (B,d); found {sorted(f.files)}")
      arrays = npz_arrays(f, Dataset._fields, path)
  except DataError:
    raise
  except Exception as e:  # noqa: BLE001 - BadZipFile, zlib.error, a truncated member, ...: an unreadable file
    raise DataError(f"{path}: not a readable .npz data file ({type(e).__name__}: {e})") from e
  data = validate(Dataset(**arrays), batched=True, where=path)
  check_magnitudes(data._asdict(), dtype, path)
  return Dataset(*(np.asarray(a, dtype) for a in data))


def npz_arrays(npz, names, path: str) -> dict:
  """{name: array} of the members ``names`` of an open .npz; DataError for a member that is no
  .npy (np.load hands back its raw bytes)."""
  out = {}
  for k in names:
    out[k] = npz[k]
    if not isinstance(out[k], np.ndarray):
      raise DataError(f"{path}: its member {k!r} is not an array (.npy); the file must hold arrays written by "
                      "np.savez")
  return out


def check_magnitudes(arrays: dict, dtype=np.float64, where: str = "data") -> None:
  """DataError when a numeric array holds a value too large for models in ``dtype``
  (``magnitude_limit``)."""
  limit = magnitude_limit(dtype)
  for name, a in arrays.items():
    a = np.asarray(a)
    if a.dtype.kind not in "fiu" or not a.size:
      continue
    biggest = float(np.max(np.abs(a.astype(np.float64))))
    if biggest > limit:
      raise DataError(f"{where}: array '{name}' holds values as large as {biggest:.3g}; {np.dtype(dtype).name} "
                      f"models need |values| <= {limit:.0e} (larger ones overflow in the scores and the SVMs); "
                      "rescale the data")


def check_vector_head(path: str | os.PathLike) -> None:
  """DataError when the .npz at ``path`` holds a head v that is not one vector per data set
  (B, d), as a linear head needs (a matrix head's (B, d, d) would fail in training)."""
  try:
    with np.load(os.fspath(path), allow_pickle=False) as f:
      v = npz_arrays(f, ["v"], os.fspath(path))["v"] if "v" in f.files else None
  except DataError:
    raise
  except Exception:  # noqa: BLE001 - unreadable: the format's own loader names the problem
    return
  if v is not None and v.ndim != 2:
    raise DataError(f"{os.fspath(path)}: v must have shape (B, d) (one head vector per data set: this "
                    f"experiment's head is linear), got {v.shape}")


def check_file_magnitudes(path: str | os.PathLike, dtype=np.float64) -> None:
  """``check_magnitudes`` on every array of the .npz at ``path`` (any data format); an unreadable
  file is left to the format's own loader."""
  try:
    with np.load(os.fspath(path), allow_pickle=False) as f:
      arrays = npz_arrays(f, f.files, os.fspath(path))
  except DataError:
    raise
  except Exception:  # noqa: BLE001 - unreadable: the format's own loader names the problem
    return
  check_magnitudes(arrays, dtype, os.fspath(path))


def magnitude_limit(dtype=np.float64) -> float:
  """The largest |value| a data file may hold for models in ``dtype``: the sixth root of the
  largest float, rounded down to a power of ten (1e51 in float64, 1e6 in float32), so that the
  products of several values in the scores, Gram matrices and SVDs stay finite."""
  import math
  return 10.0 ** math.floor(math.log10(float(np.finfo(dtype).max)) / 6)


def take(data: Dataset, index) -> Dataset:
  """Select data sets along the leading axis (NumPy or JAX arrays)."""
  return Dataset(*(a[index] for a in data))
