"""svmattn.train.native_kernel: the GD kernel of the closed-form case as a native CPU custom call.

It computes what the XLA block kernel computes (same gradient, same step), rounded its own way,
and a data set's trajectory depends on nothing else in its block (tests/test_block_kernel.py
checks that bit for bit with whichever kernel this machine runs). Here: that it is the kernel
that runs on a CPU with a C++ compiler, that it agrees with the XLA block kernel to rounding,
that it keeps XLA:CPU's flush of subnormals, and that training falls back to XLA, saying why,
when it cannot be built.
"""
import ctypes
import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import needs_native
from svmattn import native_build
from svmattn.data import datasets as data_lib
from svmattn.models import heads
from svmattn.train import block_kernel
from svmattn.train import host_init
from svmattn.train import native_kernel
from svmattn.train import native_train
from svmattn.train import loop as train_lib

# Every test here is of the native kernel itself: without a compiler (or off x86-64) they skip with the
# reason, and training runs the XLA block kernel, which the rest of the suite covers.
pytestmark = needs_native

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _block(n=6, T=8, d=10, b=11, seed=3, scale=0.3, param="W", m=None):
  """One block (the block axis last) with b not a multiple of the kernel's lanes (8 or 4)."""
  data = data_lib.generate(data_lib.DataSpec(n=n, T=T, d=d), seed, np.arange(b))
  last = lambda x: jnp.moveaxis(jnp.asarray(x), 0, -1)  # noqa: E731
  X, Z, Y, v = last(data.X), last(data.Z), last(data.Y), last(data.v)
  h = jnp.einsum("ntdb,db->ntb", X, v)
  rng = np.random.default_rng(seed)
  if param == "W":
    params = {"W": jnp.asarray(rng.normal(size=(d, d, b)) * scale)}
  else:
    params = {k: jnp.asarray(rng.normal(size=(d, m or d, b)) * scale) for k in ("K", "Q")}
  return params, X, Z, Y, h, v


def _xla_steps(config, params, X, Z, Y, h, steps):
  step = block_kernel.make_step(config)
  return jax.jit(lambda p: jax.lax.fori_loop(0, steps, lambda i, p: step(p, X, Z, Y, h), p))(params)


def _assert_agrees(config, block, steps, lam=0.0):
  """``steps`` steps of both kernels from the block's point agree to 1e-9 of max|p| per data set,
  and the parameters moved."""
  params, X, Z, Y, h, v = block
  xla = _xla_steps(config, params, X, Z, Y, h, steps)
  native = _native_steps(config, params, X, Z, Y, v, steps, lam=lam)
  for k in params:
    scale = np.max(np.abs(np.asarray(xla[k])), axis=(0, 1))
    assert np.max(np.abs(np.asarray(native[k]) - np.asarray(xla[k])) / scale) < 1e-9, k
    assert not np.array_equal(np.asarray(native[k]), np.asarray(params[k]))


def _native_steps(config, params, X, Z, Y, v, steps, lam=0.0):
  """``steps`` steps of the native kernel (given the head v (d,b): it computes h = X v itself)."""
  normalized = block_kernel.OPTIMIZERS[config.optimizer]
  return jax.jit(lambda p: native_kernel.run_steps(p, X, Z, Y, v, param=config.param, lr=config.lr, ridge=lam,
                                                   steps=steps, loss=config.loss, normalized=normalized))(params)


def test_the_native_kernel_trains_where_it_can_be_built():
  """On a CPU with g++ (this machine, CI's), the closed-form configurations train natively."""
  assert native_kernel.available(), native_kernel.why_not()
  assert native_kernel.kernel_name() == "native-cpu"
  assert block_kernel.uses_native(train_lib.TrainConfig(), np.float64)
  assert not block_kernel.uses_native(train_lib.TrainConfig(), np.float32)      # float32: the XLA kernel
  assert native_kernel.report() == {"gd_kernel": "native-cpu"}


@pytest.mark.parametrize("param, optimizer, loss", [
    ("W", "normalized_gd", "logistic"), ("KQ", "normalized_gd", "logistic"),
    pytest.param("W", "gd", "exponential", marks=pytest.mark.slow),        # (siblings: slow tests)
    pytest.param("KQ", "gd", "correlation", marks=pytest.mark.slow)])
def test_agrees_with_the_xla_block_kernel_to_rounding(param, optimizer, loss):
  """The same 60 steps in both kernels, from the same point, on 11 data sets (whole groups of
  lanes and a part-filled one). One step differs by a few ulps (measured at most 3e-15 of
  max|p|, numerics version 10); after 60 steps the difference is rounding amplified through the
  steps (measured at most 4e-16 for W, 8e-13 for (K,Q)). The bound 1e-9 is four orders of magnitude above that and
  far below a wrong term of the gradient, which moves p by about lr per step."""
  config = train_lib.TrainConfig(param=param, optimizer=optimizer, loss=loss, lr=0.05 if optimizer == "gd" else 0.1)
  _assert_agrees(config, _block(param=param), 60)


def test_ridge_and_a_rectangular_kq():
  """(K,Q) of d x m with m != d and a ridge: the same as the XLA kernel to rounding."""
  config = train_lib.TrainConfig(param="KQ", ridge=0.01, lr=0.1)
  _assert_agrees(config, _block(d=5, n=3, T=4, param="KQ", m=3), 30, lam=0.01)


@pytest.mark.parametrize("param, optimizer, n, d, m", [
    ("W", "normalized_gd", 12, 3, None), ("W", "gd", 8, 5, None),   # more sequences than dimensions
    ("KQ", "normalized_gd", 4, 5, 3),                               # (K,Q) through Q^T z_i (n < d)
    ("KQ", "normalized_gd", 12, 3, 2)])                             # (K,Q) through K Q^T and G
