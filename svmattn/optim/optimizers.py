"""Optimizers as optax GradientTransformations.

  normalize_by_leaf_norm():  g_p -> g_p / ||g_p||_F for every parameter p
                             (0 where ||g_p|| = 0)
  normalized_gd(lr):         p <- p - lr * g_p / ||g_p||_F   (the paper's NGD)
  normalize_plus_eps(eps):   g_p -> g_p / (||g_p||_F + eps)   (the authors' code, eps = float64 epsilon)
  normalized_gd_eps(lr):     p <- p - lr * g_p / (||g_p||_F + eps)
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


# The epsilon of the authors' normalization: float64 machine epsilon (whatever the dtype).
AUTHORS_EPS = 2.220446049250313e-16


def normalize_plus_eps(eps: float = AUTHORS_EPS) -> optax.GradientTransformation:
  """Divide each parameter's update by its Frobenius norm plus ``eps``, as the authors' code
  does. Not normalized GD once ||g|| falls to ~eps: the step lr ||g|| / (||g|| + eps) then
  shrinks far below lr and training freezes."""

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    del params
    return jax.tree_util.tree_map(lambda g: g / (jnp.sqrt(jnp.sum(g * g)) + eps), updates), state

  return optax.GradientTransformation(init_fn, update_fn)


def normalized_gd_eps(learning_rate: float, eps: float = AUTHORS_EPS) -> optax.GradientTransformation:
  """p <- p - lr * grad_p / (||grad_p||_F + eps): the authors' normalized GD."""
  return optax.chain(normalize_plus_eps(eps), optax.scale(-learning_rate))


def gd(learning_rate: float) -> optax.GradientTransformation:
  """Plain gradient descent p <- p - lr * grad_p."""
  return optax.sgd(learning_rate)


OPTIMIZERS = {"normalized_gd": normalized_gd, "ngd": normalized_gd, "gd": gd}


def get_optimizer(name: str, learning_rate: float, numerics: str = "exact") -> optax.GradientTransformation:
  """normalized_gd (alias ngd), gd, or the name of any optax optimizer (adam, sgd, lion, ...).

  numerics="authors": normalized_gd divides by ||g|| + float64 epsilon (``normalized_gd_eps``)."""
  if numerics not in ("exact", "authors"):
    raise ValueError(f"numerics must be 'exact' or 'authors', got {numerics!r}")
  if numerics == "authors" and name in ("normalized_gd", "ngd"):
    return normalized_gd_eps(learning_rate)
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
