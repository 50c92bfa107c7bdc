"""Mini-batch training in the engine's loop (TrainConfig.minibatch, TrainConfig.sampling).

The claims (svmattn.train.loop.TrainConfig): minibatch=0 is full-batch GD unchanged; minibatch=n
with cyclic sampling is full-batch GD bit for bit; without replacement every sequence is used once
per epoch; the indices are a pure function of (run key, step), so a data set's trajectory is the
same in any batch or alone, and a run resumed from a checkpoint (or a ``start``) equals the
uninterrupted one. The snapshots stay full-data values.
"""
import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import REPO_ROOT
from svmattn.data import datasets as data_lib
from svmattn.io import checkpoint as ckpt_lib
from svmattn.studies import local_convergence
from svmattn.train import loop as train_lib
from test_sweep import ENV, assert_same_results, has_checkpoint, kill_when

SPEC = data_lib.DataSpec(n=5, T=4, d=4)      # n = 5: minibatch 2 does not divide it (batches wrap)
RUNS = np.arange(3)
# schedule [(5, 2)] * 3: 3 chunks of one compiled shape
BASE = train_lib.TrainConfig(steps=30, snapshot_every=5, chunk_steps=10, block_size=2)


@pytest.fixture(scope="module")
def data():
  return data_lib.generate(SPEC, 0, RUNS)


@pytest.fixture(scope="module")
def keys():
  return train_lib.init_keys(0, RUNS)


MINI = dataclasses.replace(BASE, minibatch=2, sampling="without")


@pytest.fixture(scope="module")
def mini_run(data, keys):
  """MINI trained on the batch, uninterrupted, without checkpoints."""
  return train_lib.train(MINI, data, keys)


def _same(got, want, fields=("steps", "W", "max_prob", "loss", "attention")):
  for field in fields:
    a, b = getattr(got, field), getattr(want, field)
    assert a.dtype == b.dtype and np.array_equal(a, b), field
  for a, b in zip(jax.tree_util.tree_leaves(got.params), jax.tree_util.tree_leaves(want.params)):
    assert np.array_equal(a, b)


def _stream(n, m, sampling, steps, key=None):
  key = jax.random.PRNGKey(7) if key is None else key
  fn = jax.jit(jax.vmap(lambda t: train_lib.minibatch_indices(key, t, n, m, sampling)))
  return np.asarray(fn(jnp.arange(steps)))          # (steps, m)


