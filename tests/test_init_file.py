"""svmattn.train.init_file and stages.Train(init_file=...): training from given starting points.

Small runs: n=3, T=4, d=3, 20 normalized GD steps, blocks of 4 data sets (the batches of 4 runs
and of 1 run below are padded to one block: a run's result does not depend on its batch).
"""
import dataclasses
import os

import numpy as np
import pytest

from svmattn.data import datasets as data_lib
from svmattn.execution import stages
from svmattn.train import init_file as init_lib
from svmattn.train import loop as train_lib

SPEC = data_lib.DataSpec(n=3, T=4, d=3)
SEED = 0
RUNS = np.arange(4)
CONFIGS = {p: train_lib.TrainConfig(param=p, steps=20, snapshot_every=10, chunk_steps=20, block_size=4)
           for p in ("W", "KQ")}
NAMES = {"W": ("W",), "KQ": ("K", "Q")}


@pytest.fixture(scope="module")
def data():
  """Runs 0..3 of seed 0 as a host batch {X, Y, Z, v}."""
  return {k: np.asarray(v) for k, v in data_lib.generate(SPEC, SEED, RUNS)._asdict().items()}


def _take(batch, index):
  return {k: v[index] for k, v in batch.items()}


def _run(stage, batch, runs):
  arrays, _ = stage.run(batch, np.asarray(runs), SEED, None, None)
  return arrays


def _assert_same(a, b, index=slice(None)):
  assert set(a) == set(b)
  for k in a:
    x, y = np.asarray(a[k]), np.asarray(b[k])
    if k != "steps":
      y = y[index]
    assert x.dtype == y.dtype and x.shape == y.shape, k
    assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), k


def _normal_file(path, param, seed, rows=4, m=None):
  rng = np.random.default_rng(seed)
  d = SPEC.d
  shape = (rows, d, d) if param == "W" else (rows, d, m or d)
  arrays = {k: rng.standard_normal(shape) for k in NAMES[param]}
  np.savez(path, **arrays)
  return arrays


@pytest.mark.parametrize("param, train_head", [("KQ", False)] + [pytest.param(*c, marks=pytest.mark.slow) for c in [("W", False), ("W", True)]])
def test_rows_of_the_random_init_reproduce_it_bit_for_bit(tmp_path, data, param, train_head):
  config = dataclasses.replace(CONFIGS[param], train_head=train_head)
  random = _run(stages.Train("t", config), data, RUNS)
  # the parameters the random init starts from: a run of 0 steps
  first = train_lib.train(dataclasses.replace(config, steps=0), data_lib.Dataset(**data),
                          train_lib.init_keys(SEED, RUNS)).params
  path = str(tmp_path / "init.npz")
  np.savez(path, **{k: np.asarray(first[k]) for k in NAMES[param]})
  from_file = _run(stages.Train("t", config, init_file=path), data, RUNS)
  _assert_same(from_file, random)
  if train_head:
    np.testing.assert_array_equal(from_file["V"][:, 0], data["v"])   # the head still starts at the data's v


@pytest.mark.parametrize("param", ["W", "KQ"])
def test_run_r_depends_only_on_row_r(tmp_path, data, param):
  config = CONFIGS[param]
  path_a, path_b, path_p, path_c = (str(tmp_path / f"{n}.npz") for n in "abpc")
  rows_a = _normal_file(path_a, param, seed=1)
  _normal_file(path_b, param, seed=2)
  a = _run(stages.Train("t", config, init_file=path_a), data, RUNS)
  b = _run(stages.Train("t", config, init_file=path_b), data, RUNS)
  random = _run(stages.Train("t", config), data, RUNS)
  np.testing.assert_array_equal(a["W"][:, 0], rows_a["W"] if param == "W" else rows_a["K"] @ rows_a["Q"].transpose(0, 2, 1))
  for other in (b, random):               # other starts, other trajectories: every run differs
    assert all(not np.array_equal(a["W"][r], other["W"][r]) for r in RUNS)
  # runs in another order and another batch: the same results run by run
  order = np.array([3, 1, 0, 2])
  _assert_same(_run(stages.Train("t", config, init_file=path_a), _take(data, order), order), a, order)
  _assert_same(_run(stages.Train("t", config, init_file=path_a), _take(data, [2]), [2]), a, [2])   # replay alone
  # rows permuted with the data sets: batch entry b (run b) holds data set perm[b] and row perm[b]
  perm = np.array([2, 0, 3, 1])
  np.savez(path_p, **{k: v[perm] for k, v in rows_a.items()})
  _assert_same(_run(stages.Train("t", config, init_file=path_p), _take(data, perm), RUNS), a, perm)
  # change row 0 only: run 0 changes, the other runs stay bit for bit
  changed = {k: v.copy() for k, v in rows_a.items()}
  for v in changed.values():
    v[0] *= -1.5
  np.savez(path_c, **changed)
  c = _run(stages.Train("t", config, init_file=path_c), data, RUNS)
  assert not np.array_equal(c["W"][0], a["W"][0])
  _assert_same(_take(c, slice(1, None)) | {"steps": c["steps"]}, a, slice(1, None))