def test_either_form_of_the_step(param, optimizer, n, d, m):
  """(K,Q)'s two forms of a step, chosen by the sizes (numerics version 10): through P_i = Q^T z_i
  (buffers n x m) where that takes fewer operations, through K Q^T and G otherwise; and W with more
  sequences than dimensions. All the same as the XLA kernel to rounding, as above."""
  config = train_lib.TrainConfig(param=param, optimizer=optimizer, lr=0.05 if optimizer == "gd" else 0.1)
  _assert_agrees(config, _block(n=n, T=4, d=d, param=param, m=m), 40)


def _trajectories(param, optimizer, schedules, steps=60, ridge=None):
  data = data_lib.generate_host(data_lib.DataSpec(n=6, T=8, d=10), 0, np.arange(5))
  keys = train_lib.init_keys(0, np.arange(5))
  return [train_lib.train(train_lib.TrainConfig(param=param, optimizer=optimizer, lr=0.1, steps=steps, ridge=ridge,
                                                snapshot_every=every, chunk_steps=chunk, chunk_every=chunk_every),
                          data, keys)
          for every, chunk, chunk_every in schedules]


def _assert_same_at_snapshots(runs, reference):
  for run in runs:
    at = np.searchsorted(np.asarray(run.steps), np.asarray(reference.steps))
    np.testing.assert_array_equal(np.asarray(run.steps)[at], np.asarray(reference.steps))
    np.testing.assert_array_equal(np.asarray(run.W)[:, at], np.asarray(reference.W))
    for k in reference.params:
      np.testing.assert_array_equal(np.asarray(run.params[k]), np.asarray(reference.params[k]))


@pytest.mark.parametrize("param, optimizer", [("W", "normalized_gd"), ("W", "gd"), ("KQ", "normalized_gd")])
def test_a_trajectory_does_not_depend_on_its_observations(param, optimizer):
  """Bit for bit: 65 steps in chunks of 30, 30 and 5 steps with a snapshot every 10 (the schedule
  10 x 3, 10 x 3, 5 x 1), and the same chunks observed at every step (as a replay records a run:
  snapshot_every 1, chunk_every 10), give the same parameters at steps 10, 20, ..., 65. W's anchored
  step (numerics version 14, E2's n = 6 < d = 10) forms W where it observes it and carries nothing
  from an observation into the steps."""
  runs = _trajectories(param, optimizer, ((10, 30, 0), (1, 30, 10)), steps=65)
  assert train_lib.config_schedule(train_lib.TrainConfig(steps=65, snapshot_every=10, chunk_steps=30), 65) == [
      (10, 3), (10, 3), (5, 1)]
  _assert_same_at_snapshots(runs[1:], runs[0])


def test_kq_and_w_with_a_ridge_do_not_depend_on_their_calls():
  """(K,Q), and W with a ridge (the direct step): each step starts from the parameters alone, so
  60 steps in one call, in six calls of 10, and observed at every step are the same bits."""
  for param, ridge in (("KQ", None), ("W", 0.01)):
    runs = _trajectories(param, "normalized_gd", ((10, 60, 0), (10, 10, 0), (1, 60, 0)), ridge=ridge)
    _assert_same_at_snapshots(runs[1:], runs[0])


@pytest.mark.parametrize("optimizer", ["normalized_gd", "gd"])
def test_the_anchored_w_step_depends_on_its_calls_by_rounding_only(optimizer):
  """W's anchored step starts each call from W alone (W = W0 + A Z^T within it), so 60 steps in one
  call and in six calls of 10 differ, by rounding: each re-anchoring rounds W once (about 1e-16 of
  max|W|), amplified over the steps no more than the kernels' other rounding differences (the XLA
  kernel agrees to 1e-9 above). A term of the gradient dropped or misplaced moves W by about lr."""
  one, six = _trajectories("W", optimizer, ((10, 60, 0), (10, 10, 0)))
  W1, W6 = np.asarray(one.W), np.asarray(six.W)
  scale = np.abs(W1).max(axis=(2, 3), keepdims=True)
  assert np.all(np.abs(W6 - W1) <= 1e-9 * np.maximum(scale, 1.0))


def test_a_lane_does_not_depend_on_its_neighbours():
  """Bit for bit: data set 9 of a block of 11 (lane 1 of the second group of 8 lanes, or of the
  third group of 4) equals the same data set alone in a block of 1 (lane 0, the other lanes
  copies of it)."""
  config = train_lib.TrainConfig(param="W", lr=0.1)
  params, X, Z, Y, _, v = _block()
  full = _native_steps(config, params, X, Z, Y, v, 25)
  one = lambda x: x[..., 9:10]  # noqa: E731
  alone = _native_steps(config, jax.tree_util.tree_map(one, params), one(X), one(Z), one(Y), one(v), 25)
  np.testing.assert_array_equal(np.asarray(alone["W"])[..., 0], np.asarray(full["W"])[..., 9])


def test_subnormals_flush_to_zero_as_in_xla():
  """One sequence of two tokens x = 1, 0 (d = 1, z = 1, v = 1, y = 1) and W = w: logits w and 0,
  the second token's softmax exp(-w) / (1 + exp(-w)). At w = 720 that is subnormal (2e-313),
  which XLA:CPU flushes to 0: the softmax is exactly one-hot, the gradient exactly zero and
  normalized GD does not move (a stalled run). The native kernel flushes too (XLA runs it on a
  thread that flushes, and the kernel sets the flush itself as well), so it does not move
  either; at w = 10 both move, by the same step to rounding."""
  assert float(jax.jit(jnp.exp)(jnp.float64(-720.0))) == 0.0          # the engine's semantics
  config = train_lib.TrainConfig(param="W", lr=0.1)
  block = lambda a: jnp.asarray(np.array(a, dtype=np.float64))  # noqa: E731
  X = block([[[1.0, 1.0]], [[0.0, 0.0]]])[None]      # (n=1, T=2, d=1, b=2)
  Z = block([[[1.0, 1.0]]])                           # (n=1, d=1, b=2)
  Y = block([1.0, 1.0])[None]                         # (n=1, b=2)
  v = block([[1.0, 1.0]])                             # (d=1, b=2)
  h = X[:, :, 0, :]                                   # h = X v
  params = {"W": block([[[720.0, 10.0]]])}            # (d=1, d=1, b=2)
  xla = np.asarray(_xla_steps(config, params, X, Z, Y, h, 1)["W"])
  native = np.asarray(_native_steps(config, params, X, Z, Y, v, 1)["W"])
  assert xla[0, 0, 0] == 720.0 and native[0, 0, 0] == 720.0
  assert xla[0, 0, 1] != 10.0 and abs(native[0, 0, 1] - xla[0, 0, 1]) < 1e-12


