"""Sequence-to-sequence and causal attention: data and SVMs (docs/science.md section 7).

Every position k of sequence i is a query z_ik = x_ik with its own label Y_ik
and target token alpha_ik. One data set is a ``data.Dataset`` with
  X (n, T, d) tokens, Y (n, T) labels in {-1, +1}, Z (n, T, d) = X (the queries),
  v head parameters (``(d,)`` for the linear head);
a batch adds a leading axis B. The models are ``model.MODELS["seq2seq"]`` and
``model.MODELS["causal"]`` (train them with ``TrainConfig(model="seq2seq")``).

The SVMs (host side: NumPy, SciPy NNLS, cvxpy; never traces JAX), for targets alpha (n,T):

  seq2seq:  minimize ||W||  s.t.  (x_{i,alpha_ik} - x_it)^T W z_ik >= 1  for all i, k, t != alpha_ik
  causal:   the same for t <= k, t != alpha_ik only, with alpha_ik <= k.

With w = vec(W) (row-major) the constraints are ONE matrix inequality A w >= 1,
rows vec((x_{i,alpha_ik} - x_it) z_ik^T), built by broadcasting
(``margin_matrix``) and solved by ``svm.solve_margin_program`` ("fro": NNLS,
exact, with the dual multipliers; "nuc": cvxpy). Causal position k = 0 attends
to itself only, so its softmax is the constant 1 whatever W: it has no
constraint (fewer than 2 allowed tokens), and it is left out of token
optimality too.

Results are ``svm.SVMResult`` objects whose per-constraint arrays
(support, margins, dual) have shape (n, T, T) indexed [i, k, t].
"""
from __future__ import annotations

import dataclasses
import os
import zipfile
from typing import Callable, Sequence

import numpy as np

from svmattn.data import datasets as data_lib
from svmattn.io import atomic_files as results_io
from svmattn.models import heads
from svmattn.svm import att_svm as svm_lib

MODES = ("seq2seq", "causal")
TIE_RTOL = 1e-12   # as analysis.metrics.TIE_RTOL


def _check_mode(mode: str) -> bool:
  """True for causal."""
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
  return mode == "causal"


# ----------------------------------------------------------------------------
# Data (device side)
# ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Seq2SeqSpec:
  """Sizes of generated seq2seq data sets (the same data serve seq2seq and causal).

  labels: "random" (uniform +-1 per position) or "positive" (all +1).
  """
  n: int = 4
  T: int = 5
  d: int = 20
  labels: str = "random"

  def validate(self) -> "Seq2SeqSpec":
    data_lib.check_sizes(self)
    return self


@data_lib.host_sampler
def unit_gaussian(spec: Seq2SeqSpec, seed: int, runs: np.ndarray, head: heads.Head,
                  dtype=np.float64) -> tuple[np.ndarray, ...]:
  """Seq2seq data sets (on the host, every run at once: ``data.datasets.host_sampler``): unit-normalized
  Gaussian tokens X (n,T,d), queries Z = X, labels Y (n,T) (+-1 uniform, or all +1), head
  parameters unit Gaussian. Run r draws from split(data key of r, 4) = (kx, kz, ky, kv): X from kx,
  the labels from ky, the head from kv (kz unused). (Numerics version 9; before, a compiled program
  per shape normalized the rows with XLA's norm, now ``data.datasets``' exact-sum norm.)"""
  n, T, d = spec.n, spec.T, spec.d
  fx, _, fy, fv = data_lib.flat_draws((n * T * d, 0, n * T, data_lib.head_size(head, d)), seed, runs, dtype)
  B = len(fx)
  X = data_lib.unit_rows_host(fx.reshape(B, n, T, d))
  dt = np.dtype(dtype)
  Y = np.ones((B, n, T), dt) if spec.labels == "positive" else np.where(fy.reshape(B, n, T), 1.0, -1.0).astype(dt)
  return X, Y, X, data_lib.flat_head(fv, head, d)


def generate(spec: Seq2SeqSpec, seed: int, runs: Sequence[int] | np.ndarray,
             head: heads.Head = heads.LINEAR, dtype=np.float64) -> data_lib.Dataset:
  """A batch of seq2seq data sets: entry b is run ``runs[b]`` of ``seed`` (leading axis B);
  drawn like ``data.generate`` (same run keys, bit-exact whatever the batch)."""
  return data_lib.generate(spec, seed, runs, head, sampler=unit_gaussian, dtype=dtype)