def test_rows_load_and_the_cache(tmp_path):
  path = str(tmp_path / "init.npz")
  rng = np.random.default_rng(0)
  W, K, Q = rng.standard_normal((5, 3, 3)), rng.standard_normal((5, 3, 2)), rng.standard_normal((5, 3, 2))
  np.savez(path, W=W, K=K, Q=Q, note=np.array("N(0,1) like the mirror-descent code"))
  init_lib.check(path, {"w": "W", "kq": "KQ"}, 5, 3, 2, np.float64)      # extra arrays are allowed
  got = init_lib.rows(path, "KQ", np.array([4, 0]), np.float32)
  assert set(got) == {"K", "Q"} and got["K"].dtype == np.float32
  np.testing.assert_array_equal(got["K"], K[[4, 0]].astype(np.float32))
  np.testing.assert_array_equal(init_lib.rows(path, "W", [1], np.float64)["W"], W[[1]])
  loaded = init_lib.load(path, np.float32)
  assert loaded["W"].dtype == np.float32 and loaded["note"].dtype.kind == "U"
  # a rewritten file is read again (the cache is per path and modification)
  np.savez(path, W=W + 1)
  st = os.stat(path)
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
  np.testing.assert_array_equal(init_lib.rows(path, "W", [1], np.float64)["W"], W[[1]] + 1)


def _write(path, kind):
  rng = np.random.default_rng(0)
  W, K = rng.standard_normal((4, 3, 3)), rng.standard_normal((4, 3, 3))
  if kind == "missing":
    np.savez(path, W=W)
  elif kind == "missing_Q":
    np.savez(path, K=K)
  elif kind == "shape":
    np.savez(path, K=K[:, :, :2], Q=K)
  elif kind == "rows":
    np.savez(path, K=K[:2], Q=K[:2])
  elif kind == "nan":
    K[1, 0, 0] = np.nan
    np.savez(path, K=K, Q=K)
  elif kind == "overflow":
    np.savez(path, K=K * 1e300, Q=K)
  elif kind == "dtype":
    np.savez(path, K=K.astype(complex), Q=K)
  elif kind == "corrupt":
    np.savez(path, K=K, Q=K)
    raw = bytearray(open(path, "rb").read())
    open(path, "wb").write(bytes(raw[:len(raw) // 2]))
  elif kind == "garbage":
    open(path, "wb").write(b"\x00\x01 not an archive at all" * 10)
  elif kind == "npy":
    np.save(path, K)
  elif kind == "member":              # a zip whose member K is no .npy: np.load hands back its bytes
    import zipfile
    np.savez(path, Q=K)
    with zipfile.ZipFile(path, "a") as z:
      z.writestr("K", b"raw bytes, not an array")
  elif kind == "absent":
    pass


@pytest.mark.parametrize("kind, dtype, match", [
    ("missing", np.float64, r"has no K and Q, which the KQ parameterization \(stage 'kq'\) starts from"),
    ("missing_Q", np.float64, r"has no Q, which the KQ parameterization"),
    ("shape", np.float64, r"K must have shape \(rows, d, m\) = \(rows,\) \+ \(3, 3\) for d=3, m=3, got \(4, 3, 2\)"),
    ("rows", np.float64, r"K has 2 rows but 4 runs need one each"),
    ("nan", np.float64, r"K has 1 non-finite values \(NaN or inf\)"),
    ("overflow", np.float32, r"K holds values too large for float32"),
    ("dtype", np.float64, r"K must hold real numbers \(float\), got dtype complex128"),
    ("corrupt", np.float64, r"not a readable \.npz file of starting points"),
    ("garbage", np.float64, r"not a readable \.npz file of starting points"),
    ("npy", np.float64, r"must be an \.npz archive of named arrays"),
    ("member", np.float64, r"its member 'K' is not an array \(\.npy\)"),
    ("absent", np.float64, r"no such file of starting points"),
])
def test_bad_files_raise_one_clear_sentence(tmp_path, kind, dtype, match):
  path = str(tmp_path / ("init.npy" if kind == "npy" else "init.npz"))
  _write(path, kind)
  with pytest.raises(data_lib.DataError, match=match) as info:
    init_lib.check(path, {"kq": "KQ"}, 4, 3, None, dtype)
  message = str(info.value)
  assert "\n" not in message and message.startswith(path)


def test_the_stage_checks_its_file(tmp_path, data):
  path = str(tmp_path / "init.npz")
  _normal_file(path, "W", seed=1, rows=2)
  with pytest.raises(data_lib.DataError, match=r"W has 2 rows but 4 runs need one each"):
    _run(stages.Train("t", CONFIGS["W"], init_file=path), data, RUNS)
  with pytest.raises(data_lib.DataError, match=r"has no K and Q, which the KQ parameterization \(stage 't'\)"):
    _run(stages.Train("t", CONFIGS["KQ"], init_file=path), data, RUNS)
