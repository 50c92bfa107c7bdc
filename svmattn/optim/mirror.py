"""Normalized l_p mirror descent (docs/science.md section 10; Julistiono, Tarzanagh, Azizan 2024,
arXiv 2410.14581, code aaronk2002/AttentionMD), per parameter leaf.

Potential psi(W) = (1/p) sum |W_ij|^p, q = p/(p-1). One step, eta the learning rate:

    W' = sign(W)|W|^(p-1) - eta G / ||vec G||_q,      W <- sign(W')|W'|^(1/(p-1)).

As an optax GradientTransformation it needs the params (update = W_new - W); the training loop
passes them (``optimizer.update(grads, state, params)``). p = 2 is normalized GD up to rounding.
A zero gradient gives a zero update. Pure jnp (jit, vmap, float32, float64).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax


def dual_normalized(g, q: float):
  """G / ||vec G||_q (0 where G = 0), computed on G / max|G| (no underflow)."""
  peak = jnp.max(jnp.abs(g))
  nonzero = peak > 0
  u = g / jnp.where(nonzero, peak, 1)
  norm = jnp.sum(jnp.abs(u) ** q) ** (1 / q)
  return jnp.where(nonzero, u / jnp.where(nonzero, norm, 1), jnp.zeros_like(g)), nonzero


def mirror_step(w, g, learning_rate: float, p: float):
  """The new W after one normalized l_p mirror-descent step from W with gradient G."""
  q = p / (p - 1)
  direction, nonzero = dual_normalized(g, q)
  dual = jnp.sign(w) * jnp.abs(w) ** (p - 1) - learning_rate * direction
  new = jnp.sign(dual) * jnp.abs(dual) ** (1 / (p - 1))
  return jnp.where(nonzero, new, w)


def lp_mirror_descent(learning_rate: float, p: float) -> optax.GradientTransformation:
  """Normalized l_p mirror descent, 1 < p < inf; update = W_new - W (needs params)."""
  if not (1 < p < math.inf):
    raise ValueError(f"l_p mirror descent needs 1 < p < inf, got p={p}")

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("lp_mirror_descent: update needs params (update(grads, state, params))")
    return jax.tree_util.tree_map(lambda g, w: mirror_step(w, g, learning_rate, p) - w, updates, params), state

  return optax.GradientTransformation(init_fn, update_fn)
