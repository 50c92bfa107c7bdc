"""Margin losses l(u), u = Y f; all strictly decreasing.

  logistic     l(u) = log(1 + e^{-u})
  exponential  l(u) = e^{-u}
  correlation  l(u) = -u
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

LOSSES: dict[str, Callable[[jax.Array], jax.Array]] = {
    "logistic": lambda u: jnp.logaddexp(0.0, -u),
    "exponential": lambda u: jnp.exp(-u),
    "correlation": lambda u: -u,
}


def get_loss(name: str) -> Callable[[jax.Array], jax.Array]:
  """A margin loss by name (``LOSSES`` lists them)."""
  if name not in LOSSES:
    raise ValueError(f"unknown loss {name!r}; known losses: {sorted(LOSSES)}")
  return LOSSES[name]
