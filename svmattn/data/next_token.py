"""Next-token data sets (docs/science.md section 12): a vocabulary, token sequences, next-token labels.

One data set is a :class:`TokenData`:
  E (K,d)       unit-norm token embeddings
  tokens (n,T)  token ids, distinct within a sequence; the last one is the query
  labels (n,)   the next token of each sequence, a token that occurs in it
A batch has a leading axis B on every field. ``to_dataset`` turns it into the engine's
``Dataset`` for the next-token models of ``svmattn.models.attention``: X = E[tokens] (n,T,d),
Z = E[query] (n,d), Y (n,T) 1.0 at the label's position, v = E (K,d).

Generator (the public code's, yixiao-huang/next-token-prediction, data_utils.py): E Gaussian
with unit rows; each sequence T distinct tokens drawn uniformly without replacement; labels
uniform over the K tokens, a label absent from its sequence replaced by the token at a
uniformly random position of it; a data set none of whose token graphs has a cycle (every SCC a
single token) is drawn again (``require_cycle``). Data set r of seed s comes from
``rng.run_key(s, r)`` (attempt a from ``fold_in`` of its data key with a): the same whatever the
batch it is drawn in.
"""
from __future__ import annotations

import dataclasses
import os
import zipfile
from typing import NamedTuple, Sequence

import numpy as np

from svmattn import rng
from svmattn.data import datasets as data_lib
from svmattn.data.datasets import DataError
from svmattn.data.datasets import Dataset
from svmattn.data import token_graph
from svmattn.io import atomic_files as results_io

MAX_ATTEMPTS = 1000


class TokenData(NamedTuple):
  E: np.ndarray        # (K,d)
  tokens: np.ndarray   # (n,T) int
  labels: np.ndarray   # (n,) int


@dataclasses.dataclass(frozen=True)
class TokenSpec:
  """Sizes of generated next-token data sets (the paper's global setting by default)."""
  K: int = 6
  d: int = 8
  n: int = 6
  T: int = 4
  require_cycle: bool = True
  labels: str = "uniform"     # or "zipf": label k drawn with probability ZIPF(K)[k] (E19, ``zipf_labels``)

  def validate(self) -> "TokenSpec":
    for name in ("K", "d", "n", "T"):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"TokenSpec.{name} must be a positive integer, got {value!r}")
    if self.T < 2:
      raise ValueError(f"TokenSpec.T must be >= 2 (a query and another token), got {self.T}")
    if self.T > self.K:
      raise ValueError(f"TokenSpec: T={self.T} distinct tokens per sequence need K >= T, got K={self.K}")
    if self.labels not in LABELS:
      raise ValueError(f"TokenSpec.labels must be one of {', '.join(LABELS)}, got {self.labels!r}")
    return self


LABELS = ("uniform", "zipf")


def zipf(K: int) -> np.ndarray:
  """(K,) the class frequencies pi_k proportional to 1/k, k = 1..K (token id k - 1): Kunstner et al.
  2024's heavy tail (docs/science.md section 24)."""
  w = 1.0 / np.arange(1, K + 1)
  return w / w.sum()


