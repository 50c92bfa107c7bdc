"""Linearly separable data sets for the linear-classifier control (docs/science.md,
"Linear-classifier control").

  binary(seed, runs, n, d, margin)        -> LinearData(X (B,n,d), y (B,n) in {-1,+1})
  multiclass(seed, runs, n, d, k, margin) -> LinearData(X (B,n,d), y (B,n) in 0..k-1)

Data set b is run ``runs[b]`` of ``seed``: everything is drawn from ``rng.run_key(seed, r)``
(= fold_in(PRNGKey(seed), r), the convention of ``datasets.generate``), on the host, in float64,
so a data set does not depend on the list it is drawn in.

Separable by construction, with a margin:
  binary:     x ~ N(0, I_d), a unit teacher u; y = sign(u^T x) (+1 at 0), then x <- x + margin y u,
              so y u^T x >= margin for every point.
  multiclass: x ~ N(0, I_d), a teacher Q (k, d) with orthonormal rows (k <= d); y = argmax Q x,
              then x <- x + margin Q_y, so (Q_y - Q_c)^T x >= margin for every c != y.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from svmattn import rng


@dataclasses.dataclass(frozen=True)
class LinearData:
  """X (B, n, d) float64; y (B, n): +-1 (binary, int) or class labels 0..k-1 (multiclass);
  teacher: (B, d) unit vector (binary) or (B, k, d) orthonormal rows (multiclass)."""
  X: np.ndarray
  y: np.ndarray
  teacher: np.ndarray


def _keys(seed: int, runs) -> list:
  runs = np.asarray(runs, dtype=np.uint32).reshape(-1)
  return [rng.run_key(seed, int(r)) for r in runs]


def _host():
  return jax.local_devices(backend="cpu")[0]


def _draw(seed: int, runs, one) -> LinearData:
  """LinearData of ``one(key) -> (X, y, teacher)`` for every run's key, drawn on the host."""
  with jax.default_device(_host()):
    Xs, ys, teachers = zip(*(one(key) for key in _keys(seed, runs)))
  return LinearData(np.stack(Xs), np.stack(ys).astype(np.int64), np.stack(teachers))


def binary(seed: int, runs: Sequence[int], n: int = 20, d: int = 5, margin: float = 0.1) -> LinearData:
  """Separable binary data sets (see the module docstring)."""
  if n < 1 or d < 1 or margin < 0:
    raise ValueError(f"need n >= 1, d >= 1, margin >= 0; got n={n}, d={d}, margin={margin}")

  def one(key):
    k_x, k_u = jax.random.split(key)
    X = np.array(rng.normal(k_x, (n, d)), np.float64)
    u = np.array(rng.normal(k_u, (d,)), np.float64)
    u /= np.linalg.norm(u)
    y = np.where(X @ u >= 0, 1, -1)
    return X + margin * y[:, None] * u[None, :], y, u
  return _draw(seed, runs, one)


def multiclass(seed: int, runs: Sequence[int], n: int = 30, d: int = 5, k: int = 3,
               margin: float = 0.1) -> LinearData:
  """Separable k-class data sets (see the module docstring); needs 2 <= k <= d."""
  if not (2 <= k <= d) or n < 1 or margin < 0:
    raise ValueError(f"need 2 <= k <= d, n >= 1, margin >= 0; got n={n}, d={d}, k={k}, margin={margin}")

  def one(key):
    k_x, k_q = jax.random.split(key)
    X = np.array(rng.normal(k_x, (n, d)), np.float64)
    G = np.array(rng.normal(k_q, (d, k)), np.float64)
    Q = np.linalg.qr(G)[0].T            # (k, d), orthonormal rows
    y = np.argmax(X @ Q.T, axis=1)
    return X + margin * Q[y], y, Q
  return _draw(seed, runs, one)
