"""Normalized steepest descent in a norm (docs/science.md section 10), per parameter leaf.

Each direction is Delta = argmax_{||Delta|| <= 1} <G, Delta> for the leaf's gradient G (W, or K and Q
separately); the optimizers below are ``optax.chain(direction, optax.scale(-lr))``, so
p <- p - lr * Delta(grad_p). Every direction has unit norm in its own norm and
<G, Delta> = ||G||_dual. A zero gradient gives a zero step. Pure jnp (jit, vmap, float32, float64).

  entrywise l1:    Delta = sign(G_ij) e_i e_j^T at the largest |G_ij| (ties share 1 equally)
  entrywise l_inf: Delta = sign(G)                                (sign descent)
  entrywise l_p:   Delta = sign(G)|G|^(q-1) / ||G||_q^(q-1),  q = p/(p-1),  1 < p < inf
  spectral:        Delta = U V^T for G = U S V^T (polar factor, by SVD; singular values below
                   max(m, n) * eps * s_max count as zero, so a rank-deficient G gets the polar
                   factor of its range, not arbitrary null-space directions)
  spectral (NS):   Muon's quintic Newton-Schulz iteration on G / ||G||_F (approximate polar factor)
  nuclear:         Delta = u_1 v_1^T (top singular pair)

All directions are homogeneous of degree 0 in G, so they are computed on u = G / max|G| (no
underflow when squaring or powering a gradient of 1e-25 in float32).
"""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import optax

# Muon's quintic Newton-Schulz coefficients and step count (Jordan et al. 2024; optax.contrib.muon).
MUON_NS_COEFFS = (3.4445, -4.775, 2.0315)
MUON_NS_STEPS = 5
# The classical cubic Newton-Schulz iteration X <- 1.5 X - 0.5 X X^T X: converges to the exact polar
# factor for singular values in (0, sqrt(3)) (slowly for small ones).
CUBIC_NS_COEFFS = (1.5, -0.5, 0.0)


def _peak_scaled(g):
  """(u, peak, nonzero): u = g / max|g| (g itself where g = 0)."""
  peak = jnp.max(jnp.abs(g))
  nonzero = peak > 0
  return g / jnp.where(nonzero, peak, 1), peak, nonzero


def _as_matrix(g):
  if g.ndim > 2:
    raise ValueError(f"matrix-norm steepest descent needs leaves of at most 2 dimensions, got shape {g.shape}")
  return g.reshape(-1, 1) if g.ndim < 2 else g


# ----------------------------------------------------------------------------
# Directions of one leaf
# ----------------------------------------------------------------------------

def l1_direction(g):
  """sign(G_ij) at the entries of largest |G_ij|, 1 shared equally among ties (||Delta||_1 = 1)."""
  peak = jnp.max(jnp.abs(g))
  top = (jnp.abs(g) == peak) & (peak > 0)
  count = jnp.sum(top)
  return jnp.where(top, jnp.sign(g), 0).astype(g.dtype) / jnp.maximum(count, 1).astype(g.dtype)


def linf_direction(g):
  """sign(G) (||Delta||_inf = 1 unless G = 0)."""
  return jnp.sign(g)


def l2_direction(g):
  """G / ||G||_F."""
  u, _, nonzero = _peak_scaled(g)
  norm = jnp.sqrt(jnp.sum(u * u))
  return jnp.where(nonzero, u / jnp.where(norm > 0, norm, 1), jnp.zeros_like(g))


def lp_direction(g, p: float):
  """sign(G)|G|^(q-1) / ||G||_q^(q-1), q = p/(p-1): the unit-l_p direction of steepest descent."""
  if not (1 < p < math.inf):
    raise ValueError(f"lp_direction needs 1 < p < inf, got {p}")
  q = p / (p - 1)
  u, _, nonzero = _peak_scaled(g)
  a = jnp.abs(u)
  num = jnp.sign(u) * a ** (q - 1)
  norm_q = jnp.sum(a ** q) ** (1 / q)   # >= 1 where g != 0 (the peak entry is 1)
  return jnp.where(nonzero, num / jnp.where(nonzero, norm_q, 1) ** (q - 1), jnp.zeros_like(g))


def spectral_direction(g, rtol: float | None = None):
  """Polar factor U V^T of G by SVD, over the singular values above rtol * s_max
  (default rtol = max(m, n) * eps of the dtype); 0 where G = 0. ||Delta||_2 = 1, <G, Delta> = ||G||_*."""
  shape = g.shape
  u, _, nonzero = _peak_scaled(_as_matrix(g))
  U, s, Vt = jnp.linalg.svd(u, full_matrices=False)
  if rtol is None:
    rtol = max(u.shape) * float(jnp.finfo(u.dtype).eps)
  keep = (s > rtol * s[0]).astype(u.dtype)
  polar = (U * keep) @ Vt
  return jnp.where(nonzero, polar, jnp.zeros_like(u)).reshape(shape)


