"""Randomness from explicit keys (ground floor: used by the data generators and the models'
initializations alike). Run r of seed s draws everything from ``run_key(s, r)``."""
from __future__ import annotations

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
