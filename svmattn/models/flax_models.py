"""Attention models written in flax (linen), trained by the engine's loop like the built-in ones.

The protocol a module follows (a researcher's own module needs nothing else from svmattn):

    class MyModel(nn.Module):
      @nn.compact
      def __call__(self, X, Z, v):        # ONE data set: X (n,T,d), Z (n,d) queries, v its head parameters
        r, s = attend(logits, X)              # softmax s and pooled tokens X^T s (stable; see ``attend``)
        self.sow("intermediates", "attention", s)    # every softmax, (n,T) or (n,K,T): read per layer/head
        self.sow("intermediates", "kq", W)           # optional: its key-query matrix (d,d), snapshotted
        return f                                     # (n,) predictions; the loss is mean_i l(Y_i f_i)

    TrainConfig(module=MyModel(), ...)      # instead of param= / model=; loss_scale: a number or "auto"
                                            # ("auto": every softmax through ``softmax`` / ``attend``)

``svmattn.train.loop`` initializes the module's "params" with ``module.init`` from each run's
init key, vmaps and blocks it over the data sets like any model, normalizes each parameter's
gradient by its own norm (normalized GD), checkpoints and resumes it. Per snapshot it records
every sown "kq" matrix (named by the submodule path, e.g. ``head0_kq``) and their sum as "W";
at the end, every sown "attention" (``head0_attention``, ...); the last one sown is the model's
``attention`` (its ``selected`` tokens).

Built-in flax models (docs/science.md section 13):
  SingleHead   s = softmax(X W z), f = v^T X^T s: the built-in single-query model, for checks
  MultiHead    f = sum_h v_h^T X^T softmax(X W_h z), W_h or K_h Q_h^T; v (H,d) per head or (d,) shared
  TwoLayer     layer 1: self-attention over the tokens with a residual, x1_k = x_k + sum_t softmax_t(x_t^T W1 x_k) x_t;
               layer 2: cross-attention of z over X1, f = v^T X1^T softmax(X1 W2 z)
"""
from __future__ import annotations

import contextvars
import functools
import threading

import jax
import jax.numpy as jnp

from svmattn.models import attention as model_lib

# The module classes, defined with flax on first use (``__getattr__``): flax takes 0.2 s to import, and
# every process that imports the registry imports this module (through the studies that train one).
MODULES = ("KeyQuery", "CrossAttention", "SingleHead", "MultiHead", "SelfAttentionResidual", "TwoLayer")
_DEFINING = threading.Lock()

# loss_scale="auto" of a module's training (train.loop): None (plain softmax), a list (collect each
# softmax's shift) or the shift c (scale every softmax's derivative by exp(c)). Set while tracing.
_AUTO_SCALE = contextvars.ContextVar("svmattn_flax_auto_scale", default=None)


def softmax(logits: jax.Array) -> jax.Array:
  """softmax over the last axis, as jax.nn.softmax; under ``TrainConfig(loss_scale="auto")`` its
  derivative is scaled by the training's shift exp(c) and computed in log space, so that the
  gradient survives float32 once the softmax saturates (see ``auto_scaled``)."""
  mode = _AUTO_SCALE.get()
  if isinstance(mode, list):
    mode.append(model_lib.auto_shift(logits))
  elif mode is not None:
    return model_lib.auto_softmax(logits, mode)
  return jax.nn.softmax(logits, axis=-1)


