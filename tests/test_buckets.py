"""svmattn.train.buckets: d padded with zeros to a bucket, one compiled program per bucket.

The padding runs by default on GPUs and TPUs; here it is forced on the CPU (``buckets.PAD_D``) with
the native kernel off, so the XLA block kernel runs as it does on a GPU.
"""
import numpy as np
import pytest

from svmattn.data import datasets as data_lib
from svmattn.io import checkpoint as ckpt_lib
from svmattn.train import buckets
from svmattn.train import loop as train_lib
from svmattn.train import native_kernel

SEED = 3


@pytest.fixture
def xla(monkeypatch):
  """The XLA block kernel (as on a GPU), padding on or off: xla(True) / xla(False)."""
  monkeypatch.setattr(native_kernel, "ENABLED", False)

  def set_padding(on: bool):
    monkeypatch.setattr(buckets, "PAD_D", bool(on))
    train_lib._JIT_CACHE.clear()
  yield set_padding
  train_lib._JIT_CACHE.clear()


def _train(config, d, runs, **kw):
  runs = np.asarray(runs)
  data = data_lib.generate_host(data_lib.DataSpec(n=5, T=5, d=d), SEED, runs)
  return train_lib.train(config, data, train_lib.init_keys(SEED, runs), **kw)


def _programs():
  return sum(len(fn.executables) for fn in train_lib._JIT_CACHE.values() if hasattr(fn, "executables"))


def test_bucket_sizes_and_where_padding_is_on(monkeypatch):
  assert [buckets.padded_size(d) for d in (1, 2, 4, 5, 8, 9, 20)] == [4, 4, 4, 8, 8, 12, 20]
  monkeypatch.setattr(buckets, "PAD_D", False)
  assert not buckets.enabled()
  monkeypatch.setattr(buckets, "PAD_D", True)
  assert buckets.enabled()
  monkeypatch.setattr(buckets, "PAD_D", None)
  assert not buckets.enabled()            # the default on a CPU (these tests' backend)


@pytest.mark.slow   # (CI runs it with the slow tests: the test command stays under 5 minutes)
def test_one_program_for_every_d_of_a_bucket(xla):
  """d = 6 and 7 share the bucket 8: one chunk program padded, two unpadded."""
  config = train_lib.TrainConfig(steps=20, snapshot_every=10, chunk_steps=20, block_size=8)
  for on, programs in ((True, 1), (False, 2)):
    xla(on)
    for d in (6, 7):
      tr = _train(config, d, range(4))
      assert tr.W.shape == (4, 3, d, d) and tr.params["W"].shape == (4, d, d)
    assert _programs() == programs, on


@pytest.mark.parametrize("d", [pytest.param(3, marks=pytest.mark.slow), 6])
def test_padded_run_equals_the_unpadded_to_rounding(xla, d):
  """The padding adds zero terms to the sums, which XLA may group otherwise: the same trajectory
  to rounding. Measured on this host after 200 normalized steps: 5e-15 of max|W| (d = 5, 6, 10).
  The bound 1e-9 leaves five orders of magnitude to other CPUs' rounding and sits far below what
  a padded entry leaking into the logits would do (a change of order lr = 0.1 in W per step)."""
  config = train_lib.TrainConfig(steps=200, snapshot_every=50, chunk_steps=100, block_size=8)
  xla(False)
  plain = _train(config, d, range(6))
  xla(True)
  padded = _train(config, d, range(6))
  scale = np.max(np.abs(plain.W), axis=(2, 3), keepdims=True)
  assert np.max(np.abs(padded.W - plain.W) / scale) < 1e-9
  np.testing.assert_allclose(padded.loss, plain.loss, rtol=1e-9, atol=1e-300)
  np.testing.assert_allclose(padded.attention, plain.attention, rtol=0, atol=1e-9)
  np.testing.assert_array_equal(padded.selected, plain.selected)


@pytest.mark.parametrize("param", ["W", pytest.param("KQ", marks=pytest.mark.slow)])
def test_padded_runs_are_exact_across_batches_and_resume(xla, tmp_path, param):
  """Within the padded numerics: a data set alone equals it in a batch, and a run interrupted
  after its first chunk and resumed from the checkpoint equals the uninterrupted run, bit for bit.
  The checkpoint holds the unpadded state (what a replay reads)."""
  xla(True)
  config = train_lib.TrainConfig(param=param, steps=40, snapshot_every=10, chunk_steps=20, block_size=4)
  whole = _train(config, 6, range(7))
  alone = _train(config, 6, [5])
  np.testing.assert_array_equal(alone.W[0], whole.W[5])
  np.testing.assert_array_equal(alone.attention[0], whole.attention[5])

  class Interrupt(Exception):
    pass

  def stop(steps):
    raise Interrupt

  meta = {"param": param}
  with pytest.raises(Interrupt):
    _train(config, 6, range(7), progress=stop, checkpoints=ckpt_lib.Checkpoints(str(tmp_path), meta))
  ckpt = ckpt_lib.Checkpoints(str(tmp_path), meta)
  assert ckpt.steps() == [1]
  saved = ckpt.restore(1)
  shapes = sorted(np.asarray(x).shape for x in saved["state"].values())
  assert all(s[1:] == (6, 6) for s in shapes), shapes                       # unpadded: d = 6, not 8
  assert np.asarray(saved["snapshots"]["W"]).shape[2:] == (6, 6)
  resumed = _train(config, 6, range(7), checkpoints=ckpt_lib.Checkpoints(str(tmp_path), meta))
  for field in ("W", "loss", "max_prob", "attention"):
    np.testing.assert_array_equal(getattr(resumed, field), getattr(whole, field))
  for name in whole.params:
    np.testing.assert_array_equal(resumed.params[name], whole.params[name])
