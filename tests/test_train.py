"""svmattn.train.loop: config validation, the snapshot schedule, scan/vmap training.

The small run (conftest.SMALL) trains B=4 data sets for 25 normalized GD steps
with a snapshot every 10 and chunks of 20: snapshots at steps 0, 10, 20, 25.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import RUNS, SEED, SMALL, SMALL_STEPS, SPEC, host
from svmattn.data import datasets as data_lib
from svmattn.models import heads
from svmattn.models import attention as model_lib
from svmattn.train import loop as train_lib


# ----------------------------------------------------------------------------
# Config and schedule
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    ({"param": "V"}, "unknown parameterization 'V'"),
    ({"head": "tanh"}, "unknown head 'tanh'"),
    ({"loss": "hinge"}, "unknown loss 'hinge'"),
    ({"optimizer": "nope"}, "unknown optimizer 'nope'"),
    ({"model": "decoder"}, "unknown model 'decoder'"),
    ({"init": "gauss"}, r"TrainConfig\.init must be one of"),
    ({"steps": -1}, r"TrainConfig\.steps must be a non-negative integer"),
    ({"steps": 10.5}, r"TrainConfig\.steps must be a non-negative integer"),
    ({"snapshot_every": 0}, r"TrainConfig\.snapshot_every must be a positive integer"),
    ({"chunk_steps": 0}, r"TrainConfig\.chunk_steps must be a positive integer"),
    ({"chunk_every": -1}, r"TrainConfig\.chunk_every must be a non-negative integer"),
    ({"chunk_every": 2.5}, r"TrainConfig\.chunk_every must be a non-negative integer"),
    ({"m": 0}, r"TrainConfig\.m must be positive"),
    ({"lr": 0.0}, r"TrainConfig\.lr must be a positive number"),
    ({"lr": -0.1}, r"TrainConfig\.lr must be a positive number"),
    ({"lr": float("nan")}, r"TrainConfig\.lr must be a positive number"),
    ({"lr": float("inf")}, r"TrainConfig\.lr must be a positive number"),
])
def test_train_config_validate_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    train_lib.TrainConfig(**kwargs).validate()


def test_train_config_defaults_are_the_papers():
  cfg = train_lib.TrainConfig().validate()
  assert (cfg.param, cfg.loss, cfg.optimizer, cfg.lr, cfg.steps) == ("W", "logistic", "normalized_gd", 0.1, 2000)


@pytest.mark.parametrize("steps, every, chunk", [
    (25, 10, 20), (2000, 10, 500), (7, 10, 500), (0, 10, 500), (1, 1, 1), (103, 7, 30), (50, 10, 5)])
def test_schedule(steps, every, chunk):
  plan = train_lib.schedule(steps, every, chunk)
  assert sum(e * k for e, k in plan) == steps
  assert all(e >= 1 and k >= 1 for e, k in plan)
  # the snapshot steps: every multiple of ``every`` up to steps, then steps itself
  taken = np.cumsum([e for e, k in plan for _ in range(k)]).tolist()
  expected = list(range(every, steps + 1, every))
  if steps and steps % every:
    expected.append(steps)
  assert taken == expected
  # chunks of at most max(chunk, every) steps
  assert all(e * k <= max(chunk, every) for e, k in plan)


def test_schedule_of_small():
  assert train_lib.schedule(25, 10, 20) == [(10, 2), (5, 1)]


@pytest.mark.parametrize("steps, every, chunk", [(2001, 100, 1000), (2551, 100, 1000), (103, 7, 30), (25, 10, 20)])
def test_a_replays_schedule_keeps_the_runs_chunks(steps, every, chunk):
  """A replay observes every step (snapshot_every 1) on the run's own chunks (chunk_every): the
  same chunk boundaries as the run's schedule, every step a snapshot."""
  run = train_lib.TrainConfig(steps=steps, snapshot_every=every, chunk_steps=chunk)
  replay = train_lib.TrainConfig(steps=steps, snapshot_every=1, chunk_steps=chunk, chunk_every=every).validate()
  ends = lambda plan: np.cumsum([e * k for e, k in plan]).tolist()  # noqa: E731
  plan = train_lib.config_schedule(replay, steps)
  assert ends(plan) == ends(train_lib.config_schedule(run, steps)) and all(e == 1 for e, _ in plan)
  np.testing.assert_array_equal(train_lib.config_snapshot_steps(replay), np.arange(steps + 1))
  with pytest.raises(ValueError, match="snapshot_every 3 does not divide"):
    train_lib.config_schedule(train_lib.TrainConfig(steps=20, snapshot_every=3, chunk_steps=10, chunk_every=10), 20)


