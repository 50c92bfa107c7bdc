"""Randomness from explicit keys (ground floor: used by the data generators and the models'
initializations alike). Run r of seed s draws everything from ``run_key(s, r)``."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def run_key(seed: int, run: int | jax.Array) -> jax.Array:
  """The PRNG key of run ``run`` of seed ``seed`` (data and initialization)."""
  return jax.random.fold_in(jax.random.PRNGKey(seed), run)


def split_run_key(key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(data key, init key) of a run key."""
  k_data, k_init = jax.random.split(key)
  return k_data, k_init


def normal(key: jax.Array, shape: tuple[int, ...], dtype=jnp.float64) -> jax.Array:
  """Standard normal samples, drawn flat and reshaped (XLA on CPU compiles a
  multi-dimensional jax.random.normal ~10x slower than a flat one). With JAX's partitionable
  threefry (its default) the values equal jax.random.normal(key, shape, dtype)."""
  return jax.random.normal(key, (int(np.prod(shape)),), dtype).reshape(shape)


def uniform(key: jax.Array, shape: tuple[int, ...], dtype=jnp.float64, minval=0.0, maxval=1.0) -> jax.Array:
  """Uniform samples on [minval, maxval), drawn flat and reshaped (see ``normal``). With JAX's
  partitionable threefry (its default) the values equal jax.random.uniform(key, shape, ...)."""
  return jax.random.uniform(key, (int(np.prod(shape)),), dtype, minval, maxval).reshape(shape)


# ----------------------------------------------------------------------------
# Flat draws for many keys, one program for every size
# ----------------------------------------------------------------------------
#
# With JAX's partitionable threefry (its default), element i of a flat draw of a key is a function
# of the key and i alone: the 64 random bits of threefry2x32(key, (0, i)) (32 for float32), made a
# uniform and, for a normal, sqrt(2) erfinv of a uniform on (-1, 1) (``jax.random``'s own
# formulas). The program below computes that for CALL consecutive elements of the flat
# concatenation of B draws of ``size`` values each (element e: key e // size, position e % size),
# with the keys, the size and the offset given at run time, so ONE program per dtype serves every
# draw size and number of keys, with no padding of small draws (a jitted draw of each size
# compiles threefry and the inverse error function again, 0.3 s to 1 s each). Every operation is
# element-wise, so a key's values do not depend on the keys drawn with it, and they are
# ``normal`` / ``uniform`` of that key, bit for bit (tests/test_rng.py, tests/test_host_init.py).

CALL = 1 << 16       # elements per call of the draw program (the last call padded)
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def check_partitionable() -> None:
  """The flat draws below rely on JAX's partitionable threefry (its default): RuntimeError if off."""
  if not jax.config.jax_threefry_partitionable:
    raise RuntimeError("svmattn needs jax_threefry_partitionable=True (JAX's default): its random draws are "
                       "functions of the key and the position alone, which only that scheme guarantees")


def threefry2x32(k1, k2, x1, x2, xp=np):
  """The threefry2x32 hash of counters (x1, x2) under keys (k1, k2), element-wise (uint32 arrays,
  broadcast together), as ``jax._src.random.threefry2x32`` (Salmon et al., 2011: 20 rounds of
  32-bit additions, rotations and xors, with a key injection every 4); ``xp`` is NumPy (on the
  host) or jax.numpy (inside a program): integer arithmetic, the same bits either way."""
  if xp is np:
    from svmattn import rng_native
    if rng_native.available():                      # the same integers in one C pass (5-50x faster)
      return rng_native.threefry2x32(k1, k2, x1, x2)
    k1, k2, x1, x2 = (np.asarray(a, np.uint32) for a in np.broadcast_arrays(k1, k2, x1, x2))
  u32 = xp.uint32
  ks = (k1, k2, k1 ^ k2 ^ u32(_PARITY))
  a, b = x1 + ks[0], x2 + ks[1]
  for i in range(5):
    for r in _ROTATIONS[i % 2]:
      a = a + b
      b = (b << u32(r)) | (b >> u32(32 - r))
      b = a ^ b
    a = a + ks[(i + 1) % 3]
    b = b + ks[(i + 2) % 3] + u32(i + 1)
  return a, b


