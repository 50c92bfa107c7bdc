"""Test sets (issue 66): --test_n draws test sequences from the generator's own test key, so training
is unchanged bit for bit; a --data file's X_test, Y_test, Z_test are checked on load and scored."""
import numpy as np
import pytest

import svmattn
from svmattn.data import datasets as data_lib
from svmattn.execution import pipeline
from svmattn.studies import local_convergence as e2

svmattn.configure()

SMALL = {"runs": 3, "steps": 60, "n": 5, "T": 4, "d": 4, "out": "unused", "progress": False, "norms": ["fro"],
         "snapshot_every": 20}


def _run(tmp_path, name, **over):
  fl = e2.SETTINGS.validate({**SMALL, **over})
  return pipeline.run(e2.build(fl), str(tmp_path / name), workers=0, show_progress=False).cells[0]


def test_a_test_set_leaves_training_bit_for_bit_unchanged(tmp_path):
  plain, tested = _run(tmp_path, "plain"), _run(tmp_path, "tested", test_n=40)
  for k, a in plain.items():
    assert np.array_equal(a, tested[k], equal_nan=a.dtype.kind == "f"), k
  for p in ("W", "KQ"):
    assert tested[f"test_acc_{p}"].shape == (3, 4) and tested[f"test_pred_{p}"].shape == (3, 40)
    assert np.all((tested[f"test_acc_{p}"] >= 0) & (tested[f"test_acc_{p}"] <= 1))
  first = data_lib.generate_test_host(data_lib.DataSpec(5, 4, 4), 0, [1], 40)
  again = data_lib.generate_test_host(data_lib.DataSpec(5, 4, 4), 0, [0, 1, 2], 40)
  assert np.array_equal(first["X_test"][0], again["X_test"][1])           # a run's test set is its own
  train = data_lib.generate_host(data_lib.DataSpec(40, 4, 4), 0, [1])
  assert not np.array_equal(train.X[0], first["X_test"][0])               # and not its training draw


def test_a_test_set_equal_to_the_training_set_scores_the_same(tmp_path):
  data = data_lib.generate_host(data_lib.DataSpec(5, 4, 4), 7, [0, 1, 2])
  path = tmp_path / "same.npz"
  np.savez(path, X=data.X, Y=data.Y, Z=data.Z, v=data.v, X_test=data.X, Y_test=data.Y, Z_test=data.Z)
  got = _run(tmp_path, "file", data=str(path))
  for p in ("W", "KQ"):
    assert np.array_equal(got[f"train_acc_{p}"], got[f"test_acc_{p}"])
    assert np.array_equal(got[f"svm_fro_{p}_train_acc"], got[f"svm_fro_{p}_test_acc"], equal_nan=True)
    np.testing.assert_allclose(got[f"test_loss_{p}"], got[f"loss_{p}"], rtol=1e-10)   # the same loss


@pytest.mark.parametrize("change, match", [
    ({"X_test": np.ones((3, 6, 4, 5))}, r"X_test must have shape \(3, 6, 4, 4\)"),
    ({"Y_test": np.zeros((3, 6))}, "test labels Y_test must be -1 or \\+1"),
    ({"Z_test": None}, "needs X_test, Y_test and Z_test"),
    ({"X_test": np.full((3, 6, 4, 4), np.nan)}, "X_test must hold finite real numbers"),
])
def test_bad_test_arrays_are_named(tmp_path, change, match):
  data = data_lib.generate_host(data_lib.DataSpec(5, 4, 4), 7, [0, 1, 2])
  arrays = {"X": data.X, "Y": data.Y, "Z": data.Z, "v": data.v, "X_test": np.ones((3, 6, 4, 4)),
            "Y_test": np.ones((3, 6)), "Z_test": np.ones((3, 6, 4)), **change}
  path = tmp_path / "bad.npz"
  np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
  with pytest.raises(data_lib.DataError, match=match):
    data_lib.load_test_npz(path, data_lib.load_npz(path))


def test_test_n_with_a_data_file_without_a_test_set_is_refused(tmp_path):
  data = data_lib.generate_host(data_lib.DataSpec(5, 4, 4), 7, [0, 1])
  path = tmp_path / "plain.npz"
  data_lib.save_npz(path, data)
  with pytest.raises(ValueError, match="has none"):
    e2.build(e2.SETTINGS.validate({**SMALL, "data": str(path), "test_n": 10}))