@pytest.mark.slow   # (CI runs it with the slow tests: the test command stays under 5 minutes)
def test_without_a_compiler_training_runs_the_xla_kernel_and_says_why(tmp_path):
  """CXX pointing at a program that fails: no library, the XLA block kernel trains, and the
  summary's environment records why."""
  script = textwrap.dedent("""
      import numpy as np
      import sys
      import svmattn
      svmattn.configure()
      from svmattn import native_build
      native_build.BUILD_DIR = sys.argv[1]
      from svmattn.data import datasets as data_lib
      from svmattn.train import block_kernel, native_kernel, loop as train_lib
      config = train_lib.TrainConfig(steps=4, snapshot_every=2, chunk_steps=4)
      data = data_lib.generate(data_lib.DataSpec(n=2, T=3, d=2), 0, np.arange(3))
      out = train_lib.train(config, data, train_lib.init_keys(0, np.arange(3)))
      assert np.all(np.isfinite(out.W))
      assert not block_kernel.uses_native(config, np.float64)
      print(native_kernel.report())
  """)
  env = {**os.environ, "CXX": "/bin/false", "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "'gd_kernel': 'xla'" in proc.stdout and "/bin/false failed" in proc.stdout
  assert not list(tmp_path.glob("*.so"))               # nothing half-written


def _train_relu(config, runs, dtype, native: bool):
  data = data_lib.generate(data_lib.DataSpec(n=3, T=4, d=6), 1, np.asarray(runs), heads.RELU, dtype=dtype)
  block_kernel.ENABLED = native
  train_lib._JIT_CACHE.clear()
  try:
    return train_lib.train(config, data, train_lib.init_keys(1, np.asarray(runs)))
  finally:
    block_kernel.ENABLED = True
    train_lib._JIT_CACHE.clear()


def test_relu_head_agrees_with_the_autodiff_program_to_rounding():
  """E5's configuration (ReLU head on W, normalized GD): the native kernel's closed-form gradient
  against autodiff of the objective, vmapped (the program every other head runs). After 300 steps
  measured 2e-14 of max|W| (E5's sizes, 70 data sets); the bound 1e-9 is far below a wrong term,
  which moves W by about lr per step; the selected tokens are the same."""
  config = train_lib.TrainConfig(param="W", head="relu", lr=0.1, steps=300, snapshot_every=100, chunk_steps=300)
  assert block_kernel.supports(config)
  new = _train_relu(config, range(20), np.float64, True)
  old = _train_relu(config, range(20), np.float64, False)
  scale = np.max(np.abs(old.W), axis=(2, 3), keepdims=True)
  assert np.max(np.abs(new.W - old.W) / scale) < 1e-9
  np.testing.assert_allclose(new.loss, old.loss, rtol=1e-9, atol=1e-300)
  np.testing.assert_array_equal(new.selected, old.selected)
  assert not np.array_equal(new.W[:, -1], new.W[:, 0])


def _train_both(config, data, runs):
  """(native, vmapped autodiff) trajectories of ``config`` on ``data``."""
  out = {}
  for native in (True, False):
    block_kernel.ENABLED = native
    train_lib._JIT_CACHE.clear()
    try:
      out[native] = train_lib.train(config, data, train_lib.init_keys(1, runs))
    finally:
      block_kernel.ENABLED = True
      train_lib._JIT_CACHE.clear()
  return out[True], out[False]


@pytest.mark.parametrize("lam", [pytest.param(0.0, marks=pytest.mark.slow), 0.7, pytest.param(3.0, marks=pytest.mark.slow)])
def test_lambda_head_agrees_with_the_autodiff_program_to_rounding(lam):
  """E6's head (h(r) = v^T r - lam ||r||^2 on W): the native kernel's closed-form gradient
  (dh/dr = v - 2 lam r) against autodiff of the objective, vmapped.

  With GD (lr 1, 300 steps) the two agree to rounding: measured 8e-16 of max|W| at lam = 0.7; the
  bound 1e-12 is far below a wrong term (lam = 0.7 against lam = 0 differ by more than 1e-2). With
  normalized GD only the first step is compared (measured 1.4e-15): the lambda head's best attention
  is inside the simplex, where the gradient vanishes and g / ||g|| turns a rounding difference in g
  into a different direction, so two correct implementations part after tens of steps (measured:
  1e-9 after 5 steps, 1e-2 after 300 on some runs; CHANGELOG.md, version 7)."""
  head = heads.lambda_head(lam)
  config = train_lib.TrainConfig(param="W", head=head.name, optimizer="gd", lr=1.0, steps=300, snapshot_every=100,
                                 chunk_steps=300)
  assert block_kernel.supports(config) and not block_kernel.supports(dataclasses.replace(config, param="KQ"))
  runs = np.arange(20)
  data = data_lib.generate(data_lib.DataSpec(n=3, T=4, d=6, labels="random"), 1, runs, head)
  new, old = _train_both(config, data, runs)
  scale = np.max(np.abs(old.W), axis=(2, 3), keepdims=True)
  assert np.max(np.abs(new.W - old.W) / scale) < 1e-12
  np.testing.assert_allclose(new.loss, old.loss, rtol=1e-12, atol=1e-300)
  np.testing.assert_array_equal(new.selected, old.selected)
  if lam:
    plain = train_lib.train(dataclasses.replace(config, head=heads.lambda_head(0.0).name), data,
                            train_lib.init_keys(1, runs))
    assert np.max(np.abs(plain.W[:, -1] - new.W[:, -1]) / scale[:, -1]) > 1e-2
  one = dataclasses.replace(config, optimizer="normalized_gd", lr=0.1, steps=1, snapshot_every=1, chunk_steps=1)
  new, old = _train_both(one, data, runs)
  assert np.max(np.abs(new.W - old.W) / np.max(np.abs(old.W), axis=(2, 3), keepdims=True)) < 1e-12


@pytest.mark.slow
def test_relu_head_in_float32_keeps_the_vmapped_program():
  """The native kernel is float64 only: float32 data with the ReLU head trains with the vmapped
  autodiff program, bit for bit as with the kernel turned off."""
  config = train_lib.TrainConfig(param="W", head="relu", lr=0.1, steps=20, snapshot_every=10, chunk_steps=20)
  new = _train_relu(config, range(3), np.float32, True)
  old = _train_relu(config, range(3), np.float32, False)
  assert new.W.dtype == np.float32
  np.testing.assert_array_equal(new.W, old.W)


def test_relu_head_with_kq_keeps_the_vmapped_program():
  assert block_kernel.supports(train_lib.TrainConfig(head="relu"))
  assert not block_kernel.supports(train_lib.TrainConfig(head="relu", param="KQ"))
  assert block_kernel.supports(train_lib.TrainConfig(head="relu", numerics="authors"))
  # the authors' numerics with the linear head (E2's variant) or another optimizer: the vmapped program
  assert not block_kernel.supports(train_lib.TrainConfig(numerics="authors"))
  assert not block_kernel.supports(train_lib.TrainConfig(head="relu", numerics="authors", optimizer="sd_l2"))


def test_relu_head_with_the_authors_numerics_agrees_with_the_autodiff_program():
  """E5's variant with the authors' numerics (pooled token X^T s, g / (||g||_F + eps)): the kernel
  against autodiff of that objective, vmapped. Over 150 steps, while the softmax is not yet
  saturated, they agree to rounding (measured 4e-14 of max|W|; the bound 1e-9 is far below a wrong
  term, which moves W by about lr per step). Later the authors' numerics freeze each run where
  rounding loses the gradient, and the two implementations freeze at slightly different points
  (docs/science.md section 20)."""
  config = train_lib.TrainConfig(param="W", head="relu", lr=0.1, steps=150, snapshot_every=50, chunk_steps=150,
                                 numerics="authors")
  assert block_kernel.supports(config)
  new = _train_relu(config, range(20), np.float64, True)
  old = _train_relu(config, range(20), np.float64, False)
  scale = np.max(np.abs(old.W), axis=(2, 3), keepdims=True)
  assert np.max(np.abs(new.W - old.W) / scale) < 1e-9
  np.testing.assert_array_equal(new.selected, old.selected)
  exact = _train_relu(dataclasses.replace(config, numerics="exact"), range(20), np.float64, True)
  assert not np.array_equal(exact.W[:, -1], new.W[:, -1])         # the option reaches the kernel


@pytest.mark.parametrize("numerics", ["exact", pytest.param("authors", marks=pytest.mark.slow)])
def test_relu_head_a_data_set_does_not_depend_on_its_block(numerics):
  """Bit for bit with the ReLU head: run 3 trained alone equals run 3 at position 3 (first block,
  lane 3) and at position 66 (second block, lane 2) of one batch of 67 data sets."""
  config = train_lib.TrainConfig(param="W", head="relu", lr=0.1, steps=30, snapshot_every=15, chunk_steps=30,
                                 numerics=numerics)
  batch = _train_relu(config, [*range(66), 3], np.float64, True)
  alone = _train_relu(config, [3], np.float64, True)
  for at in (3, 66):
    np.testing.assert_array_equal(alone.W[0], batch.W[at])
    np.testing.assert_array_equal(alone.loss[0], batch.loss[at])


@pytest.mark.parametrize("param, loss, ridge, head", [
    ("W", "logistic", None, "linear"),
    pytest.param("KQ", "exponential", 0.05, "linear", marks=pytest.mark.slow),   # (siblings: slow tests)
    pytest.param("W", "correlation", 0.01, "linear", marks=pytest.mark.slow),
    ("W", "logistic", None, "relu")])
def test_observations_agree_with_the_trainers_observe(param, loss, ridge, head):
  """The kernel observes as it trains: at the starting parameters and after each snapshot's
  steps, W, the mean largest attention, the loss (mean l(Y f) + lam ridge, from the kernel's
  predictions f) and the final attention equal Trainer.observe at the same parameters to
  rounding. Each is a handful of sums of at most max(T, d, n) terms of size <= 1 after an exp
  within 1 ulp, so it is within about 100 eps of the XLA value here; the bound 1e-12 (relative)
  is far below what a wrong term or a wrong token changes (order 1e-3 and more)."""
  n, T, d, b = 4, 5, 6, 11
  spec_head = heads.RELU if head == "relu" else heads.LINEAR
  data = data_lib.generate_host(data_lib.DataSpec(n=n, T=T, d=d), 2, np.arange(b), spec_head)
  config = train_lib.TrainConfig(param=param, loss=loss, ridge=ridge, head=head, lr=0.2, steps=30,
                                 snapshot_every=10, chunk_steps=30).validate()
  assert block_kernel.supports(config) and block_kernel.uses_native(config, np.float64)
  trainer = train_lib.make_trainer(config)
  state = jax.vmap(trainer.init_one)(train_lib.init_keys(2, np.arange(b)), data)
  chunk = jax.jit(block_kernel.make_native_chunk(trainer, 10, 3, True))
  after, start, snaps, attention = chunk(state, data)
  observe = jax.jit(jax.vmap(trainer.observe))

  def close(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and np.all(np.abs(a - b) <= 1e-12 * np.maximum(np.abs(b), 1.0))

  W0, p0, l0, _, _ = observe(state.params, data)
  for got, want in zip(start[:3], (W0, p0, l0)):
    close(got, want)
  W1, p1, l1, s1, _ = observe(after.params, data)
  for got, want in zip((snaps[0][:, -1], snaps[1][:, -1], snaps[2][:, -1], attention), (W1, p1, l1, s1)):
    close(got, want)
  assert not np.allclose(np.asarray(snaps[2][:, -1]), np.asarray(l0))      # it trained


def test_a_diverged_runs_observations_are_nan_as_in_xla():
  """Non-finite parameters give NaN attention; the kernel's mean largest attention and loss are
  then NaN, as jnp.max and jnp.mean give them in Trainer.observe (not -inf)."""
  n, T, d, b = 3, 4, 5, 9
  data = data_lib.generate_host(data_lib.DataSpec(n=n, T=T, d=d), 5, np.arange(b))
  config = train_lib.TrainConfig(param="W", lr=0.1, steps=1, snapshot_every=1, chunk_steps=1).validate()
  trainer = train_lib.make_trainer(config)
  state = jax.vmap(trainer.init_one)(train_lib.init_keys(5, np.arange(b)), data)
  W = np.array(state.params["W"])
  W[2, 0, 0] = np.nan
  W[4, 1, 1] = np.inf
  state = state._replace(params={"W": jnp.asarray(W)})
  _, start, _, _ = jax.jit(block_kernel.make_native_chunk(trainer, 1, 1, True))(state, data)
  _, p_xla, l_xla, _, _ = jax.jit(jax.vmap(trainer.observe))(state.params, data)
  for got, want in ((start[1], p_xla), (start[2], l_xla)):
    got, want = np.asarray(got), np.asarray(want)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got[2])
    assert np.all(np.isfinite(got[[0, 1, 3]]))


BASE_FLAGS = native_kernel.FLAGS


def _chunk_with_lanes(lanes, tmp_path, monkeypatch, cases):
  """run_chunk's outputs for each case, with the kernel built for ``lanes`` data sets per vector."""
  monkeypatch.setattr(native_kernel, "FLAGS", BASE_FLAGS + (f"-DLANES={lanes}",))
  monkeypatch.setattr(native_kernel, "_state", {})
  monkeypatch.setattr(native_build, "BUILD_DIR", str(tmp_path / f"lanes{lanes}"))
  assert native_kernel.available(), native_kernel.why_not()
  outs = [native_kernel._state["targets"]["W"]]           # (the build's own target: its flags are in the name)
  for param, head, loss, ridge, normalized, *authors in cases:
    params, X, Z, Y, _, h = _block(n=4, T=5, d=6, b=13, param=param, m=4 if param == "KQ" else None)
    if head == "relu":
      h = jnp.asarray(np.random.default_rng(7).normal(size=(6, 6, 13)))
    options = dict(param=param, lr=0.1, ridge=ridge, every=7, snapshots=3, start=True, loss=loss,
                   normalized=normalized, head=head, authors=bool(authors))
    run = jax.jit(lambda p, X, Z, Y, h, options=options: native_kernel.run_chunk(p, X, Z, Y, h, **options))
    outs.append([np.asarray(x) for x in jax.tree_util.tree_leaves(run(params, X, Z, Y, h))])
  return outs


@pytest.mark.slow
def test_the_results_do_not_depend_on_the_vector_width(tmp_path, monkeypatch):
  """The kernel takes a vector register's worth of data sets (8 lanes with AVX-512, 4 otherwise);
  built for 8, 4 and 1 lane (1: scalar fused multiply-adds through std::fma), three distinct
  libraries give the same parameters and observations bit for bit, for W, (K,Q) with a ridge,
  plain GD and the ReLU head (exact and authors' numerics), on a block of 13 data sets (a part-filled last group at 8 and 4)."""
  cases = [("W", "linear", "logistic", 0.0, True), ("KQ", "linear", "exponential", 0.02, False),
           ("W", "linear", "correlation", 0.01, False), ("W", "relu", "logistic", 0.0, True),
           ("W", "relu", "logistic", 0.0, True, "authors")]
  ref_target, *ref = _chunk_with_lanes(8, tmp_path, monkeypatch, cases)
  targets = {ref_target}
  for lanes in (4, 1):
    target, *got = _chunk_with_lanes(lanes, tmp_path, monkeypatch, cases)
    targets.add(target)
    for case, a, b in zip(cases, ref, got):
      assert len(a) == len(b) == 6 + (case[0] == "KQ")
      for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y, err_msg=f"{case} with {lanes} lanes")
  assert len(targets) == 3                                   # three builds ran, not one cached
  W_obs = ref[0][1]                                          # (S, d, d, b): it trained
  assert np.all(np.isfinite(W_obs)) and not np.array_equal(W_obs[0], W_obs[-1])


