"""svmattn.optim.steepest and .mirror: the steps of docs/science.md section 10, by name through get_optimizer.

Each step is checked against its formula on a hand-made 3x3 gradient, for unit norm in its own norm
and the dual-norm identity <G, Delta> = ||G||_dual, for zero gradient -> zero step, float32 / jit /
vmap, and in a short training run on 2 tiny data sets.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from svmattn.data import datasets as data_lib
from svmattn.optim import mirror
from svmattn.optim import optimizers
from svmattn.optim import steepest
from svmattn.train import loop as train_lib

# A full-rank gradient with a unique largest entry (-4 at (1, 1)).
G = np.array([[3.0, -1.0, 2.0], [0.5, -4.0, 1.0], [2.0, 1.0, -0.5]])
# Ties: the largest |entry| 4 at (0, 0) and (1, 1), opposite signs.
G_TIES = np.array([[4.0, -1.0, 2.0], [0.5, -4.0, 1.0], [2.0, 1.0, -0.5]])
W0 = np.array([[0.3, -1.2, 0.7], [-0.4, 0.9, 0.05], [1.1, -0.6, -0.8]])


def _schatten(a, k):
  s = np.linalg.svd(a, compute_uv=False)
  return {"op": s.max(), "nuc": s.sum()}[k]


def _entry(a, p):
  return np.max(np.abs(a)) if p == np.inf else np.sum(np.abs(a) ** p) ** (1 / p)


def _step(name, g, params=None, lr=1.0, **kw):
  """The update of get_optimizer(name, lr) for the one-leaf gradient g."""
  opt = optimizers.get_optimizer(name, lr)
  params = {"W": jnp.asarray(W0 if params is None else params, g.dtype)}
  updates, _ = opt.update({"W": jnp.asarray(g)}, opt.init(params), params, **kw)
  return np.asarray(updates["W"])


# ----------------------------------------------------------------------------
# Each step equals its formula; unit norm; dual-norm identity
# ----------------------------------------------------------------------------

def test_l1_is_the_signed_largest_entry_ties_shared():
  delta = -_step("sd_l1", G)
  expected = np.zeros((3, 3))
  expected[1, 1] = -1.0
  np.testing.assert_array_equal(delta, expected)
  delta = -_step("sd_l1", G_TIES)
  expected = np.zeros((3, 3))
  expected[0, 0], expected[1, 1] = 0.5, -0.5
  np.testing.assert_array_equal(delta, expected)
  for g, d in ((G, -_step("sd_l1", G)), (G_TIES, delta)):
    assert np.sum(np.abs(d)) == 1.0                          # ||Delta||_1 = 1
    np.testing.assert_allclose(np.sum(g * d), np.max(np.abs(g)), rtol=1e-15)   # = ||G||_inf


def test_linf_is_sign_descent():
  delta = -_step("sd_linf", G)
  np.testing.assert_array_equal(delta, np.sign(G))
  np.testing.assert_allclose(np.sum(G * delta), np.sum(np.abs(G)), rtol=1e-15)   # = ||G||_1


@pytest.mark.parametrize("p", [1.5, 3.0, 2.0])
def test_lp(p):
  name = f"sd_l{p:g}"
  q = p / (p - 1)
  delta = -_step(name, G)
  expected = np.sign(G) * np.abs(G) ** (q - 1) / _entry(G, q) ** (q - 1)
  np.testing.assert_allclose(delta, expected, rtol=1e-13)
  np.testing.assert_allclose(_entry(delta, p), 1.0, rtol=1e-13)
  np.testing.assert_allclose(np.sum(G * delta), _entry(G, q), rtol=1e-13)
  # the general formula at p = 2 is normalized GD
  np.testing.assert_allclose(np.asarray(steepest.lp_direction(jnp.asarray(G), 2.0)),
                             G / np.linalg.norm(G), rtol=1e-14)


def test_sd_l2_is_normalized_gd():
  np.testing.assert_array_equal(_step("sd_l2", G, lr=0.3), _step("normalized_gd", G, lr=0.3))


def test_spectral_is_the_polar_factor():
  U, _, Vt = np.linalg.svd(G)
  delta = -_step("sd_spectral", G)
  np.testing.assert_allclose(delta, U @ Vt, atol=1e-14)
  np.testing.assert_allclose(_schatten(delta, "op"), 1.0, rtol=1e-13)
  np.testing.assert_allclose(np.sum(G * delta), _schatten(G, "nuc"), rtol=1e-13)   # = ||G||_*


def test_spectral_of_a_rank_deficient_gradient_is_the_polar_factor_of_its_range():
  a, b = np.array([1.0, 2.0, -1.0, 0.5]), np.array([0.3, -1.0, 2.0])
  g = 1e-30 * np.outer(a, b)                 # rank 1, tiny (peak scaling keeps it exact)
  delta = -_step("sd_spectral", g, params=np.zeros((4, 3)))
  np.testing.assert_allclose(delta, np.outer(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)), atol=1e-14)


def test_newton_schulz_approximates_the_polar_factor():
  U, _, Vt = np.linalg.svd(G)
  polar = U @ Vt
  # Muon's quintic iteration (5 steps): singular values near 1, not on it: within 0.35 in operator norm
  ns = -_step("sd_spectral_ns", G)
  assert np.linalg.norm(ns - polar, 2) < 0.35
  s = np.linalg.svd(ns, compute_uv=False)
  assert np.all((s > 0.6) & (s < 1.25))
  np.testing.assert_allclose(ns, np.asarray(steepest.newton_schulz_direction(jnp.asarray(G))), rtol=1e-15)
  # the cubic iteration converges to the exact polar factor
  cubic = np.asarray(steepest.newton_schulz_direction(jnp.asarray(G), steps=40, coeffs=steepest.CUBIC_NS_COEFFS))
  np.testing.assert_allclose(cubic, polar, atol=1e-12)
  # a tall leaf (transposed internally)
  g = np.arange(12.0).reshape(4, 3) ** 1.5 - 4
  cubic = np.asarray(steepest.newton_schulz_direction(jnp.asarray(g), steps=60, coeffs=steepest.CUBIC_NS_COEFFS))
  U, _, Vt = np.linalg.svd(g, full_matrices=False)
  np.testing.assert_allclose(cubic, U @ Vt, atol=1e-10)


def test_nuclear_is_the_top_singular_pair():
  U, s, Vt = np.linalg.svd(G)
  delta = -_step("sd_nuc", G)
  np.testing.assert_allclose(delta, np.outer(U[:, 0], Vt[0]), atol=1e-14)
  np.testing.assert_allclose(_schatten(delta, "nuc"), 1.0, rtol=1e-13)
  np.testing.assert_allclose(np.sum(G * delta), s[0], rtol=1e-13)   # = ||G||_2


@pytest.mark.parametrize("p", [1.75, 3.0])
def test_mirror_descent_formula(p):
  eta = 0.1
  q = p / (p - 1)
  dual = np.sign(W0) * np.abs(W0) ** (p - 1) - eta * G / _entry(G, q)
  new = np.sign(dual) * np.abs(dual) ** (1 / (p - 1))
  np.testing.assert_allclose(_step(f"md_l{p:g}", G, lr=eta), new - W0, rtol=1e-12, atol=1e-15)


def test_md_l2_is_a_normalized_gd_step():
  np.testing.assert_allclose(_step("md_l2", G, lr=0.1), -0.1 * G / np.linalg.norm(G), rtol=1e-13, atol=1e-16)


# ----------------------------------------------------------------------------
# Zero gradient, float32, jit + vmap, names
# ----------------------------------------------------------------------------

NAMES = ["sd_l1", "sd_linf", "sd_l3", "sd_l1.5", "sd_spectral", "sd_spectral_ns", "sd_nuc", "md_l1.75", "md_l3"]


@pytest.mark.parametrize("name", NAMES)
def test_zero_gradient_zero_step(name):
  step = _step(name, np.zeros((3, 3)))
  np.testing.assert_array_equal(step, np.zeros((3, 3)))


def test_float32_jit_vmap_and_two_leaves():
  grads = {"K": jnp.asarray(np.stack([G, 1e-20 * G, np.zeros((3, 3))]), jnp.float32),
           "Q": jnp.asarray(np.stack([G.T, G, G]), jnp.float32)}
  params = {k: jnp.asarray(np.stack([W0] * 3), jnp.float32) for k in grads}
  for name in NAMES:
    opt = optimizers.get_optimizer(name, 0.1)
    run = jax.jit(jax.vmap(lambda g, p: opt.update(g, opt.init(p), p)[0]))
    out = run(grads, params)
    for k in ("K", "Q"):
      assert out[k].dtype == jnp.float32, (name, k)
      assert np.all(np.isfinite(np.asarray(out[k]))), (name, k)
    # leaf by leaf, row by row: the float64 step of that leaf alone, up to float32 rounding
    # (1e-20 G steps like G: every step is homogeneous of degree 0 in G)
    if name != "sd_spectral_ns":
      for k, b, g in [("K", 0, G), ("K", 1, G), ("Q", 0, G.T), ("Q", 1, G)]:
        np.testing.assert_allclose(np.asarray(out[k][b]), _step(name, g, lr=0.1), atol=2e-6, err_msg=name)
    np.testing.assert_array_equal(np.asarray(out["K"][2]), 0)


def test_names():
  for name in NAMES + ["sd_l2", "md_l2", "adam", "muon", "polyak", "normalized_gd", "ngd", "gd", "sgd", "sd_l1.0"]:
    assert isinstance(optimizers.get_optimizer(name, 0.1), optax.GradientTransformation), name
  assert optimizers.needs_value("polyak") and not optimizers.needs_value("sd_linf")
  for bad in ["sd_l0.5", "sd_lx", "sd_l", "md_l1", "md_linf", "md_lnan", "sd_frob", "md_"]:
    with pytest.raises(ValueError, match="unknown optimizer"):
      optimizers.get_optimizer(bad, 0.1)
  with pytest.raises(ValueError):
    mirror.lp_mirror_descent(0.1, 1.0)


def test_muon_and_polyak_steps():
  params = {"W": jnp.asarray(W0)}
  opt = optimizers.get_optimizer("muon", 0.1)
  updates, _ = opt.update({"W": jnp.asarray(G)}, opt.init(params), params)
  assert np.all(np.isfinite(np.asarray(updates["W"])))
  # Polyak: -min(f / ||g||^2, lr) g, ||g|| over all leaves together
  grads = {"K": jnp.asarray(G), "Q": jnp.asarray(2 * G)}
  params = {"K": jnp.asarray(W0), "Q": jnp.asarray(W0)}
  sq = 5 * np.sum(G * G)
  opt = optimizers.get_optimizer("polyak", 0.5)
  updates, _ = opt.update(grads, opt.init(params), params, value=jnp.asarray(3.0))
  np.testing.assert_allclose(np.asarray(updates["Q"]), -3.0 / sq * 2 * G, rtol=1e-14)    # 3 / sq < 0.5
  updates, _ = opt.update(grads, opt.init(params), params, value=jnp.asarray(1e6))
  np.testing.assert_allclose(np.asarray(updates["Q"]), -0.5 * 2 * G, rtol=1e-14)         # capped at lr
  tiny = {k: 1e-200 * g for k, g in grads.items()}   # no freeze, no underflow of ||g||^2
  opt = steepest.polyak(max_learning_rate=np.inf, scaling=0.5)
  updates, _ = opt.update(tiny, opt.init(params), params, value=jnp.asarray(3e-200))
  np.testing.assert_allclose(np.asarray(updates["K"]), -0.5 * 3.0 / sq * G, rtol=1e-13)
  zero = {k: jnp.zeros((3, 3)) for k in grads}
  updates, _ = opt.update(zero, opt.init(params), params, value=jnp.asarray(3.0))
  np.testing.assert_array_equal(np.asarray(updates["K"]), 0)


# ----------------------------------------------------------------------------
# End to end: train 2 tiny data sets
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("name, param", [("sd_linf", "W"), pytest.param("md_l3", "W", marks=pytest.mark.slow),
                                         ("sd_spectral", "W"), pytest.param("sd_spectral", "KQ", marks=pytest.mark.slow),
                                         pytest.param("polyak", "W", marks=pytest.mark.slow)])   # (siblings: slow)
def test_train_end_to_end(batch, keys, name, param):
  data = data_lib.Dataset(*(np.asarray(a)[:2] for a in batch))
  cfg = train_lib.TrainConfig(param=param, optimizer=name, lr=0.1, steps=30, snapshot_every=10,
                              chunk_steps=30, block_size=2)
  tr = train_lib.train(cfg, data, keys[:2])
  assert np.all(tr.finite), name
  assert np.all(tr.loss[:, -1] < tr.loss[:, 0]), (name, tr.loss)


def test_steps_with_an_svd_are_marked_for_one_cpu_device():
  """sd_spectral and sd_nuc call LAPACK's SVD, which deadlocked XLA:CPU on two devices; the
  training loop runs exactly these on one CPU device (Newton-Schulz and Muon are matmuls)."""
  assert optimizers.uses_decompositions("sd_spectral") and optimizers.uses_decompositions("sd_nuc")
  for name in ("sd_spectral_ns", "muon", "sd_linf", "md_l3", "normalized_gd", "adam"):
    assert not optimizers.uses_decompositions(name)
