"""Image data sets as token sequences for the Att-SVM (docs/science.md section 14).

Data flow, one function a step (NumPy only):

  load_images(name, split)          -> images (N, H, W) float64 in [0, 1], labels (N,) int64
  class_labels(labels, (a, b))      -> index (M,) of the images used, y (M,) in {-1, +1}
  patch_tokens(images[index], p)    -> tokens (M, T, D): T = (H/p)(W/p) patches of p*p pixels,
                                       plus an optional positional encoding, unit-normalized
  with_query(tokens, "mean"|"cls")  -> X (M, T', D'), Z (M, D'): the query is the mean token
                                       (cross-attention) or a [CLS] token at position 0
                                       (self-attention)
  split_pool(M, test_fraction, seed) -> train / test indices into the M examples

Data sets:
  "digits":        scikit-learn's bundled 8x8 digits (1797 images, no download, no split).
  "fashion_mnist": the 28x28 Fashion-MNIST IDX files of Debian's package
                   dataset-fashion-mnist (FASHION_DIR); split "train" (60000), "test"
                   (10000, the t10k files) or "all" (train then test). The arrays are
                   parsed here (no extra dependency), validated, and cached per (root, split)
                   in this module; load_images returns read-only arrays for them.

Why a positional encoding: two identical tokens (e.g. two blank patches, or the same
stroke at two places) cannot be told apart by any attention weights W, so an Att-SVM
that must select one of them against the other is infeasible. pos="onehot" or
pos="sincos" makes equal patches at different places different tokens.
"""
from __future__ import annotations

import gzip
import os
import re
import struct
import zlib

import numpy as np

from svmattn.data.datasets import DataError

DATASETS = ("digits", "fashion_mnist")
FASHION_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_INSTALL = "apt-get install dataset-fashion-mnist"

SPLITS = ("train", "test", "all")
POSITIONS = ("none", "onehot", "sincos")
QUERIES = ("mean", "cls")

_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions
_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension
_FASHION_FILES = {"train": "train", "test": "t10k"}
_SINCOS_BASE = 10000.0

# (absolute root, split) -> (images, labels), both read-only.
_FASHION_CACHE: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}


# ----------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------

