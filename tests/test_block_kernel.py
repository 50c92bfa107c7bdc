"""svmattn.train.block_kernel: the closed-form GD kernel with the data sets on the SIMD axis.

It computes what the vmapped per-data-set program computes (same gradient, same optimizer step),
rounded differently, and a data set's trajectory depends on nothing else in its block.
"""
import dataclasses

import numpy as np
import pytest

from svmattn.data import datasets as data_lib
from svmattn.train import block_kernel
from svmattn.train import loop as train_lib

SPEC = data_lib.DataSpec(n=6, T=8, d=10)
SEED = 5


def _train(config, runs, kernel: bool, monkeypatch):
  runs = np.asarray(runs)
  data = data_lib.generate(SPEC, SEED, runs)
  if kernel:
    return train_lib.train(config, data, train_lib.init_keys(SEED, runs))
  with monkeypatch.context() as m:        # the per-data-set program, vmapped (compiled apart)
    m.setattr(block_kernel, "supports", lambda config: False)
    train_lib._JIT_CACHE.clear()
    out = train_lib.train(config, data, train_lib.init_keys(SEED, runs))
  train_lib._JIT_CACHE.clear()
  return out


SLOW = pytest.mark.slow     # (siblings of a fast case: with the slow tests)


@pytest.mark.parametrize("param, optimizer, loss", [("W", "normalized_gd", "logistic"),
                                                    pytest.param("KQ", "normalized_gd", "logistic", marks=SLOW),
                                                    pytest.param("W", "gd", "exponential", marks=SLOW),
                                                    pytest.param("KQ", "gd", "correlation", marks=SLOW)])
def test_matches_the_vmapped_program_to_rounding(param, optimizer, loss, monkeypatch):
  """Same objective, gradient and step; only the rounding differs. After 200 steps the two
  trajectories differ by rounding amplified through the steps: measured 6e-16 of max|W| for W
  and 1e-11 for (K,Q) (two factors, a ridge of machine epsilon). The bound 1e-7 leaves four
  orders of magnitude to other CPUs' rounding and sits five below a wrong gradient term, which
  moves W by about lr per step (lr / max|W| > 1e-2 here)."""
  config = train_lib.TrainConfig(param=param, optimizer=optimizer, loss=loss, lr=0.05 if optimizer == "gd" else 0.1,
                                 steps=200, snapshot_every=50, chunk_steps=100)
  assert block_kernel.supports(config)
  new = _train(config, range(8), True, monkeypatch)
  old = _train(config, range(8), False, monkeypatch)
  np.testing.assert_array_equal(new.steps, old.steps)
  scale = np.max(np.abs(old.W), axis=(2, 3), keepdims=True)
  assert np.max(np.abs(new.W - old.W) / scale) < 1e-7
  np.testing.assert_allclose(new.loss, old.loss, rtol=1e-7, atol=1e-300)
  np.testing.assert_allclose(new.max_prob, old.max_prob, rtol=1e-7)
  np.testing.assert_array_equal(new.selected, old.selected)


@pytest.mark.parametrize("param", ["W", pytest.param("KQ", marks=SLOW)])
def test_a_data_set_does_not_depend_on_its_block(param, monkeypatch):
  """Bit for bit: run 3 trained with 69 others (at position 3 of the first block) equals run 3
  trained alone (position 0, the rest of the block padding) and at position 66 (second block)."""
  config = train_lib.TrainConfig(param=param, steps=40, snapshot_every=20, chunk_steps=40)
  big = _train(config, range(70), True, monkeypatch)
  alone = _train(config, [3], True, monkeypatch)
  moved = _train(config, [*range(66), 3], True, monkeypatch)
  for other, at in ((alone, 0), (moved, 66)):
    np.testing.assert_array_equal(other.W[at], big.W[3])
    np.testing.assert_array_equal(other.loss[at], big.loss[3])
    np.testing.assert_array_equal(other.attention[at], big.attention[3])


def test_const_schedule_takes_the_kernel_of_its_optimizer():
  """<name>@const is <name> (optim.optimizers): both train with the same kernel, so their
  trajectories stay bit-identical (test_optim_momentum.test_existing_trajectories_unchanged)."""
  for name in ("normalized_gd@const", "ngd@const", "gd@const", "sd_l2@const"):
    assert block_kernel.supports(dataclasses.replace(train_lib.TrainConfig(), optimizer=name))
  for name in ("normalized_gd@sqrt", "normalized_gd+mom0.9@const", "adam@const"):
    assert not block_kernel.supports(dataclasses.replace(train_lib.TrainConfig(), optimizer=name))


@pytest.mark.parametrize("change", [dict(optimizer="adam"), dict(optimizer="sd_linf"), dict(numerics="authors"),
                                    dict(minibatch=2), dict(loss_scale=2.0), dict(train_head=True),
                                    dict(head="tanh"), dict(model="prompt", param="p")])
def test_other_configurations_keep_the_vmapped_program(change):
  assert block_kernel.supports(train_lib.TrainConfig())
  assert not block_kernel.supports(dataclasses.replace(train_lib.TrainConfig(), **change))