@pytest.mark.parametrize("param, loss, ridge, head", [
    ("W", "logistic", None, "linear"),
    pytest.param("KQ", "exponential", 0.05, "linear", marks=pytest.mark.slow),   # (siblings: slow tests)
    pytest.param("W", "logistic", None, "relu", marks=pytest.mark.slow)])
def test_training_without_xla_equals_the_custom_call(param, loss, ridge, head):
  """train() runs the kernel's C entry point on NumPy arrays (train.native_train), with no XLA
  program: the parameters, every snapshot's W and mean largest attention, and the final attention
  equal those of the kernel as an XLA custom call (block_kernel.make_native_chunk) bit for bit.
  The loss is computed in NumPy there, in XLA here: within a few ulps (measured 4e-16 relative;
  the bound 1e-14 is far below any change of the predictions f that it is computed from)."""
  n, T, d, b = 4, 5, 6, 11
  data = data_lib.generate_host(data_lib.DataSpec(n=n, T=T, d=d), 2, np.arange(b),
                                heads.RELU if head == "relu" else heads.LINEAR)
  # one chunk of 30 steps, as the custom call below runs them (W's anchored step depends on where a
  # call begins, numerics version 14)
  config = train_lib.TrainConfig(param=param, loss=loss, ridge=ridge, head=head, lr=0.2, steps=30,
                                 snapshot_every=10, chunk_steps=30).validate()
  assert native_train.supports(config, np.float64)
  keys = train_lib.init_keys(2, np.arange(b))
  got = train_lib.train(config, data, keys)
  assert not [key for key in train_lib._JIT_CACHE if key[0] == config and key[1] == "chunk"]   # no program
  trainer = train_lib.make_trainer(config)
  params = host_init.init_params_of(config, keys, data)
  state = train_lib.State(params, jax.vmap(trainer.optimizer.init)(params))
  after, start, snaps, attention = jax.jit(block_kernel.make_native_chunk(trainer, 10, 3, True))(state, data)
  joined = lambda k: np.concatenate([np.asarray(start[k])[:, None], np.asarray(snaps[k])], axis=1)  # noqa: E731
  np.testing.assert_array_equal(got.W, joined(0))
  np.testing.assert_array_equal(got.max_prob, joined(1))
  np.testing.assert_array_equal(got.attention, np.asarray(attention))
  for k in got.params:
    np.testing.assert_array_equal(got.params[k], np.asarray(after.params[k]))
  np.testing.assert_allclose(got.loss, joined(2), rtol=1e-14, atol=0)
  assert not np.array_equal(got.W[:, 0], got.W[:, -1])


