"""Prediction heads h(r) on the pooled token r = X^T s, and token scores.

A head is a pair of pure functions (in the spirit of optax):
  init(key, d, dtype) -> params     (fixed head parameters, stored as ``v``)
  apply(params, r) -> scalar        h(r) for one pooled token r (d,)
New heads (ReLU, lambda, trained heads) are new entries of ``HEADS``.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp


class Head(NamedTuple):
  name: str
  init: Callable[[jax.Array, int, Any], jax.Array]
  apply: Callable[[jax.Array, jax.Array], jax.Array]


def _unit_vector(key, d, dtype):
  v = jax.random.normal(key, (d,), dtype)
  return v / jnp.linalg.norm(v)


def _linear_apply(v, r):
  """h(r) = v^T r."""
  return jnp.dot(v, r)


LINEAR = Head("linear", _unit_vector, _linear_apply)

HEADS: dict[str, Callable[..., Head]] = {"linear": lambda: LINEAR}


def get_head(name: str, **kwargs) -> Head:
  """A head by name (``HEADS`` lists them)."""
  if name not in HEADS:
    raise ValueError(f"unknown head {name!r}; known heads: {sorted(HEADS)}")
  return HEADS[name](**kwargs)


def token_scores(head: Head, v: jax.Array, X: jax.Array, Y: jax.Array) -> jax.Array:
  """gamma_it = Y_i h(x_it) for one data set: X (n,T,d), Y (n,) -> (n,T)."""
  h = jax.vmap(jax.vmap(head.apply, (None, 0)), (None, 0))(v, X)
  return Y[:, None] * h