def attend(logits: jax.Array, X: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(pooled tokens r, softmax s) of attention logits over X's tokens: s = softmax(logits) (see
  ``softmax``) and r = X^T s computed as ``models.attention.pooled_token`` does: around the most
  attended token, free of the cancellation of the textbook X^T s, which rounds the gradient away
  once the softmax saturates (docs/science.md section 9).

  logits (n,T) (one query per sequence) -> r (n,d); or (n,K,T) (K queries) -> r (n,K,d). X (n,T,d).
  """
  s = softmax(logits)
  if s.ndim == 2:
    return model_lib.pooled_token(s, X), s
  return jax.vmap(model_lib.pooled_token, in_axes=(1, None), out_axes=1)(s, X), s


def auto_scaled(loss_fn):
  """loss_fn(params, data) -> L of a module whose softmaxes go through ``softmax`` / ``attend``
  -> the objective of loss_scale="auto" (as ``models.attention.make_loss``): the value L, the
  gradient exp(c) grad L with one shift c per call, c = -max log s over the non-top tokens of
  every such softmax (a first pass of the module, without gradient, finds it). Exact when each
  parameter reaches the loss through one softmax (one layer, any number of heads); a path through
  k stacked softmaxes (TwoLayer's W1 through layer 2) is scaled by exp(k c)."""
  def objective(params, data):
    shifts = []
    token = _AUTO_SCALE.set(shifts)
    try:
      loss_fn(params, data)                # traced for its logits only (XLA drops the rest)
    finally:
      _AUTO_SCALE.reset(token)
    if not shifts:
      raise ValueError("loss_scale='auto' needs the module's softmaxes to go through "
                       "svmattn.models.flax_models.softmax or attend")
    c = jax.lax.stop_gradient(functools.reduce(jnp.minimum, shifts))
    token = _AUTO_SCALE.set(c)
    try:
      return loss_fn(params, data)
    finally:
      _AUTO_SCALE.reset(token)
  return objective


def uniform_init(key, shape, dtype=jnp.float64):
  """U(-1/sqrt(d), 1/sqrt(d)) entrywise with d = shape[-2] (the engine's default init), drawn in
  float64 and rounded to dtype."""
  b = 1.0 / jnp.sqrt(shape[-2])
  return jax.random.uniform(key, shape, jnp.float64, -b, b).astype(dtype)


def __getattr__(name: str):
  """``flax_models.MultiHead`` and the other module classes (``MODULES``), defined on first use."""
  if name not in MODULES:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  with _DEFINING:
    if name not in globals():
      globals().update(_define_modules())
  return globals()[name]


def _define_modules() -> dict:
  """{name: class} of the module classes (flax.linen imported here)."""
  import flax.linen as nn

  class KeyQuery(nn.Module):
    """A key-query matrix: W (d,d) ("W") or K Q^T with K, Q (d,m) ("KQ")."""
    param_kind: str = "W"
    m: int | None = None

    @nn.compact
    def __call__(self, d: int, dtype) -> jax.Array:
      if self.param_kind == "W":
        return self.param("W", uniform_init, (d, d), dtype)
      if self.param_kind != "KQ":
        raise ValueError(f"KeyQuery.param_kind must be 'W' or 'KQ', got {self.param_kind!r}")
      m = self.m or d
      return self.param("K", uniform_init, (d, m), dtype) @ self.param("Q", uniform_init, (d, m), dtype).T

  class CrossAttention(nn.Module):
    """s_i = softmax(X_i W z_i), sown with its W; returns (the pooled tokens r (n,d), s)."""
    param_kind: str = "W"

    @nn.compact
    def __call__(self, X, Z):
      W = KeyQuery(self.param_kind, name="kq_matrix")(X.shape[-1], X.dtype)
      r, s = attend(model_lib.attention_logits(W, X, Z), X)
      self.sow("intermediates", "kq", W)
      self.sow("intermediates", "attention", s)
      return r, s

  class SingleHead(nn.Module):
    """The built-in single-query model with the linear head: f_i = v^T X_i^T softmax(X_i W z_i)."""
    param_kind: str = "W"

    @nn.compact
    def __call__(self, X, Z, v):
      r, _ = CrossAttention(self.param_kind, name="head0")(X, Z)
      return r @ v

  class MultiHead(nn.Module):
    """H heads: f_i = sum_h v_h^T X_i^T softmax(X_i W_h z_i). v: (H,d) one fixed head per attention
    head, or (d,) shared by all."""
    heads: int = 2
    param_kind: str = "W"

    @nn.compact
    def __call__(self, X, Z, v):
      f = 0.0
      for h in range(self.heads):
        r, _ = CrossAttention(self.param_kind, name=f"head{h}")(X, Z)
        f = f + r @ (v[h] if v.ndim == 2 else v)
      return f

  class SelfAttentionResidual(nn.Module):
    """x1_k = x_k + sum_t softmax_t(x_t^T W x_k) x_t per sequence (every token x_k a query, values the tokens)."""
    param_kind: str = "W"

    @nn.compact
    def __call__(self, X):
      W = KeyQuery(self.param_kind, name="kq_matrix")(X.shape[-1], X.dtype)
      r, s = attend(model_lib.seq2seq_logits(W, X, X), X)      # s (n, T, T): query k over tokens t
      self.sow("intermediates", "kq", W)
      self.sow("intermediates", "attention", s)
      return X + r

  class TwoLayer(nn.Module):
    """Layer 1: self-attention with a residual; layer 2: cross-attention of z over layer 1's outputs,
    read out by the linear head v (d,)."""
    param_kind: str = "W"

    @nn.compact
    def __call__(self, X, Z, v):
      X1 = SelfAttentionResidual(self.param_kind, name="layer1")(X)
      self.sow("intermediates", "outputs", X1)
      r, _ = CrossAttention(self.param_kind, name="layer2")(X1, Z)
      return r @ v

  classes = {"KeyQuery": KeyQuery, "CrossAttention": CrossAttention, "SingleHead": SingleHead,
             "MultiHead": MultiHead, "SelfAttentionResidual": SelfAttentionResidual, "TwoLayer": TwoLayer}
  assert tuple(classes) == MODULES
  for name, cls in classes.items():
    cls.__qualname__ = name          # as a class of the module's top level (pickle, repr)
  return classes
