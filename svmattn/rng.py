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
# Flat draws for blocks of keys, one program per size
# ----------------------------------------------------------------------------
#
# With JAX's partitionable threefry (its default), element i of a flat draw does not depend on the
# draw's size: a flat draw of N values is the prefix of a flat draw of any larger size. The
# programs below draw, for every key of a block, a flat draw of a bucketed size (``bucket``), so
# that a handful of programs serve every shape (a jitted draw of each shape compiles threefry, and
# the normals' inverse error function, again: 0.3 s to 1 s each). Every operation is element-wise,
# so a key's values do not depend on the others drawn with it, and they are the values of
# ``normal`` / ``uniform`` on that key, bit for bit.

BLOCK = 64           # keys per call of a draw program (the last block padded)
MIN_BUCKET = 64      # the smallest flat-draw size


def bucket(count: int) -> int:
  """The flat-draw size serving ``count`` values: the next power of two, at least MIN_BUCKET."""
  return max(MIN_BUCKET, 1 << max(int(count) - 1, 0).bit_length())


def check_partitionable() -> None:
  """The flat draws below rely on JAX's partitionable threefry (its default): RuntimeError if off."""
  if not jax.config.jax_threefry_partitionable:
    raise RuntimeError("svmattn needs jax_threefry_partitionable=True (JAX's default): its random draws are "
                       "prefixes of larger flat draws, which only that scheme guarantees")


def normal_fn(size: int, dtype, scale: float | None = None):
  """Jitted keys (block, 2) -> (block, size) standard normals, flat, of each key (times the
  constant ``scale`` in the same program, where given: XLA folds it into the draw's own last
  multiplication, so a scaled draw rounds as ``scale * normal(...)`` does in any program)."""
  return _normal_fn(int(size), np.dtype(dtype), scale)


@functools.lru_cache(maxsize=None)
def _normal_fn(size: int, dtype, scale):
  check_partitionable()
  if scale is None:
    return jax.jit(jax.vmap(lambda k: jax.random.normal(k, (size,), dtype)))
  return jax.jit(jax.vmap(lambda k: scale * jax.random.normal(k, (size,), dtype)))


def uniform_fn(size: int, dtype):
  """Jitted (keys (block, 2), minval, maxval) -> (block, size) uniforms on [minval, maxval), flat."""
  return _uniform_fn(int(size), np.dtype(dtype))


@functools.lru_cache(maxsize=None)
def _uniform_fn(size: int, dtype):
  check_partitionable()
  return jax.jit(jax.vmap(lambda k, lo, hi: jax.random.uniform(k, (size,), dtype, lo, hi), (0, None, None)))


# ----------------------------------------------------------------------------
# Keys and coin flips on the host (NumPy), without a compiled program
# ----------------------------------------------------------------------------
#
# Deriving keys (fold_in, split) and fair coin flips is integer arithmetic: JAX's threefry2x32 hash
# (Salmon et al., 2011: 20 rounds of 32-bit additions, rotations and xors, with a key injection
# every 4) on counters, which NumPy computes exactly as XLA does. Compiling those programs cost
# 0.2 to 1 s each in a fresh process; here they cost nothing, and the values are JAX's bit for bit
# (tests/test_rng.py compares them on many keys, sizes and seeds).

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def threefry2x32(k1, k2, x1, x2) -> tuple[np.ndarray, np.ndarray]:
  """The threefry2x32 hash of counters (x1, x2) under keys (k1, k2), element-wise (uint32 arrays,
  broadcast together), as ``jax._src.random.threefry2x32``."""
  k1, k2, x1, x2 = (np.asarray(a, np.uint32) for a in np.broadcast_arrays(k1, k2, x1, x2))
  ks = (k1, k2, k1 ^ k2 ^ _PARITY)
  a, b = x1 + ks[0], x2 + ks[1]
  for i in range(5):
    for r in _ROTATIONS[i % 2]:
      a = a + b
      b = (b << np.uint32(r)) | (b >> np.uint32(32 - r))
      b = a ^ b
    a = a + ks[(i + 1) % 3]
    b = b + ks[(i + 2) % 3] + np.uint32(i + 1)
  return a, b


def run_keys(seed: int, runs) -> np.ndarray:
  """(B, 2) ``run_key(seed, r)`` of every run r of ``runs``: fold_in(PRNGKey(seed), r)."""
  check_partitionable()
  runs = np.asarray(runs, np.uint32).reshape(-1)
  seed = int(seed)
  hi, lo = np.uint32((seed >> 32) & 0xFFFFFFFF), np.uint32(seed & 0xFFFFFFFF)
  a, b = threefry2x32(hi, lo, np.zeros_like(runs), runs)
  return np.stack([a, b], axis=-1)


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


def in_blocks(fn, keys: np.ndarray, *args) -> list[np.ndarray]:
  """``fn`` (a program of this section) on ``keys`` (B, 2), in blocks of BLOCK, the last padded: its outputs for the B entries, as
  NumPy arrays."""
  keys = np.asarray(keys, np.uint32)
  parts = []
  for start in range(0, len(keys), BLOCK):
    block = keys[start:start + BLOCK]
    padded = np.concatenate([block, np.repeat(block[-1:], BLOCK - len(block), axis=0)])
    out = fn(jnp.asarray(padded), *args)
    parts.append([np.asarray(a)[:len(block)] for a in (out if isinstance(out, tuple) else (out,))])
  return [np.concatenate(p) for p in zip(*parts)]
