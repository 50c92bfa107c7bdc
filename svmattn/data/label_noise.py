"""E17's data sets (docs/science.md section 21; Sakamoto & Sato 2024): a relevant token, weakly
relevant tokens, Gaussian noise tokens and flipped labels.

For run r of seed s, the key ``rng.run_key(s, r)`` is split in four: tokens, labels, flips and the
test set (its own key: the training draw does not depend on ``test_n``). With mu_{+1} = s e_1 and
mu_{-1} = s e_2 (s the signal norm):

  x_it ~ N(0, I_d) for every token (not unit norm);  y_i = +1 or -1 with probability 1/2;
  token 0 (the relevant token) += mu_{y_i};  token 1 += rho mu_{y_i};  token 2 += rho mu_{-y_i};
  ceil(eta n) of the n training labels, a uniformly random subset, are flipped (Y is what training
  sees, Y_clean the labels before the flips); the test labels are clean.

The fixed head is nu = (mu_1 - mu_2) / ||mu_1 - mu_2|| / s = (e_1 - e_2) / (sqrt(2) s), the public
code's (keitaroskmt/benign-attention, main.py) scale. Z (the query) is zero: prompt attention does
not read it.
"""
from __future__ import annotations

import math

import numpy as np

from svmattn import rng

RELEVANT = 0          # the token that carries the class signal (``relevant_tokens``)


def _keys(seed: int, runs) -> np.ndarray:
  return rng.split_keys(rng.run_keys(seed, runs), 4)          # (B, 4, 2): tokens, labels, flips, test


def _tokens(keys, labels: np.ndarray, T: int, d: int, signal: float, rho: float) -> np.ndarray:
  B, n = labels.shape
  X = rng.normals(keys, n * T * d).reshape(B, n, T, d)
  plus = labels > 0
  own = np.where(plus, 0, 1)            # mu_y's coordinate: e_1 for +1, e_2 for -1
  other = 1 - own
  b, i = np.meshgrid(np.arange(B), np.arange(n), indexing="ij")
  X[b, i, 0, own] += signal
  if T > 1:
    X[b, i, 1, own] += rho * signal
  if T > 2:
    X[b, i, 2, other] += rho * signal
  return X


def head(d: int, signal: float) -> np.ndarray:
  """nu (d,): (e_1 - e_2) / (sqrt(2) s)."""
  v = np.zeros(d)
  v[0], v[1] = 1.0, -1.0
  return v / (math.sqrt(2.0) * signal)


def flipped_count(n: int, eta: float) -> int:
  """ceil(eta n) labels flipped (the public code's count; at most n)."""
  return min(n, int(math.ceil(n * eta - 1e-12)))


def train(seed: int, runs, n: int, T: int, d: int, signal: float, rho: float, eta: float) -> dict:
  """The training sets of ``runs``: X (B,n,T,d), Y (B,n) (flipped), Y_clean, flipped (B,n) bool,
  relevant_tokens (B,n) (all RELEVANT), Z (B,n,d) zero, v (B,d) the head."""
  runs = np.asarray(runs).reshape(-1)
  keys = _keys(seed, runs)
  B = len(runs)
  clean = np.where(rng.coin_flips(keys[:, 1], n), 1.0, -1.0)
  X = _tokens(keys[:, 0], clean, T, d, signal, rho)
  order = rng.permutations(keys[:, 2], n)
  flipped = np.zeros((B, n), bool)
  np.put_along_axis(flipped, order[:, :flipped_count(n, eta)], True, axis=1)
  Y = np.where(flipped, -clean, clean)
  return {"X": X, "Y": Y, "Y_clean": clean, "flipped": flipped,
          "relevant_tokens": np.full((B, n), RELEVANT, np.int64), "Z": np.zeros((B, n, d)),
          "v": np.tile(head(d, signal), (B, 1))}


def test(seed: int, run: int, size: int, T: int, d: int, signal: float, rho: float) -> tuple[np.ndarray, np.ndarray]:
  """(X_test (size,T,d), Y_test (size,)) of one run: clean labels, from the run's test key."""
  k = rng.split_keys(_keys(seed, [run])[:, 3], 2)                   # (1, 2, 2)
  y = np.where(rng.coin_flips(k[:, 1], size), 1.0, -1.0)
  return _tokens(k[:, 0], y, T, d, signal, rho)[0], y[0]
