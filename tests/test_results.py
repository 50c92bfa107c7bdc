"""svmattn.io.atomic_files: atomic writes (no temporary files left, old files intact on failure)."""
import json
import os
import stat

import numpy as np
import pytest

from svmattn.io import atomic_files as results_io


def test_write_npz_round_trip_and_no_temporary_files(tmp_path):
  path = tmp_path / "sub" / "r.npz"  # the directory is created
  arrays = {"a": np.arange(6.0).reshape(2, 3), "status": np.array(["optimal", "infeasible"]),
            "mask": np.array([True, False]), "n": 3}
  results_io.write_npz(path, arrays)
  assert os.listdir(tmp_path / "sub") == ["r.npz"]
  with np.load(path, allow_pickle=False) as f:
    assert sorted(f.files) == sorted(arrays)
    np.testing.assert_array_equal(f["a"], arrays["a"])
    assert f["status"].tolist() == ["optimal", "infeasible"]
    assert f["mask"].dtype == bool and int(f["n"]) == 3
  # files get the umask's permissions, not mkstemp's 0600
  umask = os.umask(0)
  os.umask(umask)
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~umask


def test_write_npz_object_array_keeps_old_file(tmp_path):
  path = tmp_path / "r.npz"
  results_io.write_npz(path, {"a": np.ones(3)})
  before = path.read_bytes()
  with pytest.raises(TypeError, match="array 'bad' has dtype object"):
    results_io.write_npz(path, {"a": np.zeros(3), "bad": np.array([{"x": 1}, None], dtype=object)})
  assert path.read_bytes() == before
  assert os.listdir(tmp_path) == ["r.npz"]


def test_failure_midway_keeps_old_file(tmp_path):
  """json.dump fails after writing part of the document: the old file is intact, no temporary left."""
  path = tmp_path / "s.json"
  results_io.write_json(path, {"x": 1})
  before = path.read_bytes()
  with pytest.raises(TypeError):
    results_io.write_json(path, {"first": list(range(100)), "second": object()})
  assert path.read_bytes() == before
  assert os.listdir(tmp_path) == ["s.json"]


def test_atomic_path_on_exception(tmp_path):
  path = tmp_path / "f.txt"
  path.write_text("old")
  with pytest.raises(RuntimeError):
    with results_io.atomic_path(path) as tmp:
      with open(tmp, "w") as f:
        f.write("new, half")
      assert os.path.dirname(tmp) == str(tmp_path) and tmp != str(path)
      raise RuntimeError("crash")
  assert path.read_text() == "old"
  assert os.listdir(tmp_path) == ["f.txt"]
  with results_io.atomic_path(path) as tmp:
    with open(tmp, "w") as f:
      f.write("new")
  assert path.read_text() == "new" and os.listdir(tmp_path) == ["f.txt"]


def test_write_json_converts_numpy_and_nonfinite(tmp_path):
  path = tmp_path / "s.json"
  results_io.write_json(path, {"a": np.arange(3), "b": np.float64(0.5), "c": float("nan"), "d": (1, np.int64(2)),
                            3: {"e": float("inf")}})
  with open(path) as f:
    obj = json.load(f)
  assert obj == {"a": [0, 1, 2], "b": 0.5, "c": None, "d": [1, 2], "3": {"e": None}}
  assert os.listdir(tmp_path) == ["s.json"]


def test_save_figure(tmp_path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(1, 1))
  ax.plot([0, 1], [1, 0])
  path = tmp_path / "f.png"
  results_io.save_figure(fig, path, dpi=20)
  plt.close(fig)
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert os.listdir(tmp_path) == ["f.png"]