def test_training_without_xla_does_not_depend_on_the_shares(monkeypatch):
  """The batch is cut into one share per device, each run on a thread: one share or two give the
  same trajectories bit for bit (and the same as each data set alone)."""
  data = data_lib.generate_host(data_lib.DataSpec(n=3, T=4, d=5), 4, np.arange(9))
  config = train_lib.TrainConfig(param="KQ", lr=0.1, steps=12, snapshot_every=4, chunk_steps=8,
                                 block_size=1).validate()
  keys = train_lib.init_keys(4, np.arange(9))
  shares = []
  real = native_train._Share
  monkeypatch.setattr(native_train, "_Share", lambda *a: shares.append(a) or real(*a))
  one = train_lib.train(config, data, keys, mesh=train_lib.data_mesh(jax.local_devices()[:1]))
  assert shares == [(0, 9)]
  two = train_lib.train(config, data, keys, mesh=train_lib.data_mesh(jax.local_devices()[:2]))
  assert shares[1:] == [(0, 4), (4, 9)] or shares[1:] == [(0, 5), (5, 9)]
  alone = train_lib.train(config, data_lib.Dataset(*(a[5:6] for a in data)), keys[5:6])
  for a in (two, alone):
    sl = slice(None) if a is two else slice(5, 6)
    for name in ("W", "max_prob", "loss", "attention"):
      np.testing.assert_array_equal(getattr(one, name)[sl], getattr(a, name))


