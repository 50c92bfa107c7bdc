"""Momentum (+mom / +nesterov), Signum, sign_gd and step-size schedules (@sqrt, @inv) of
svmattn.optim.optimizers (module docstring; docs/science.md section 15)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from svmattn.config import allowed
from svmattn.data import datasets as data_lib
from svmattn.io import checkpoint as ckpt_lib
from svmattn.optim import optimizers
from svmattn.train import loop as train_lib

SPEC = data_lib.DataSpec(n=3, T=4, d=4)
RUNS = np.arange(2)

NEW_NAMES = ["normalized_gd+mom0.9", "normalized_gd+nesterov0.9", "sd_l1+mom0.9", "sd_linf+nesterov0.9",
             "sd_l3+mom0.5", "sd_spectral+mom0.95", "sd_spectral_ns+nesterov0.9", "sd_nuc+mom0.9",
             "signum0.9", "sign_gd", "normalized_gd@sqrt", "gd@inv", "adam@sqrt",
             "sd_linf+nesterov0.9@sqrt", "signum0.9@inv"]

G1 = np.array([[1.0, -2.0], [3.0, -4.0]])
G2 = np.array([[-5.0, 1.0], [-1.0, 2.0]])
LR = 0.1


@pytest.fixture(scope="module")
def tiny():
  return data_lib.generate(SPEC, 0, RUNS), train_lib.init_keys(0, RUNS)


def _config(name, param, steps=30, **kw):
  return train_lib.TrainConfig(param=param, optimizer=name, lr=LR, steps=steps, snapshot_every=10,
                               chunk_steps=kw.pop("chunk_steps", steps), **kw)


def _updates(name, grads):
  """The updates of get_optimizer(name, LR) for the gradients ``grads`` (on a 2x2 leaf W)."""
  opt = optimizers.get_optimizer(name, LR)
  params = {"W": jnp.zeros((2, 2))}
  state = opt.init(params)
  out = []
  for g in grads:
    u, state = opt.update({"W": jnp.asarray(g)}, state, params)
    out.append(np.asarray(u["W"]))
  return out


# (a) every new name trains

FAST_NAMES = ("sd_linf+nesterov0.9@sqrt",)   # the rest with the slow tests


@pytest.mark.parametrize("param", ["W", pytest.param("KQ", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", [n if n in FAST_NAMES else pytest.param(n, marks=pytest.mark.slow) for n in NEW_NAMES])
def test_new_names_train(tiny, name, param):
  data, keys = tiny
  traj = train_lib.train(_config(name, param), data, keys)
  assert list(traj.steps) == [0, 10, 20, 30]
  assert np.all(np.isfinite(traj.loss)) and np.all(np.isfinite(traj.W))
  assert not np.array_equal(traj.W[:, 0], traj.W[:, -1])   # it moved
  assert allowed.optimizer(name) is None


# (b) hand-checked updates

def test_heavy_ball_normalized_gd_by_hand():
  m1 = 0.1 * G1
  m2 = 0.9 * m1 + 0.1 * G2
  want = [-LR * m1 / np.linalg.norm(m1), -LR * m2 / np.linalg.norm(m2)]
  got = _updates("normalized_gd+mom0.9", [G1, G2])
  np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-16)
  # not normalized GD of the gradient itself at step 2
  assert not np.allclose(got[1], -LR * G2 / np.linalg.norm(G2))


def test_nesterov_by_hand():
  # M_t = beta M_{t-1} + g_t, direction of g_t + beta M_t (= of (1-beta) g_t + beta m_t, m the EMA)
  M1 = G1
  M2 = 0.9 * M1 + G2
  u1, u2 = G1 + 0.9 * M1, G2 + 0.9 * M2
  want = [-LR * u1 / np.linalg.norm(u1), -LR * u2 / np.linalg.norm(u2)]
  got = _updates("normalized_gd+nesterov0.9", [G1, G2])
  np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-16)
  ema2 = 0.9 * (0.1 * G1) + 0.1 * G2
  lerp = 0.1 * G2 + 0.9 * ema2
  np.testing.assert_allclose(got[1], -LR * lerp / np.linalg.norm(lerp), rtol=1e-13)
  # sign version
  got = _updates("sd_linf+nesterov0.9", [G1, G2])
  np.testing.assert_array_equal(got[1], -LR * np.sign(u2))


def test_signum_is_sign_of_the_ema():
  m1 = 0.1 * G1
  m2 = 0.9 * m1 + 0.1 * G2                       # [[-0.41, -0.08], [0.17, -0.16]]
  got = _updates("signum0.9", [G1, G2])
  np.testing.assert_array_equal(got[0], -LR * np.sign(G1))
  np.testing.assert_array_equal(got[1], -LR * np.sign(m2))
  assert not np.array_equal(np.sign(m2), np.sign(G2))   # the momentum matters here
  # signum<beta> is sd_linf+mom<beta> bit for bit; sign_gd is sd_linf
  for a, b in zip(got, _updates("sd_linf+mom0.9", [G1, G2])):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(_updates("sign_gd", [G1, G2]), _updates("sd_linf", [G1, G2])):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(_updates("sign_gd", [G2])[0], -LR * np.sign(G2))


@pytest.mark.parametrize("suffix, factor", [("sqrt", lambda t: 1 / np.sqrt(t + 1)), ("inv", lambda t: 1 / (t + 1))])
def test_schedules_by_hand(suffix, factor):
  grads = [G1, G1, G1]
  for t, u in enumerate(_updates(f"normalized_gd@{suffix}", grads)):
    np.testing.assert_allclose(u, -LR * factor(t) * G1 / np.linalg.norm(G1), rtol=1e-13)
  for t, u in enumerate(_updates(f"gd@{suffix}", grads)):
    np.testing.assert_allclose(u, -LR * factor(t) * G1, rtol=1e-13)
  for t, u in enumerate(_updates(f"sd_linf@{suffix}", grads)):
    np.testing.assert_allclose(u, -LR * factor(t) * np.sign(G1), rtol=1e-13)
  adam = _updates("adam", grads)
  for t, u in enumerate(_updates(f"adam@{suffix}", grads)):
    np.testing.assert_allclose(u, factor(t) * adam[t], rtol=1e-12)
  # with momentum: the EMA's direction times the scheduled step
  m = np.zeros((2, 2))
  for t, (g, u) in enumerate(zip([G1, G2, G1], _updates(f"normalized_gd+mom0.9@{suffix}", [G1, G2, G1]))):
    m = 0.9 * m + 0.1 * g
    np.testing.assert_allclose(u, -LR * factor(t) * m / np.linalg.norm(m), rtol=1e-13)
  # @const is the unscheduled optimizer
  for a, b in zip(_updates("normalized_gd@const", grads), _updates("normalized_gd", grads)):
    np.testing.assert_array_equal(a, b)


# (c) existing names unchanged

OLD_NAMES = ["normalized_gd", "ngd", "gd", "sd_l1", "sd_linf", "sd_l2", "sd_l3", "sd_l1.5", "sd_spectral",
             "sd_spectral_ns", "sd_nuc", "md_l1.75", "md_l3", "muon", "polyak", "adam", "sgd", "lion"]


def test_existing_names_never_reach_the_new_parser(monkeypatch):
  def boom(*args):
    raise AssertionError("new parser used")
  monkeypatch.setattr(optimizers, "_new_optimizer", boom)
  for name in OLD_NAMES:
    optimizers.get_optimizer(name, LR)
  optimizers.get_optimizer("normalized_gd", LR, "authors")


@pytest.mark.parametrize("old, new", [("normalized_gd", "normalized_gd@const"), ("sd_linf", "sign_gd"),
                                      ("adam", "adam@const")])
@pytest.mark.slow
def test_existing_trajectories_unchanged(tiny, old, new):
  data, keys = tiny
  a = train_lib.train(_config(old, "W"), data, keys)
  b = train_lib.train(_config(new, "W"), data, keys)
  for field in ("W", "loss", "max_prob"):
    np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


def test_uses_decompositions():
  for name in ("sd_spectral+mom0.9", "sd_nuc+nesterov0.5@sqrt", "sd_spectral@inv"):
    assert optimizers.uses_decompositions(name)
  for name in ("sd_spectral_ns+mom0.9", "signum0.9", "adam@sqrt", "gd"):
    assert not optimizers.uses_decompositions(name)
  assert not optimizers.needs_value("sd_linf+mom0.9")


# (d) resume is exact (the schedule's step count and the momentum live in the checkpointed state)

class Interrupt(Exception):
  pass


def test_resume_is_exact(tiny, tmp_path):
  data, keys = tiny
  config = _config("sd_linf+nesterov0.9@sqrt", "W", steps=40, chunk_steps=20)
  reference = train_lib.train(config, data, keys)

  def stop(steps):
    raise Interrupt

  meta = {"optimizer": config.optimizer}
  with pytest.raises(Interrupt):
    train_lib.train(config, data, keys, progress=stop, checkpoints=ckpt_lib.Checkpoints(tmp_path, meta))
  assert ckpt_lib.Checkpoints(tmp_path, meta).steps() == [1]
  calls = []
  resumed = train_lib.train(config, data, keys, progress=calls.append,
                            checkpoints=ckpt_lib.Checkpoints(tmp_path, meta))
  assert calls == [20, 20]
  for field in ("steps", "W", "loss", "max_prob", "attention"):
    np.testing.assert_array_equal(getattr(resumed, field), getattr(reference, field))
  for a, b in zip(jax.tree_util.tree_leaves(resumed.params), jax.tree_util.tree_leaves(reference.params)):
    np.testing.assert_array_equal(a, b)


# (e) bad names

@pytest.mark.parametrize("name", ["sd_linf+mom", "gd@foo", "signum2", "signum", "sd_linf+mom1", "normalized_gd+mom-0.1",
                                  "polyak+mom0.9", "adam+nesterov0.9", "sd_l0.5+mom0.9", "md_l3@sqrt", "polyak@inv",
                                  "nosuch@sqrt", "gd@sqrt@inv", "@sqrt", "sd_linf+momentum0.9", "sd_linf+mom0.9+mom0.9"])
def test_bad_names_raise(name):
  with pytest.raises(ValueError, match="unknown optimizer"):
    optimizers.get_optimizer(name, LR)
  message = allowed.optimizer(name)
  assert message and "\n" not in message
