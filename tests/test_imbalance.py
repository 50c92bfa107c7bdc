"""E19 (svmattn.studies.imbalance): Zipf labels, the per-bucket losses from the model's own loss,
the fit times and decays, and checks that are not evaluated where nothing could be measured
(docs/science.md section 24)."""
import numpy as np
import pytest

import svmattn
from svmattn.data import next_token as next_token_data
from svmattn.execution import pipeline
from svmattn.optim import optimizers
from svmattn.studies import imbalance as e19

svmattn.configure()


def test_zipf_labels_keep_their_frequencies_and_the_sequences_valid():
  pi = next_token_data.zipf(16)
  assert pi[0] / pi[15] == pytest.approx(16) and pi.sum() == pytest.approx(1)
  data = next_token_data.generate(next_token_data.TokenSpec(16, 8, 4000, 4, require_cycle=False, labels="zipf"),
                                  0, np.arange(2))
  next_token_data.validate(data)
  share = np.bincount(data.labels.ravel(), minlength=16) / data.labels.size
  # binomial standard error of each share over 8000 labels, 5 sigma
  assert np.all(np.abs(share - pi) <= 5 * np.sqrt(pi * (1 - pi) / data.labels.size))
  uniform = next_token_data.generate(next_token_data.TokenSpec(6, 8, 6, 4), 0, np.arange(2))
  again = next_token_data.generate(next_token_data.TokenSpec(6, 8, 6, 4, labels="uniform"), 0, np.arange(2))
  assert all(np.array_equal(a, b) for a, b in zip(uniform, again))        # E12's data: untouched
  with pytest.raises(ValueError, match="labels must be one of uniform, zipf"):
    next_token_data.TokenSpec(labels="pareto").validate()


def test_buckets_and_fit_times():
  assert e19.buckets(16).tolist() == [0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 4]
  steps = np.array([0, 10, 20, 30])
  loss = np.array([[1.0, 2.0, 1.0], [0.6, 1.5, 1.0], [0.5, 0.9, 1.0], [0.1, 0.8, 0.9]])
  np.testing.assert_array_equal(e19.fit_times(loss, steps), [20.0, 20.0, np.nan])
  pi = np.array([0.4, 0.1, 0.025])
  assert e19.decay(np.array([10.0, 40.0, 160.0]), pi) == pytest.approx(1.0)     # t proportional to 1/pi
  assert np.isnan(e19.decay(np.array([10.0, np.nan, 160.0]), pi))                # fewer than 3 buckets


def test_gd_momentum_is_heavy_ball():
  import jax.numpy as jnp
  opt = optimizers.get_optimizer("gd+mom0.5", 1.0)
  state = opt.init(jnp.zeros(2))
  u1, state = opt.update(jnp.array([2.0, 0.0]), state)
  u2, _ = opt.update(jnp.array([0.0, 2.0]), state)
  np.testing.assert_allclose(u1, [-1.0, 0.0])              # -(1 - beta) g
  np.testing.assert_allclose(u2, [-0.5, -1.0])             # -(beta m + (1 - beta) g)


@pytest.mark.slow   # (an end-to-end pipeline run: 10-15 s on 2 cores; the README's test command keeps the rest)
def test_a_small_run_and_its_bucket_losses(tmp_path):
  fl = e19.SETTINGS.validate({"runs": 2, "steps": 200, "snapshot_every": 20, "K": 8, "d": 8, "n": 64,
                              "optimizers": ["gd:2", "sign_gd:0.01"], "out": "unused", "progress": False})
  (cell,) = pipeline.run(e19.build(fl), str(tmp_path / "e19"), workers=0, show_progress=False).cells
  assert cell["bucket_loss_gd_lr2"].shape == (2, 11, 4) and cell["t_half_gd_lr2"].shape == (2, 4)
  # the bucket losses are the means of the model's loss over each bucket's sequences: at step 0
  # (W uniform +-1/sqrt(d)), their mean weighted by the bucket sizes is the trainer's recorded loss
  labels = cell["labels"]
  of = e19.buckets(8)[labels]
  for b in range(2):
    counts = np.bincount(of[b], minlength=4)
    weighted = np.nansum(cell["bucket_loss_gd_lr2"][b, 0] * counts) / counts.sum()
    assert weighted == pytest.approx(cell["loss_gd_lr2"][b, 0], rel=1e-12)
  arrays, summary = e19.reduce(fl, cell)
  assert list(summary["optimizers"]) == ["gd_lr2", "sign_gd_lr0.01"]
  assert summary["optimizers"]["sign_gd_lr0.01"]["optimizer"] == "sign_gd"
  names = [c["name"] for c in summary["checks"]]
  assert names == ["gd: median decay of the time to fit a bucket with 1/pi",
                   "sign_gd: median decay of the time to fit a bucket with 1/pi",
                   "rare classes: GD's decay above sign descent's"]
  for c in summary["checks"]:      # measured, or not evaluated with the reason: never a FAIL for lack of data
    assert (c["ok"] is None) == (c["value"] is None)
    assert c["ok"] is not None or "no decay to measure" in c["reason"]