def test_training_without_xla_leaves_a_callers_start_as_it_was():
  """The parameters drawn inside train() are trained in place; a caller's start is copied first:
  after training from it, its arrays hold the start still, and the run equals the one that drew
  the same start itself, bit for bit."""
  data = data_lib.generate_host(data_lib.DataSpec(n=3, T=4, d=5), 3, np.arange(5))
  for param in ("W", "KQ"):
    config = train_lib.TrainConfig(param=param, lr=0.1, steps=6, snapshot_every=3, chunk_steps=6).validate()
    keys = train_lib.init_keys(3, np.arange(5))
    trainer = train_lib.make_trainer(config)
    params = host_init.init_params_of(config, keys, data)
    kept = {k: v.copy() for k, v in params.items()}
    given = train_lib.train(config, data, keys, start=(0, train_lib.State(params, jax.vmap(trainer.optimizer.init)(params))))
    for k in params:
      np.testing.assert_array_equal(params[k], kept[k], err_msg=f"{param}: the caller's {k} was written")
    drawn = train_lib.train(config, data, keys)
    for k in params:
      np.testing.assert_array_equal(given.params[k], drawn.params[k])
      assert not np.array_equal(drawn.params[k], kept[k])                # (it trained)
    np.testing.assert_array_equal(given.W, drawn.W)


def test_training_without_xla_refuses_a_start_of_the_wrong_shape():
  """A starting state whose leaves do not match the batch (here for 4 data sets, the batch holds 6)
  is refused with one error naming the array, before the kernel reads or writes by those sizes."""
  data = data_lib.generate_host(data_lib.DataSpec(n=3, T=4, d=5), 1, np.arange(6))
  config = train_lib.TrainConfig(param="W", lr=0.1, steps=4, snapshot_every=2, chunk_steps=4).validate()
  keys = train_lib.init_keys(1, np.arange(6))
  trainer = train_lib.make_trainer(config)
  small = host_init.init_params_of(config, keys[:4], data_lib.Dataset(*(a[:4] for a in data)))
  start = (0, train_lib.State(small, jax.vmap(trainer.optimizer.init)(small)))
  with pytest.raises(ValueError, match=r"starting state.*W.*shape \(4, 5, 5\), expected \(6, 5, 5\)"):
    train_lib.train(config, data, keys, start=start)
  bad = data_lib.Dataset(data.X, data.Y, data.Z, data.v[:, :4])
  with pytest.raises(ValueError, match=r"data\.v has shape \(6, 4\), expected \(6, 5\)"):
    train_lib.train(config, bad, keys)


# ----------------------------------------------------------------------------
# The seq2seq and causal models (E8) through the kernel: each query a sequence of its own
# ----------------------------------------------------------------------------