# ----------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------

_OBJECTIVE = model_lib.make_loss(model_lib.W_PARAM, heads.LINEAR, "logistic")


@jax.jit
def _manual_step(W, data):
  """W <- W - 0.1 grad / ||grad||_F for one data set, written out by hand."""
  g = jax.grad(lambda W: _OBJECTIVE({"W": W}, data))(W)
  return W - 0.1 * g / jnp.linalg.norm(g)


def test_snapshots_at_the_right_steps(batch, keys, small_run):
  tr = small_run
  B, S = len(RUNS), len(SMALL_STEPS)
  np.testing.assert_array_equal(tr.steps, SMALL_STEPS)
  assert tr.W.shape == (B, S, SPEC.d, SPEC.d)
  assert tr.max_prob.shape == (B, S) and tr.loss.shape == (B, S)
  assert tr.attention.shape == (B, SPEC.n, SPEC.T)
  np.testing.assert_array_equal(tr.W_final, tr.W[:, -1])
  np.testing.assert_array_equal(tr.W_final, np.asarray(tr.params["W"]))
  np.testing.assert_array_equal(tr.selected, np.argmax(tr.attention, -1))
  # replay run 2 step by step: the snapshot k is W after exactly steps[k] steps
  b = 2
  one = data_lib.Dataset(*(jnp.asarray(a[b]) for a in host(batch)))
  W = model_lib.W_PARAM.init(keys[b], SPEC.d, SPEC.d, jnp.float64)["W"]
  for step in range(SMALL_STEPS[-1] + 1):
    if step in SMALL_STEPS:
      k = SMALL_STEPS.index(step)
      np.testing.assert_allclose(tr.W[b, k], W, rtol=1e-11, atol=1e-13, err_msg=f"step {step}")
      s = np.asarray(model_lib.attention(W, one.X, one.Z))
      np.testing.assert_allclose(tr.max_prob[b, k], s.max(-1).mean(), rtol=1e-11)
      np.testing.assert_allclose(tr.loss[b, k], _OBJECTIVE({"W": W}, one), rtol=1e-11)
    W = _manual_step(W, one)
  np.testing.assert_allclose(tr.attention[b], model_lib.attention(tr.W_final[b], one.X, one.Z), rtol=1e-11)
  # normalized GD moves W by lr per step: ||W(10) - W(0)|| <= 10 * 0.1
  assert np.linalg.norm(tr.W[b, 1] - tr.W[b, 0]) <= 1.0 + 1e-12
  assert np.all(tr.loss[:, -1] < tr.loss[:, 0])


