"""svmattn.data.images: loading, patch tokens, positional encodings, labels, queries, splits."""
import gzip
import os
import struct

import numpy as np
import pytest

from svmattn.data import images as images_lib
from svmattn.data.datasets import DataError


# ----------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------

def test_digits_shapes_range_and_labels():
  images, labels = images_lib.load_images("digits")
  assert images.shape == (1797, 8, 8) and images.dtype == np.float64
  assert labels.shape == (1797,) and labels.dtype == np.int64
  assert images.min() == 0.0 and images.max() == 1.0
  assert sorted(np.unique(labels).tolist()) == list(range(10))


def test_load_errors():
  with pytest.raises(ValueError, match="no official"):
    images_lib.load_images("digits", "train")
  with pytest.raises(ValueError, match="fashion_mnist"):
    images_lib.load_images("mnist")
  with pytest.raises(ValueError, match="split"):
    images_lib.load_images("fashion_mnist", "valid")


def _idx(path, magic, dims, data):
  with gzip.open(path, "wb") as f:
    f.write(struct.pack(">i", magic) + struct.pack(f">{len(dims)}I", *dims) + bytes(data))


def _fake_fashion(root, n_train=5, n_test=3, h=4, w=6):
  """A tiny Fashion-MNIST directory; returns {split: (uint8 pixels, labels)}."""
  os.makedirs(root, exist_ok=True)
  rng = np.random.default_rng(0)
  out = {}
  for split, prefix, n in (("train", "train", n_train), ("test", "t10k", n_test)):
    pixels = rng.integers(0, 256, size=(n, h, w), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    _idx(os.path.join(root, f"{prefix}-images-idx3-ubyte.gz"), 2051, pixels.shape, pixels.tobytes())
    _idx(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz"), 2049, labels.shape, labels.tobytes())
    out[split] = (pixels, labels)
  return out


def test_fake_fashion_reads_splits_and_caches(tmp_path):
  root = str(tmp_path / "fm")
  raw = _fake_fashion(root)
  images, labels = images_lib.load_images("fashion_mnist", "train", root=root)
  assert images.shape == (5, 4, 6) and images.dtype == np.float64 and labels.dtype == np.int64
  np.testing.assert_array_equal(images, raw["train"][0] / 255.0)
  np.testing.assert_array_equal(labels, raw["train"][1])
  test_images, test_labels = images_lib.load_images("fashion_mnist", "test", root=root)
  np.testing.assert_array_equal(test_images, raw["test"][0] / 255.0)
  all_images, all_labels = images_lib.load_images("fashion_mnist", "all", root=root)
  assert all_images.shape == (8, 4, 6)
  np.testing.assert_array_equal(all_labels, np.concatenate([raw["train"][1], raw["test"][1]]))
  # cached and read-only
  again, _ = images_lib.load_images("fashion_mnist", "train", root=root)
  assert again is images and not images.flags.writeable


@pytest.mark.parametrize("damage", ["truncate", "magic", "count", "not_gzip"])
def test_fake_fashion_corrupt_file_names_it(tmp_path, damage):
  root = str(tmp_path / "fm")
  raw = _fake_fashion(root)
  bad = os.path.join(root, "train-images-idx3-ubyte.gz")
  if damage == "truncate":  # a gzip stream cut short
    blob = open(bad, "rb").read()
    open(bad, "wb").write(blob[: len(blob) // 2])
  elif damage == "magic":
    _idx(bad, 2049, raw["train"][0].shape, raw["train"][0].tobytes())
  elif damage == "count":  # 4 images against 5 labels
    _idx(bad, 2051, (4, 4, 6), raw["train"][0][:4].tobytes())
  else:
    open(bad, "wb").write(b"not a gzip file")
  with pytest.raises(DataError, match="train-images-idx3-ubyte.gz"):
    images_lib.load_images("fashion_mnist", "train", root=root)


def test_fake_fashion_short_data_names_file(tmp_path):
  root = str(tmp_path / "fm")
  raw = _fake_fashion(root)
  bad = os.path.join(root, "t10k-labels-idx1-ubyte.gz")
  _idx(bad, 2049, (3,), raw["test"][1][:2].tobytes())  # header says 3, data has 2
  with pytest.raises(DataError, match="t10k-labels-idx1-ubyte.gz"):
    images_lib.load_images("fashion_mnist", "test", root=root)


def test_missing_fashion_says_how_to_install(tmp_path):
  with pytest.raises(DataError, match=images_lib.FASHION_INSTALL) as e:
    images_lib.load_images("fashion_mnist", "train", root=str(tmp_path / "absent"))
  assert "not installed" in str(e.value)
  root = str(tmp_path / "fm")
  _fake_fashion(root)
  os.remove(os.path.join(root, "t10k-labels-idx1-ubyte.gz"))
  with pytest.raises(DataError, match=images_lib.FASHION_INSTALL):
    images_lib.load_images("fashion_mnist", "test", root=root)


@pytest.mark.skipif(not os.path.isdir(images_lib.FASHION_DIR), reason="Debian's dataset-fashion-mnist is not installed")
def test_installed_fashion_train_shapes():
  images, labels = images_lib.load_images("fashion_mnist", "train")
  assert images.shape == (60000, 28, 28) and labels.shape == (60000,)
  assert 0.0 <= images.min() and images.max() <= 1.0
  assert sorted(np.unique(labels).tolist()) == list(range(10))


# ----------------------------------------------------------------------------
# Patch tokens
# ----------------------------------------------------------------------------

IMAGE = np.arange(1.0, 17.0).reshape(1, 4, 4)  # pixel (i, j) = 4 i + j + 1


def _unit(v):
  v = np.asarray(v, dtype=float)
  return v / np.linalg.norm(v)


def test_patch_order_and_grid():
  tokens = images_lib.patch_tokens(IMAGE, 2)
  assert tokens.shape == (1, 4, 4)
  expected = [[1, 2, 5, 6], [3, 4, 7, 8], [9, 10, 13, 14], [11, 12, 15, 16]]
  np.testing.assert_allclose(tokens[0], [_unit(e) for e in expected], rtol=0, atol=1e-15)
  grid = images_lib.patch_grid(4, 4, 2)
  assert grid.dtype.kind == "i"
  np.testing.assert_array_equal(grid, [[0, 0], [0, 2], [2, 0], [2, 2]])
  for t, (r, c) in enumerate(grid):  # each token is the block at its grid offset
    np.testing.assert_allclose(tokens[0, t], _unit(IMAGE[0, r:r + 2, c:c + 2].ravel()), atol=1e-15)


def test_patch_grid_rectangular():
  grid = images_lib.patch_grid(4, 6, 2)
  np.testing.assert_array_equal(grid, [[0, 0], [0, 2], [0, 4], [2, 0], [2, 2], [2, 4]])
  images = np.random.default_rng(0).random((2, 4, 6))
  tokens = images_lib.patch_tokens(images, 2)
  for t, (r, c) in enumerate(grid):
    np.testing.assert_allclose(tokens[1, t], _unit(images[1, r:r + 2, c:c + 2].ravel()), atol=1e-15)


def test_zero_patch_stays_zero_and_norms_are_one():
  image = np.zeros((1, 4, 4))
  image[0, :2, :2] = 0.5
  tokens = images_lib.patch_tokens(image, 2)
  np.testing.assert_allclose(np.linalg.norm(tokens[0, 0]), 1.0)
  np.testing.assert_array_equal(tokens[0, 1:], 0.0)


@pytest.mark.parametrize("pos, D", [("onehot", 4 + 4), ("sincos", 4)])
def test_positional_encoding_separates_identical_patches(pos, D):
  image = np.ones((1, 4, 4))  # four identical patches
  assert np.allclose(images_lib.patch_tokens(image, 2)[0], images_lib.patch_tokens(image, 2)[0, 0])
  tokens = images_lib.patch_tokens(image, 2, pos=pos)
  assert tokens.shape == (1, 4, D)
  np.testing.assert_allclose(np.linalg.norm(tokens, axis=-1), 1.0, rtol=0, atol=1e-14)
  gram = tokens[0] @ tokens[0].T
  assert np.all(gram[~np.eye(4, dtype=bool)] < 1 - 1e-6)  # pairwise different directions
  blank = images_lib.patch_tokens(np.zeros((1, 4, 4)), 2, pos=pos)  # blank patches no longer zero
  np.testing.assert_allclose(np.linalg.norm(blank, axis=-1), 1.0, rtol=0, atol=1e-14)


def test_onehot_layout_and_scale():
  tokens = images_lib.patch_tokens(IMAGE, 2, pos="onehot", pos_scale=3.0)
  raw = np.array([[1, 2, 5, 6], [3, 4, 7, 8], [9, 10, 13, 14], [11, 12, 15, 16]], dtype=float)
  expected = np.concatenate([raw, 3.0 * np.eye(4)], axis=1)
  np.testing.assert_allclose(tokens[0], expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-15)


def test_sincos_formula():
  pe = images_lib._sincos_2d(2, 3, 9)  # rows: first 5 features; cols: last 4
  r, c = 1, 2
  t = r * 3 + c
  w5 = 10000.0 ** (-2.0 * np.array([0, 0, 1, 1, 2]) / 5)
  w4 = 10000.0 ** (-2.0 * np.array([0, 0, 1, 1]) / 4)
  expect = np.concatenate([
      [np.sin(r * w5[0]), np.cos(r * w5[1]), np.sin(r * w5[2]), np.cos(r * w5[3]), np.sin(r * w5[4])],
      [np.sin(c * w4[0]), np.cos(c * w4[1]), np.sin(c * w4[2]), np.cos(c * w4[3])]])
  np.testing.assert_allclose(pe[t], expect, rtol=0, atol=1e-15)
  image = np.random.default_rng(1).random((1, 6, 9))
  tokens = images_lib.patch_tokens(image, 3, pos="sincos", pos_scale=0.5)
  raw = np.stack([image[0, i:i + 3, j:j + 3].ravel() for i in (0, 3) for j in (0, 3, 6)])
  expected = raw + 0.5 * pe
  np.testing.assert_allclose(tokens[0], expected / np.linalg.norm(expected, axis=-1, keepdims=True), atol=1e-15)


def test_digit_tokens_shapes():
  images, _ = images_lib.load_images("digits")
  assert images_lib.patch_tokens(images[:10], 2).shape == (10, 16, 4)
  assert images_lib.patch_tokens(images[:10], 4, pos="onehot").shape == (10, 4, 16 + 4)


@pytest.mark.parametrize("kwargs, match", [
    (dict(p=0), "p must be"),
    (dict(p=2.0), "p must be"),
    (dict(p=3), "not divisible"),
    (dict(p=2, pos="learned"), "unknown positional"),
    (dict(p=2, pos="onehot", pos_scale=0.0), "pos_scale"),
    (dict(p=2, pos="sincos", pos_scale=-1.0), "pos_scale"),
])
def test_patch_token_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    images_lib.patch_tokens(IMAGE, **kwargs)


def test_patch_token_input_errors():
  with pytest.raises(ValueError, match=r"\(N, H, W\)"):
    images_lib.patch_tokens(IMAGE[0], 2)
  bad = IMAGE.copy()
  bad[0, 1, 1] = np.nan
  with pytest.raises(ValueError, match="non-finite"):
    images_lib.patch_tokens(bad, 2)
  with pytest.raises(ValueError, match="not divisible"):
    images_lib.patch_grid(4, 6, 4)


# ----------------------------------------------------------------------------
# Labels, queries, splits
# ----------------------------------------------------------------------------

LABELS = np.array([0, 1, 2, 1, 0, 2, 2])


def test_class_labels_pair_and_rest():
  index, y = images_lib.class_labels(LABELS, (1, 2))
  np.testing.assert_array_equal(index, [1, 2, 3, 5, 6])
  np.testing.assert_array_equal(y, [1, -1, 1, -1, -1])
  assert index.dtype == np.int64 and y.dtype == np.float64
  index, y = images_lib.class_labels(LABELS, (0, "rest"))
  np.testing.assert_array_equal(index, np.arange(7))
  np.testing.assert_array_equal(y, [1, -1, -1, -1, 1, -1, -1])


@pytest.mark.parametrize("classes, match", [
    ((1, 1), "different"),
    ((1, 7), r"class 7 does not occur.*\[0, 1, 2\]"),
    ((9, "rest"), "class 9 does not occur"),
    ((1, 2, 3), "pair"),
    ((1, "others"), "'rest'"),
])
def test_class_labels_errors(classes, match):
  with pytest.raises(ValueError, match=match):
    images_lib.class_labels(LABELS, classes)


def test_parse_classes():
  assert images_lib.parse_classes("0,1") == (0, 1)
  assert images_lib.parse_classes("3,rest") == (3, "rest")
  assert images_lib.parse_classes(" 3 , 5 ") == (3, 5)
  for bad in ("0", "0,1,2", "a,b", "rest,3", "0;1", ""):
    with pytest.raises(ValueError, match="e.g. '0,1'"):
      images_lib.parse_classes(bad)


def test_with_query_mean():
  tokens = images_lib.patch_tokens(np.random.default_rng(2).random((3, 4, 4)), 2)
  X, Z = images_lib.with_query(tokens, "mean")
  assert X.shape == (3, 4, 4) and Z.shape == (3, 4)
  np.testing.assert_array_equal(X, tokens)
  np.testing.assert_allclose(Z, [_unit(t.mean(axis=0)) for t in tokens], atol=1e-15)
  _, Z0 = images_lib.with_query(np.zeros((1, 4, 4)), "mean")
  np.testing.assert_array_equal(Z0, 0.0)


def test_with_query_cls():
  tokens = images_lib.patch_tokens(np.random.default_rng(3).random((3, 4, 4)), 2)
  X, Z = images_lib.with_query(tokens, "cls")
  assert X.shape == (3, 5, 5) and Z.shape == (3, 5)
  np.testing.assert_array_equal(X[:, 0], np.tile([0, 0, 0, 0, 1.0], (3, 1)))
  np.testing.assert_array_equal(Z, X[:, 0])
  np.testing.assert_array_equal(X[:, 1:, :4], tokens)
  np.testing.assert_array_equal(X[:, 1:, 4], 0.0)
  with pytest.raises(ValueError, match="unknown query"):
    images_lib.with_query(tokens, "max")


def test_split_pool():
  train, test = images_lib.split_pool(20, 0.25, seed=5)
  assert len(test) == 5 and len(train) == 15
  assert np.all(np.diff(train) > 0) and np.all(np.diff(test) > 0)
  assert not set(train) & set(test)
  np.testing.assert_array_equal(np.union1d(train, test), np.arange(20))
  again = images_lib.split_pool(20, 0.25, seed=5)
  np.testing.assert_array_equal(again[0], train)
  np.testing.assert_array_equal(again[1], test)
  assert not np.array_equal(images_lib.split_pool(20, 0.25, seed=6)[1], test)
  for fraction in (0.0, 1.0, -0.1, 1.5):
    with pytest.raises(ValueError, match="test_fraction"):
      images_lib.split_pool(20, fraction, seed=0)