def newton_schulz_direction(g, steps: int = MUON_NS_STEPS, coeffs=MUON_NS_COEFFS):
  """Approximate polar factor of G: X_0 = G / ||G||_F, then ``steps`` times
  X <- a X + (b A + c A^2) X with A = X X^T (the smaller Gram side). With Muon's coefficients
  (default) the singular values land near 1 (roughly in [0.7, 1.2]), not on it; with
  CUBIC_NS_COEFFS and enough steps X converges to the exact polar factor."""
  shape = g.shape
  x = l2_direction(_as_matrix(g))
  a, b, c = coeffs
  transpose = x.shape[0] > x.shape[1]
  if transpose:
    x = x.T
  for _ in range(steps):
    A = x @ x.T
    x = a * x + (b * A + c * (A @ A)) @ x
  if transpose:
    x = x.T
  return x.reshape(shape)


def nuclear_direction(g):
  """u_1 v_1^T, the top singular pair of G (||Delta||_* = 1, <G, Delta> = ||G||_2); 0 where G = 0."""
  shape = g.shape
  u, _, nonzero = _peak_scaled(_as_matrix(g))
  U, _, Vt = jnp.linalg.svd(u, full_matrices=False)
  top = jnp.outer(U[:, 0], Vt[0])
  return jnp.where(nonzero, top, jnp.zeros_like(u)).reshape(shape)


# ----------------------------------------------------------------------------
# GradientTransformations and optimizers
# ----------------------------------------------------------------------------

def per_leaf(direction: Callable) -> optax.GradientTransformation:
  """The stateless transformation g_p -> direction(g_p) for every parameter leaf p."""

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    del params
    return jax.tree_util.tree_map(direction, updates), state

  return optax.GradientTransformation(init_fn, update_fn)


def steepest_direction(norm: str, p: float | None = None, **kwargs) -> optax.GradientTransformation:
  """norm: "l1", "linf", "l2", "lp" (with p), "spectral", "spectral_ns", "nuclear"."""
  if norm == "l1":
    fn = l1_direction
  elif norm == "linf":
    fn = linf_direction
  elif norm == "l2":
    fn = l2_direction
  elif norm == "lp":
    if p is None or not (1 < p < math.inf):
      raise ValueError(f"steepest descent in l_p needs 1 < p < inf, got p={p}")
    fn = lambda g: lp_direction(g, p)  # noqa: E731
  elif norm == "spectral":
    fn = lambda g: spectral_direction(g, **kwargs)  # noqa: E731
  elif norm == "spectral_ns":
    fn = lambda g: newton_schulz_direction(g, **kwargs)  # noqa: E731
  elif norm == "nuclear":
    fn = nuclear_direction
  else:
    raise ValueError(f"unknown steepest-descent norm {norm!r}")
  return per_leaf(fn)


def steepest_descent(learning_rate: float, norm: str, p: float | None = None, **kwargs) -> optax.GradientTransformation:
  """p <- p - lr * Delta(grad_p), Delta the unit steepest-descent direction in ``norm``."""
  return optax.chain(steepest_direction(norm, p, **kwargs), optax.scale(-learning_rate))


def polyak(max_learning_rate: float = 1.0, scaling: float = 1.0,
           f_min: float = 0.0) -> optax.GradientTransformationExtraArgs:
  """Polyak's step size, capped (own implementation; the semantics of
  optax.polyak_sgd(max_learning_rate, scaling, f_min)): with f the objective's value (keyword
  ``value`` of update) and g the gradient of all leaves together,
      p <- p - gamma g,   gamma = min(scaling * (f - f_min) / ||g||^2, max_learning_rate).
  get_optimizer("polyak", lr) is polyak(max_learning_rate=lr), f_min = 0 (the losses are >= 0).
  The cap matters: with a fixed head the loss's infimum is above 0, so uncapped steps blow up as
  g -> 0. Differs from optax.polyak_sgd in: no freeze when ||g||^2 <= float64 eps (optax zeroes
  the step there, and on separable data ||g|| -> 0), ||g|| computed without squaring underflow,
  arithmetic kept in the gradient's dtype (no float64 step on float32 leaves), f < f_min gives
  no step ('sps+'). A zero gradient gives a zero step."""

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None, *, value, **extra):
    del params, extra
    leaves = jax.tree_util.tree_leaves(updates)
    dtype = jnp.result_type(*leaves)
    peak = jnp.max(jnp.stack([jnp.max(jnp.abs(g)).astype(dtype) for g in leaves]))
    nonzero = peak > 0
    safe_peak = jnp.where(nonzero, peak, 1)
    unorm = jnp.sqrt(sum(jnp.sum((g.astype(dtype) / safe_peak) ** 2) for g in leaves))
    gnorm = peak * unorm                                            # ||g||
    gap = jnp.maximum(jnp.asarray(value, dtype) - f_min, 0)
    # gamma g = [scaling gap / ||g||] * [g / ||g||], capped so that gamma <= max_learning_rate
    length = jnp.minimum(scaling * gap / jnp.where(nonzero, gnorm, 1), max_learning_rate * gnorm)
    scale = jnp.where(nonzero, length / jnp.where(nonzero, gnorm, 1), 0)
    return jax.tree_util.tree_map(lambda g: (-scale * g).astype(g.dtype), updates), state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
