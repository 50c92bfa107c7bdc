"""--numerics: "exact" (normalized GD as written in the paper) against "authors" (the paper's
code: g / (||g|| + float64 eps) and the pooled token X^T s). With the authors' numerics a run
freezes once its gradient norm falls to about eps; with exact numerics every step has length lr."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from svmattn.data import datasets as data_lib
from svmattn.models import attention as model_lib
from svmattn.optim import optimizers
from svmattn.train import loop as train_lib


def test_authors_normalization_divides_by_the_norm_plus_epsilon():
  g = {"W": jnp.array([[3.0, 4.0]]), "K": jnp.array([1e-17, 0.0])}
  out, _ = optimizers.normalize_plus_eps().update(g, optimizers.normalize_plus_eps().init(g))
  np.testing.assert_allclose(out["W"], np.array([[3.0, 4.0]]) / (5.0 + 2.220446049250313e-16), rtol=1e-15)
  # a gradient far below eps gives a step far below lr (exact normalization would give a unit step)
  assert float(jnp.linalg.norm(out["K"])) < 0.05
  exact, _ = optimizers.normalize_by_leaf_norm().update(g, None)
  assert abs(float(jnp.linalg.norm(exact["K"])) - 1.0) < 1e-12
  assert optimizers.AUTHORS_EPS == np.finfo(np.float64).eps


def test_plain_pooled_token_is_x_transpose_s():
  key = jax.random.PRNGKey(0)
  X = jax.random.normal(key, (3, 4, 5))
  s = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(1), (3, 4)), -1)
  np.testing.assert_allclose(model_lib.pooled_token_plain(s, X), np.einsum("nt,ntd->nd", s, X), rtol=1e-13, atol=1e-15)  # summation order
  np.testing.assert_allclose(model_lib.pooled_token(s, X), model_lib.pooled_token_plain(s, X), rtol=1e-12)
  with pytest.raises(ValueError, match="numerics"):
    model_lib.get_pooling("bogus")
  with pytest.raises(ValueError, match="numerics"):
    train_lib.TrainConfig(numerics="bogus").validate()


def _steps_and_norms(numerics, data, runs):
  config = train_lib.TrainConfig(param="W", lr=1.0, steps=300, snapshot_every=1, chunk_steps=300, block_size=2,
                                 numerics=numerics)
  W = train_lib.train(config, data, train_lib.init_keys(0, runs)).W.reshape(len(runs), 301, -1)
  return np.linalg.norm(np.diff(W, axis=1), axis=-1), np.linalg.norm(W, axis=-1)


@pytest.mark.slow   # (the fast set keeps a sibling of this check; CI runs the slow ones too)
def test_authors_numerics_stall_while_exact_keeps_unit_steps():
  runs = np.arange(2)
  data = data_lib.generate(data_lib.DataSpec(3, 4, 6), 0, runs)
  steps, norms = _steps_and_norms("exact", data, runs)
  np.testing.assert_allclose(steps, 1.0, rtol=1e-9)                     # every step has length lr
  assert np.all(norms[:, -1] > 250)
  steps, norms = _steps_and_norms("authors", data, runs)
  # the same trajectory at first (the gradient is far above eps) ...
  np.testing.assert_allclose(steps[:, :20], 1.0, rtol=1e-9)
  # ... then the gradient falls below eps and training freezes: steps far below lr, ||W|| stalls
  assert np.all(steps[:, -100:].max(1) < 0.1), steps[:, -100:].max(1)
  assert np.all(norms[:, -1] - norms[:, -101] < 10), norms[:, -1] - norms[:, -101]
  assert np.all(norms[:, -1] < 120), norms[:, -1]
