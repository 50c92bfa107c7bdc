"""svmattn.models.losses and the training objective's gradient (model.make_loss).

The autodiff gradient of L(params) = (1/n) sum_i l(Y_i v^T X_i^T softmax(X_i W z_i))
(+ ridge) must match central finite differences, for W and (K,Q), for every loss.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import host
from svmattn.data import datasets as data_lib
from svmattn.models import heads
from svmattn.models import losses as losses_lib
from svmattn.models import attention as model_lib

LOSSES = ("logistic", "exponential", "correlation")


def test_loss_values():
  u = np.array([-30.0, -2.0, -0.5, 0.0, 0.7, 3.0, 40.0])
  np.testing.assert_allclose(losses_lib.get_loss("logistic")(u), np.log1p(np.exp(-u)), rtol=1e-14)
  np.testing.assert_allclose(losses_lib.get_loss("exponential")(u), np.exp(-u), rtol=1e-14)
  np.testing.assert_allclose(losses_lib.get_loss("correlation")(u), -u, rtol=0)
  # logistic stays finite and accurate far out
  assert np.isfinite(losses_lib.get_loss("logistic")(jnp.array(-800.0)))
  np.testing.assert_allclose(losses_lib.get_loss("logistic")(jnp.array(-800.0)), 800.0, rtol=1e-15)


@pytest.mark.parametrize("name", LOSSES)
def test_losses_strictly_decreasing(name):
  u = jnp.linspace(-5.0, 5.0, 101)
  assert np.all(np.diff(np.asarray(losses_lib.get_loss(name)(u))) < 0)
  assert np.all(np.asarray(jax.vmap(jax.grad(losses_lib.get_loss(name)))(u)) < 0)


def test_unknown_loss():
  with pytest.raises(ValueError, match="unknown loss 'hinge'.*correlation.*exponential.*logistic"):
    losses_lib.get_loss("hinge")


# ----------------------------------------------------------------------------
# Autodiff vs central finite differences
# ----------------------------------------------------------------------------

def _one(batch, b=0):
  return data_lib.Dataset(*(jnp.asarray(a[b]) for a in host(batch)))


@functools.lru_cache(maxsize=None)
def _fns(param_name, loss, ridge):
  """jitted gradient(theta, data) and central differences fd(theta, data, h) of the
  objective as a function of the flat parameter vector theta, compiled together."""
  param = model_lib.get_parameterization(param_name)
  objective = model_lib.make_loss(param, heads.LINEAR, loss, ridge=ridge)

  def value(theta, data):
    d = data.X.shape[-1]
    if param_name == "W":
      params = {"W": theta.reshape(d, d)}
    else:
      params = {"K": theta[: d * d].reshape(d, d), "Q": theta[d * d:].reshape(d, d)}
    return objective(params, data)

  def both(theta, data, h):
    fd = jax.vmap(lambda e: (value(theta + h * e, data) - value(theta - h * e, data)) / (2 * h))(
        jnp.eye(theta.size, dtype=theta.dtype))
    return jax.grad(value)(theta, data), fd

  return jax.jit(both)


@pytest.mark.parametrize("param_name", ["W", "KQ"])
@pytest.mark.parametrize("loss", [LOSSES[0]] + [pytest.param(x, marks=pytest.mark.slow) for x in LOSSES[1:]])   # (siblings: slow)
def test_gradient_matches_central_differences(batch, param_name, loss):
  ds = _one(batch, 1)
  d = ds.X.shape[-1]
  size = d * d * (1 if param_name == "W" else 2)
  # O(1) random parameters: softmax far from saturation, so curvature is visible
  theta = jax.random.normal(jax.random.PRNGKey(11), (size,), jnp.float64)
  ridge = 0.05 if param_name == "KQ" else None  # a visible ridge term for (K,Q)
  g, numeric = (np.asarray(a) for a in _fns(param_name, loss, ridge)(theta, ds, 1e-5))
  assert np.linalg.norm(g) > 1e-3  # a nontrivial gradient
  # central differences: truncation O(h^2) ~ 1e-10, rounding ~ eps / h ~ 1e-11
  np.testing.assert_allclose(g, numeric, rtol=1e-7, atol=1e-9)