# ----------------------------------------------------------------------------
# Validation and files (host side)
# ----------------------------------------------------------------------------

def validate(data: data_lib.Dataset, batched: bool = True, where: str = "data") -> data_lib.Dataset:
  """Check a seq2seq data set; returns it as NumPy float arrays.

  batched: True for X (B,n,T,d), Y (B,n,T), Z (B,n,T,d), v (B,d) (or (B,d,d));
  False for the same without B. Raises data.DataError naming the field.
  """
  DataError = data_lib.DataError
  arrays = {}
  for name in data_lib.Dataset._fields:
    a = getattr(data, name)
    if a is None:
      raise DataError(f"{where}: array '{name}' is missing")
    a = np.asarray(a)
    if a.dtype.kind not in "fiu":
      raise DataError(f"{where}: array '{name}' must be numeric, got dtype {a.dtype}")
    arrays[name] = a
  X, Y, Z, v = (arrays[k] for k in data_lib.Dataset._fields)
  lead = 1 if batched else 0
  pre = (X.shape[0],) if batched and X.ndim else ()
  if X.ndim != 3 + lead:
    raise DataError(f"{where}: X must have shape {'(B, n, T, d)' if batched else '(n, T, d)'}, got {X.shape}")
  n, T, d = X.shape[lead:]
  if T < 2:
    raise DataError(f"{where}: X must have at least T=2 tokens per sequence, got T={T}")
  if min(n, d) < 1:
    raise DataError(f"{where}: X has an empty axis: {X.shape}")
  if Y.shape != pre + (n, T):
    raise DataError(f"{where}: seq2seq labels Y must have shape {pre + (n, T)} (one label per position) "
                    f"to match X {X.shape}, got {Y.shape}")
  if Z.shape != X.shape:
    raise DataError(f"{where}: seq2seq queries Z must have the shape of X {X.shape} (Z = X), got {Z.shape}")
  if v.shape not in (pre + (d,), pre + (d, d)):
    raise DataError(f"{where}: v must have shape {pre + (d,)} (or {pre + (d, d)} for a matrix head), "
                    f"got {v.shape}")
  if batched and pre and pre[0] < 1:
    raise DataError(f"{where}: holds no data set (X has shape {X.shape})")
  for name, a in arrays.items():
    if not np.all(np.isfinite(a)):
      bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
      raise DataError(f"{where}: array '{name}' has {bad} non-finite values (NaN or inf)")
  if not np.all(np.isin(Y, (-1.0, 1.0))):
    raise DataError(f"{where}: labels Y must be -1 or +1, got values {np.unique(Y)[:6].tolist()}")
  return data_lib.Dataset(*(a.astype(np.float64) if a.dtype.kind != "f" else a for a in (X, Y, Z, v)))


def save_npz(path: str | os.PathLike, data: data_lib.Dataset) -> None:
  """Write a batch of seq2seq data sets as .npz with arrays X, Y, Z, v (atomically)."""
  data = validate(data, batched=True, where=str(path))
  results_io.write_npz(path, data._asdict())


def load_npz(path: str | os.PathLike, dtype=np.float64) -> data_lib.Dataset:
  """Read seq2seq data sets: X (B,n,T,d), Y (B,n,T), v (B,d), and Z (B,n,T,d) (Z = X when absent).

  Raises data.DataError naming the file and the problem."""
  path = os.fspath(path)
  if not os.path.exists(path):
    raise data_lib.DataError(f"{path}: no such data file")
  try:
    with np.load(path, allow_pickle=False) as f:
      missing = [k for k in ("X", "Y", "v") if k not in f.files]
      if missing:
        raise data_lib.DataError(f"{path}: missing array(s) {missing}; a seq2seq data file needs X (B,n,T,d), "
                                 f"Y (B,n,T), v (B,d) and optionally Z (B,n,T,d); found {sorted(f.files)}")
      arrays = data_lib.npz_arrays(f, [k for k in f.files if k in data_lib.Dataset._fields], path)
  except data_lib.DataError:
    raise
  except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
    raise data_lib.DataError(f"{path}: not a readable .npz data file ({type(e).__name__}: {e})") from e
  arrays.setdefault("Z", arrays["X"])
  data = validate(data_lib.Dataset(**arrays), batched=True, where=path)
  data_lib.check_magnitudes(data._asdict(), dtype, path)
  return data_lib.Dataset(*(np.asarray(a, dtype) for a in data))


# ----------------------------------------------------------------------------
# Optimality
# ----------------------------------------------------------------------------

