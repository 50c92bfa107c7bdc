"""--init_scale (issue 67): the random initialization times S for every parameterization; 1 is today's
start bit for bit."""
import numpy as np
import pytest

import svmattn
from svmattn.data import datasets as data_lib
from svmattn.train import loop as train_lib

svmattn.configure()


def _start(param, scale, init="uniform", model="single_query"):
  data = data_lib.generate_host(data_lib.DataSpec(4, 3, 5), 0, [0, 1])
  cfg = train_lib.TrainConfig(param=param, model=model, steps=10, snapshot_every=10, chunk_steps=10, init=init,
                              init_scale=scale, block_size=2).validate()
  return np.asarray(train_lib.train(cfg, data, train_lib.init_keys(0, np.array([0, 1]))).W[:, 0])


@pytest.mark.parametrize("param, model, power", [("W", "single_query", 1), ("KQ", "single_query", 2), ("p", "prompt", 1)])
def test_the_start_is_scaled(param, model, power):
  one, small = _start(param, 1.0, model=model), _start(param, 1e-3, model=model)
  np.testing.assert_allclose(small, one * 1e-3 ** power, rtol=1e-12, atol=0)
  assert np.array_equal(_start(param, 1.0, model=model), one)


def test_the_kq_zero_scheme_scales_k():
  assert np.all(_start("KQ", 1e-2, init="zero") == 0)       # Q = 0: K Q^T = 0 at any scale


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), True])
def test_a_bad_scale_is_refused(bad):
  with pytest.raises(ValueError, match="init_scale must be a finite number > 0"):
    train_lib.TrainConfig(init_scale=bad).validate()
