"""svmattn.optim.optimizers: normalized GD, plain GD, optimizers by name."""
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from svmattn.optim import optimizers


def _grads():
  rng = np.random.default_rng(0)
  return {"K": jnp.asarray(rng.normal(size=(4, 3)) * 1e-7), "Q": jnp.asarray(rng.normal(size=(4, 3)) * 50.0)}


def _params():
  return {"K": jnp.ones((4, 3)), "Q": -jnp.ones((4, 3))}


def test_normalized_gd_update_has_norm_lr_per_leaf():
  lr = 0.1
  opt = optimizers.normalized_gd(lr)
  grads, params = _grads(), _params()
  updates, _ = opt.update(grads, opt.init(params), params)
  for name in ("K", "Q"):
    u, g = np.asarray(updates[name]), np.asarray(grads[name])
    np.testing.assert_allclose(np.linalg.norm(u), lr, rtol=1e-14)
    # the direction of -g, each leaf by its own norm
    np.testing.assert_allclose(u, -lr * g / np.linalg.norm(g), rtol=1e-13, atol=1e-17)
  new = optax.apply_updates(params, updates)
  np.testing.assert_allclose(np.linalg.norm(np.asarray(new["Q"] - params["Q"])), lr, rtol=1e-14)


def test_normalized_update_is_invariant_to_loss_scale():
  opt = optimizers.normalized_gd(0.3)
  grads, params = _grads(), _params()
  u1, _ = opt.update(grads, opt.init(params), params)
  u2, _ = opt.update({k: 1e-9 * g for k, g in grads.items()}, opt.init(params), params)
  for k in u1:
    np.testing.assert_allclose(u1[k], u2[k], rtol=1e-13)


def test_zero_gradient_stays_zero():
  opt = optimizers.normalized_gd(0.1)
  params = _params()
  grads = {"K": jnp.zeros((4, 3)), "Q": _grads()["Q"]}
  updates, _ = opt.update(grads, opt.init(params), params)
  assert np.all(np.asarray(updates["K"]) == 0) and np.all(np.isfinite(np.asarray(updates["K"])))
  np.testing.assert_allclose(np.linalg.norm(np.asarray(updates["Q"])), 0.1, rtol=1e-14)
  transform = optimizers.normalize_by_leaf_norm()
  out, _ = transform.update({"W": jnp.zeros((3, 3))}, transform.init(None))
  assert np.all(np.asarray(out["W"]) == 0)


def test_gd():
  opt = optimizers.gd(0.5)
  grads, params = _grads(), _params()
  updates, _ = opt.update(grads, opt.init(params), params)
  for k in grads:
    np.testing.assert_allclose(updates[k], -0.5 * np.asarray(grads[k]), rtol=1e-15)


def test_get_optimizer_by_name():
  grads, params = _grads(), _params()
  for name in ("normalized_gd", "ngd"):
    opt = optimizers.get_optimizer(name, 0.2)
    updates, _ = opt.update(grads, opt.init(params), params)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(updates["K"])), 0.2, rtol=1e-14)
  opt = optimizers.get_optimizer("adam", 0.01)
  assert isinstance(opt, optax.GradientTransformation)
  state = opt.init(params)
  updates, state = opt.update(grads, state, params)
  # Adam's first step is -lr * g / (|g| + eps) entrywise: about lr * sign(g) for |g| >> eps
  q, g = np.asarray(updates["Q"]), np.asarray(grads["Q"])
  np.testing.assert_allclose(q, -0.01 * np.sign(g), rtol=1e-6)
  new = optax.apply_updates(params, updates)
  assert np.all(np.isfinite(np.asarray(new["Q"])))


@pytest.mark.parametrize("name, match", [
    ("sgdx", r"unknown optimizer 'sgdx'"),
    ("_private", r"unknown optimizer '_private'"),
    ("__version__", r"unknown optimizer"),
    ("apply_updates", r"optax.apply_updates cannot be built from a learning rate alone"),
    ("sd_l1e400", r"unknown optimizer 'sd_l1e400': p=1e400 overflows to infinity"),     # never rounded to sd_linf
    ("md_l1e999", r"unknown optimizer 'md_l1e999': p=1e999 overflows to infinity"),
])
def test_get_optimizer_errors(name, match):
  with pytest.raises(ValueError, match=match):
    optimizers.get_optimizer(name, 0.1)
