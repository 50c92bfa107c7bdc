"""Shape buckets: one compiled training program for every d of a bucket (docs/science.md section 20).

XLA compiles a training chunk for each shape. A sweep over d (E4: 19 values of d for each n)
therefore compiles one program per cell, about 1.3 s each on a GPU, where the training of a
cell may take less. Here the token dimension d is padded with zeros up to the next multiple of
``MULTIPLE`` (and the width m of (K, Q) with it, where m is d), so every d of a bucket runs the
same program:

  tokens x_it, queries z_i and the head v get zero entries d..D-1; W (D, D) (K, Q (D, M)) gets
  zero rows and columns there.

The padding is exact in exact arithmetic: the logits x^T W z and the head's h = v^T x see only the
first d entries, the gradient G = sum_i r_i z_i^T (r_i = X_i^T dL/dlogits) is zero in the padded
rows and columns, so the normalized step keeps them zero and ||G||_F is the same, and the
observations (W sliced back to d x d, the attention, the loss) are those of the unpadded run. In
floating point a padded reduction adds zeros, which XLA may group differently from the unpadded
one: the results agree with the unpadded program's to rounding (tests/test_buckets.py), and
padding is part of the numerics (numerics version 11).

Where it applies: the XLA block kernel's configurations (``block_kernel.supports``, the XLA
program rather than the native CPU kernel) with parameters drawn on the host, whose optimizer has
no state shaped like the parameters. When: by default on GPUs and TPUs (``ENV`` unset), where a
compilation costs more than the padded arithmetic (the devices run such small products far below
their rate); never on a CPU, whose native kernel compiles nothing per shape and whose XLA
programs are cheap to compile. ``ENV``=1 pads on any backend, ``ENV``=0 never.

Within one version a run stays exact: the padding depends on d and the configuration alone, a
checkpoint holds the unpadded state (so a replay or a resume reads it whatever it pads), and every
data set's trajectory is the same whatever its batch, block or device.
"""
from __future__ import annotations

import jax
import numpy as np

from svmattn.train import block_kernel
from svmattn.train import host_init

MULTIPLE = 4        # d (and m = d) padded to the next multiple of 4: E4's d = 2..20 in 5 buckets
# True or False: pad d (or not) whatever the backend; None: on any backend but the CPU
PAD_D: bool | None = None


def enabled() -> bool:
  """Whether runs pad d here: ``PAD_D`` where set, else on any backend but the CPU."""
  if PAD_D is not None:
    return bool(PAD_D)
  return jax.default_backend() != "cpu"


def padded_size(d: int) -> int:
  return -(-d // MULTIPLE) * MULTIPLE


def plan(config, data, opt_init) -> int | None:
  """D, the padded d of ``config`` on ``data`` (B, n, T, d), or None where nothing is padded:
  padding is off (``enabled``), d is already a bucket's size, the configuration does not run the
  XLA block kernel, or its optimizer state (``opt_init``, vmapped) holds arrays like the parameters."""
  d = int(data.X.shape[-1])
  D = padded_size(d)
  # (block_kernel.supports implies parameters drawn by host_init and no trained head)
  if D == d or not enabled() or not block_kernel.supports(config) or block_kernel.uses_native(config, data.X.dtype):
    return None
  params = host_init.init_params_of(config, np.zeros((1, 2), np.uint32), _first(data))
  if any(np.ndim(x) > 1 for x in jax.tree_util.tree_leaves(jax.eval_shape(opt_init, params))):
    return None
  return D


def _first(data):
  return type(data)(*(np.asarray(a)[:1] for a in data))


def pad_data(data, D: int):
  """The data sets with tokens, queries and head padded with zeros to D entries."""
  grow = lambda a: np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, D - a.shape[-1])])  # noqa: E731
  return data._replace(X=grow(np.asarray(data.X)), Z=grow(np.asarray(data.Z)), v=grow(np.asarray(data.v)))


def pad_to(x, shape) -> np.ndarray:
  """x zero-padded at the end of every axis to ``shape``."""
  x = np.asarray(x)
  return x if x.shape == tuple(shape) else np.pad(x, [(0, s - n) for n, s in zip(x.shape, shape)])


def cut_to(x, shape) -> np.ndarray:
  """The leading ``shape`` block of x (what ``pad_to`` padded)."""
  x = np.asarray(x)
  return x if x.shape == tuple(shape) else x[tuple(slice(0, s) for s in shape)]


def tree_pad(tree, shapes):
  return jax.tree_util.tree_map(lambda x, s: pad_to(x, s.shape), tree, shapes)


def tree_cut(tree, shapes):
  return jax.tree_util.tree_map(lambda x, s: cut_to(x, s.shape), tree, shapes)


class Checkpoints:
  """A ``train`` run's checkpoints (``io.checkpoint.Checkpoints``) as the padded run uses them:
  it saves the unpadded state and snapshots, and pads what it restores, so a checkpoint reads the
  same whatever pads it (a replay's template is the unpadded state)."""

  def __init__(self, inner, state_real, state_padded, snaps_real: dict):
    self.inner = inner
    self.real, self.padded = state_real, state_padded        # shapes (jax.eval_shape) of the State
    self.snaps_real = snaps_real                              # name -> unpadded (B, S, ...) shape

  def due(self) -> bool:
    return self.inner.due()

  def _state(self, tree, fn, shapes):
    """The state's leaves {"0": ..., "1": ...} (``loop.save_chunk``), each cut or padded to its shape."""
    leaves = jax.tree_util.tree_leaves(shapes)
    return {k: fn(x, leaves[int(k)].shape) for k, x in tree.items()}

  def save(self, step, tree) -> None:
    tree = {**tree, "state": self._state(tree["state"], cut_to, self.real),
            "snapshots": {k: cut_to(v, self.snaps_real[k]) for k, v in tree["snapshots"].items()}}
    self.inner.save(step, tree)

  def restore_latest(self, template):
    padded_snaps = {k: np.asarray(v).shape for k, v in template["snapshots"].items()}
    real = {**template, "state": self._state(template["state"], cut_to, self.real),
            "snapshots": {k: cut_to(v, self.snaps_real[k]) for k, v in template["snapshots"].items()}}
    found = self.inner.restore_latest(real)
    if found is None:
      return None
    step, tree = found
    return step, {**tree, "state": self._state(tree["state"], pad_to, self.padded),
                  "snapshots": {k: pad_to(v, padded_snaps[k]) for k, v in tree["snapshots"].items()}}