def _seq_data(runs, n=3, T=4, d=7):
  from svmattn.svm import seq2seq as s2s
  data = s2s.generate(s2s.Seq2SeqSpec(n, T, d), 2, np.asarray(runs))
  return data_lib.Dataset(*(np.asarray(a) for a in data))


@pytest.mark.parametrize("model, param", [("seq2seq", "W"), ("causal", "W"),
                                          pytest.param("causal", "KQ", marks=pytest.mark.slow),
                                          pytest.param("seq2seq", "KQ", marks=pytest.mark.slow)])
def test_seq_models_agree_with_the_autodiff_program_to_rounding(model, param):
  """E8's models through the kernel (``native_train._as_queries``, causal: query k sees t <= k)
  against autodiff of the seq2seq objective, vmapped. E8's default run measured W within 3.8e-13,
  corr within 1.2e-14 and max_prob within 1.4e-13 of XLA's, the same selections; the bound 1e-9 of
  max|W| is far below a wrong or missing mask, which moves W by about lr per step."""
  config = train_lib.TrainConfig(param=param, model=model, lr=0.1, steps=120, snapshot_every=10,
                                 chunk_steps=60).validate()
  assert native_train.supports(config, np.float64) and not block_kernel.supports(config)
  new, old = _train_both(config, _seq_data(range(9)), np.arange(9))
  assert new.attention.shape == old.attention.shape == (9, 3, 4, 4)
  scale = np.max(np.abs(old.W), axis=(2, 3), keepdims=True)
  assert np.max(np.abs(new.W - old.W) / scale) < 1e-9
  np.testing.assert_allclose(new.loss, old.loss, rtol=1e-9, atol=1e-300)
  np.testing.assert_allclose(new.max_prob, old.max_prob, rtol=1e-9)
  np.testing.assert_allclose(new.attention, old.attention, rtol=1e-9, atol=1e-12)
  np.testing.assert_array_equal(new.selected, old.selected)
  assert not np.array_equal(new.W[:, -1], new.W[:, 0])
  if model == "causal":                                   # the future's weight is exactly 0
    future = np.triu(np.ones((4, 4), bool), 1)
    assert np.all(new.attention[..., future] == 0.0)
    assert np.all(new.attention[..., ~future] > 0.0)


def test_a_seq_data_set_does_not_depend_on_its_batch():
  """A causal data set trained alone equals the same data set inside a batch of 11, bit for bit
  (the kernel's lanes), as replay needs."""
  config = train_lib.TrainConfig(param="W", model="causal", lr=0.1, steps=60, snapshot_every=10,
                                 chunk_steps=30).validate()
  data = _seq_data(range(11))
  whole = train_lib.train(config, data, train_lib.init_keys(1, np.arange(11)))
  alone = train_lib.train(config, data_lib.take(data, np.array([6])), train_lib.init_keys(1, np.array([6])))
  for name in ("W", "max_prob", "loss", "attention"):
    np.testing.assert_array_equal(getattr(alone, name)[0], getattr(whole, name)[6], err_msg=name)


def test_the_kernel_refuses_a_causal_split_that_does_not_fit():
  """causal=K must divide the sequences and be at most T, and needs the linear head."""
  params, X, Z, Y, _, h = _block(n=6, T=4, d=5, b=3)
  rows = lambda a: np.ascontiguousarray(np.moveaxis(np.asarray(a), -1, 0))   # noqa: E731
  W, X, Z, Y, h = rows(params["W"]), rows(X), rows(Z), rows(Y), rows(h)
  obs = {"W": np.empty((3, 1, 5, 5)), "f": np.empty((3, 1, 6)), "max_prob": np.empty((3, 1)),
         "ridge_sum": np.empty((3, 1)), "attention": np.empty((3, 6, 4))}
  common = dict(param="W", lr=0.1, ridge=0.0, every=2, snapshots=1, start=False, loss="logistic", normalized=True)
  for K in (4, 5):                                         # 4 does not divide 6; 5 > T
    with pytest.raises(ValueError, match="causal"):
      native_kernel.run_chunk_rows([W], X, Z, Y, h, [W.copy()], obs, causal=K, **common)
  native_kernel.run_chunk_rows([W], X, Z, Y, h, [W.copy()], obs, causal=3, **common)
  assert np.all(obs["attention"][:, 0, 1:] == 0.0) and np.all(obs["attention"][:, 2, 3:] == 0.0)


_LANE_OPS = r"""
#define SVMATTN_LANE_PAIRS
#include "lanes.h"
// y[i], out of the lane arithmetic's exps, max and scaling, with subnormals flushed as in the kernels
extern "C" void lane_ops(const double* x, const double* b, double* y, long n, int which) {
  FlushDenormals flush;
  for (long i = 0; i + L <= n; i += L) {
    vd v, w;
    for (int j = 0; j < L; ++j) v[j] = x[i + j], w[j] = b[i + j];
    vd r = which == 0 ? vexp_nonpositive(v) : which == 1 ? vexp(v) : which == 2 ? loss_derivative(kLogistic, v)
         : which == 3 ? vmax(v, w) : which == 4 ? fnmadd(v, w, v) : vexp2_nonpositive(v);
    for (int j = 0; j < L; ++j) y[i + j] = r[j];
  }
}
"""


def _lane_ops(tmp_path, lanes):
  """The exps, max and fnmadd of lanes.h built with ``lanes`` data sets per vector, as a function of
  (which, x, b)."""
  cxx = native_build.compiler()
  if cxx is None:
    pytest.skip("no C++ compiler")
  src = tmp_path / f"ops{lanes}.cc"
  src.write_text(_LANE_OPS)
  lib = tmp_path / f"ops{lanes}.so"
  include = Path(native_kernel.SOURCE).parent
  subprocess.run([cxx, *native_build.FLAGS, f"-DLANES={lanes}", "-I", str(include), str(src), "-o", str(lib)],
                 check=True, capture_output=True)
  fn = ctypes.CDLL(str(lib)).lane_ops
  P = ctypes.POINTER(ctypes.c_double)

  def run(which, x, b):
    y = np.empty_like(x)
    fn(x.ctypes.data_as(P), b.ctypes.data_as(P), y.ctypes.data_as(P), ctypes.c_long(len(x)), ctypes.c_int(which))
    return y
  return run