def load_images(name: str, split: str = "all", root: str | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Images (N, H, W) float64 in [0, 1] and labels (N,) int64 of a data set in DATASETS.

  "digits": split must be "all" (the data set has no official split); root must be None.
  "fashion_mnist": split "train", "test" or "all"; root is the directory of the gzipped
  IDX files (default FASHION_DIR). Raises DataError for missing or corrupt files (naming
  the file; a missing one says how to install the package). The Fashion-MNIST arrays are
  cached and returned read-only: copy them before writing.
  """
  if name not in DATASETS:
    raise ValueError(f"unknown image data set {name!r}; expected one of {DATASETS}")
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
  if name == "digits":
    return _load_digits(split, root)
  return _load_fashion(split, FASHION_DIR if root is None else root)


def _load_digits(split: str, root: str | None) -> tuple[np.ndarray, np.ndarray]:
  if split != "all":
    raise ValueError(f"digits has no official train/test split: use split='all' (and split_pool), "
                     f"got split={split!r}")
  if root is not None:
    raise ValueError(f"digits is bundled with scikit-learn and takes no root directory, got root={root!r}")
  from sklearn.datasets import load_digits
  bunch = load_digits()
  images = np.asarray(bunch.images, dtype=np.float64) / 16.0
  labels = np.asarray(bunch.target, dtype=np.int64)
  return images, labels


def _load_fashion(split: str, root: str) -> tuple[np.ndarray, np.ndarray]:
  root = os.path.abspath(os.fspath(root))
  if not os.path.isdir(root):
    raise DataError(f"Fashion-MNIST not found in {root}: the package is not installed; install Debian's "
                    f"package with `{FASHION_INSTALL}` (see BUILD.md)")
  key = (root, split)
  if key not in _FASHION_CACHE:
    images, labels = _fashion_all(root) if split == "all" else _fashion_split(root, split)
    _FASHION_CACHE[key] = (_read_only(images), _read_only(labels))
  return _FASHION_CACHE[key]


def _fashion_all(root: str) -> tuple[np.ndarray, np.ndarray]:
  """Train then test (reusing cached splits, without caching the parts it reads)."""
  parts = [_FASHION_CACHE.get((root, s)) or _fashion_split(root, s) for s in ("train", "test")]
  if parts[0][0].shape[1:] != parts[1][0].shape[1:]:
    raise DataError(f"Fashion-MNIST in {root}: train images are {parts[0][0].shape[1:]} but test images are "
                    f"{parts[1][0].shape[1:]}")
  return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _fashion_split(root: str, split: str) -> tuple[np.ndarray, np.ndarray]:
  """One official split ("train" or "test") read from its two IDX files."""
  prefix = os.path.join(root, _FASHION_FILES[split])
  image_path = f"{prefix}-images-idx3-ubyte.gz"
  label_path = f"{prefix}-labels-idx1-ubyte.gz"
  pixels = _read_idx(image_path, _IMAGES_MAGIC)
  labels = _read_idx(label_path, _LABELS_MAGIC)
  if pixels.shape[0] != labels.shape[0]:
    raise DataError(f"{image_path} has {pixels.shape[0]} images but {label_path} has "
                    f"{labels.shape[0]} labels")
  return pixels.astype(np.float64) / 255.0, labels.astype(np.int64)


def _read_idx(path: str, magic: int) -> np.ndarray:
  """The uint8 array of a gzipped IDX file with the given magic number (2051: 3-D, 2049: 1-D)."""
  if not os.path.isfile(path):
    raise DataError(f"Fashion-MNIST file {path} not found: the package is not installed (or is incomplete); "
                    f"install Debian's package with `{FASHION_INSTALL}` (see BUILD.md)")
  try:
    with gzip.open(path, "rb") as f:
      data = f.read()
  except (OSError, EOFError, zlib.error) as e:
    raise DataError(f"{path}: not a readable gzip file ({e})") from e
  ndim = magic & 0xFF
  header = 4 + 4 * ndim
  if len(data) < header:
    raise DataError(f"{path}: truncated IDX header ({len(data)} bytes, expected at least {header})")
  found = struct.unpack(">i", data[:4])[0]
  if found != magic:
    raise DataError(f"{path}: bad IDX magic number {found}, expected {magic}")
  dims = struct.unpack(f">{ndim}I", data[4:header])
  size = int(np.prod(dims, dtype=np.int64))
  if len(data) - header != size:
    raise DataError(f"{path}: IDX dimensions {dims} need {size} data bytes, found {len(data) - header}")
  return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def _read_only(a: np.ndarray) -> np.ndarray:
  a.setflags(write=False)
  return a


# ----------------------------------------------------------------------------
# Tokens
# ----------------------------------------------------------------------------

def patch_tokens(images: np.ndarray, p: int, pos: str = "none", pos_scale: float = 1.0) -> np.ndarray:
  """Images (N, H, W) -> unit tokens (N, T, D), one per p x p patch, T = (H/p)(W/p).

  Order: the patch at grid row r, column c is token r * (W/p) + c (row-major over the
  grid, as patch_grid); its features are its p*p pixels in row-major order.

  pos:
    "none":   D = p*p.
    "onehot": append pos_scale * one_hot(t, T) for token t: D = p*p + T.
    "sincos": add pos_scale * PE(r, c), a 2-D sinusoidal encoding of dimension D = p*p.
              The first m = ceil(D/2) features encode the grid row r, the last D - m the
              grid column c, each with the 1-D encoding of size n at position q:
                e[2k] = sin(q * w_k),  e[2k+1] = cos(q * w_k),  w_k = 10000 ** (-2k / n),
              k = 0, 1, ... (the last sin is kept alone when n is odd). A half of even size
              n has norm sqrt(n / 2), so |PE| is about p / sqrt(2), the scale of a patch
              (p = 1 is degenerate: D = 1 encodes only sin(r); use "onehot").

  Then each token is divided by its norm; a token that is exactly zero (a blank patch with
  pos="none") stays zero. Identical tokens (e.g. blank patches) make any selection among
  them infeasible for the Att-SVM; a positional encoding makes equal patches at different
  places different tokens.

  Raises ValueError for images that are not 3-D or not finite, p < 1, H or W not divisible
  by p, an unknown pos, or pos_scale <= 0 with pos != "none".
  """
  images = _check_images(images)
  N, H, W = images.shape
  _check_patch(H, W, p)
  if pos not in POSITIONS:
    raise ValueError(f"unknown positional encoding pos={pos!r}; expected one of {POSITIONS}")
  if pos != "none" and not (np.isfinite(pos_scale) and pos_scale > 0):
    raise ValueError(f"pos_scale must be a finite number > 0 with pos={pos!r}, got {pos_scale!r}")
  rows, cols = H // p, W // p
  tokens = images.reshape(N, rows, p, cols, p).transpose(0, 1, 3, 2, 4).reshape(N, rows * cols, p * p)
  if pos == "onehot":
    onehot = np.broadcast_to(pos_scale * np.eye(rows * cols), (N, rows * cols, rows * cols))
    tokens = np.concatenate([tokens, onehot], axis=-1)
  elif pos == "sincos":
    tokens = tokens + pos_scale * _sincos_2d(rows, cols, p * p)
  return _unit(tokens)


def _sincos_2d(rows: int, cols: int, dim: int) -> np.ndarray:
  """The (rows * cols, dim) 2-D sinusoidal encoding of patch_tokens(pos="sincos"), in its token order."""
  m = (dim + 1) // 2
  r, c = np.divmod(np.arange(rows * cols), cols)
  return np.concatenate([_sincos_1d(r, m), _sincos_1d(c, dim - m)], axis=-1)


def _sincos_1d(q: np.ndarray, n: int) -> np.ndarray:
  """(len(q), n): e[2k] = sin(q w_k), e[2k+1] = cos(q w_k), w_k = 10000 ** (-2k / n)."""
  k = np.arange(n) // 2
  angle = q[:, None].astype(np.float64) * _SINCOS_BASE ** (-2.0 * k / max(n, 1))
  return np.where(np.arange(n) % 2 == 0, np.sin(angle), np.cos(angle))


def patch_grid(H: int, W: int, p: int) -> np.ndarray:
  """(T, 2) int64 (row, col) pixel offsets of each token's top-left corner, in patch_tokens order."""
  _check_patch(H, W, p)
  r, c = np.divmod(np.arange((H // p) * (W // p), dtype=np.int64), W // p)
  return np.stack([r * p, c * p], axis=1)


def _check_images(images: np.ndarray) -> np.ndarray:
  images = np.asarray(images)
  if images.dtype.kind not in "biuf":
    raise ValueError(f"images must be numeric, got dtype {images.dtype}")
  if images.ndim != 3:
    raise ValueError(f"images must have shape (N, H, W), got shape {images.shape}")
  images = images.astype(np.float64)
  if not np.all(np.isfinite(images)):
    bad = int(images.size - np.count_nonzero(np.isfinite(images)))
    raise ValueError(f"images have {bad} non-finite values (NaN or inf)")
  return images


def _check_patch(H: int, W: int, p: int) -> None:
  if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
    raise ValueError(f"patch size p must be an integer >= 1, got {p!r}")
  if H < 1 or W < 1:
    raise ValueError(f"images must have H, W >= 1, got H={H}, W={W}")
  if H % p or W % p:
    raise ValueError(f"image size H x W = {H} x {W} is not divisible by the patch size p={p}")


def _unit(a: np.ndarray) -> np.ndarray:
  """a / |a| along the last axis; rows that are exactly zero stay zero."""
  norm = np.linalg.norm(a, axis=-1, keepdims=True)
  return np.divide(a, norm, out=np.zeros(a.shape, dtype=np.float64), where=norm > 0)


# ----------------------------------------------------------------------------
# Labels, queries, splits
# ----------------------------------------------------------------------------

def class_labels(labels: np.ndarray, classes: tuple) -> tuple[np.ndarray, np.ndarray]:
  """The images of a binary task and their labels.

  classes: (a, b), two different classes: the images of a (y = +1) and b (y = -1);
           (a, "rest"): every image, y = +1 for class a and -1 for all others.
  Returns (index (M,) int64, increasing; y (M,) float64 in {-1, +1}).
  """
  labels = np.asarray(labels)
  if labels.ndim != 1 or labels.dtype.kind not in "iu":
    raise ValueError(f"labels must be a 1-D integer array, got shape {labels.shape} dtype {labels.dtype}")
  if not isinstance(classes, (tuple, list)) or len(classes) != 2:
    raise ValueError(f"classes must be a pair (a, b) or (a, 'rest'), got {classes!r}")
  a, b = classes
  present = np.unique(labels).tolist()
  _check_class(a, present)
  if isinstance(b, str):
    if b != "rest":
      raise ValueError(f"the second class must be an integer or 'rest', got {b!r}")
    if present == [a]:
      raise ValueError(f"classes ({a}, 'rest'): every image is of class {a}, the rest is empty")
    index = np.arange(labels.size, dtype=np.int64)
  else:
    _check_class(b, present)
    if a == b:
      raise ValueError(f"classes must be two different classes, got ({a}, {b})")
    index = np.flatnonzero((labels == a) | (labels == b)).astype(np.int64)
  y = np.where(labels[index] == a, 1.0, -1.0)
  return index, y


def _check_class(c, present: list) -> None:
  if isinstance(c, bool) or not isinstance(c, (int, np.integer)):
    raise ValueError(f"a class must be an integer, got {c!r}")
  if c not in present:
    raise ValueError(f"class {c} does not occur in the labels; classes present: {present}")


_CLASSES_RE = re.compile(r"\s*(\d+)\s*,\s*(\d+|rest)\s*")


def parse_classes(text: str) -> tuple:
  """'0,1' -> (0, 1); '3,rest' -> (3, 'rest'). ValueError for anything else."""
  match = _CLASSES_RE.fullmatch(text) if isinstance(text, str) else None
  if match is None:
    raise ValueError(f"classes must be 'A,B' or 'A,rest' with class numbers A, B (e.g. '0,1' or '3,rest'), "
                     f"got {text!r}")
  a, b = match.groups()
  return (int(a), b if b == "rest" else int(b))


def with_query(tokens: np.ndarray, query: str = "mean") -> tuple[np.ndarray, np.ndarray]:
  """Tokens (N, T, D) -> (X, Z), the inputs and queries of the attention model.

  "mean": X = tokens (N, T, D); Z (N, D) = the mean token of each image, unit-normalized
          (a zero mean stays zero). Cross-attention.
  "cls":  X (N, T+1, D+1): a feature 0 is appended to every token and a [CLS] token
          e_{D} (the unit vector on the new feature) is prepended at position 0;
          Z (N, D+1) = that [CLS] token. Self-attention with query position 0.
  """
  tokens = np.asarray(tokens, dtype=np.float64)
  if tokens.ndim != 3:
    raise ValueError(f"tokens must have shape (N, T, D), got shape {tokens.shape}")
  if not np.all(np.isfinite(tokens)):
    raise ValueError("tokens have non-finite values (NaN or inf)")
  N, T, D = tokens.shape
  if query == "mean":
    return tokens, _unit(tokens.mean(axis=1))
  if query == "cls":
    X = np.zeros((N, T + 1, D + 1))
    X[:, 0, D] = 1.0
    X[:, 1:, :D] = tokens
    return X, X[:, 0].copy()
  raise ValueError(f"unknown query {query!r}; expected one of {QUERIES}")


def split_pool(N: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """A fixed random split of range(N) into (train, test) indices, each sorted (int64).

  The test set is the first round(test_fraction * N) entries of
  numpy.random.default_rng(seed).permutation(N); both parts must be non-empty.
  """
  if isinstance(N, bool) or not isinstance(N, (int, np.integer)) or N < 2:
    raise ValueError(f"N must be an integer >= 2 to split, got {N!r}")
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
  n_test = int(round(test_fraction * N))
  if not 0 < n_test < N:
    raise ValueError(f"test_fraction={test_fraction} of N={N} leaves an empty train or test set "
                     f"({n_test} test examples)")
  perm = np.random.default_rng(seed).permutation(N).astype(np.int64)
  return np.sort(perm[n_test:]), np.sort(perm[:n_test])