def zipf_labels(tokens: np.ndarray, K: int, u: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(tokens, labels) with Zipf labels: label i is the token whose cumulative frequency first exceeds
  u[i] (uniform in [0,1)); a label absent from its sequence takes the place of the token at position
  pos[i], so the labels keep their Zipf frequencies exactly and the tokens stay distinct."""
  labels = np.minimum(np.searchsorted(np.cumsum(zipf(K)), u, side="right"), K - 1)
  present = np.any(tokens == labels[..., None], axis=-1)
  put = np.zeros(tokens.shape, bool)
  np.put_along_axis(put, pos[..., None], True, axis=-1)
  tokens = np.where(put & ~present[..., None], labels[..., None], tokens)
  return tokens, labels


def _draw(spec: TokenSpec, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(E (B,K,d), tokens (B,n,T), labels (B,n)) of the attempt keys (B, 2), on the host: for each key
  (ke, kt, kl, kr) = split(key, 4); E the rows of normal(ke, (K, d)) scaled to unit norm (the exact-sum
  norm of ``data.datasets``); sequence i the first T entries of permutation(split(kt, n)[i], K); labels
  randint(kl, (n,), 0, K), one absent from its sequence replaced by the token at position
  randint(kr, (n,), 0, T)[i] (Zipf labels: ``zipf_labels`` of uniform(kl, (n,)) and those positions). JAX's draws of those calls, computed without a program (numerics
  version 9; before, a compiled program per shape with XLA's norm of E)."""
  keys = np.asarray(keys, np.uint32).reshape(-1, 2)
  B, K, d, n, T = len(keys), spec.K, spec.d, spec.n, spec.T
  ke, kt, kl, kr = np.moveaxis(rng.split_keys(keys, 4), 1, 0)
  E = data_lib.unit_rows_host(rng.normals(ke, K * d).reshape(B, K, d))
  tokens = rng.permutations(rng.split_keys(kt, n).reshape(-1, 2), K)[:, :T].reshape(B, n, T)
  pos = rng.randints(kr, n, 0, T)
  if spec.labels == "zipf":
    tokens, labels = zipf_labels(tokens, K, rng.uniforms(kl, n), pos)
    return E, tokens, labels
  labels = rng.randints(kl, n, 0, K)
  present = np.any(tokens == labels[..., None], axis=2)
  labels = np.where(present, labels, np.take_along_axis(tokens, pos[..., None], axis=2)[..., 0])
  return E, tokens, labels


def has_cycle(tokens: np.ndarray, labels: np.ndarray) -> bool:
  """Whether some query token's graph (``token_graph.token_graph``: an edge from each sequence's label
  to its every other token, over the sequences ending in that query) has an SCC of two tokens or
  more, that is a directed cycle (the graph has no self-loops): some node reaches itself in the
  transitive closure (Warshall on the small boolean matrix; the same answer as the SCCs of
  ``token_graph.graphs``, tested, at a tenth of its cost)."""
  tokens = np.asarray(tokens, np.int64)
  target = tokens == np.asarray(labels)[:, None]
  for query in np.unique(tokens[:, -1]):
    rows = tokens[:, -1] == query
    nodes = np.unique(tokens[rows])
    at = np.searchsorted(nodes, tokens[rows])                              # (r, T) node of each token
    reach = np.zeros((len(nodes), len(nodes)), bool)
    for i, j in zip(*np.nonzero(target[rows])):                          # label -> every token of its row
      reach[at[i, j], at[i]] = True
    np.fill_diagonal(reach, False)
    for k in range(len(nodes)):
      reach |= reach[:, k:k + 1] & reach[k:k + 1, :]
    if np.any(np.diagonal(reach)):
      return True
  return False


def generate(spec: TokenSpec, seed: int, runs: Sequence[int] | np.ndarray) -> TokenData:
  """Data sets ``runs`` of ``seed`` (leading axis B = len(runs))."""
  spec.validate()
  runs = np.asarray(runs, np.int64)
  data_keys = rng.split_keys(rng.run_keys(seed, runs.astype(np.uint32)))[:, 0]     # split_run_key(run_key)[0]
  B = len(runs)
  E = np.zeros((B, spec.K, spec.d))
  tokens = np.zeros((B, spec.n, spec.T), np.int64)
  labels = np.zeros((B, spec.n), np.int64)
  todo = np.arange(B)
  for attempt in range(MAX_ATTEMPTS):
    # attempt a of a run draws from fold_in(its data key, a), on the host for the runs still to draw
    e, t, y = _draw(spec, rng.fold_in_keys(data_keys[todo], np.full(len(todo), attempt)))
    keep = np.array([not spec.require_cycle or has_cycle(t[j], y[j]) for j in range(len(todo))], bool)
    E[todo[keep]], tokens[todo[keep]], labels[todo[keep]] = e[keep], t[keep], y[keep]
    todo = todo[~keep]
    if not len(todo):
      return TokenData(E, tokens, labels)
  raise ValueError(f"no data set with a cycle in {MAX_ATTEMPTS} draws for runs {runs[todo][:5].tolist()} "
                   f"(K={spec.K}, n={spec.n}, T={spec.T}): use require_cycle=False or other sizes")


def to_dataset(data: TokenData) -> Dataset:
  """The engine's Dataset of a batch: X = E[tokens] (B,n,T,d), Y (B,n,T) 1.0 at the label,
  Z = E[query] (B,n,d), v = E (B,K,d)."""
  E, tokens, labels = (np.asarray(a) for a in data)
  X = np.take_along_axis(E[:, None, :, :], tokens[..., None], axis=2)        # (B,n,T,d)
  Y = (tokens == labels[..., None]).astype(E.dtype)
  return Dataset(X, Y, X[:, :, -1], E)


def validate(data: TokenData, where: str = "data") -> TokenData:
  """Shapes, finiteness, ids in range, distinct tokens, labels in their sequences: DataError."""
  E, tokens, labels = (np.asarray(a) for a in data)
  if E.ndim != 3:
    raise DataError(f"{where}: E must have shape (B, K, d), got {E.shape}")
  if tokens.ndim != 3 or tokens.shape[0] != E.shape[0]:
    raise DataError(f"{where}: tokens must have shape (B, n, T) with B = {E.shape[0]}, got {tokens.shape}")
  if labels.shape != tokens.shape[:2]:
    raise DataError(f"{where}: labels must have shape (B, n) = {tokens.shape[:2]}, got {labels.shape}")
  if E.shape[0] == 0:
    raise DataError(f"{where}: no data sets (B = 0)")
  for b in range(E.shape[0]):
    try:
      token_graph.check_data(E[b], tokens[b], labels[b], where=f"data set {b}")
    except ValueError as e:
      raise DataError(f"{where}: {e}") from None
  norms = np.linalg.norm(E, axis=-1)
  if np.any(norms == 0):
    raise DataError(f"{where}: E has an all-zero embedding (data set {int(np.argwhere(norms == 0)[0, 0])})")
  return TokenData(E.astype(np.float64), tokens.astype(np.int64), labels.astype(np.int64))


FIELDS = TokenData._fields


def load_npz(path: str | os.PathLike) -> TokenData:
  """Read next-token data sets from .npz: E (B,K,d), tokens (B,n,T) int, labels (B,n) int.
  Raises DataError naming the file and the problem."""
  path = os.fspath(path)
  if not os.path.exists(path):
    raise DataError(f"{path}: no such data file")
  try:
    with np.load(path, allow_pickle=False) as f:
      missing = [k for k in FIELDS if k not in f.files]
      if missing:
        raise DataError(f"{path}: missing array(s) {missing}; a next-token data file needs E (B,K,d), "
                        f"tokens (B,n,T) int and labels (B,n) int; found {sorted(f.files)}")
      arrays = data_lib.npz_arrays(f, FIELDS, path)
  except DataError:
    raise
  except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
    raise DataError(f"{path}: not a readable .npz data file ({type(e).__name__}: {e})") from e
  return validate(TokenData(**arrays), where=path)


def save_npz(path: str | os.PathLike, data: TokenData) -> None:
  results_io.write_npz(os.fspath(path), {k: np.asarray(v) for k, v in data._asdict().items()})


def take(data: TokenData, index) -> TokenData:
  return TokenData(*(np.asarray(a)[index] for a in data))