def test_vmap_matches_training_each_data_set_alone(batch, keys, small_run):
  for b in range(len(RUNS)):
    alone = train_lib.train(SMALL, data_lib.take(batch, slice(b, b + 1)), keys[b:b + 1])
    np.testing.assert_array_equal(alone.steps, small_run.steps)
    np.testing.assert_allclose(alone.W[0], small_run.W[b], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(alone.loss[0], small_run.loss[b], rtol=1e-12)
    np.testing.assert_allclose(alone.attention[0], small_run.attention[b], rtol=1e-12, atol=1e-15)


def test_init_keys_do_not_depend_on_the_batch(keys):
  np.testing.assert_array_equal(np.asarray(train_lib.init_keys(SEED, [3, 1])), np.asarray(keys)[[3, 1]])
  np.testing.assert_array_equal(np.asarray(train_lib.init_keys(SEED, [2])[0]),
                                np.asarray(jax.random.split(data_lib.run_key(SEED, 2))[1]))


@pytest.mark.slow   # (CI runs it with the slow tests: the test command stays under 5 minutes)
def test_float32_stays_float32(batch32, keys):
  tr = train_lib.train(SMALL, batch32, keys)
  for name in ("W", "max_prob", "loss", "attention"):
    assert getattr(tr, name).dtype == np.float32, name
  assert np.asarray(tr.params["W"]).dtype == np.float32
  assert np.all(tr.finite)
  assert np.all(tr.loss[:, -1] < tr.loss[:, 0])


def test_nan_runs_are_flagged_not_raised(batch, keys, small_run):
  X = np.array(batch.X)
  X[1, 0, 2, 3] = np.nan
  bad = host(batch)._replace(X=X)
  tr = train_lib.train(SMALL, bad, keys)
  np.testing.assert_array_equal(tr.finite, [True, False, True, True])
  assert np.all(small_run.finite)
  # the other runs are untouched by their neighbour's NaN
  for b in (0, 2, 3):
    np.testing.assert_array_equal(tr.W[b], small_run.W[b])


def test_finite_flags_inf_in_W_or_loss(small_run):
  W = small_run.W.copy()
  W[0, -1, 0, 0] = np.inf
  loss = small_run.loss.copy()
  loss[3, -1] = np.nan
  np.testing.assert_array_equal(small_run._replace(W=W, loss=loss).finite, [False, True, True, False])


def test_progress_callback_and_key_check(batch, keys):
  done = []
  train_lib.train(SMALL, batch, keys, progress=done.append)
  assert sum(done) == SMALL.steps and len(done) == len(train_lib.schedule(25, 10, 20))
  with pytest.raises(ValueError, match="train: 3 keys for 4 data sets"):
    train_lib.train(SMALL, batch, keys[:3])


def test_kq_snapshots_are_K_Q_transpose(converged):
  tr = converged["KQ"]
  K, Q = np.asarray(tr.params["K"]), np.asarray(tr.params["Q"])
  np.testing.assert_allclose(tr.W_final, K @ np.swapaxes(Q, 1, 2), rtol=1e-13, atol=1e-13)
  assert K.shape == (len(RUNS), SPEC.d, SPEC.d)


@pytest.mark.parametrize("optimizer, leaves", [("normalized_gd", 0), ("gd", 0), ("adam", 3)])
def test_the_optimizer_start_compiles_nothing_for_a_stateless_optimizer(optimizer, leaves):
  """``loop._compiled_opt_init``: normalized GD's and GD's state has no arrays, so its start is the
  abstract value and no program is compiled; Adam's (first and second moments, count) is compiled
  and computed as before (zeros)."""
  from svmattn import xla_cache
  xla_cache.count_compiles()
  config = train_lib.TrainConfig(param="W", optimizer=optimizer, lr=0.1, steps=10)
  trainer = train_lib.make_trainer(config)
  params = {"W": np.zeros((3, 4, 4))}
  before = xla_cache.compile_stats()["xla_programs_compiled"]
  state = train_lib._compiled_opt_init(trainer)(params)
  compiled = xla_cache.compile_stats()["xla_programs_compiled"] - before
  assert len(jax.tree_util.tree_leaves(state)) == leaves
  assert jax.tree_util.tree_structure(state) == jax.tree_util.tree_structure(
      jax.vmap(trainer.optimizer.init)(params))
  assert (compiled == 0) == (leaves == 0), compiled
  for leaf in jax.tree_util.tree_leaves(state):
    assert not np.any(np.asarray(leaf))