# ----------------------------------------------------------------------------
# The indices
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("n, m", [pytest.param(*nm, marks=pytest.mark.slow) for nm in [(5, 2), (6, 2), (6, 4), (5, 5)]])   # (slow)
def test_without_replacement_each_sequence_once_per_epoch(n, m):
  epochs = 7
  steps = -(-epochs * n // m)
  flat = _stream(n, m, "without", steps).reshape(-1)
  perms = flat[:epochs * n].reshape(epochs, n)
  for e in range(epochs):
    assert sorted(perms[e]) == list(range(n)), (e, perms[e])
  assert len({tuple(p) for p in perms}) > 1          # a fresh permutation per epoch
  if n % m == 0:                                     # no batch crosses an epoch: distinct sequences
    assert all(len(set(b)) == m for b in flat.reshape(-1, m))
  # a pure function of (key, step): the same again, and another key gives another stream
  assert np.array_equal(_stream(n, m, "without", steps).reshape(-1), flat)
  other = _stream(n, m, "without", steps, key=jax.random.PRNGKey(8)).reshape(-1)
  assert not np.array_equal(other, flat) or m == n == 1


@pytest.mark.parametrize("n, m, sampling, first", [
    (6, 4, "without", 5),            # batches that cross epochs, a window that starts mid-epoch
    pytest.param(6, 1, "without", 0, marks=pytest.mark.slow),
    pytest.param(5, 5, "without", 3, marks=pytest.mark.slow),
    pytest.param(5, 2, "with", 9, marks=pytest.mark.slow),
    pytest.param(5, 2, "cyclic", 4, marks=pytest.mark.slow)])
def test_table_of_a_window_equals_the_steps_indices(n, m, sampling, first):
  # the trainers draw the sequences of a window of steps at once, on the host (minibatch_table_host):
  # the very indices minibatch_indices gives step by step, wherever the window starts, for any key
  key, other, steps = jax.random.PRNGKey(7), jax.random.PRNGKey(8), 13
  want = _stream(n, m, sampling, first + steps)[first:]
  host = train_lib.minibatch_table_host(np.stack([np.asarray(key), np.asarray(other)]), first, steps, n, m, sampling)
  assert host.shape == (2, steps, m)
  assert np.array_equal(host[0], want)
  assert np.array_equal(host[1], _stream(n, m, sampling, first + steps, key=other)[first:])


def test_cyclic_order_wraps():
  got = _stream(5, 2, "cyclic", 6)
  assert np.array_equal(got, (2 * np.arange(6)[:, None] + np.arange(2)) % 5)
  assert np.array_equal(_stream(5, 5, "cyclic", 3), np.tile(np.arange(5), (3, 1)))


def test_with_replacement_uniform_draws():
  n, m, steps = 4, 2, 4000
  got = _stream(n, m, "with", steps)
  assert got.shape == (steps, m) and got.min() == 0 and got.max() == n - 1
  counts = np.bincount(got.reshape(-1), minlength=n)
  assert np.all(np.abs(counts - steps * m / n) < 0.05 * steps * m / n), counts
  assert np.any(got[:, 0] == got[:, 1])              # with replacement: repeats within a step occur
  assert len({tuple(b) for b in got[:50]}) > 5       # each step its own draw
  assert np.array_equal(_stream(n, m, "with", steps), got)


def test_bad_minibatch_settings(data, keys):
  with pytest.raises(ValueError, match="minibatch=6 exceeds the n=5"):
    train_lib.train(dataclasses.replace(BASE, minibatch=6), data, keys)
  with pytest.raises(ValueError, match="minibatch must be a non-negative integer"):
    dataclasses.replace(BASE, minibatch=-1).validate()
  with pytest.raises(ValueError, match="sampling must be one of"):
    dataclasses.replace(BASE, minibatch=2, sampling="shuffle").validate()
  problems = local_convergence.SETTINGS.problems({**local_convergence.SETTINGS.values({}), "n": 4, "minibatch": 5})
  assert problems == ["--minibatch=5 exceeds --n=4: a step draws at most the n sequences of a data set"]
  problems = local_convergence.SETTINGS.problems({**local_convergence.SETTINGS.values({}), "sampling": "shuffle"})
  assert problems and "sampling" in problems[0]


# ----------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------

def test_default_is_full_batch(data, keys):
  assert train_lib.TrainConfig().minibatch == 0 and train_lib.TrainConfig().sampling == "without"
  full = train_lib.train(BASE, data, keys)
  _same(train_lib.train(dataclasses.replace(BASE, minibatch=0, sampling="with"), data, keys), full)


def _flax_single_head():
  from svmattn.models import flax_models
  return flax_models.SingleHead()


SLOW = pytest.mark.slow     # (each path compiles its own programs: with the slow tests, which CI runs)


@pytest.mark.parametrize("kwargs", [
    dict(param="W"),                                                     # closed-form gradient, normalized GD
    pytest.param(dict(param="KQ", optimizer="gd"), marks=SLOW),
    pytest.param(dict(param="W", optimizer="adam", lr=0.01), marks=SLOW),  # an optax optimizer
    pytest.param(dict(param="p", model="prompt"), marks=SLOW),            # autodiff
    pytest.param(dict(module="flax"), marks=SLOW),                        # the flax-model path
], ids=["W", "KQ-gd", "W-adam", "prompt", "flax"])
def test_all_sequences_in_order_is_full_batch_bit_for_bit(data, keys, kwargs):
  """A mini-batch of all n sequences in cyclic order runs the full-batch program (whatever kernel
  that is: ``train.loop.full_batch_if_whole``), bit for bit."""
  if kwargs.get("module") == "flax":
    kwargs = {"module": _flax_single_head()}
  config = dataclasses.replace(BASE, **kwargs)
  full = train_lib.train(config, data, keys)
  every = train_lib.train(dataclasses.replace(config, minibatch=SPEC.n, sampling="cyclic"), data, keys)
  _same(every, full)
  # a real mini-batch changes the trajectory, while the snapshots stay full-data values
  mini = train_lib.train(dataclasses.replace(config, minibatch=2, sampling="with"), data, keys)
  assert np.all(np.isfinite(mini.W)) and not np.array_equal(mini.W, full.W)
  # the same start: W itself, or K Q^T, d products rounded by two programs (within 1e-13 of each other)
  np.testing.assert_allclose(mini.W[:, 0], full.W[:, 0], rtol=1e-13, atol=1e-15)
  # the same full-data loss of it, observed by the mini-batch program and by the full batch's kernel:
  # a few dozen float64 operations each, so within 1e-12 relative of each other
  np.testing.assert_allclose(mini.loss[:, 0], full.loss[:, 0], rtol=1e-12)
  assert mini.attention.shape == full.attention.shape


@pytest.mark.slow   # (the fast set keeps a sibling of this check; CI runs the slow ones too)
def test_full_data_loss_recorded(data, mini_run):
  """A snapshot's loss is the full-data objective of the parameters it records."""
  t = mini_run
  objective = train_lib.make_trainer(MINI).objective
  one = jax.tree_util.tree_map(lambda a: a[1], data)
  assert np.allclose(float(objective({"W": jnp.asarray(t.W[1, -1])}, one)), t.loss[1, -1], rtol=1e-12, atol=0)


@pytest.mark.parametrize("sampling", ["with", pytest.param("without", marks=pytest.mark.slow)])  # (a fast sibling)
def test_same_alone_as_in_a_batch(data, keys, sampling):
  config = dataclasses.replace(BASE, minibatch=2, sampling=sampling)
  batch = train_lib.train(config, data, keys)
  for b in (1, 2):
    alone = train_lib.train(config, jax.tree_util.tree_map(lambda a: a[b:b + 1], data), keys[b:b + 1])
    for field in ("W", "loss", "max_prob", "attention"):
      assert np.array_equal(getattr(alone, field)[0], getattr(batch, field)[b]), (b, field)
  assert not np.array_equal(batch.W[1], batch.W[2])


@pytest.mark.slow
@pytest.mark.skipif(len(jax.local_devices()) < 2, reason="one device")
def test_two_devices_equal_one(data, keys, mini_run):
  one = train_lib.train(MINI, data, keys, mesh=train_lib.data_mesh(jax.local_devices()[:1]))
  two = train_lib.train(MINI, data, keys, mesh=train_lib.data_mesh(jax.local_devices()[:2]))
  _same(one, two)
  _same(two, mini_run)


class Interrupt(Exception):
  pass


@pytest.mark.parametrize("k", [1, pytest.param(2, marks=pytest.mark.slow)])   # (the sibling: slow tests)
def test_resumed_from_checkpoint_is_bit_identical(data, keys, mini_run, tmp_path, k):
  config, reference = MINI, mini_run
  meta = {"minibatch": 2}
  calls = []

  def stop_after_k(steps):
    calls.append(steps)
    if len(calls) == k:
      raise Interrupt

  with pytest.raises(Interrupt):
    train_lib.train(config, data, keys, progress=stop_after_k, checkpoints=ckpt_lib.Checkpoints(tmp_path, meta))
  resumed_calls = []
  resumed = train_lib.train(config, data, keys, progress=resumed_calls.append,
                            checkpoints=ckpt_lib.Checkpoints(tmp_path, meta))
  assert resumed_calls[0] == 10 * k               # it did resume after chunk k
  _same(resumed, reference)


@pytest.mark.slow
def test_start_continues_the_sampling_stream(data, keys, mini_run, tmp_path):
  """``start`` = (step, state): step t still trains on the indices of step t (the state after
  chunk 1, step 10, taken from a checkpoint)."""
  meta = {"minibatch": 2}
  ckpt = ckpt_lib.Checkpoints(tmp_path, meta)
  _same(train_lib.train(MINI, data, keys, checkpoints=ckpt), mini_run)
  trainer = train_lib.make_trainer(MINI)
  one = jax.tree_util.tree_map(lambda a: a[0], data)
  treedef = jax.tree_util.tree_structure(jax.eval_shape(lambda: trainer.init_one(jax.random.PRNGKey(0), one)))
  tree = ckpt.restore(1)
  state = jax.tree_util.tree_unflatten(treedef, [np.asarray(tree["state"][str(i)])[:len(RUNS)]
                                                 for i in range(treedef.num_leaves)])
  rest = train_lib.train(MINI, data, keys, start=(10, state))
  assert list(rest.steps) == [10, 15, 20, 25, 30]
  assert np.array_equal(rest.W, mini_run.W[:, 2:]) and np.array_equal(rest.loss, mini_run.loss[:, 2:])
  # from the same state at another step: other indices, another trajectory
  other = train_lib.train(MINI, data, keys, start=(15, state))
  assert not np.array_equal(other.W[:, 1:], mini_run.W[:, 3:])


# ----------------------------------------------------------------------------
# E2 end to end
# ----------------------------------------------------------------------------

E2_FLAGS = ("--runs=3", "--n=4", "--T=4", "--d=4", "--steps=60", "--chunk_steps=20", "--minibatch=2",
            "--sampling=with", "--noprogress", "--checkpoint_every_s=0")   # (the kill waits for a checkpoint)


def _e2(out, *args):
  return subprocess.run([sys.executable, "-m", "experiments.local_convergence", f"--out={out}", *E2_FLAGS, *args],
                        cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def e2_reference(tmp_path_factory):
  out = tmp_path_factory.mktemp("e2_minibatch")
  proc = _e2(out)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return out


@pytest.mark.slow
def test_e2_minibatch_end_to_end(e2_reference):
  import json
  with open(os.path.join(e2_reference, "summary.json")) as f:
    summary = json.load(f)
  assert summary["flags"]["minibatch"] == 2 and summary["flags"]["sampling"] == "with"
  with np.load(os.path.join(e2_reference, "results.npz")) as f:
    assert f["W_final_W"].shape == (3, 4, 4) and np.all(np.isfinite(f["W_final_W"]))
    assert f["loss_KQ"].shape == (3, 7)


@pytest.mark.slow   # kill -9 and --resume end to end
def test_e2_minibatch_killed_and_resumed(e2_reference, tmp_path):
  out = tmp_path / "run"
  log = open(tmp_path / "log", "w")
  started = subprocess.Popen([sys.executable, "-m", "experiments.local_convergence", f"--out={out}", *E2_FLAGS],
                             cwd=REPO_ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
  started.log = log
  killed = kill_when(started, out, has_checkpoint)
  assert killed is not None, "the run finished before it could be killed"
  proc = _e2(out, "--resume")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert not os.path.exists(out / "work")
  assert_same_results(out, e2_reference)


@pytest.mark.slow   # two end-to-end runs of the binary
def test_e2_every_sequence_in_order_is_the_full_batch_run(tmp_path):
  """The binary: --minibatch=n --sampling=cyclic gives the full-batch run's results bit for bit, on
  the same GD kernel."""
  common = ("--runs=3", "--n=4", "--T=4", "--d=4", "--steps=60", "--chunk_steps=20", "--noprogress")
  outs = {}
  for name, extra in (("full", ()), ("cyclic", ("--minibatch=4", "--sampling=cyclic"))):
    outs[name] = tmp_path / name
    proc = subprocess.run([sys.executable, "-m", "experiments.local_convergence", f"--out={outs[name]}", *common,
                           *extra], cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
  with np.load(outs["full"] / "results.npz") as a, np.load(outs["cyclic"] / "results.npz") as b:
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
      assert np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f"), k
  kernels = [json.load(open(outs[n] / "summary.json"))["environment"]["gd_kernel"] for n in ("full", "cyclic")]
  assert kernels[0] == kernels[1] and kernels[0] != "not loaded"
