"""Heads: values and token scores against direct formulas, names, hashing, and the
loss gradient with each head against central finite differences."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import SPEC
from svmattn.data import datasets as data_lib
from svmattn.models import heads
from svmattn.models import attention as model_lib
from svmattn.train import loop as train_lib

HEAD_NAMES = ["linear", "relu", "lambda:0.7"]


def _direct(name, v, r):
  """h(r) written out in NumPy."""
  v, r = np.asarray(v, np.float64), np.asarray(r, np.float64)
  if name == "linear":
    return float(v @ r)
  if name == "relu":
    return float(np.sum(np.maximum(v.T @ r, 0.0)))
  lam = float(name.split(":")[1])
  return float(v @ r - lam * r @ r)


@pytest.fixture(scope="module")
def datasets(batch):
  """The shared batch (conftest) with head parameters from each head's init: v (B,d) or V (B,d,d)."""
  keys = jax.random.split(jax.random.PRNGKey(7), len(batch.X))
  out = {}
  for name in HEAD_NAMES:
    head = heads.get_head(name)
    out[name] = batch._replace(v=jnp.stack([head.init(k, SPEC.d, jnp.float64) for k in keys]))
  return out


def test_relu_init_has_unit_frobenius_norm_and_is_reproducible():
  key = jax.random.PRNGKey(3)
  V = heads.RELU.init(key, SPEC.d, jnp.float64)
  assert V.shape == (SPEC.d, SPEC.d) and V.dtype == jnp.float64
  np.testing.assert_allclose(np.linalg.norm(V), 1.0, rtol=1e-14)
  np.testing.assert_array_equal(V, heads.RELU.init(key, SPEC.d, jnp.float64))
  assert np.linalg.matrix_rank(np.asarray(V)) == SPEC.d   # a Gaussian matrix, not a scaled constant
  v = heads.get_head("lambda", lam=2.0).init(key, SPEC.d, jnp.float64)
  assert v.shape == (SPEC.d,)
  np.testing.assert_allclose(np.linalg.norm(v), 1.0, rtol=1e-14)


@pytest.mark.parametrize("name", HEAD_NAMES)
def test_head_values_and_token_scores_match_direct_formulas(datasets, name):
  head = heads.get_head(name)
  ds = datasets[name]
  X, Y, v = np.asarray(ds.X[0]), np.asarray(ds.Y[0]), np.asarray(ds.v[0])
  rng = np.random.default_rng(0)
  for _ in range(5):
    r = rng.normal(size=X.shape[-1])
    np.testing.assert_allclose(float(head.apply(v, r)), _direct(name, v, r), rtol=1e-13, atol=1e-14)
  gamma = np.asarray(heads.token_scores(head, v, X, Y))
  expect = np.array([[Y[i] * _direct(name, v, X[i, t]) for t in range(X.shape[1])] for i in range(X.shape[0])])
  np.testing.assert_allclose(gamma, expect, rtol=1e-13, atol=1e-14)


def test_relu_head_is_zero_where_every_unit_is_off():
  V = np.eye(3) / np.sqrt(3)
  assert float(heads.RELU.apply(V, np.array([-1.0, -2.0, -0.5]))) == 0.0
  np.testing.assert_allclose(float(heads.RELU.apply(V, np.array([1.0, -2.0, 2.0]))), 3 / np.sqrt(3))


def test_names_round_trip_and_lambda_heads_are_cached_and_hashable():
  for name in ("linear", "relu", "lambda:0.5", "lambda:0.0", "lambda:-1.5"):
    head = heads.get_head(name)
    assert heads.get_head(head.name) is head
  a = heads.get_head("lambda", lam=0.5)
  assert a is heads.get_head("lambda:0.5") is heads.lambda_head(0.5) is heads.get_head("lambda", lam="0.5")
  assert a != heads.get_head("lambda", lam=0.25)
  assert heads.get_head("lambda", lam=-0.0) is heads.get_head("lambda", lam=0.0)
  assert heads.get_head("lambda") is heads.lambda_head(heads.LAMBDA_DEFAULT)
  assert len({a: 1, heads.lambda_head(0.5): 2, heads.RELU: 3}) == 2   # hashable, equal for the same lam
  assert heads.get_head("linear") is heads.LINEAR and heads.get_head("relu") is heads.RELU


@pytest.mark.parametrize("name, match", [
    ("cubic", "unknown head"), ("lambda:abc", "finite number"), ("lambda:nan", "finite number"),
    ("relu:3", "takes no argument"), (3, "must be a string")])
def test_bad_head_names_raise_clear_errors(name, match):
  with pytest.raises(ValueError, match=match):
    heads.get_head(name)
  with pytest.raises(ValueError, match="not both"):
    heads.get_head("lambda:0.5", lam=0.5)


def test_train_config_takes_the_lambda_from_the_head_name():
  config = train_lib.TrainConfig(head="lambda:0.3", steps=1).validate()
  trainer = train_lib.make_trainer(config)
  assert trainer.head is heads.lambda_head(0.3)
  with pytest.raises(ValueError, match="finite"):
    train_lib.TrainConfig(head="lambda:inf").validate()


@pytest.mark.parametrize("name", HEAD_NAMES)
def test_loss_gradient_matches_central_differences(datasets, name):
  head = heads.get_head(name)
  ds = data_lib.take(datasets[name], 1)
  loss = model_lib.make_loss(model_lib.W_PARAM, head)
  d = SPEC.d
  W = jnp.asarray(np.random.default_rng(1).normal(size=(d, d)))
  grad = np.asarray(jax.jit(jax.grad(loss))({"W": W}, ds)["W"])
  eps = 1e-6
  E = jnp.asarray(np.eye(d * d).reshape(d * d, d, d) * eps)
  losses = jax.jit(jax.vmap(lambda w: loss({"W": w}, ds)))
  fd = np.asarray((losses(W + E) - losses(W - E)) / (2 * eps)).reshape(d, d)
  assert np.linalg.norm(grad) > 1e-4
  np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-9)
