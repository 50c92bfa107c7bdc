"""The training loop: lax.scan over steps, vmap over data sets, jit once per shape.

    state = init_state(config, data, keys)          # vmapped over B data sets
    trajectory = train(config, data, keys)           # snapshots every k steps

A data-set batch has a leading axis B on every field (see ``svmattn.data.datasets``).
Steps advance in jitted chunks of ``chunk_steps`` (a Python loop over chunks,
for progress reports and, later, checkpoints); inside a chunk, ``lax.scan``
runs ``snapshot_every`` optimizer steps between two snapshots.

A snapshot records, per data set: W (or K Q^T), the mean over sequences of the
largest attention probability (1/n) sum_i max_t s_it, and the loss.

Blocks: the batch is cut into blocks of ``block_size`` data sets (the last one
padded with copies of the last data set); ``vmap`` runs within a block and
``lax.map`` over blocks. XLA's float results depend on the shape of the
vectorized computation, never on the values or positions of the other data sets
in it, so with a fixed block size a data set's trajectory is bit for bit the same
whatever the batch size, the number of devices or the pipeline batch it ran in:
this is what makes replay and multi-device runs exact. Blocks also keep the
working set in cache for large batches.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

import svmattn
from svmattn import rng
from svmattn.data import datasets as data_lib
from svmattn.models import flax_models
from svmattn.models import heads
from svmattn.models import attention as model_lib
from svmattn.models import losses as losses_lib
from svmattn.optim import optimizers
from svmattn.train import block_kernel
from svmattn.train import buckets
from svmattn.train import chunks
from svmattn.train import host_init
from svmattn.train import native_train
# (the chunks' names, as the engine's modules and its users know them: train.loop.State, ...)
from svmattn.train.chunks import State, Trajectory, config_schedule, config_snapshot_steps  # noqa: F401
from svmattn.train.chunks import restore_chunk, save_chunk, schedule, snapshot_steps  # noqa: F401


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything that defines a training run besides the data and the keys.

  Mini-batch training (``minibatch`` > 0; docs/science.md section 15): step t trains on the
  ``minibatch`` sequences ``minibatch_indices(key, t, n, minibatch, sampling)`` of each data set,
  ``key`` its run's initialization key (``init_keys``), t the global step (0 at the start of
  training, whatever the chunk or the ``start``). The objective of a step is the model's own
  objective on the selected sequences (the same mean, over ``minibatch`` sequences instead of n;
  the ridge term unchanged); the snapshots (W, loss, max_prob, attention) stay full-data values.
  The indices are a pure function of (run key, step), so a data set's trajectory does not depend
  on the batch, the block or the device it runs in, and a resumed run needs no sampler state.
    "with": ``minibatch`` indices uniform on 0..n-1 with replacement, drawn from
      fold_in(fold_in(key, SAMPLING_SALT), t).
    "without": the stream perm_0, perm_1, ... of random permutations of 0..n-1, perm_e from
      fold_in(fold_in(key, SAMPLING_SALT), e), consumed ``minibatch`` at a time: step t takes
      stream positions t*minibatch .. (t+1)*minibatch - 1. Epoch e is the n positions of perm_e,
      so every sequence is used exactly once per epoch; when ``minibatch`` does not divide n a
      batch wraps from the end of one epoch into the next (nothing is dropped; such a batch may
      hold one sequence twice, once from each epoch).
    "cyclic": the same stream with every perm_e = 0..n-1 (sequence order, wrapping). With
      ``minibatch`` = n it is full-batch GD, bit for bit the per-data-set (vmapped) program
      (and, where full batch runs ``block_kernel``, equal to it to rounding).
  ``minibatch`` = 0 (the default) is full-batch GD with the very program of a run without
  these fields (no sampling op is traced).
  """
  param: str = "W"                  # "W" or "KQ"
  m: int | None = None              # (K,Q) width; None = d
  head: str = "linear"
  loss: str = "logistic"
  optimizer: str = "normalized_gd"  # or "gd", or any optax optimizer name
  lr: float = 0.1
  steps: int = 2000
  snapshot_every: int = 10
  chunk_steps: int = 500
  init: str = "uniform"             # see model.INIT_SCHEMES
  init_scale: float = 1.0           # the random initialization times this (1: as drawn; every parameterization)
  ridge: float | None = None        # None: the parameterization's default
  model: str = "single_query"       # see model.MODELS
  block_size: int = 64              # data sets per vectorized block (see module docstring)
  loss_scale: float | str = 1.0     # a number multiplies the objective; "auto": see model.make_loss
  numerics: str = "exact"           # "authors": X^T s pooling and g / (||g|| + eps) (docs/science.md section 9)
  train_head: bool = False          # train the head's parameters v with the attention (from data.v)
  module: Any = None                # a flax linen module (models.flax_models' protocol): replaces param/model
  minibatch: int = 0                # sequences per step; 0: all n (full-batch GD, the default)
  sampling: str = "without"         # minibatch > 0: "with", "without" (epochs) or "cyclic" replacement
  chunk_every: int = 0              # > 0: the chunks of a run snapshotting every chunk_every steps (``schedule``)

  def validate(self) -> "TrainConfig":
    if self.module is not None:
      import flax.linen as nn
      if not isinstance(self.module, nn.Module):
        raise ValueError(f"TrainConfig.module must be a flax linen Module, got {type(self.module).__name__}")
      if self.train_head or self.model != "single_query":
        raise ValueError("TrainConfig.module: a flax model goes with the defaults of model and train_head "
                         "(it holds its own architecture)")
      model_lib.check_loss_scale(self.loss_scale)
    model_lib.get_parameterization(self.param)
    heads.get_head(self.head)
    model_lib.get_model(self.model)
    losses_lib.get_loss(self.loss)
    optimizers.get_optimizer(self.optimizer, self.lr, self.numerics)
    if self.init not in model_lib.INIT_SCHEMES:
      raise ValueError(f"TrainConfig.init must be one of {model_lib.INIT_SCHEMES}, got {self.init!r}")
    if (isinstance(self.init_scale, bool) or not isinstance(self.init_scale, (int, float, np.floating))
        or not np.isfinite(self.init_scale) or self.init_scale <= 0):
      raise ValueError(f"TrainConfig.init_scale must be a finite number > 0, got {self.init_scale!r}")
    if (not isinstance(self.chunk_every, (int, np.integer)) or isinstance(self.chunk_every, bool)
        or self.chunk_every < 0):
      raise ValueError(f"TrainConfig.chunk_every must be a non-negative integer (0: snapshot_every), "
                       f"got {self.chunk_every!r}")
    for name in ("steps", "snapshot_every", "chunk_steps", "block_size"):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value < (0 if name == "steps" else 1):
        raise ValueError(f"TrainConfig.{name} must be a {'non-negative' if name == 'steps' else 'positive'} "
                         f"integer, got {value!r}")
    if (self.param == "p") != (self.model == "prompt"):
      raise ValueError(f"TrainConfig: the prompt parameterization 'p' goes with the model 'prompt' (and only "
                       f"it), got param={self.param!r}, model={self.model!r}")
    if self.train_head and self.model.startswith("next_token"):
      raise ValueError(f"TrainConfig.train_head: the model {self.model!r} has no head to train")
    if (not isinstance(self.minibatch, (int, np.integer)) or isinstance(self.minibatch, bool)
        or self.minibatch < 0):
      raise ValueError(f"TrainConfig.minibatch must be a non-negative integer (0: every sequence), "
                       f"got {self.minibatch!r}")
    if self.sampling not in SAMPLINGS:
      raise ValueError(f"TrainConfig.sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
    if self.m is not None and self.m < 1:
      raise ValueError(f"TrainConfig.m must be positive, got {self.m}")
    if not np.isfinite(self.lr) or self.lr <= 0:
      raise ValueError(f"TrainConfig.lr must be a positive number, got {self.lr}")
    return self


SAMPLINGS = ("with", "without", "cyclic")
SAMPLING_SALT = 0x6D696E69       # folded into a run's key before the step or epoch ("mini")


def check_minibatch(config: "TrainConfig", n: int) -> None:
  """ValueError unless 0 <= config.minibatch <= n (n: sequences per data set)."""
  if config.minibatch > n:
    raise ValueError(f"TrainConfig.minibatch={config.minibatch} exceeds the n={n} sequences of a data set "
                     f"(0 trains on all of them)")


def full_batch_if_whole(config: "TrainConfig", n: int) -> "TrainConfig":
  """``config`` with minibatch 0 where its mini-batch is every one of the n sequences in cyclic
  order (each step's gradient is then the full batch's, in the same order): such a run trains on
  the full-batch program, bit for bit, and its kernel."""
  if config.minibatch == n and config.sampling == "cyclic":
    return dataclasses.replace(config, minibatch=0)
  return config


def minibatch_indices(key: jax.Array, step, n: int, minibatch: int, sampling: str) -> jax.Array:
  """(minibatch,) int: the sequences step ``step`` trains on (see ``TrainConfig``). Pure, jittable
  (``step`` may be traced; n, minibatch and sampling are static)."""
  if not 1 <= minibatch <= n:
    raise ValueError(f"minibatch_indices: minibatch must be in [1, n={n}], got {minibatch}")
  step = jnp.asarray(step)
  key = jax.random.fold_in(key, SAMPLING_SALT)
  if sampling == "with":
    return jax.random.randint(jax.random.fold_in(key, step), (minibatch,), 0, n)
  pos = step * minibatch + jnp.arange(minibatch, dtype=step.dtype)          # stream positions
  if sampling == "cyclic":
    return pos % n
  if sampling != "without":
    raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
  epoch = (step * minibatch) // n                                          # epoch of the first position
  perm = lambda e: jax.random.permutation(jax.random.fold_in(key, e), n)  # noqa: E731
  offset = pos % n
  if n % minibatch == 0:                                                   # a batch never crosses an epoch
    return perm(epoch)[offset]
  return jnp.where(pos // n == epoch, perm(epoch)[offset], perm(epoch + 1)[offset])


def minibatch_table_host(keys, first: int, steps: int, n: int, minibatch: int, sampling: str) -> np.ndarray:
  """(B, steps, minibatch): ``minibatch_indices(key, first + s, ...)`` for s < steps, of every run
  key of ``keys`` (B, 2), computed on the host (``rng``'s exact threefry, permutations and integers;
  "without" draws each permutation the steps span once): the same indices, with no random op in the
  training programs (a permutation per step lengthened their compilation by about a second each).
  The smallest unsigned integer type that holds n - 1."""
  if not 1 <= minibatch <= n:
    raise ValueError(f"minibatch_table_host: minibatch must be in [1, n={n}], got {minibatch}")
  if sampling not in SAMPLINGS:
    raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
  keys = np.asarray(keys, np.uint32).reshape(-1, 2)
  B, dtype = len(keys), np.min_scalar_type(max(n - 1, 0))
  t = int(first) + np.arange(steps, dtype=np.int64)
  pos = t[:, None] * minibatch + np.arange(minibatch)[None]                # (steps, minibatch) stream positions
  if sampling == "cyclic":
    return np.broadcast_to(pos % n, (B, steps, minibatch)).astype(dtype)
  salted = rng.fold_in_keys(keys, SAMPLING_SALT)
  if sampling == "with":
    draw_keys = rng.fold_in_keys(np.repeat(salted, steps, axis=0), np.tile(t.astype(np.uint32), B))
    return rng.randints(draw_keys, minibatch, 0, n).reshape(B, steps, minibatch).astype(dtype)
  e0 = (int(first) * minibatch) // n
  count = (steps * minibatch + n - 2) // n + 1                             # the most epochs the positions span
  epochs = np.arange(e0, e0 + count, dtype=np.int64).astype(np.uint32)
  perms = rng.permutations(rng.fold_in_keys(np.repeat(salted, count, axis=0), np.tile(epochs, B)), n)
  return perms.reshape(B, count, n)[:, pos // n - e0, pos % n].astype(dtype)


def take_sequences(data, idx: jax.Array):
  """The data set of the sequences ``idx`` (X, Y, Z rows; the head v is shared)."""
  take = lambda a: jnp.take(a, idx, axis=0)  # noqa: E731
  return data._replace(X=take(data.X), Y=take(data.Y), Z=take(data.Z))


class Trainer(NamedTuple):
  config: TrainConfig
  param: model_lib.Parameterization
  head: heads.Head
  objective: Callable
  optimizer: optax.GradientTransformation
  grad: Callable                    # grad(params, data), see model.make_grad

  def observe(self, params, data):
    """(W, mean max softmax, loss, attention, {"V": head} when the head is trained) of one data set."""
    W = self.param.to_W(params)
    _, s = model_lib.get_model(self.config.model)(self.head, W, model_lib.with_head(params, data))
    loss = self.objective(params, data)
    if not isinstance(self.config.loss_scale, str) and self.config.loss_scale != 1.0:
      loss = loss / self.config.loss_scale  # ("auto" objectives return the unscaled loss)
    extra = {"V": params[model_lib.HEAD_KEY]} if self.config.train_head else {}
    return W, jnp.mean(jnp.max(s, axis=-1)), loss, s, extra

  def init_one(self, key, data):
    d = data.X.shape[-1]
    m = self.config.m or d
    params = model_lib.scaled(self.param.init(key, d, m, data.X.dtype, self.config.init), self.config.init_scale)
    if self.config.train_head:
      params = {**params, model_lib.HEAD_KEY: jnp.asarray(data.v)}   # the data set's head is the start
    return State(params, self.optimizer.init(params))

  def step_one(self, state: State, data) -> State:
    grads = self.grad(state.params, data)
    extra = ({"value": self.objective(state.params, data)}   # Polyak's step size needs the loss
             if optimizers.needs_value(self.config.optimizer) else {})
    updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params, **extra)
    return State(optax.apply_updates(state.params, updates), opt_state)

  def advance_one(self, state: State, data, every: int, snapshots: int, table=None):
    """``snapshots`` times: ``every`` steps, then a snapshot. One data set.

    Mini-batch training (config.minibatch > 0) needs the sequences of every step, ``table``
    (snapshots, every, minibatch) (``minibatch_table_host``); snapshots are on the full data set."""
    if not self.config.minibatch:
      def inner(st, _):
        return self.step_one(st, data), None

      def outer(st, _):
        st, _ = jax.lax.scan(inner, st, None, length=every)
        W, p, l, _, extra = self.observe(st.params, data)
        return st, (W, p, l, extra)

      return jax.lax.scan(outer, state, None, length=snapshots)

    def inner_mb(st, idx):
      return self.step_one(st, take_sequences(data, idx)), None

    def outer_mb(st, rows):     # rows (every, minibatch): the sequences of the next ``every`` steps
      st, _ = jax.lax.scan(inner_mb, st, rows)
      W, p, l, _, extra = self.observe(st.params, data)
      return st, (W, p, l, extra)

    return jax.lax.scan(outer_mb, state, table, length=snapshots)


def _sown(tree) -> dict:
  """{submodule path joined by "_" + "_" + name: the last value sown under it} of "intermediates"."""
  from flax import traverse_util
  flat = traverse_util.flatten_dict(tree.get("intermediates", {}))
  return {"_".join(str(k) for k in key): value[-1] for key, value in flat.items()}


class FlaxTrainer(NamedTuple):
  """``Trainer``'s interface for a flax module (``models.flax_models``' protocol)."""
  config: TrainConfig
  objective: Callable
  optimizer: optax.GradientTransformation
  grad: Callable

  def apply(self, params, data):
    f, state = self.config.module.apply({"params": params}, data.X, data.Z, data.v, mutable=["intermediates"])
    return f, _sown(state)

  def observe(self, params, data):
    """(sum of the sown kq matrices, mean max of the last sown softmax, loss, {every sown value
    but kq}, {each sown kq})."""
    _, sown = self.apply(params, data)
    is_kq = lambda k: k == "kq" or k.endswith("_kq")  # noqa: E731
    kq = {k: v for k, v in sown.items() if is_kq(k)}
    rest = {k: v for k, v in sown.items() if not is_kq(k)}
    att = [v for k, v in rest.items() if k.endswith("attention")]
    if not att:
      raise ValueError("a flax model must sow at least one 'attention' (see svmattn.models.flax_models)")
    d = data.X.shape[-1]
    W = sum(kq.values()) if kq else jnp.zeros((d, d), data.X.dtype)
    loss = self.objective(params, data)
    if not isinstance(self.config.loss_scale, str) and self.config.loss_scale != 1.0:
      loss = loss / self.config.loss_scale  # ("auto" objectives return the unscaled loss)
    return W, jnp.mean(jnp.max(att[-1], axis=-1)), loss, rest, kq

  def init_one(self, key, data):
    params = self.config.module.init({"params": key}, data.X, data.Z, data.v)["params"]
    params = model_lib.scaled(params, self.config.init_scale)
    return State(params, self.optimizer.init(params))

  step_one = Trainer.step_one
  advance_one = Trainer.advance_one


def _flax_trainer(config: TrainConfig) -> FlaxTrainer:
  """The objective mean_i l(Y_i f_i) of the module's predictions; loss_scale as ``model.make_loss``:
  a number S multiplies it, "auto" scales the derivative of every softmax the module takes through
  ``flax_models.softmax`` / ``attend`` (``flax_models.auto_scaled``)."""
  ell = losses_lib.get_loss(config.loss)
  module = config.module
  scale = config.loss_scale

  def loss(params, data):
    f = module.apply({"params": params}, data.X, data.Z, data.v)
    return jnp.mean(ell(data.Y * f))

  if isinstance(scale, str):
    objective = flax_models.auto_scaled(loss)
  elif scale != 1.0:
    objective = lambda params, data: loss(params, data) * scale  # noqa: E731
  else:
    objective = loss

  return FlaxTrainer(config, objective, optimizers.get_optimizer(config.optimizer, config.lr, config.numerics),
                     jax.grad(objective))


def make_trainer(config: TrainConfig) -> Trainer:
  config.validate()
  if config.module is not None:
    return _flax_trainer(config)
  param = model_lib.get_parameterization(config.param)
  head = heads.get_head(config.head)
  args = (param, head, config.loss, config.ridge, config.model, config.loss_scale, config.numerics)
  return Trainer(config, param, head, model_lib.make_loss(*args),
                 optimizers.get_optimizer(config.optimizer, config.lr, config.numerics),
                 model_lib.make_grad(*args, train_head=config.train_head))


def start_state(config: TrainConfig, params: dict) -> tuple[int, State]:
  """``train``'s ``start`` from given parameters, at step 0, with the optimizer's state initialized
  for them: runs that start where a paper's code starts, or from a scale of your choosing.

  config: the ``TrainConfig`` that will train them (its optimizer initializes the state).
  params: {name: array (B, ...)} with a leading data-set axis B: ``{"W": (B, d, d)}`` for
    ``param="W"``, ``{"K": (B, d, m), "Q": (B, d, m)}`` for ``param="KQ"``, or a flax module's
    parameter tree with that leading axis.
  Returns (0, state), to pass as ``train(config, batch, keys, start=start_state(config, params))``;
  the keys then decide nothing about the start. ``--init=FILE.npz`` does the same from the command
  line."""
  trainer = make_trainer(config)
  params = jax.tree_util.tree_map(jnp.asarray, params)      # flat, or a flax model's nested tree
  return 0, _host(State(params, jax.vmap(trainer.optimizer.init)(params)))


def init_keys(seed: int, runs) -> np.ndarray:
  """Initialization keys (B, 2) of the given runs: the second half of each run key's split
  (``data_lib.split_run_key(data_lib.run_key(seed, r))[1]``, computed on the host: ``rng``)."""
  return rng.split_keys(rng.run_keys(seed, np.asarray(runs, dtype=np.uint32)))[:, 1]


# jitted, blocked functions cached per trainer (the shapes are the jit cache key)
_JIT_CACHE: dict = {}


def _blocked(fn, block: int, whole_block: bool = False):
  """fn vmapped over a block, lax.map over blocks: leading axis B (a multiple of block).
  whole_block: fn already takes a whole block (``block_kernel``), it is not vmapped."""
  batched = fn if whole_block else jax.vmap(fn)

  def run(*args):
    B = jax.tree_util.tree_leaves(args)[0].shape[0]
    split = lambda x: x.reshape((B // block, block) + x.shape[1:])
    out = jax.lax.map(lambda a: batched(*a), jax.tree_util.tree_map(split, args))
    return jax.tree_util.tree_map(lambda x: x.reshape((B,) + x.shape[2:]), out)

  return run


def data_mesh(devices=None):
  """A 1-D mesh with axis "data" over ``devices`` (default: this process's devices)."""
  devices = jax.local_devices() if devices is None else devices
  return jax.sharding.Mesh(np.asarray(devices), ("data",))


def batch_mesh(B: int, block_size: int, mesh=None):
  """The mesh ``train`` runs B data sets on: ``mesh`` (default ``data_mesh()``), cut to its
  first ceil(B / block_size) devices when there are fewer blocks than devices (idle devices
  rather than padding)."""
  mesh = data_mesh() if mesh is None else mesh
  blocks = -(-B // block_size)
  return data_mesh(list(mesh.devices.flat)[:blocks]) if blocks < mesh.size else mesh


class Split(NamedTuple):
  """A batch cut along its leading axis into one part per device, each part committed to its
  device (``place``); ``_host`` joins the parts back."""
  parts: tuple

  def map(self, fn) -> "Split":
    return Split(tuple(fn(p) for p in self.parts))


class PerDevice:
  """One single-device program per device, each run on its own part of a ``Split`` batch.

  Every device runs the program compiled for one device, the very program a one-device run
  compiles, so the results are bit for bit those of one device whatever the number of devices
  (a partitioned program, even jit(shard_map(...)), is compiled by XLA with other fusions and
  rounds differently: seen on CPU with autodiff gradients). The parts are dispatched
  asynchronously, so the devices run concurrently."""

  def __init__(self, fn):
    self.fn = jax.jit(fn)
    self.executables = {}      # (device, argument shapes and dtypes) -> compiled program

  def _executable(self, args):
    leaves, tree = jax.tree_util.tree_flatten(args)
    key = (tuple(d.id for d in leaves[0].devices()), tree, tuple((x.shape, x.dtype) for x in leaves))
    if key not in self.executables:
      self.executables[key] = self.fn.lower(*args).compile()
    return self.executables[key]

  def compile_for(self, *args: Split) -> "PerDevice":
    """Compile now for every part's device and shapes (compile time apart from run time)."""
    for k in range(len(args[0].parts)):
      self._executable(tuple(a.parts[k] for a in args))
    return self

  def __call__(self, *args: Split) -> Split:
    out = []
    for k in range(len(args[0].parts)):
      part = tuple(a.parts[k] for a in args)
      out.append(self._executable(part)(*part))     # asynchronous: the devices run concurrently
    return Split(tuple(out))


def _advance_fn(trainer: Trainer, every: int, snapshots: int):
  """The blocked advance of ``every`` x ``snapshots`` steps: (state, data[, keys, step]) ->
  (state, snapshots) with a leading axis B (a multiple of the block size)."""
  block = trainer.config.block_size
  if block_kernel.supports(trainer.config):      # the closed form with the data sets on the SIMD axis
    return _blocked(block_kernel.make_advance(trainer, every, snapshots), block, whole_block=True)
  if trainer.config.minibatch:                   # (also the sequences of every step)
    return _blocked(lambda st, dt, table: trainer.advance_one(st, dt, every, snapshots, table=table), block)
  return _blocked(lambda st, dt: trainer.advance_one(st, dt, every, snapshots), block)


def _chunk_fn(trainer: Trainer, every: int, snapshots: int, starts: bool = True):
  """The one program of a training chunk: (first, state, data, keys[, table]) -> (state, the
  observation of the starting state, the chunk's snapshots, the final attention); table (B,
  snapshots, every, minibatch): the mini-batches' sequences (``minibatch_table_host``).

  first (a scalar): initialize the state from the keys (the state passed in only gives the
  shapes) instead of continuing it. Initializing, observing and advancing in one program
  compiles one program per chunk shape and configuration where three were compiled before.
  starts=False: a chunk shape that never starts a run (a schedule's shorter last chunk) leaves
  out the initialization and the starting observation (``first`` is ignored, None returned)."""
  block = trainer.config.block_size
  init, observe = _blocked(trainer.init_one, block), _blocked(trainer.observe, block)
  advance = _advance_fn(trainer, every, snapshots)

  init_inside = not host_init.supports(trainer.config)   # else train() draws the start before the chunks

  def run(first, state, data, keys, *table):
    start = None
    if starts:
      if init_inside:
        state = jax.lax.cond(first, lambda: init(keys, data), lambda: state)
      start = observe(state.params, data)
    state, out = advance(state, data, *table)
    return state, start, out, observe(state.params, data)[3]

  return run


def _compiled(trainer: Trainer, kind: str, mesh, *static):
  """The blocked ``kind`` function ("chunk": ``_chunk_fn``; "init", "observe", "advance": its
  parts, for the benchmark), run on every device of ``mesh`` on its own part of the batch
  (``PerDevice``: the one-device program on every device)."""
  key = (trainer.config, kind, mesh) + static
  if key not in _JIT_CACHE:
    block = trainer.config.block_size
    fn = {"init": lambda: _blocked(trainer.init_one, block), "observe": lambda: _blocked(trainer.observe, block),
          "advance": lambda: _advance_fn(trainer, *static), "chunk": lambda: _chunk_fn(trainer, *static)}[kind]()
    _JIT_CACHE[key] = PerDevice(fn)
  return _JIT_CACHE[key]


def _compiled_opt_init(trainer: Trainer):
  """The optimizer's starting state of a batch of parameters (jitted, cached per trainer). A
  stateless optimizer's (normalized GD, GD: a state without arrays) is its abstract value, with no
  program compiled for it (an empty cache compiled one per configuration, 0.08 s of E2's cold run)."""
  key = (trainer.config, "opt_init")
  if key not in _JIT_CACHE:
    compiled = jax.jit(jax.vmap(trainer.optimizer.init))

    def init(params):
      state = jax.eval_shape(compiled, params)
      return state if not jax.tree_util.tree_leaves(state) else compiled(params)

    _JIT_CACHE[key] = init
  return _JIT_CACHE[key]


def _flag(value: bool, mesh) -> Split:
  """A scalar bool on every device of ``mesh`` (the ``first`` argument of a chunk)."""
  return Split(tuple(jax.device_put(np.asarray(value), dev) for dev in mesh.devices.flat))


def place(tree, mesh) -> Split:
  """``tree`` (leading axis a multiple of the mesh's size) cut into one part per device of
  ``mesh``, each part on its device. The functions of ``_compiled`` run the one-device blocked
  program on each part (``PerDevice``): the results are bit for bit those of one device,
  whatever the number of devices. On a CPU the devices are cores (see ``svmattn.cpu_devices``).
  """
  devices = list(mesh.devices.flat)
  B = jax.tree_util.tree_leaves(tree)[0].shape[0]
  per = B // len(devices)
  if per * len(devices) != B:
    raise ValueError(f"place: {B} data sets cannot be cut into {len(devices)} equal parts")
  return Split(tuple(jax.device_put(jax.tree_util.tree_map(lambda x: np.asarray(x)[k * per:(k + 1) * per], tree), dev)
                     for k, dev in enumerate(devices)))


def _host(tree):
  """Device arrays (or the parts of a ``Split``, joined) to NumPy on the host."""
  if isinstance(tree, Split):
    parts = [_host(p) for p in tree.parts]
    return jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *parts)
  return jax.tree_util.tree_map(np.asarray, jax.device_get(tree))


def pad_to_blocks(tree, block: int):
  """Pad the leading axis to a multiple of block with copies of the last entry."""
  B = jax.tree_util.tree_leaves(tree)[0].shape[0]
  extra = -B % block
  if not extra:
    return tree
  # on the host (NumPy): eager jnp ops here would each compile a small XLA program
  return jax.tree_util.tree_map(
      lambda x: np.concatenate([np.asarray(x), np.repeat(np.asarray(x)[-1:], extra, axis=0)]), tree)


def train(config: TrainConfig, data: data_lib.Dataset, keys: jax.Array,
          progress: Callable[[int], None] | None = None, checkpoints=None,
          start: tuple[int, Any] | None = None, mesh=None) -> Trajectory:
  """Train one model per data set (vmapped over the leading axis B).

  data: batch of B data sets (jax or numpy arrays, float64 or float32: kept as given).
  keys: (B,) initialization keys (``init_keys(seed, runs)``).
  progress: called with the number of steps just done after each chunk.
  checkpoints: a ``svmattn.io.checkpoint.Checkpoints``: the state and the snapshots so far
    are saved after a chunk (every chunk but the last, where ``Checkpoints.due``: at most one save
    per ``every_s`` seconds), and training starts from the newest checkpoint found
    there. Resumed runs are bit for bit equal to uninterrupted ones (same compiled
    chunks applied to the same restored state).
  start: (step, State with leaves (B, ...)) to continue from a saved state at ``step``
    instead of initializing; snapshots then start at that step. A step's arithmetic does
    not depend on the chunking or the snapshot interval, so this is bit-exact too. With
    ``config.minibatch`` > 0, the step number is the global one (step t trains on
    ``minibatch_indices(key, t, ...)`` whatever the start).
  mesh: a 1-D mesh with axis "data" (``data_mesh()``); default: every local device. The
    data sets are split over its devices (see ``place``); each device runs the same
    blocked program, so the results equal a one-device run bit for bit.
  Where ``buckets.plan`` says so (the XLA block kernel on a GPU or TPU), d is padded with zeros to
  its bucket for the chunks and the outputs are cut back: one program per bucket of d.
  """
  data = data_lib.Dataset(*(np.asarray(a) for a in data))   # placed on the devices by place()
  svmattn.require_x64(data.X.dtype)
  B = data.X.shape[0]
  if keys.shape[0] != B:
    raise ValueError(f"train: {keys.shape[0]} keys for {B} data sets")
  if B == 0:
    raise ValueError("train: no data sets (B = 0)")
  check_minibatch(config, data.X.shape[1])
  config = full_batch_if_whole(config, data.X.shape[1])
  trainer = make_trainer(config)
  if mesh is None and optimizers.uses_decompositions(config.optimizer) and jax.default_backend() == "cpu":
    mesh = data_mesh(jax.local_devices()[:1])   # see optim.optimizers.DECOMPOSING: XLA:CPU may deadlock
  mesh = batch_mesh(B, config.block_size, mesh)
  if native_train.supports(config, data.X.dtype):    # the native kernel's C entry point: no XLA program
    return native_train.train(config, trainer, data, np.asarray(keys), progress, checkpoints, start, mesh,
                              _compiled_opt_init(trainer))
  return _train_xla(config, trainer, data, keys, progress, checkpoints, start, mesh)


def _minibatch_args(config: TrainConfig, data, keys, plan, first_step: int, mesh, chunk: int, call=None) -> tuple:
  """A chunk's arguments after the keys: with mini-batches the sequences of its steps, drawn on the
  host from the global step; for compiling a chunk shape ``call`` (every, k), an array of the
  table's shape and type (compiling reads no values, so nothing is drawn for it)."""
  if not config.minibatch:
    return ()
  n, mb = data.X.shape[1], config.minibatch
  every, k = call or (plan[chunk] if chunk < len(plan) else (1, 0))
  if call is not None:
    table = np.zeros((len(keys), every * k, mb), np.min_scalar_type(max(n - 1, 0)))
  else:
    table = minibatch_table_host(keys, first_step + sum(e * j for e, j in plan[:chunk]), every * k, n, mb,
                                 config.sampling)
  return (place(table.reshape(len(table), k, every, mb), mesh),)


def _train_xla(config: TrainConfig, trainer: Trainer, data, keys, progress, checkpoints, start, mesh) -> Trajectory:
  """``train`` on the XLA programs: the blocked chunk programs on every device of ``mesh``."""
  B = data.X.shape[0]
  unit = config.block_size * mesh.size
  data, keys = pad_to_blocks((data, keys), unit)
  d = data.X.shape[-1]
  pad_d = buckets.plan(config, data, _compiled_opt_init(trainer))     # one program per bucket of d
  if pad_d is not None:
    real = jax.eval_shape(jax.vmap(trainer.init_one), keys, data)
    if start is None:        # drawn at the real d (host_init), as an unpadded run draws it
      params = host_init.init_params_of(config, keys, data)
      start = (0, State(params, _host(_compiled_opt_init(trainer)(params))))
    data = buckets.pad_data(data, pad_d)
  first_step, plan, steps = chunks.plan_from(config, start)
  data_p, keys_p = place(data, mesh), place(keys, mesh)

  t0 = time.perf_counter()
  shapes = jax.eval_shape(jax.vmap(trainer.init_one), keys, data)
  if start is None and host_init.supports(config):   # the start drawn before the chunks (``host_init``)
    params = host_init.init_params_of(config, keys, data)
    state = State(params, _host(_compiled_opt_init(trainer)(params)))
  elif start is None:               # any values: the first chunk initializes the state (``_chunk_fn``)
    state = jax.tree_util.tree_map(lambda x: np.zeros(x.shape, x.dtype), shapes)
  else:
    state = pad_to_blocks(jax.tree_util.tree_map(np.asarray, start[1]), unit)
    if pad_d is not None:
      state = buckets.tree_pad(state, shapes)
  state_p = place(state, mesh)
  first_obs = jax.eval_shape(jax.vmap(trainer.observe), shapes.params, data)
  extra_args = lambda chunk, call=None: _minibatch_args(config, data, keys, plan, first_step, mesh, chunk, call)  # noqa: E731
  runs = plan or [(1, 0)]           # no step to take: one chunk of no snapshot (initial state, attention)
  W0, p0, l0, _, extra0 = first_obs
  kq_names = sorted(extra0) if config.module is not None else []
  named = lambda extra: {("kq__" + k if config.module is not None else k): v for k, v in extra.items()}  # noqa: E731
  first = {"W": W0, "max_prob": p0, "loss": l0, **named(extra0)}
  snaps = {k: np.zeros((x.shape[0], len(steps)) + x.shape[1:], x.dtype) for k, x in first.items()}
  if pad_d is not None and checkpoints is not None:     # checkpoints hold the unpadded state and snapshots
    checkpoints = buckets.Checkpoints(checkpoints, real, shapes,
                                      {**{k: v.shape for k, v in snaps.items()}, "W": snaps["W"].shape[:2] + (d, d)})
  begin, initialize = 0, start is None
  found = restore_chunk(checkpoints, shapes, snaps)
  if found is not None:
    begin, state, snaps = found
    initialize = False
    state_p = place(state, mesh)
  # the first chunk's shape starts the run (initializes and observes); any other shape only advances.
  # A resumed run compiles each shape as the uninterrupted run does (XLA may round one computation
  # differently in programs that hold different parts), so resuming stays bit-identical.
  calls = {call: _compiled(trainer, "chunk", mesh, *call, call == runs[0]).compile_for(
               _flag(True, mesh), state_p, data_p, keys_p, *extra_args(begin, call))
           for call in set(runs[begin:])}
  compile_seconds = time.perf_counter() - t0

  t0 = time.perf_counter()
  held = {"state": state_p, "initialize": initialize, "s": None}

  def step(chunk, every, k, pos, observe_start):
    res = calls[(every, k)](_flag(held["initialize"], mesh), held["state"], data_p, keys_p, *extra_args(chunk))
    held["state"], held["initialize"] = res.map(lambda r: r[0]), False     # every device on its part, concurrently
    if observe_start:                         # the starting state's observation is snapshot 0
      W0, p0, l0, _, extra0 = _host(res.map(lambda r: r[1]))
      for name, x in {"W": W0, "max_prob": p0, "loss": l0, **named(extra0)}.items():
        snaps[name][:, 0] = x
    W, p, l, extra = _host(res.map(lambda r: r[2]))
    for name, x in {"W": W, "max_prob": p, "loss": l, **named(extra)}.items():
      snaps[name][:, pos:pos + k] = x
    if chunk + 1 == len(runs):
      held["s"] = _host(res.map(lambda r: r[3]))

  chunks.run_chunks(plan, begin, snaps, step, lambda: _host(held["state"]), checkpoints, progress)
  state_p, s = held["state"], held["s"]
  params = _host(state_p.map(lambda part: part.params))
  if pad_d is not None:
    params, snaps["W"] = buckets.tree_cut(params, real.params), snaps["W"][..., :d, :d]
  run_seconds = time.perf_counter() - t0
  cut = lambda x: np.asarray(x)[:B]  # noqa: E731
  sown = None
  if config.module is not None:      # flax: s holds every sown value but kq; the last attention is the model's
    sown = {**{k: cut(v) for k, v in s.items()}, **{k: cut(snaps["kq__" + k]) for k in kq_names}}
    s = [v for k, v in s.items() if k.endswith("attention")][-1]
  return Trajectory(steps, cut(snaps["W"]), cut(snaps["max_prob"]), cut(snaps["loss"]), cut(s),
                    jax.tree_util.tree_map(cut, params), compile_seconds, run_seconds,
                    cut(snaps["V"]) if "V" in snaps else None, sown)
