"""The pipeline's work files (svmattn.io.work_files): arrays back as written, and a damaged file
refused with one line naming it."""
import numpy as np
import pytest

from svmattn.io import work_files

ARRAYS = {"W": np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4) / 7,
          "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)), "view": np.arange(10.0)[::3],
          "labels": np.array(["kept", "stalled"]), "finite": np.array([True, False]), "step": np.int64(7),
          "nothing": np.zeros((0, 5)), "f32": np.linspace(0, 1, 5, dtype=np.float32)}


def test_arrays_come_back_as_written(tmp_path):
  path = tmp_path / "u.arrays"
  work_files.write(path, ARRAYS)
  work_files.check(path)
  assert work_files.names(path) == list(ARRAYS)
  back = work_files.read(path)
  for k, want in ARRAYS.items():
    got = back[k]
    want = np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, k
    assert np.array_equal(got, want), k
    assert got.flags.writeable
  assert back["fortran"].flags.f_contiguous and not back["fortran"].flags.c_contiguous
  only = work_files.read(path, ["labels", "step"])
  assert list(only) == ["labels", "step"] and only["labels"].tolist() == ["kept", "stalled"]
  with pytest.raises(KeyError):
    work_files.read(path, ["missing"])


@pytest.mark.parametrize("damage", ["truncated", "one byte more", "overwritten", "empty", "index cut"])
def test_a_damaged_file_fails_its_check(tmp_path, damage):
  path = tmp_path / "u.arrays"
  work_files.write(path, ARRAYS)
  data = path.read_bytes()
  path.write_bytes({"truncated": data[:-8], "one byte more": data + b"\0", "overwritten": b"PK\3\4 not this",
                    "empty": b"", "index cut": data[:40]}[damage])
  with pytest.raises(work_files.WorkFileError, match=str(path)):
    work_files.check(path)
  with pytest.raises(work_files.WorkFileError):
    work_files.read(path)


def test_objects_are_refused_and_nothing_is_left(tmp_path):
  with pytest.raises(TypeError, match="dtype object"):
    work_files.write(tmp_path / "u.arrays", {"bad": np.array([{}, None])})
  assert list(tmp_path.iterdir()) == []
