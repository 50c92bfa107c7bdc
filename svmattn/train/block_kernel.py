"""The GD kernel of the closed-form case, with the data sets of a block on the vectorized axis.

``train.loop`` vmaps one data set's step over a block of data sets. For the case the paper's
experiments train most (the single-query model with the linear head, a named loss, exact
numerics, full batch, normalized GD or GD, W or (K,Q)), the vmapped program is a sequence of
batched dots of tiny matrices (6x8 by 10 at E2's sizes), which XLA:CPU runs far below the
machine's rate. Here the same gradient (``models.attention._linear_head_grad``, docs/science.md
section 4) is written once for the whole block with the data-set axis last, where XLA lays it
out as the minor (SIMD) dimension, and h = X v, constant during training, is computed once per
call instead of once per step.

Exactness within a version: every operation reduces over the axes of one data set (n, T, d, m)
and never over the block axis, and the block size is fixed, so a data set's trajectory does not
depend on the other data sets of its block or on its position there (tests/test_block_kernel.py);
replay, resume, any batch size and any device count stay bit for bit the same. The rounding
differs from the vmapped program's (numerics version 3, CHANGELOG.md).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from svmattn.models import attention as model_lib
from svmattn.models import heads
from svmattn.models import losses as losses_lib
from svmattn.optim import optimizers
from svmattn.train import native_kernel

# normalized GD (p <- p - lr g / ||g||_F, optim.optimizers.normalized_gd) and GD (p <- p - lr g)
OPTIMIZERS = {"normalized_gd": True, "ngd": True, "sd_l2": True, "gd": False}
# False: every configuration runs the vmapped per-data-set program (numerics version 2's kernel),
# for the benchmark's side-by-side measurement (programs compiled while it was True stay cached
# in train.loop._JIT_CACHE: clear it when changing this).
ENABLED = True


def supports(config) -> bool:
  """True when ``config`` trains with this kernel: the closed-form gradient's case of
  ``models.attention.make_grad`` with a normalized GD or GD step and full batches; with the ReLU
  head (on W) where the native kernel runs, which has that head's gradient too, in the exact
  numerics and in the authors' (X^T s pooling, g / (||g|| + eps)); with the lambda head (on W, the
  exact numerics) where the native kernel runs."""
  # (the authors' normalized GD is normalized_gd / ngd, optim.optimizers.get_optimizer)
  authors_relu = (config.numerics == "authors" and config.head == "relu"
                  and config.optimizer in ("normalized_gd", "ngd", "gd"))
  closed_form = (ENABLED and config.module is None and not config.train_head and not config.minibatch
                 and (config.numerics == "exact" or authors_relu) and config.model == "single_query"
                 and isinstance(config.loss, str) and config.loss in model_lib.LOSS_DERIVATIVES
                 and not isinstance(config.loss_scale, str) and config.loss_scale == 1.0
                 and optimizers.without_const_schedule(config.optimizer) in OPTIMIZERS)
  if pooled_head(config):            # the native kernel only (float32 data: the vmapped program, in make_advance)
    return closed_form and config.param == "W" and uses_native(config, jnp.float64)
  return closed_form and config.head == "linear" and config.param in ("W", "KQ")


def pooled_head(config) -> bool:
  """True for the heads on the pooled token that the native kernel has: ReLU and lambda."""
  return config.head == "relu" or heads.lambda_of(config.head) is not None


def _last(x):
  return jnp.moveaxis(x, 0, -1)


def _first(x):
  return jnp.moveaxis(x, -1, 0)


def _normalized(g):
  """g / ||g||_F of every data set (axes 0, 1; the block last), as ``normalize_by_leaf_norm``:
  through u = g / max|g|, and 0 where g is 0."""
  peak = jnp.max(jnp.abs(g), axis=(0, 1), keepdims=True)
  u = g / jnp.where(peak > 0, peak, 1)
  norm = jnp.sqrt(jnp.sum(u * u, axis=(0, 1), keepdims=True))
  return jnp.where(peak > 0, u / jnp.where(norm > 0, norm, 1), jnp.zeros_like(g))


def _settings(config):
  """(parameterization, ridge, normalized) of the step that ``config`` trains with."""
  param = model_lib.get_parameterization(config.param)
  lam = param.ridge if config.ridge is None else config.ridge
  return param, lam, OPTIMIZERS[optimizers.without_const_schedule(config.optimizer)]


def make_step(config):
  """step(params, X, Z, Y, h) -> params, every array with the block axis last:
  X (n,T,d,b), Z (n,d,b), Y (n,b), h = X v (n,T,b), W (d,d,b) or K, Q (d,m,b)."""
  param, lam, normalize = _settings(config)
  dl = model_lib.LOSS_DERIVATIVES[config.loss]
  lr = config.lr

  def grad(params, X, Z, Y, h):
    W = params["W"] if param.name == "W" else jnp.einsum("dmb,emb->deb", params["K"], params["Q"])
    q = jnp.einsum("edb,ndb->neb", W, Z)                                   # W z_i
    s = jax.nn.softmax(jnp.einsum("ntdb,ndb->ntb", X, q), axis=1)          # (n,T,b)
    ref = jnp.argmax(s, axis=1)
    h_ref = jnp.take_along_axis(h, ref[:, None], axis=1)                  # (n,1,b)
    dh = h - h_ref
    sd = jnp.sum(s * dh, axis=1)                                           # (n,b)
    f = h_ref[:, 0] + sd
    a = Y * dl(Y * f) / f.shape[0]
    delta = s * (a[:, None] * dh - (a * sd)[:, None])                     # dL/dlogits
    G = jnp.einsum("ndb,neb->deb", jnp.einsum("ntb,ntdb->ndb", delta, X), Z)   # dL/dW
    if param.name == "W":
      grads = {"W": G}
    else:
      grads = {"K": jnp.einsum("deb,emb->dmb", G, params["Q"]), "Q": jnp.einsum("deb,dmb->emb", G, params["K"])}
    if lam:
      grads = {k: g + 2 * lam * params[k] for k, g in grads.items()}
    return grads

  def step(params, X, Z, Y, h):
    grads = grad(params, X, Z, Y, h)
    return {k: params[k] + (-lr) * (_normalized(g) if normalize else g) for k, g in grads.items()}

  return step


def uses_native(config, dtype) -> bool:
  """True when ``config`` (which ``supports``) trains with the native CPU kernel
  (``train.native_kernel``) for data of ``dtype``; otherwise with ``make_step``'s XLA program."""
  return jnp.dtype(dtype) == jnp.float64 and config.loss in native_kernel.LOSSES and native_kernel.available()


