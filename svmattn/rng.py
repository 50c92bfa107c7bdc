"""Randomness from explicit keys (ground floor: used by the data generators and the models'
initializations alike). Run r of seed s draws everything from ``run_key(s, r)``.

Every value is ``jax.random``'s own: the functions below call its public functions (``fold_in``,
``split``, ``normal``, ``uniform``, ``bernoulli``, ``randint``, ``permutation``) in jitted programs
vmapped over many keys at once, and return NumPy arrays. A program is compiled per kind of draw,
per bucket of its size and per bucket of its number of keys (powers of two), not per exact shape:

- a batch of keys is drawn in calls of at most CALL_VALUES values, the rest of it padded to a power
  of two (repeating its last key), and the padding dropped: vmap computes each
  key on its own, so a key's values do not depend on the keys drawn with it;
- a flat draw of ``size`` values is the first ``size`` values of a draw of the bucket's size. With
  JAX's partitionable threefry (its default), value i of a flat draw is a function of the key and
  i alone, so that prefix is the draw itself, bit for bit (``check_partitionable``;
  tests/test_rng.py checks the property on JAX's functions).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

CALL_VALUES = 1 << 20    # values per call of a draw program at most (larger batches of keys are cut)
LEAST_SIZE = 128         # the smallest bucket of sizes
LEAST_NORMALS = 512      # normals' (a data set's few draws share one erfinv program; a start's uniforms
                         # stay close to their size: they are drawn inside every timed training call)


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


def check_partitionable() -> None:
  """The draws below rely on JAX's partitionable threefry (its default): RuntimeError if off."""
  if not jax.config.jax_threefry_partitionable:
    raise RuntimeError("svmattn needs jax_threefry_partitionable=True (JAX's default): its random draws are "
                       "functions of the key and the position alone, which only that scheme guarantees")


def _bucket(n: int, least: int = LEAST_SIZE) -> int:
  """The smallest power of two >= max(n, least)."""
  return 1 << (max(int(n), least) - 1).bit_length()


_PROGRAMS: dict = {}      # (kind, size, dtype, consts) -> its jitted program


def programs() -> list[tuple]:
  """The (kind, size, dtype, consts) of every draw program made in this process (one per bucket)."""
  return sorted(_PROGRAMS, key=repr)


def _program(kind: str, size: int, dtype: str, *consts):
  """The jitted draw of ``kind`` for a batch of keys (B, 2) (and per-key values (B,) each: "fold_in"'s
  data, "uniform"'s bounds): a ``jax.random`` function of one key, vmapped."""
  name = (kind, size, dtype, consts)
  if name not in _PROGRAMS:
    _PROGRAMS[name] = _make_program(kind, size, np.dtype(dtype), consts)
  return _PROGRAMS[name]


def _make_program(kind: str, size: int, dt: np.dtype, consts: tuple):

  def one(key, *data):
    if kind == "fold_in":
      return jax.random.fold_in(key, data[0])
    if kind == "split":
      return jax.random.split(key, size)          # split(key, n)[i] depends on key and i alone, as a draw's values
    if kind == "normal":
      x = jax.random.normal(key, (size,), dt)
      return x if consts[0] is None else consts[0] * x     # a constant factor, as a program rounds it
    if kind == "uniform":                         # the bounds given at run time: one program for all
      return jax.random.uniform(key, (size,), dt, data[0], data[1])
    if kind == "randint":
      return jax.random.randint(key, (size,), consts[0], consts[1])
    if kind == "permutation":
      return jax.random.permutation(key, size)
    raise ValueError(f"rng: no draw {kind!r}")

  return jax.jit(jax.vmap(one))


def _keys(keys) -> np.ndarray:
  keys = np.asarray(keys)
  if keys.dtype != np.uint32 and not np.issubdtype(keys.dtype, np.integer):
    raise TypeError(f"rng: keys must be uint32 key data (B, 2), got {keys.dtype}")
  return keys.astype(np.uint32, copy=False).reshape(-1, 2)


