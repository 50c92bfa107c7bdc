"""Training a linear classifier, the linear-classifier control (docs/science.md,
"Linear-classifier control").

  train_binary(X, y, optimizer, lr, steps, every, schedule)      -> LinearRun(w (B, S, d), ...)
  train_multiclass(X, y, k, optimizer, lr, steps, every, schedule) -> LinearRun(w (B, S, k, d), ...)

f(x) = w^T x with the logistic loss mean_i log(1 + exp(-y_i w^T x_i)) (y in +-1), or f(x) = W x
with the cross-entropy mean_i [logsumexp(W x_i) - (W x_i)_{y_i}] (y in 0..k-1); w = 0 at
initialization; any optimizer name of ``optim.optimizers.get_optimizer``; jit(vmap over data
sets) of a lax.scan over snapshots of a lax.scan over ``every`` steps. Snapshot s holds w after
(s + 1) * every steps (S = steps // every).

Mini-batch training (``minibatch`` > 0, docs/science.md section 15): step t trains on the loss
of the ``minibatch`` points ``train.loop.minibatch_indices(key, t, n, minibatch, sampling)`` of
each data set (the attention loop's rule, from the run's own key); 0 is full batch. The loss
recorded at snapshots is always the full-data loss. Optimizers that need the objective (polyak)
get the mini-batch loss.

Step sizes (``schedule``): "constant" lr, or "inv_sqrt" lr / sqrt(t + 1) (t = 0, 1, ...), the
decaying steps under which normalized steepest descent's margin converges (Fan, Schmidt,
Thrampoulidis 2025, arXiv 2502.04664); a constant step makes a normalized method oscillate at
distance ~ lr around a direction.

A standalone loop rather than ``train.loop``: that loop trains the attention weights W (d, d) of a
model with a head and reports attention diagnostics (softmax scores, selected tokens, Att-SVM
correlations) that a linear classifier has none of; this loop is thirty lines of the same
construction (explicit float64, vmap over data sets, scan over steps).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from svmattn.optim import optimizers
from svmattn.train import loop as loop_lib


@dataclasses.dataclass(frozen=True)
class LinearRun:
  """w: (B, S, d) or (B, S, k, d) snapshots; steps: (S,) the step count of each snapshot;
  loss: (B, S) the training loss at each snapshot; last_rise: (B,) the last step t at which the
  objective the step saw, L(w_t) (a mini-batch's loss with mini-batches), was above L(w_{t-1}),
  checked at every step (0 if it never rose): the end of the oscillating phase of large steps."""
  w: np.ndarray
  steps: np.ndarray
  loss: np.ndarray
  last_rise: np.ndarray | None = None


def logistic_loss(w, X, y):
  """mean_i log(1 + exp(-y_i w^T x_i)); X (n, d), y (n,) in +-1."""
  return jnp.mean(jax.nn.softplus(-y * (X @ w)))


def cross_entropy_loss(W, X, y):
  """mean_i [logsumexp(W x_i) - (W x_i)_{y_i}]; X (n, d), y (n,) int in 0..k-1, W (k, d).

  Written as softplus(logsumexp_{c != y_i} (W_c - W_{y_i})^T x_i), which has the same value but
  an accurate gradient at large margins: the usual form's gradient softmax - onehot computes
  1 - p_{y_i}, which rounds to 0 in float64 once the margin exceeds ~37, zeroing the correct
  class's row while the other rows keep their tiny values -- harmless for GD, but it turns a
  normalized method's direction (sign, polar factor) into a wrong one."""
  S = X @ W.T
  D = S - jnp.take_along_axis(S, y[:, None], axis=1)
  other = jnp.arange(W.shape[0])[None, :] != y[:, None]
  return jnp.mean(jax.nn.softplus(jax.nn.logsumexp(jnp.where(other, D, -jnp.inf), axis=1)))


def _optimizer(name: str, lr: float, schedule: str) -> optax.GradientTransformation:
  if schedule == "constant":
    return optimizers.get_optimizer(name, lr)
  if schedule == "inv_sqrt":
    # get_optimizer(name, 1) is the unit-step method (for the normalized ones the unit
    # steepest-descent direction); scale it by the decaying step lr / sqrt(t + 1).
    return optax.chain(optimizers.get_optimizer(name, 1.0),
                       optax.scale_by_schedule(lambda t: lr / jnp.sqrt(t + 1.0)))
  raise ValueError(f"schedule must be 'constant' or 'inv_sqrt', got {schedule!r}")


@functools.lru_cache(maxsize=64)
def _train_fn(loss_name: str, name: str, lr: float, schedule: str, n_snap: int, every: int,
              minibatch: int = 0):
  loss_fn = logistic_loss if loss_name == "logistic" else cross_entropy_loss
  opt = _optimizer(name, lr, schedule)
  value = optimizers.needs_value(name)

  def one(w0, X, y, table):
    state0 = opt.init(w0)

    def step(carry, idx):
      w, state, t, prev, last = carry
      Xb, yb = (X[idx], y[idx]) if minibatch else (X, y)
      f, g = jax.value_and_grad(loss_fn)(w, Xb, yb)
      last = jnp.where((t > 0) & (f > prev), t, last)
      upd, state = opt.update(g, state, w, **({"value": f} if value else {}))
      return (optax.apply_updates(w, upd), state, t + 1, f, last), None

    def block(carry, rows):   # rows (every, minibatch): the points of the next ``every`` steps (None: all)
      carry, _ = jax.lax.scan(step, carry, rows, length=every)
      return carry, (carry[0], loss_fn(carry[0], X, y))

    zero = jnp.zeros((), X.dtype)
    carry, (ws, losses) = jax.lax.scan(block, (w0, state0, jnp.int32(0), zero, jnp.int32(0)), table, length=n_snap)
    return ws, losses, carry[4]

  return jax.jit(jax.vmap(one))


def _run(loss_name, w0, X, y, optimizer, lr, steps, every, schedule, minibatch=0, sampling="without",
         keys=None) -> LinearRun:
  if steps < every or every < 1 or steps % every:
    raise ValueError(f"steps must be a positive multiple of every, got steps={steps}, every={every}")
  n = X.shape[1]
  if not 0 <= minibatch <= n:
    raise ValueError(f"minibatch must be in [0, n={n}], got {minibatch}")
  if minibatch and keys is None:
    raise ValueError("mini-batch training needs the runs' keys (train.loop.init_keys(seed, runs))")
  n_snap = steps // every
  table = None     # the points of every step, drawn on the host (train.loop.minibatch_table_host)
  if minibatch:
    table = loop_lib.minibatch_table_host(keys, 0, steps, n, minibatch, sampling).reshape(
        X.shape[0], n_snap, every, minibatch)
  fn = _train_fn(loss_name, optimizer, float(lr), schedule, n_snap, int(every), int(minibatch))
  ws, losses, last = fn(w0, jnp.asarray(X, jnp.float64), y, table)
  return LinearRun(np.asarray(ws), every * np.arange(1, n_snap + 1), np.asarray(losses), np.asarray(last))


def train_binary(X, y, optimizer: str = "gd", lr: float = 1.0, steps: int = 1000, every: int = 100,
                 schedule: str = "constant", minibatch: int = 0, sampling: str = "without",
                 keys=None) -> LinearRun:
  """Logistic regression from w = 0 on each data set; X (B, n, d), y (B, n) in +-1; ``keys`` (B,)
  the runs' keys (``train.loop.init_keys``), needed when ``minibatch`` > 0."""
  X = np.asarray(X, np.float64)
  w0 = jnp.zeros(X.shape[::2], jnp.float64)
  return _run("logistic", w0, X, jnp.asarray(y, jnp.float64), optimizer, lr, steps, every, schedule,
              minibatch, sampling, keys)


def train_multiclass(X, y, k: int, optimizer: str = "gd", lr: float = 1.0, steps: int = 1000,
                     every: int = 100, schedule: str = "constant", minibatch: int = 0, sampling: str = "without",
                     keys=None) -> LinearRun:
  """Softmax regression W (k, d) from W = 0 on each data set; X (B, n, d), y (B, n) in 0..k-1."""
  X = np.asarray(X, np.float64)
  w0 = jnp.zeros((X.shape[0], k, X.shape[2]), jnp.float64)
  return _run("ce", w0, X, jnp.asarray(y, jnp.int32), optimizer, lr, steps, every, schedule,
              minibatch, sampling, keys)