def allowed_tokens(K: int, T: int, mode: str) -> np.ndarray:
  """(K,T) bool: the tokens query k may attend to (all; t <= k when causal)."""
  causal = _check_mode(mode)
  allowed = np.ones((K, T), bool)
  return np.tril(allowed) if causal else allowed


def scored_positions(K: int, T: int, mode: str) -> np.ndarray:
  """(K,) bool: query positions with at least 2 allowed tokens (causal k = 0 has one)."""
  return allowed_tokens(K, T, mode).sum(-1) >= 2


def optimal_tokens(gamma: np.ndarray, mode: str = "seq2seq") -> np.ndarray:
  """opt_ik = argmax over allowed t of gamma_ikt: (..., n, K, T) -> (..., n, K)."""
  gamma = np.asarray(gamma, np.float64)
  allowed = allowed_tokens(gamma.shape[-2], gamma.shape[-1], mode)
  return np.argmax(np.where(allowed, gamma, -np.inf), axis=-1)


def selected_tokens(s: np.ndarray) -> np.ndarray:
  """alpha_hat_ik = argmax_t s_ikt: (..., n, K, T) -> (..., n, K)."""
  return np.argmax(np.asarray(s), axis=-1)


def selects_optimal(gamma: np.ndarray, alpha: np.ndarray, mode: str = "seq2seq") -> np.ndarray:
  """(..., n, K) bool: alpha_ik = opt_ik; True at causal k = 0 (nothing to select)."""
  opt = optimal_tokens(gamma, mode)
  return (np.asarray(alpha) == opt) | ~scored_positions(opt.shape[-1], np.shape(gamma)[-1], mode)


def convergence_type(gamma: np.ndarray, alpha_hat: np.ndarray, result: svm_lib.SVMResult,
                     mode: str = "seq2seq") -> str:
  """"tie" when some scored position's optimal token is not unique (``metrics.has_tie``
  over its allowed tokens); else "global" when alpha_hat = opt at every scored position;
  "local" when the SVM at alpha_hat is feasible and gamma_{ik,alpha_ik} > gamma_ikt for
  every support token t; "not-local" otherwise. gamma (n,K,T), alpha_hat (n,K), result:
  ``svm(..., alpha_hat)``."""
  gamma = np.asarray(gamma, np.float64)
  K, T = gamma.shape[-2], gamma.shape[-1]
  scored = scored_positions(K, T, mode)
  masked = np.where(allowed_tokens(K, T, mode), gamma, -np.inf)[..., scored, :]
  top = masked.max(-1, keepdims=True)
  if np.any(np.sum(masked >= top - TIE_RTOL * np.maximum(1.0, np.abs(top)), axis=-1) > 1):
    return "tie"
  if np.all(selects_optimal(gamma, alpha_hat, mode)):
    return "global"
  if not result.ok:
    return "not-local"
  top = np.take_along_axis(gamma, np.asarray(alpha_hat)[..., None], axis=-1)
  return "local" if bool(np.all((gamma < top) | ~result.support)) else "not-local"


# ----------------------------------------------------------------------------
# The SVMs (host side)
# ----------------------------------------------------------------------------

def _check_svm_inputs(X, alpha, Z, mode):
  causal = _check_mode(mode)
  X = np.asarray(X, dtype=np.float64)
  if X.ndim != 3:
    raise ValueError(f"seq2seq svm: X must have shape (n, T, d), got {X.shape}")
  n, T, d = X.shape
  Z = X if Z is None else np.asarray(Z, dtype=np.float64)
  if Z.ndim != 3 or Z.shape[0] != n or Z.shape[2] != d:
    raise ValueError(f"seq2seq svm: Z must have shape (n, K, d) with n={n}, d={d}, got {Z.shape}")
  K = Z.shape[1]
  alpha = np.asarray(alpha)
  if alpha.shape != (n, K):
    raise ValueError(f"seq2seq svm: alpha must have shape (n, K) = {(n, K)}, got {alpha.shape}")
  if alpha.dtype.kind not in "iu" and not np.all(alpha == np.round(alpha)):
    raise ValueError(f"seq2seq svm: alpha must hold integer token indices, got {alpha}")
  alpha = alpha.astype(np.int64)
  if np.any(alpha < 0) or np.any(alpha >= T):
    raise ValueError(f"seq2seq svm: alpha entries must be in [0, T={T}), got {alpha.tolist()}")
  if causal and np.any(alpha > np.arange(K)[None, :]):
    raise ValueError(f"causal svm: alpha_ik must be <= k (a visible token), got {alpha.tolist()}")
  if not (np.all(np.isfinite(X)) and np.all(np.isfinite(Z))):
    raise ValueError("seq2seq svm: X and Z must be finite (found NaN or inf)")
  return X, Z, alpha