def make_native_chunk(trainer, every: int, snapshots: int, starts: bool):
  """run(state, data) -> (state, the starting observation (None unless ``starts``), the
  snapshots, the final attention) of ``train.loop._chunk_fn`` for a whole block (leading axis b),
  where ``uses_native``: the steps, the snapshots' observations and the final attention all come
  from one call of the native kernel (``native_kernel.run_chunk``); the loss of each observation
  is the objective's, mean_i l(Y_i f_i) + lam ridge_sum, from the kernel's predictions f."""
  config = trainer.config
  param, lam, normalize = _settings(config)
  ell = losses_lib.get_loss(config.loss)

  def observations(obs, Y):
    """(W (b,S,d,d), mean largest attention (b,S), loss (b,S)) of the kernel's observations."""
    loss = jnp.mean(ell(Y[None] * obs["f"]), axis=1)                      # (S, b)
    if lam:
      loss = loss + lam * obs["ridge_sum"]
    return jnp.moveaxis(obs["W"], -1, 0), _first(obs["max_prob"]), _first(loss)

  def run(state, data):
    X, Z, Y = _last(data.X), _last(data.Z), _last(data.Y)
    h = _last(data.v)                                                     # V, or v (the kernel computes X v)
    params, obs = native_kernel.run_chunk(
        jax.tree_util.tree_map(_last, state.params), X, Z, Y, h, param=param.name, lr=config.lr, ridge=lam or 0.0,
        every=every, snapshots=snapshots, start=starts, loss=config.loss, normalized=normalize, head=config.head,
        authors=config.numerics == "authors")
    W, p, loss = observations(obs, Y)
    attention = _first(obs["attention"])
    start = (W[:, 0], p[:, 0], loss[:, 0], None, {}) if starts else None      # (no starting attention)
    k = 1 if starts else 0
    out = (W[:, k:], p[:, k:], loss[:, k:], {})
    return state._replace(params=jax.tree_util.tree_map(_first, params)), start, out, attention

  return run


def _step_inputs(data):
  """The data arguments of ``make_step``'s step for a block with the data sets first: X, Z, Y with
  the data sets last, and h = X v, computed once per call."""
  X, Z, Y = _last(data.X), _last(data.Z), _last(data.Y)
  return X, Z, Y, jnp.einsum("ntdb,db->ntb", X, _last(data.v))


def step_cost(config, params, data) -> tuple[float, float]:
  """(flops, bytes accessed) per data set of one step of ``make_step(config)`` on the block ``data``
  (leading axis b on every field, ``params`` likewise): XLA's cost analysis of the compiled step."""
  args = (jax.tree_util.tree_map(_last, params),) + _step_inputs(data)
  cost = jax.jit(make_step(config)).lower(*args).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  b = data.X.shape[0]
  return float(cost.get("flops", float("nan"))) / b, float(cost.get("bytes accessed", float("nan"))) / b


def make_advance(trainer, every: int, snapshots: int):
  """advance(state, data) for a whole block (leading axis b on every field): ``snapshots``
  times ``every`` steps then a snapshot, as ``jax.vmap(trainer.advance_one)`` returns it.
  Where ``uses_native`` the native CPU kernel runs the steps and observes (``make_native_chunk``),
  else the steps run in XLA and ``trainer.observe`` observes."""
  config = trainer.config
  observe = jax.vmap(trainer.observe)
  pooled = pooled_head(config)
  step = None if pooled else make_step(config)

  def steps(params, X, Z, Y, h):
    params, _ = jax.lax.scan(lambda p, _: (step(p, X, Z, Y, h), None), params, None, length=every)
    return params

  def advance(state, data):
    if uses_native(config, data.X.dtype):                    # one call: the steps and the observations
      state, _, out, _ = make_native_chunk(trainer, every, snapshots, False)(state, data)
      return state, out
    if pooled:                                               # float32: the vmapped program, as without this kernel
      return jax.vmap(lambda st, dt: trainer.advance_one(st, dt, every, snapshots))(state, data)
    X, Z, Y, h = _step_inputs(data)

    def outer(params, _):
      params = steps(params, X, Z, Y, h)
      W, p, l, _, extra = observe(jax.tree_util.tree_map(_first, params), data)
      return params, (W, p, l, extra)

    params, out = jax.lax.scan(outer, jax.tree_util.tree_map(_last, state.params), None, length=snapshots)
    out = jax.tree_util.tree_map(lambda x: jnp.swapaxes(x, 0, 1), out)     # (b, S, ...)
    return state._replace(params=jax.tree_util.tree_map(_first, params)), out

  return advance