@functools.lru_cache(maxsize=None)
def _draw_fn(dtype):
  """Jitted (keys (CALL, 2), skip, size, lo, hi, c, normal) -> (CALL,): element j is position
  (skip + j) % size of key keys[(skip + j) // size]; u, its uniform on [lo, hi), or, where
  ``normal``, c * erfinv(u) (with lo = nextafter(-1, 0), hi = 1 and c = sqrt(2) the standard
  normal: ``jax.random.uniform`` and ``jax.random.normal`` element for element). c = scale *
  sqrt(2) gives scale * normal as XLA computes it in a program, which folds the two constants
  into one multiplication."""
  check_partitionable()
  from jax import lax
  nbits, nmant = np.finfo(dtype).bits, np.finfo(dtype).nmant
  udt = np.dtype(f"uint{nbits}")
  one_bits = np.array(1.0, dtype).view(udt)

  def draw(keys, skip, size, lo, hi, c, normal):
    e = skip + jnp.arange(CALL, dtype=jnp.uint32)
    key, position = keys[e // size], e % size
    a, b = threefry2x32(key[:, 0], key[:, 1], jnp.zeros_like(position), position, xp=jnp)
    bits = (a.astype(udt) << udt.type(32)) | b.astype(udt) if nbits == 64 else a ^ b
    floats = lax.bitcast_convert_type(lax.shift_right_logical(bits, udt.type(nbits - nmant)) | one_bits, dtype)
    lo, hi = lo.astype(dtype), hi.astype(dtype)
    u = lax.max(lo, (floats - jnp.array(1.0, dtype)) * (hi - lo) + lo)
    return jnp.where(normal, c.astype(dtype) * lax.erf_inv(u), u)

  return jax.jit(draw)


# The sizes of the erfinv program: CALL values at a time, the rest of a draw in the smallest size
# that holds it (a small draw padded to CALL computed up to 64 times the values it needed: 4.6x in
# all in E3, whose batches of 50 data sets draw a few thousand values each). Element-wise, so every
# value is the same bits whatever the size of the call (tests/test_rng.py).
ERFINV_SIZES = (1 << 12, 1 << 14, CALL)


@functools.lru_cache(maxsize=None)
def _erfinv_fn(dtype):
  """Jitted (u (size,), c) -> c * erfinv(u) for the sizes of ERFINV_SIZES (a program each): the draw
  program's normal of a uniform u, bit for bit."""
  from jax import lax
  return jax.jit(lambda u, c: c.astype(dtype) * lax.erf_inv(u))


def _erfinv_flat(flat: np.ndarray, c, dtype) -> None:
  """flat (N,) uniforms on (-1, 1) -> c * erfinv(flat), in place: float64 on the host by
  ``rng_native`` where it is built (the erfinv program's values bit for bit, no program), else
  CALL values per call of the erfinv program, the last call in the smallest size of ERFINV_SIZES
  that holds the rest (zero-padded)."""
  if np.dtype(dtype) == np.float64 and flat.dtype == np.float64:
    from svmattn import rng_native
    if rng_native.available():
      rng_native.normals_of_uniforms(flat, float(np.asarray(c, np.float64)))
      return
  fn, c = _erfinv_fn(dtype), np.asarray(c, np.float64)
  for start in range(0, flat.size, CALL):
    part = flat[start:start + CALL]
    size = next(s for s in ERFINV_SIZES if s >= len(part))
    if len(part) < size:
      part = np.concatenate([part, np.zeros(size - len(part), dtype)])
    flat[start:start + CALL] = np.asarray(fn(part, c))[:min(CALL, flat.size - start)]


def _check_size(size: int) -> None:
  if not 0 <= size < 2 ** 32:
    raise ValueError(f"a flat draw has 0 to 2^32 - 1 values, got {size}")


def _draw_native(keys, size: int, dtype, lo, hi, c, normal: bool) -> np.ndarray:
  """``_draw`` with the uniforms computed by ``rng_native`` (float64): the same values bit for bit."""
  from svmattn import rng_native
  u = rng_native.uniforms(keys, size, float(lo), float(hi))
  if normal and u.size:
    _erfinv_flat(u.reshape(-1), c, dtype)
  return u


def _draw(keys, size: int, dtype, lo, hi, c, normal: bool) -> np.ndarray:
  """(B, size) ``_draw_fn`` at positions 0..size-1 of every key of ``keys`` (B, 2), as NumPy (float64:
  the uniforms by ``rng_native`` on the host where it is built, the same values)."""
  dtype = np.dtype(dtype)
  keys = np.asarray(keys, np.uint32).reshape(-1, 2)
  size = int(size)
  _check_size(size)
  total = len(keys) * size
  if dtype == np.float64 and total:
    from svmattn import rng_native
    if rng_native.available():
      check_partitionable()
      return _draw_native(keys, size, dtype, lo, hi, c, normal)
  out = np.empty(total, dtype)
  if total:
    fn = _draw_fn(dtype)
    args = tuple(np.asarray(a, np.float64) for a in (lo, hi, c)) + (np.asarray(bool(normal)),)
    for start in range(0, total, CALL):
      first = start // size
      table = keys[first:first + CALL]
      if len(table) < CALL:
        table = np.concatenate([table, np.repeat(table[-1:], CALL - len(table), axis=0)])
      part = fn(jnp.asarray(table), np.uint32(start - first * size), np.uint32(size), *args)
      out[start:start + CALL] = np.asarray(part)[:min(CALL, total - start)]
  return out.reshape(len(keys), size)


def normals(keys, size: int, dtype=np.float64, scale: float | None = None) -> np.ndarray:
  """(B, size) ``normal(key, (size,), dtype)`` of every key of ``keys`` (B, 2), as NumPy (times the
  constant ``scale`` where given, rounded as ``scale * normal(...)`` in a jitted program)."""
  dtype = np.dtype(dtype)
  c = np.sqrt(np.array(2, dtype)) if scale is None else np.array(scale, dtype) * np.sqrt(np.array(2, dtype))
  lo = np.nextafter(np.array(-1.0, dtype), np.array(0.0, dtype))
  return _draw(keys, size, dtype, lo, np.array(1.0, dtype), c, True)


def normals_many(draws, dtype=np.float64) -> list[np.ndarray]:
  """[``normals(keys, size, dtype)`` for (keys, size) in ``draws``], the same values, with the
  erfinv of all of them in one pass (float64 with ``rng_native``: a few calls of the erfinv program
  for the whole batch instead of a padded one per draw)."""
  dtype = np.dtype(dtype)
  draws = [(np.asarray(k, np.uint32).reshape(-1, 2), int(size)) for k, size in draws]
  from svmattn import rng_native
  if dtype != np.float64 or not rng_native.available():
    return [normals(k, size, dtype) for k, size in draws]
  check_partitionable()
  for _, size in draws:
    _check_size(size)
  lo = float(np.nextafter(-1.0, 0.0))
  flat = np.empty(sum(len(k) * size for k, size in draws), np.float64)
  out, at = [], 0
  for k, size in draws:                            # the uniforms of every draw, one after another
    out.append(flat[at:at + len(k) * size].reshape(len(k), size))
    rng_native.uniforms(k, size, lo, 1.0, out=out[-1])
    at += len(k) * size
  if flat.size:
    _erfinv_flat(flat, np.sqrt(np.array(2, dtype)), dtype)
  return out


def uniforms(keys, size: int, dtype=np.float64, minval=0.0, maxval=1.0) -> np.ndarray:
  """(B, size) ``uniform(key, (size,), dtype, minval, maxval)`` of every key of ``keys`` (B, 2), as NumPy."""
  return _draw(keys, size, dtype, minval, maxval, 0.0, False)


# ----------------------------------------------------------------------------
# Keys and coin flips on the host (NumPy), without a compiled program
# ----------------------------------------------------------------------------
#
# Deriving keys (fold_in, split) and fair coin flips is integer arithmetic: JAX's threefry2x32 hash
# (``threefry2x32`` above) on counters, which NumPy computes exactly as XLA does. Compiling those programs cost
# 0.2 to 1 s each in a fresh process; here they cost nothing, and the values are JAX's bit for bit
# (tests/test_rng.py compares them on many keys, sizes and seeds).

def fold_in_host(keys, data) -> np.ndarray:
  """(B, 2) ``jax.random.fold_in(key, d)`` of every key of ``keys`` (B, 2, or one key (2,) for all)
  and uint32 d of ``data`` (B, or one for all): threefry2x32 of the counters (0, d)."""
  check_partitionable()
  keys = np.asarray(keys, np.uint32).reshape(-1, 2)
  data = np.asarray(data, np.uint32).reshape(-1)
  a, b = threefry2x32(keys[:, 0], keys[:, 1], np.zeros_like(data), data)
  return np.stack([a, b], axis=-1)


def run_keys(seed: int, runs) -> np.ndarray:
  """(B, 2) ``run_key(seed, r)`` of every run r of ``runs``: fold_in(PRNGKey(seed), r)."""
  seed = int(seed)
  return fold_in_host([(seed >> 32) & 0xFFFFFFFF, seed & 0xFFFFFFFF], runs)


def split_host(keys, num: int = 2) -> np.ndarray:
  """(B, num, 2) ``jax.random.split(key, num)`` of every key of ``keys`` (B, 2)."""
  check_partitionable()
  keys = np.asarray(keys, np.uint32).reshape(-1, 2)
  count = np.arange(num, dtype=np.uint32)[None]
  a, b = threefry2x32(keys[:, :1], keys[:, 1:], np.zeros_like(count), count)
  return np.stack([a, b], axis=-1)


def bits_host(keys, size: int) -> np.ndarray:
  """(B, size) ``jax.random.bernoulli(key, 0.5, (size,))`` of every key of ``keys`` (B, 2). The flip
  is uniform(key) < 0.5 with a float64 uniform built from the 64 random bits (hi, lo) of the hash
  of each position, (bits >> 12) / 2^52, which is below 0.5 exactly when the top bit of hi is 0."""
  check_partitionable()
  if not jax.config.jax_enable_x64:
    raise RuntimeError("bits_host needs jax_enable_x64 (svmattn turns it on): JAX's flips are float64 uniforms")
  keys = np.asarray(keys, np.uint32).reshape(-1, 2)
  count = np.arange(size, dtype=np.uint32)[None]
  hi, _ = threefry2x32(keys[:, :1], keys[:, 1:], np.zeros_like(count), count)
  return hi < np.uint32(1 << 31)


def permutations_host(keys, n: int) -> np.ndarray:
  """(B, n) int64 ``jax.random.permutation(key, n)`` of every key of ``keys`` (B, 2). JAX shuffles
  0..n-1 by stable sorts on 32-bit random keys, ceil(3 ln n / ln(2^32 - 1)) rounds (one below
  n = 1626), each round splitting the key and drawing the bits (hi ^ lo of the hash of positions
  0..n-1) from the second half: integer arithmetic and a stable sort, computed here exactly so."""
  check_partitionable()
  keys = np.asarray(keys, np.uint32).reshape(-1, 2)
  n = int(n)
  out = np.broadcast_to(np.arange(n, dtype=np.int64), (len(keys), n)).copy()
  rounds = int(np.ceil(3 * np.log(max(1, n)) / np.log(np.iinfo(np.uint32).max)))
  count = np.arange(n, dtype=np.uint32)[None]
  rows = np.arange(len(keys))[:, None]
  for _ in range(rounds):
    halves = split_host(keys, 2)
    keys, sub = halves[:, 0], halves[:, 1]
    a, b = threefry2x32(sub[:, :1], sub[:, 1:], np.zeros_like(count), count)
    out = out[rows, np.argsort(a ^ b, axis=1, kind="stable")]
  return out


def randint_host(keys, size: int, minval: int, maxval: int) -> np.ndarray:
  """(B, size) int64 ``jax.random.randint(key, (size,), minval, maxval)`` of every key of ``keys``
  (B, 2), for a span maxval - minval of 1 to 2^32 - 1. JAX draws 64 random bits twice per value,
  from the two halves of the key's split, and reduces them modulo the span ((hi mod s) (2^32 mod s)^2
  + lo mod s, mod s): integer arithmetic, computed here exactly as XLA does (uint64 wraps alike)."""
  check_partitionable()
  if not jax.config.jax_enable_x64:
    raise RuntimeError("randint_host needs jax_enable_x64 (svmattn turns it on): JAX's integers are then int64")
  span = int(maxval) - int(minval)
  if not 1 <= span < 2 ** 32:
    raise ValueError(f"randint_host needs 1 <= maxval - minval < 2^32, got {minval}, {maxval}")
  halves = split_host(keys, 2)
  count = np.arange(int(size), dtype=np.uint32)[None]

  def bits64(k):
    a, b = threefry2x32(k[:, :1], k[:, 1:], np.zeros_like(count), count)
    return (a.astype(np.uint64) << np.uint64(32)) | b.astype(np.uint64)

  s = np.uint64(span)
  multiplier = (np.uint64(2 ** 32) % s) * (np.uint64(2 ** 32) % s) % s
  offset = ((bits64(halves[:, 0]) % s) * multiplier + bits64(halves[:, 1]) % s) % s
  return np.int64(minval) + offset.astype(np.int64)