def constraint_mask(alpha: np.ndarray, T: int, mode: str = "seq2seq") -> np.ndarray:
  """(n,K,T) bool: the (i, k, t) with a constraint: t != alpha_ik, and t <= k with
  k >= 1 when causal (positions with fewer than 2 allowed tokens have none)."""
  alpha = np.asarray(alpha)
  K = alpha.shape[-1]
  allowed = allowed_tokens(K, T, mode) & scored_positions(K, T, mode)[:, None]   # (K,T)
  return allowed[None] & (np.arange(T) != alpha[..., None])


def margin_matrix(X: np.ndarray, alpha: np.ndarray, Z: np.ndarray | None = None,
                  mode: str = "seq2seq") -> tuple[np.ndarray, np.ndarray]:
  """Rows vec((x_{i,alpha_ik} - x_it) z_ik^T) of the constraints A vec(W) >= 1, by broadcasting.

  X (n,T,d), alpha (n,K), Z (n,K,d) (default X). Returns (A (N, d*d), keep (n,K,T) bool)
  with the rows in the order of keep's True entries (row-major over i, k, t).
  """
  X, Z, alpha = _check_svm_inputs(X, alpha, Z, mode)
  n, T, d = X.shape
  target = np.take_along_axis(X, alpha[..., None], axis=1)        # (n,K,d) x_{i,alpha_ik}
  diff = target[:, :, None, :] - X[:, None, :, :]                 # (n,K,T,d)
  keep = constraint_mask(alpha, T, mode)
  rows = np.einsum("nktd,nke->nktde", diff, Z)[keep]              # (N,d,d)
  return rows.reshape(rows.shape[0], d * d), keep


def svm(X: np.ndarray, alpha: np.ndarray, norm: str = "fro", solver: str | None = None,
        mode: str = "seq2seq", Z: np.ndarray | None = None,
        support_tol: float | None = None) -> svm_lib.SVMResult:
  """The seq2seq (mode="seq2seq") or causal (mode="causal") attention SVM of one data set.

  X (n,T,d); alpha (n,K) target tokens; Z (n,K,d) queries (default X).
  norm "fro" (solver "nnls", exact, with duals) or "nuc" (cvxpy "SCS" / "CLARABEL").
  Returns an svm.SVMResult; support, margins (NaN where no constraint) and dual are
  (n,K,T) indexed [i,k,t]; status "optimal" / "infeasible" / "failed" (never raised).
  """
  if norm not in svm_lib.NORMS:
    raise ValueError(f"unknown SVM norm {norm!r}; use one of {svm_lib.NORMS}")
  solver = solver or svm_lib.DEFAULT_SOLVER[norm]
  A, keep = margin_matrix(X, alpha, Z, mode)
  d = np.shape(X)[-1]
  status, W, dual, msg = svm_lib.solve_margin_program(A, d, norm, solver)
  tol = support_tol if support_tol is not None else svm_lib.SUPPORT_TOL.get(
      solver if solver == "nnls" else solver.upper(), 1e-5)
  support = np.zeros(keep.shape, bool)
  if status != "optimal":
    return svm_lib.SVMResult(status, None, support, None, None, float("nan"), norm, solver, msg)
  margins = np.full(keep.shape, np.nan)
  margins[keep] = A @ W.reshape(-1)
  support[keep] = margins[keep] - 1 <= tol
  full_dual = None
  if dual is not None:
    full_dual = np.zeros(keep.shape)
    full_dual[keep] = dual
  objective = float(np.linalg.norm(W, "nuc" if norm == "nuc" else "fro"))
  return svm_lib.SVMResult(status, W, support, margins, full_dual, objective, norm, solver, msg)


def svm_batch(X, alpha, norm: str = "fro", solver: str | None = None, mode: str = "seq2seq",
              Z=None, progress: Callable[[int], None] | None = None) -> list[svm_lib.SVMResult]:
  """``svm`` for each of B data sets: X (B,n,T,d), alpha (B,n,K), Z (B,n,K,d) or None."""
  out = []
  for b in range(len(X)):
    out.append(svm(X[b], alpha[b], norm, solver, mode, None if Z is None else Z[b]))
    if progress is not None:
      progress(1)
  return out
