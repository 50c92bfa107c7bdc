"""Training health per run (svmattn.analysis.health): stalled, unsaturated and diverged runs are
labelled, recorded with their step, and counted apart from the convergence types."""
import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import SEED, SPEC
from svmattn.analysis import health
from svmattn.analysis import metrics
from svmattn.data import datasets as data_lib
from svmattn.models import flax_models
from svmattn.execution import stages
from svmattn.studies import local_convergence
from svmattn.train import loop as train_lib


def test_stalled_step_finds_the_first_frozen_snapshot():
  steps = np.arange(6) * 10
  W = np.cumsum(np.ones((4, 6, 2, 2)), axis=1)
  loss = -np.cumsum(np.ones((4, 6)), axis=1)
  W[1, 3:] = W[1, 3]                      # run 1 frozen from snapshot 3 (step 30)
  loss[1, 3:] = loss[1, 3]
  W[2, 2:] = W[2, 2]                      # run 2: W frozen but the loss still moves: not stalled
  W[3, 4:] = np.nan                       # run 3 diverged: NaN never counts as equal
  loss[3, 4:] = np.nan
  np.testing.assert_array_equal(health.stalled_step(W, loss, steps), [-1, 30, -1, -1])
  W[0] = W[0, 0]                          # frozen from the start
  loss[0] = loss[0, 0]
  assert health.stalled_step(W, loss, steps)[0] == 0


def test_labels_precedence_and_threshold():
  finite = np.array([True, False, True, True, True])
  stalled = np.array([-1, 20, 40, -1, -1])
  max_prob = np.array([0.99, 0.5, 0.5, 0.5, 0.9])
  assert list(health.labels(finite, stalled, max_prob)) == ["ok", "diverged", "stalled", "unsaturated", "ok"]
  assert list(health.labels(finite, stalled, max_prob, threshold=0.0)) == ["ok", "diverged", "stalled", "ok", "ok"]
  for bad in (np.nan, -0.1, 1.5):
    with pytest.raises(ValueError, match="saturation threshold"):
      health.labels(finite, stalled, max_prob, bad)
  assert health.counts(["ok", "stalled", "ok"]) == {"ok": 2, "diverged": 0, "stalled": 1, "unsaturated": 0}


def test_unhealthy_runs_are_their_own_convergence_type():
  gamma = np.array([[1.0, 0.0], [0.0, 1.0]])
  for label in health.UNHEALTHY:
    assert metrics.convergence_type(gamma, np.array([0, 1]), None, label) == label
    assert label in metrics.CONVERGENCE_TYPES
  assert metrics.convergence_type(gamma, np.array([0, 1]), None) == "global"


def test_updates_below_the_rounding_of_w_are_stalled_from_step_0(batch):
  """Plain GD with lr 1e-30: every update is ~1e-31, below half an ulp of W's entries (~1e-1 *
  1e-16), so W and the loss never change: stalled from the first snapshot."""
  cfg = train_lib.TrainConfig(param="W", optimizer="gd", lr=1e-30, steps=30, snapshot_every=10, chunk_steps=30)
  arrays, _ = stages.Train("W", cfg).run(dict(batch._asdict()), np.arange(4), SEED, lambda k: None, None)
  np.testing.assert_array_equal(arrays["stalled_step"], 0)
  assert set(health.of_trajectory(arrays)) == {"stalled"}


def test_a_moving_run_is_not_stalled(small_run):
  assert np.all(health.stalled_step(small_run.W, small_run.loss, small_run.steps) == -1)


def test_e2_counts_unsaturated_runs_apart():
  """E2 at lr 0.01 for 300 steps: the softmax is far from saturated (mean largest probability
  ~0.4-0.6 at these sizes), so the runs are "unsaturated", not global / local / not-local."""
  fl = local_convergence.SETTINGS.validate(dict(
      n=SPEC.n, T=SPEC.T, d=SPEC.d, m=None, steps=300, lr=0.01, params=["W"], loss="logistic",
      optimizer="normalized_gd", attention="cross", query_pos=0, snapshot_every=100, chunk_steps=300,
      block_size=8, seed=SEED, runs=8, data=None))
  spec, configs = local_convergence.setup(fl)
  data = {**local_convergence.batches(spec, SEED)(np.arange(8)), "runs": np.arange(8)}
  (name, cfg), = configs
  traj, _ = stages.Train(name, cfg).run(data, np.arange(8), SEED, lambda k: None, None)
  out = local_convergence.analyze({}, data, {name: traj})
  unsat = traj["max_prob"][:, -1] < health.SATURATION
  assert unsat.any()
  np.testing.assert_array_equal(out["health_W"] == "unsaturated", unsat)
  np.testing.assert_array_equal(out["convergence_type_W"][unsat], "unsaturated")
  assert not np.isin(out["convergence_type_W"][~unsat], health.UNHEALTHY).any()
  _, summary = local_convergence.reduce(fl, out)
  assert summary["health"]["W"]["unsaturated"] == int(unsat.sum())
  assert summary["convergence_types"]["W"]["unsaturated"] == pytest.approx(unsat.mean())


class LearnedTemperature(nn.Module):
  """s = softmax(exp(tau) X W z) with a learned log-temperature tau (started at 0), pooled the
  stable way (flax_models.attend), as the README's flax example."""

  @nn.compact
  def __call__(self, X, Z, v):
    W = self.param("W", flax_models.uniform_init, (X.shape[-1],) * 2, X.dtype)
    tau = self.param("tau", lambda key, dt: jnp.zeros((), dt), X.dtype)
    r, s = flax_models.attend(jnp.exp(tau) * jnp.einsum("ntd,de,ne->nt", X, W, Z), X)
    self.sow("intermediates", "attention", s)
    self.sow("intermediates", "kq", jnp.exp(tau) * W)
    return r @ v


def test_a_learned_temperature_saturates_exactly_and_stalls(batch):
  """Normalized GD raises tau by up to lr per step: within ~100 steps every other token's
  probability underflows to exactly 0 in float64, every gradient is then exactly 0 and W stops.
  (Measured at E2's sizes, 16 data sets: stalled at steps 70-90 in every run.) The run must be
  "stalled" with that step, not reported as a result."""
  cfg = train_lib.TrainConfig(module=LearnedTemperature(), steps=400, snapshot_every=10, chunk_steps=400)
  arrays, _ = stages.Train("flax", cfg).run(dict(batch._asdict()), np.arange(4), SEED, lambda k: None, None)
  step = arrays["stalled_step"]
  assert np.all((step > 0) & (step < 400)), step
  assert set(health.of_trajectory(arrays)) == {"stalled"}
  assert np.all(arrays["max_prob"][:, -1] == 1.0)
  k = int(np.flatnonzero(arrays["steps"] == step[0])[0])        # frozen from there, moving before
  assert np.all(arrays["W"][0, k:] == arrays["W"][0, k]) and not np.all(arrays["W"][0, k - 1] == arrays["W"][0, k])
