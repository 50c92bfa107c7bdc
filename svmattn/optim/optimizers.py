"""Optimizers as optax GradientTransformations.

  normalize_by_leaf_norm():  g_p -> g_p / ||g_p||_F for every parameter p
                             (0 where ||g_p|| = 0)
  normalized_gd(lr):         p <- p - lr * g_p / ||g_p||_F   (the paper's NGD)
  gd(lr):                    p <- p - lr * g_p
  get_optimizer(name, lr):   the above, or any optax optimizer by name (adam, ...)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def normalize_by_leaf_norm() -> optax.GradientTransformation:
  """Divide each parameter's update by its own Frobenius norm.

  Invariant to a positive rescaling of the loss (hence safe with loss scaling).
  """

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    del params

    def normalize(g):
      # g / ||g|| computed as u / ||u|| with u = g / max|g|: squaring a gradient of 1e-25
      # would underflow in float32 (and one of 1e-170 in float64) although g / ||g|| is fine.
      peak = jnp.max(jnp.abs(g))
      u = g / jnp.where(peak > 0, peak, 1)
      norm = jnp.sqrt(jnp.sum(u * u))
      return jnp.where(peak > 0, u / jnp.where(norm > 0, norm, 1), jnp.zeros_like(g))

    return jax.tree_util.tree_map(normalize, updates), state

  return optax.GradientTransformation(init_fn, update_fn)


def normalized_gd(learning_rate: float) -> optax.GradientTransformation:
  """p <- p - lr * grad_p / ||grad_p||_F, each parameter by its own norm."""
  return optax.chain(normalize_by_leaf_norm(), optax.scale(-learning_rate))


def gd(learning_rate: float) -> optax.GradientTransformation:
  """Plain gradient descent p <- p - lr * grad_p."""
  return optax.sgd(learning_rate)


OPTIMIZERS = {"normalized_gd": normalized_gd, "ngd": normalized_gd, "gd": gd}


def get_optimizer(name: str, learning_rate: float) -> optax.GradientTransformation:
  """normalized_gd (alias ngd), gd, or the name of any optax optimizer (adam, sgd, lion, ...)."""
  if name in OPTIMIZERS:
    return OPTIMIZERS[name](learning_rate)
  factory = getattr(optax, name, None)
  if factory is None or not callable(factory) or name.startswith("_"):
    raise ValueError(f"unknown optimizer {name!r}; use one of {sorted(OPTIMIZERS)} "
                     "or the name of an optax optimizer (e.g. adam)")
  try:
    opt = factory(learning_rate)
  except TypeError as e:
    raise ValueError(f"optax.{name} cannot be built from a learning rate alone: {e}") from e
  if not isinstance(opt, optax.GradientTransformation):
    raise ValueError(f"optax.{name} is not an optimizer")
  return opt
