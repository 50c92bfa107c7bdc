"""Prediction heads h(r) on the pooled token r = X^T s, and token scores.

A head is a pair of pure functions (in the spirit of optax):
  init(key, d, dtype) -> params     (fixed head parameters, stored as ``v``)
  apply(params, r) -> scalar        h(r) for one pooled token r (d,)
New heads (ReLU, lambda, trained heads) are new entries of ``HEADS``.

Heads (docs/science.md section 1):
  linear   h(r) = v^T r                              v (d,) unit Gaussian
  relu     h(r) = 1^T ReLU(V^T r)                    V (d,d) Gaussian, ||V||_F = 1
  lambda   h(r) = v^T r - lam ||r||^2                v (d,) unit Gaussian, lam a number

A head's ``name`` round-trips: ``get_head(head.name) is head``. The lambda head
carries its lam in the name ("lambda:0.5"), so a training config that holds a head
name string (``TrainConfig(head="lambda:0.5")``) trains with that lam; the same
lam always returns the same Head object (hashable, equal, one jit cache entry).
"""
from __future__ import annotations

import functools
import math
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


def _unit_frobenius_matrix(key, d, dtype):
  """V (d,d) with i.i.d. N(0,1) entries (drawn flat), scaled to ||V||_F = 1."""
  V = jax.random.normal(key, (d * d,), dtype).reshape(d, d)
  return V / jnp.sqrt(jnp.sum(V * V))


def _relu_apply(V, r):
  """h(r) = 1^T ReLU(V^T r): value map V (d,d) after pooling, then ReLU, then sum."""
  return jnp.sum(jax.nn.relu(r @ V))


RELU = Head("relu", _unit_frobenius_matrix, _relu_apply)

LAMBDA_DEFAULT = 1.0


def _check_lam(lam) -> float:
  try:
    value = float(lam)
  except (TypeError, ValueError):
    raise ValueError(f"lambda head: lam must be a finite number, got {lam!r}") from None
  if not math.isfinite(value):
    raise ValueError(f"lambda head: lam must be a finite number, got {lam!r}")
  return value + 0.0  # -0.0 -> 0.0, one head per value


@functools.lru_cache(maxsize=None)
def _lambda_head(lam: float) -> Head:
  def apply(v, r):
    """h(r) = v^T r - lam ||r||^2."""
    return jnp.dot(v, r) - lam * jnp.dot(r, r)

  return Head(f"lambda:{lam!r}", _unit_vector, apply)


def lambda_head(lam: float = LAMBDA_DEFAULT) -> Head:
  """The head h(r) = v^T r - lam ||r||^2 (v unit Gaussian); one Head object per lam."""
  return _lambda_head(_check_lam(lam))


def lambda_of(name: str) -> float | None:
  """The lam of a lambda head's name ("lambda:0.5" -> 0.5; "lambda" -> LAMBDA_DEFAULT), else None."""
  base, sep, arg = name.partition(":")
  if base != "lambda":
    return None
  return _check_lam(arg) if sep else LAMBDA_DEFAULT


HEADS: dict[str, Callable[..., Head]] = {
    "linear": lambda: LINEAR,
    "relu": lambda: RELU,
    "lambda": lambda_head,
}


def get_head(name: str, **kwargs) -> Head:
  """A head by name (``HEADS`` lists them).

  kwargs go to the head's factory (``get_head("lambda", lam=0.5)``). A name
  "NAME:ARG" passes ARG as the factory's one positional argument, so
  ``get_head("lambda:0.5")`` is ``get_head("lambda", lam=0.5)`` and every head's
  ``name`` is a valid argument here.
  """
  if not isinstance(name, str):
    raise ValueError(f"head name must be a string, got {name!r}")
  base, sep, arg = name.partition(":")
  if base not in HEADS:
    raise ValueError(f"unknown head {name!r}; known heads: {sorted(HEADS)} "
                     "(lambda takes its lam as 'lambda:0.5' or lam=0.5)")
  if not sep:
    return HEADS[base](**kwargs)
  if kwargs:
    raise ValueError(f"head {name!r}: give the argument in the name or as a keyword, not both")
  try:
    return HEADS[base](arg)
  except TypeError:
    raise ValueError(f"head {base!r} takes no argument, got {name!r}") from None


def token_scores(head: Head, v: jax.Array, X: jax.Array, Y: jax.Array) -> jax.Array:
  """gamma_it = Y_i h(x_it) for one data set: X (n,T,d), Y (n,) -> (n,T)."""
  h = jax.vmap(jax.vmap(head.apply, (None, 0)), (None, 0))(v, X)
  return Y[:, None] * h
