"""Predictions, accuracy and loss of trained models on any sequences (host side, NumPy, float64).

Prompt attention (docs/science.md section 21): f(X) = sum_t softmax(X p)_t v^T x_t. The
max-margin direction as a predictor is the limit of f along R p as R grows: all the attention on
argmax_t x_t^T p (``hard_attention``), which is what a large norm heads to (ties aside).
"""
from __future__ import annotations

import numpy as np


def prompt(P: np.ndarray, v: np.ndarray, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(f (S, m), s (S, m, T)) of the prompts P (S, d) with head v (d,) on sequences X (m, T, d)."""
  P, v, X = (np.asarray(a, np.float64) for a in (P, v, X))
  m, T, d = X.shape
  logits = (X.reshape(m * T, d) @ P.T).T.reshape(len(P), m, T)
  logits -= logits.max(axis=-1, keepdims=True)
  s = np.exp(logits)
  s /= s.sum(axis=-1, keepdims=True)
  return np.einsum("smt,mt->sm", s, X @ v), s


def single_query(W: np.ndarray, v: np.ndarray, X: np.ndarray, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(f (m,), s (m,T)) of one model W (d, d) (K Q^T for (K,Q)) with a linear head v on sequences X
  (m,T,d) and queries Z (m,d): s_i = softmax(X_i W z_i), f_i = v^T X_i^T s_i."""
  logits = np.einsum("mtd,md->mt", X, Z @ W.T)
  logits = logits - logits.max(axis=-1, keepdims=True)
  s = np.exp(logits)
  s /= s.sum(axis=-1, keepdims=True)
  return np.einsum("mt,mtd->md", s, X) @ v, s


def hard_single_query(W: np.ndarray, v: np.ndarray, X: np.ndarray, Z: np.ndarray) -> np.ndarray:
  """f (m,): v^T x_{i,t*} at t* = argmax_t x_it^T W z_i, the limit of ``single_query`` along R W (the
  Att-SVM direction as a predictor); NaN where W is not finite (no solution)."""
  if not np.all(np.isfinite(W)):
    return np.full(len(X), np.nan)
  token = np.argmax(np.einsum("mtd,md->mt", X, Z @ W.T), axis=-1)
  return np.take_along_axis(X @ v, token[:, None], axis=-1)[:, 0]


def hard_attention(p: np.ndarray, v: np.ndarray, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(f (m,), token (m,)): v^T x_{i,t*} at t* = argmax_t x_it^T p, the limit of ``prompt`` along R p."""
  X = np.asarray(X, np.float64)
  token = np.argmax(X @ np.asarray(p, np.float64), axis=-1)
  return np.take_along_axis(X @ np.asarray(v, np.float64), token[:, None], axis=-1)[:, 0], token


def accuracy(f: np.ndarray, y: np.ndarray) -> np.ndarray:
  """mean_i 1[y_i f_i > 0] over the last axis."""
  return np.mean(np.asarray(y) * np.asarray(f) > 0, axis=-1)


def logistic_loss(f: np.ndarray, y: np.ndarray) -> np.ndarray:
  """mean_i log(1 + exp(-y_i f_i)) over the last axis (without overflow)."""
  return np.mean(np.logaddexp(0.0, -np.asarray(y) * np.asarray(f)), axis=-1)
