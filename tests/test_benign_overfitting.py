"""E17 (svmattn.studies.benign_overfitting): the label-noise generator, predictions and accuracy, and
the study end to end at a small size (docs/science.md section 21)."""
import math

import numpy as np
import pytest

import svmattn
from svmattn.analysis import predictions
from svmattn.data import label_noise
from svmattn.execution import pipeline
from svmattn.studies import benign_overfitting as e17

svmattn.configure()


def test_the_generator_plants_the_signal_and_flips_ceil_eta_n_labels():
  a = label_noise.train(3, [0, 1, 2], n=10, T=5, d=6, signal=50.0, rho=0.1, eta=0.25)
  assert a["X"].shape == (3, 10, 5, 6) and np.all(a["flipped"].sum(axis=1) == math.ceil(2.5))
  assert np.array_equal(a["Y"], np.where(a["flipped"], -a["Y_clean"], a["Y_clean"]))
  plus = a["Y_clean"] > 0
  # token 0 carries s e_1 (class +1) or s e_2 (class -1): at s = 50 it dominates the N(0, 1) noise
  assert np.all(a["X"][..., 0, 0][plus] > 25) and np.all(a["X"][..., 0, 1][~plus] > 25)
  assert np.all(np.abs(a["X"][..., 3:, :2]) < 25)              # noise tokens carry no signal
  np.testing.assert_allclose(a["v"][0], label_noise.head(6, 50.0))
  assert np.all(a["relevant_tokens"] == label_noise.RELEVANT)
  one = label_noise.train(3, [2], n=10, T=5, d=6, signal=50.0, rho=0.1, eta=0.25)
  assert np.array_equal(one["X"][0], a["X"][2]) and np.array_equal(one["Y"][0], a["Y"][2])   # a run alone


def test_the_test_set_has_a_key_of_its_own():
  """The test set depends on the run and its size only; the training draw not at all on it."""
  Xa, ya = label_noise.test(0, 4, 30, 5, 6, 10.0, 0.1)
  Xb, yb = label_noise.test(0, 4, 30, 5, 6, 10.0, 0.1)
  assert np.array_equal(Xa, Xb) and np.array_equal(ya, yb)
  train = label_noise.train(0, [4], 30, 5, 6, 10.0, 0.1, 0.0)
  assert not np.array_equal(train["X"][0], Xa)


def test_predictions_of_the_prompt_model():
  rng = np.random.default_rng(0)
  X, v = rng.normal(size=(7, 4, 3)), rng.normal(size=3)
  f, s = predictions.prompt(np.zeros((1, 3)), v, X)
  np.testing.assert_allclose(f[0], (X @ v).mean(axis=1), rtol=1e-13)     # p = 0: uniform attention
  p = rng.normal(size=3)
  big, _ = predictions.prompt(1e6 * p[None], v, X)
  hard, token = predictions.hard_attention(p, v, X)
  np.testing.assert_allclose(big[0], hard, rtol=1e-9)                    # the large-norm limit
  assert np.array_equal(token, np.argmax(X @ p, axis=1))
  y = np.sign(hard)
  assert predictions.accuracy(hard, y) == 1.0 and predictions.accuracy(hard, -y) == 0.0
  np.testing.assert_allclose(predictions.logistic_loss(np.array([0.0, 1000.0]), np.array([1.0, -1.0])),
                             (math.log(2) + 1000.0) / 2)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
  fl = e17.SETTINGS.validate({"runs": 2, "d": 20, "T": 5, "test_n": 50, "steps": 200, "snapshot_every": 50,
                              "signal_norms": [0.5, 40.0], "n_values": [8], "out": "unused",
                              "progress": False, "svm_workers": 0})
  study = e17.build(fl)
  output = pipeline.run(study, str(tmp_path_factory.mktemp("e17")), workers=0, show_progress=False)
  return fl, output.cells


def test_the_study_scores_every_snapshot(small):
  fl, cells = small
  for a in cells:
    assert a["train_acc"].shape == (2, 5) and a["test_acc"].shape == (2, 5)
    assert np.all((0 <= a["test_acc"]) & (a["test_acc"] <= 1))
    # step 0 (p = 0, uniform attention): train accuracy is that of the mean token under the head
    data = label_noise.train(fl.seed, a["runs"], 8, fl.T, fl.d, 0.5 if a is cells[0] else 40.0, fl.rho, fl.eta)
    f0 = (data["X"] @ data["v"][0]).mean(axis=2)
    np.testing.assert_allclose(a["train_acc"][:, 0], predictions.accuracy(f0, data["Y"]))
    assert np.all(a["flips"] == math.ceil(0.2 * 8))
  arrays, summary = e17.reduce(fl, cells)
  assert [r["signal"] for r in summary["cells"]] == [0.5, 40.0]
  assert all(0 <= r["test_acc"] <= 1 for r in summary["cells"])
  assert "test_acc_s40_n8" in arrays and summary["checks"]


def test_the_threshold_is_interpolated_on_the_grid():
  assert e17.threshold([1, 2, 4], [0.5, 0.8, 1.0]) == pytest.approx(2 + 0.1 / 0.2 * 2)
  assert e17.threshold([1, 2], [0.95, 1.0]) is None and e17.threshold([1, 2], [0.5, 0.6]) is None
  assert e17.exponent({"10": 20.0, "40": 10.0}) == pytest.approx(-0.5)
  assert e17.exponent({"10": 20.0, "40": None}) is None


def test_another_codes_data_sets_through_data_give_the_generated_run(small, tmp_path):
  """The generator's own data sets written in the --data format (with their test sets, clean labels,
  flips and relevant tokens) train and score bit for bit as the generated run's cell."""
  fl, cells = small
  a = label_noise.train(fl.seed, [0, 1], 8, fl.T, fl.d, 40.0, fl.rho, fl.eta)
  tests = [label_noise.test(fl.seed, r, fl.test_n, fl.T, fl.d, 40.0, fl.rho) for r in (0, 1)]
  path = tmp_path / "other_code.npz"
  np.savez(path, X=a["X"], Y=a["Y"], Z=a["Z"], v=a["v"], Y_clean=a["Y_clean"], flipped=a["flipped"],
           relevant_tokens=a["relevant_tokens"], X_test=np.stack([t[0] for t in tests]),
           Y_test=np.stack([t[1] for t in tests]), Z_test=np.zeros((2, fl.test_n, fl.d)))
  mine = e17.SETTINGS.validate({**dict(fl), "data": str(path), "init": "zero"})
  got = pipeline.run(e17.build(mine), str(tmp_path / "run"), workers=0, show_progress=False).cells
  assert len(got) == 1
  for k, v in cells[1].items():
    assert np.array_equal(v, got[0][k], equal_nan=v.dtype.kind == "f"), k
  _, summary = e17.reduce(mine, got)
  assert summary["checks"] == [] and summary["cells"][0]["n"] == 8


def test_a_data_file_without_a_test_set_is_refused(tmp_path):
  from svmattn.data import datasets as data_lib
  a = label_noise.train(0, [0], 4, 5, 6, 10.0, 0.1, 0.25)
  path = tmp_path / "no_test.npz"
  np.savez(path, X=a["X"], Y=a["Y"], Z=a["Z"], v=a["v"])
  with pytest.raises(data_lib.DataError, match="needs X_test, Y_test and Z_test"):
    e17.build(e17.SETTINGS.validate({"data": str(path), "T": 5, "d": 6, "out": "x"}))