@pytest.fixture(scope="module")
def lane_ops(tmp_path_factory):
  """_lane_ops at 8, 4 and 1 lanes, built once for the tests below: {lanes: run}."""
  folder = tmp_path_factory.mktemp("lane_ops")
  return {lanes: _lane_ops(folder, lanes) for lanes in (8, 4, 1)}


def test_the_lane_arithmetic_is_the_same_bits_at_every_vector_width(lane_ops):
  """lanes.h's exp (general, and the softmax's on its domain x <= 0), the logistic loss's derivative,
  max and fnmadd give the same bits with 8 lanes (with AVX-512: the scaling and max instructions, one
  operation each; with AVX2: a pair of 4-lane registers, its comparisons and selects on each) as
  with 4 (AVX2's registers and the portable code: 2^k built from its bits, selects by comparison)
  and 1 (scalar code), over the whole range of exp, its underflow and overflow edges,
  zeros of both signs, infinities and quiet NaNs of both signs with payloads; and the softmax's exp
  equals the general one for x <= 0."""
  rng = np.random.default_rng(0)
  edges = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 5e-324, -5e-324, 1e-310, -745.2, -745.1332191019412,
           -708.3964185322641, -708.39641853226408, -709.0895657128241, 709.78, 709.8, 709.9, 1e308, -1e308]
  nans = (rng.integers(0, 2**51, 64, dtype=np.uint64) | np.uint64(0x7FF8 << 48)).view(np.float64)
  x = np.concatenate([np.linspace(-800, 0, 400_000), -rng.exponential(60, 200_000), np.linspace(-760, 760, 200_000),
                      rng.uniform(-1e300, 1e300, 20_000), np.repeat(edges, 8), nans, -nans])
  x = x[: len(x) // 8 * 8].copy()
  b = rng.permutation(x)
  b[::7] = x[::7]                                           # equal operands, zeros of both signs included
  wide = lane_ops[8]
  nonpositive = (x <= 0) | np.isnan(x)                     # (the softmax's exp: its domain)
  for lanes in (4, 1):
    other = lane_ops[lanes]
    for which in range(5):
      got, want = wide(which, x, b), other(which, x, b)
      differ = (got.view(np.uint64) != want.view(np.uint64)) & (nonpositive if which == 0 else True)
      assert not differ.any(), (which, lanes, x[differ][:4], b[differ][:4], got[differ][:4], want[differ][:4])
  softmax_exp, exp = wide(0, x, b), wide(1, x, b)
  assert (softmax_exp[nonpositive].view(np.uint64) == exp[nonpositive].view(np.uint64)).all()
  assert exp[x == -800.0][0] == 0.0 and exp[x == 0.0][0] == 1.0 and exp[x == np.inf][0] == np.inf
  assert np.isnan(exp[np.isnan(x)]).all() and np.isnan(x).sum() >= 128


def test_the_softmax_exp2_is_2_to_the_x_within_2_ulp_at_every_vector_width(lane_ops):
  """vexp2_nonpositive, the softmax's numerator 2^x on its domain x <= 0 (numerics version 21: the
  logits in units of log2), gives the same bits with 8, 4 and 1 lanes, and 2^x within 2 ulp of
  NumPy's exp2: the reduction x - round(x) is exact, the Horner sum of its degree-11 polynomial on
  [0.7, 1.42] rounds to within about 1 ulp and the polynomial itself is within 2.8e-17 relative
  (a quarter ulp), scaling by 2^k is exact, and the C library's exp2 is within 1 ulp. Below
  2^-1022 the value is 0 (flushed, as the kernels flush subnormals); 2^0 is 1 exactly, -inf gives
  0, and a NaN gives itself, sign and payload (whichever NaN operand an instruction passes on,
  each is x's)."""
  rng = np.random.default_rng(1)
  edges = [0.0, -0.0, -np.inf, np.nan, -np.nan, -5e-324, -0.5, -1.5, -2.5, -1021.5, -1022.0, -1022.5,
           -1022.9, -1023.0, -1023.5, -1024.0, -1074.0, -1100.0, -1e308]
  nans = (rng.integers(0, 2**51, 64, dtype=np.uint64) | np.uint64(0x7FF8 << 48)).view(np.float64)
  x = np.concatenate([np.linspace(-1100, 0, 400_000), -rng.exponential(3, 200_000), -rng.uniform(0, 1, 200_000),
                      np.repeat(edges, 8), nans, -nans])
  x = x[: len(x) // 8 * 8].copy()
  got = lane_ops[8](5, x, x)
  for lanes in (4, 1):
    want = lane_ops[lanes](5, x, x)
    assert (got.view(np.uint64) == want.view(np.uint64)).all(), lanes
  exact = np.exp2(x)
  normal = exact >= 2.0**-1022 * (1 + 1e-12)
  ulps = np.abs(got[normal] - exact[normal]) / np.spacing(exact[normal])
  assert ulps.max() <= 2.0, (ulps.max(), x[normal][np.argmax(ulps)])
  assert (got[(exact < 2.0**-1022 * (1 - 1e-12)) & ~np.isnan(x)] == 0.0).all()
  assert got[x == 0.0].min() == got[x == 0.0].max() == 1.0 and (got[x == -np.inf] == 0.0).all()
  assert not np.isnan(got[~np.isnan(x)]).any()
  assert (got[np.isnan(x)].view(np.uint64) == x[np.isnan(x)].view(np.uint64)).all()   # NaN: x itself
  print(f"2^x: largest error {ulps.max():.2f} ulp, mean {ulps.mean():.3f}")