def _draw(kind: str, keys, size: int, dtype=np.float64, *consts, data=(), cut: int | None = None) -> np.ndarray:
  """(B, ...) the draw ``kind`` of every key of ``keys``, as NumPy: keys in buckets of powers of two,
  a flat draw of ``size`` values cut from the draw of its bucket's size (``cut``: the size to draw)."""
  check_partitionable()
  keys = _keys(keys)
  B = len(keys)
  draw_size = size if cut is None else cut
  most = max(1, CALL_VALUES // _bucket(draw_size, 1))     # keys a call at most
  fn = _program(kind, draw_size, np.dtype(dtype).name, *consts)
  parts, start = [], 0
  while start < max(B, 1):
    block = min(_bucket(B - start, 8), most)      # the rest's power of two, or a full call
    chunk = keys[start:start + block]
    if not len(chunk):
      chunk = np.zeros((1, 2), np.uint32)
    pad = block - len(chunk)
    args = [np.concatenate([chunk, np.repeat(chunk[-1:], pad, axis=0)])]
    for d in data:                                # per-key values (B,)
      d = d[start:start + block]
      args.append(np.concatenate([d, np.repeat(d[-1:], pad)]) if len(d) else np.zeros(block, d.dtype))
    parts.append(np.asarray(fn(*args))[:len(keys[start:start + block])])
    start += block
  out = np.concatenate(parts)
  return out[:, :size] if cut is not None else out


def run_keys(seed: int, runs) -> np.ndarray:
  """(B, 2) uint32: ``run_key(seed, r)`` of every run r of ``runs``."""
  runs = np.asarray(runs).reshape(-1)
  if runs.size and (runs.min() < 0 or runs.max() >= 2 ** 32):
    raise ValueError(f"run indices must lie in [0, 2^32), got {runs.min()} to {runs.max()}")
  root = np.asarray(jax.random.PRNGKey(int(seed)), np.uint32)
  return fold_in_keys(np.broadcast_to(root, (len(runs), 2)), runs)


def fold_in_keys(keys, data) -> np.ndarray:
  """(B, 2) ``jax.random.fold_in(key, d)`` of every key of ``keys`` (B, 2, or one key for all) and
  uint32 d of ``data`` (B, or one for all)."""
  keys, data = _keys(keys), np.asarray(data).reshape(-1)
  B = max(len(keys), len(data))
  keys = np.broadcast_to(keys, (B, 2)) if len(keys) == 1 else keys
  data = np.broadcast_to(data, (B,)) if len(data) == 1 else data
  if len(keys) != len(data):
    raise ValueError(f"fold_in_keys: {len(keys)} keys and {len(data)} values")
  return _draw("fold_in", keys, 0, np.uint32, data=(data.astype(np.uint32),))


def split_keys(keys, num: int = 2) -> np.ndarray:
  """(B, num, 2) ``jax.random.split(key, num)`` of every key of ``keys`` (B, 2)."""
  num = int(num)
  return _draw("split", keys, num, np.uint32, cut=_bucket(num, 4))


def normals(keys, size: int, dtype=np.float64, scale: float | None = None) -> np.ndarray:
  """(B, size) ``normal(key, (size,), dtype)`` of every key of ``keys`` (B, 2) (times the constant
  ``scale`` where given, rounded as ``scale * normal(...)`` in a jitted program)."""
  scale = None if scale is None else float(scale)
  return _draw("normal", keys, int(size), dtype, scale, cut=_bucket(size, LEAST_NORMALS))


def uniforms(keys, size: int, dtype=np.float64, minval=0.0, maxval=1.0) -> np.ndarray:
  """(B, size) ``uniform(key, (size,), dtype, minval, maxval)`` of every key of ``keys`` (B, 2)."""
  keys = _keys(keys)
  bounds = tuple(np.full(len(keys), v, np.dtype(dtype)) for v in (minval, maxval))
  return _draw("uniform", keys, int(size), dtype, data=bounds, cut=_bucket(size))


def coin_flips(keys, size: int) -> np.ndarray:
  """(B, size) bool ``jax.random.bernoulli(key, 0.5, (size,))`` of every key of ``keys`` (B, 2):
  ``jax.random.bernoulli(key, p)`` is ``uniform(key) < p`` (tests/test_rng.py), so the flips share
  the uniforms' program."""
  return uniforms(keys, size) < 0.5


def randints(keys, size: int, minval: int, maxval: int) -> np.ndarray:
  """(B, size) int64 ``jax.random.randint(key, (size,), minval, maxval)`` of every key (B, 2)."""
  if int(maxval) <= int(minval):
    raise ValueError(f"randints needs minval < maxval, got {minval}, {maxval}")
  out = _draw("randint", keys, int(size), np.int64, int(minval), int(maxval), cut=_bucket(size))
  return out.astype(np.int64, copy=False)


def permutations(keys, n: int) -> np.ndarray:
  """(B, n) int64 ``jax.random.permutation(key, n)`` of every key of ``keys`` (B, 2)."""
  return _draw("permutation", keys, int(n), np.int64).astype(np.int64, copy=False)
