"""``train.loop.train`` for the configurations of the native CPU kernel, without XLA programs.

Where the native kernel runs (``block_kernel.uses_native``) and the starting parameters are drawn
on the host (``host_init``), a training chunk is one call of the kernel's C entry point
(``native_kernel.run_chunk_rows``) per device's share of the batch, on the NumPy arrays as the engine
holds them (the data sets first: the kernel reads and writes them in place, with no transposes
around the call, and writes the observations straight into the snapshots), the shares on threads
(the call releases the GIL). Nothing is compiled per
shape: XLA compiled a wrapper program around the kernel for every shape and chunk length (0.2 to
0.5 s each; about 40 in E4), which an empty compilation cache paid again on every run.

The kernel computes every data set on its own lane with the same operations in the same order,
so a data set's trajectory does not depend on the batch, its share or the number of shares:
resume, replay, any batch size and any device count stay bit for bit the same. The loss of an
observation is mean_i l(Y_i f_i) + lam ||W||^2 from the kernel's predictions f, computed here in
NumPy (the sum over the sequences in index order), as the XLA wrapper computed it in its program
up to the rounding of l (numerics version 6).

The seq2seq and causal models (docs/science.md section 7) with the linear head train here too
(numerics version 18): every query z_ik becomes a sequence of its own with the tokens X_i and the
label Y_ik (``_as_queries``), and with causal attention the kernel lets query k see the tokens
t <= k only. Their final attention comes back as (B, n, K, T).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import time

import jax
import numpy as np

from svmattn.train import block_kernel
from svmattn.train import chunks
from svmattn.train import host_init
from svmattn.train import native_kernel

# l(u) of models.losses in NumPy (the recorded loss only: the kernel differentiates its own l')
LOSSES = {
    "logistic": lambda u: np.logaddexp(0.0, -u),
    "exponential": lambda u: np.exp(-u),
    "correlation": lambda u: -u,
}


SEQ_MODELS = ("seq2seq", "causal")


def supports(config, dtype) -> bool:
  """True when ``train`` runs ``config`` here: the native kernel's case with a host-drawn start; the
  seq2seq and causal models (docs/science.md section 7) with the linear head too, each query a
  sequence of its own (``_as_queries``)."""
  if config.model in SEQ_MODELS:
    if config.head != "linear":
      return False
    config = dataclasses.replace(config, model="single_query")
  return (block_kernel.supports(config) and block_kernel.uses_native(config, dtype)
          and host_init.supports(config) and not config.train_head)


def _as_queries(data, causal: bool):
  """A seq2seq batch (X (B,n,T,d), Z (B,n,K,d), Y (B,n,K)) as the single-query batch the kernel
  trains: sequence (i, k) is query z_ik with the tokens X_i and the label Y_ik, n K sequences in
  the order of (i, k), so the objective's mean over (i, k) is the mean over them. With causal
  attention the kernel lets query k see the tokens t <= k only (``run_chunk_rows``' causal=K)."""
  B, n, T, d = data.X.shape
  K = data.Z.shape[2]
  if data.Z.shape != (B, n, K, d) or np.shape(data.Y) != (B, n, K):
    raise ValueError(f"train: a seq2seq batch needs Z (B,n,K,d) and Y (B,n,K), got Z {data.Z.shape} and Y "
                     f"{np.shape(data.Y)} for X of shape {data.X.shape}")
  if causal and K > T:
    raise ValueError(f"train: causal attention needs K <= T queries per sequence, got K={K}, T={T}")
  X = np.repeat(np.asarray(data.X, np.float64), K, axis=1)               # (B, nK, T, d)
  return data._replace(X=X, Z=np.asarray(data.Z).reshape(B, n * K, d), Y=np.asarray(data.Y).reshape(B, n * K)), K


def _loss(name: str, Y: np.ndarray, f: np.ndarray, lam: float, ridge_sum: np.ndarray) -> np.ndarray:
  """(b, S) mean_i l(Y_i f_i) (+ lam ridge_sum) of predictions f (b, S, n), labels Y (b, n)."""
  with np.errstate(invalid="ignore", over="ignore"):   # a diverged run's loss is NaN or inf, as in XLA
    ell = LOSSES[name](Y[:, None] * f)
    total = ell[..., 0]
    for i in range(1, ell.shape[-1]):          # in index order, whatever the shape
      total = total + ell[..., i]
    loss = total / ell.shape[-1]
    return loss + lam * ridge_sum if lam else loss


def _check_shapes(state, shapes, data, relu: bool) -> None:
  """ValueError naming the first array whose shape does not match the batch's (the kernel reads
  and writes by these sizes)."""
  B, n, T, d = data.X.shape
  want = {"Y": (B, n), "Z": (B, n, d), "v": (B, d, d) if relu else (B, d)}
  for name, shape in want.items():
    if np.shape(getattr(data, name)) != shape:
      raise ValueError(f"train: data.{name} has shape {np.shape(getattr(data, name))}, expected {shape} "
                       f"for X of shape {data.X.shape}")
  for (path, leaf), ref in zip(jax.tree_util.tree_leaves_with_path(state), jax.tree_util.tree_leaves(shapes)):
    if np.shape(leaf) != ref.shape:
      raise ValueError(f"train: the starting state's {jax.tree_util.keystr(path)} has shape {np.shape(leaf)}, "
                       f"expected {ref.shape}")


class _Share:
  """One device's share of the batch: runs lo..hi-1."""

  def __init__(self, lo: int, hi: int):
    self.lo, self.hi = lo, hi


def train(config, trainer, data, keys, progress, checkpoints, start, mesh, opt_init) -> chunks.Trajectory:
  """``train.loop.train``'s result for ``supports(config)``: its chunks (``chunks.run_chunks``), each
  a call of the native kernel per device's share of the batch; ``opt_init`` the optimizer's
  starting state of a batch of parameters."""
  param, lam, normalize = block_kernel._settings(config)
  relu = config.head == "relu"
  seq_shape, causal = None, 0
  if config.model in SEQ_MODELS:                 # every query a sequence of its own
    seq_shape = data.Z.shape[1:3]                # (n, K)
    data, K = _as_queries(data, config.model == "causal")
    causal = K if config.model == "causal" else 0
  B = data.X.shape[0]
  _, plan, steps = chunks.plan_from(config, start)

  t0 = time.perf_counter()
  shapes = jax.eval_shape(jax.vmap(trainer.init_one), keys, data)
  if start is None:
    params = host_init.init_params_of(config, keys, data)
    state = chunks.State(params, jax.tree_util.tree_map(np.asarray, jax.device_get(opt_init(params))))
  else:
    state = jax.tree_util.tree_map(np.asarray, start[1])
  d = data.X.shape[-1]
  snaps = {"W": np.zeros((B, len(steps), d, d)), "max_prob": np.zeros((B, len(steps))),
           "loss": np.zeros((B, len(steps)))}
  begin = 0
  found = chunks.restore_chunk(checkpoints, shapes, snaps)
  if found is not None:
    begin, state, snaps = found
  _check_shapes(state, shapes, data, relu)
  count = min(mesh.size, B)
  bounds = np.linspace(0, B, count + 1).round().astype(int)
  shares = [_Share(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]
  names = sorted(state.params)
  kernel_names = ("W",) if param.name == "W" else ("K", "Q")
  # the parameters, trained in place: those drawn here as they are, a copy of a caller's start or of
  # a checkpoint's (left as they were)
  drawn = start is None and found is None
  held = {k: np.require(state.params[k], np.float64, ["C", "W"]) if drawn
          else np.array(state.params[k], np.float64, order="C", copy=True) for k in names}
  X, Z, Y, head = (np.ascontiguousarray(a, np.float64) for a in (data.X, data.Z, data.Y, data.v))
  compile_seconds = time.perf_counter() - t0

  t0 = time.perf_counter()
  runs = plan or [(1, 0)]           # no step to take: one chunk of no snapshot (initial state, attention)
  attention = np.zeros(data.X.shape[:2] + data.X.shape[2:3]) if begin < len(runs) else None   # (B, n, T)
  pool = concurrent.futures.ThreadPoolExecutor(len(shares)) if len(shares) > 1 else None

  def step(chunk, every, k, pos, observe_start):
    first = pos - 1 if observe_start else pos      # (the start's observation: snapshot 0)

    def run(j):
      rows = slice(shares[j].lo, shares[j].hi)
      S = pos + k - first
      f, ridge_sum = np.empty((rows.stop - rows.start, S, Y.shape[1])), np.empty((rows.stop - rows.start, S))
      obs = {"W": snaps["W"][rows, first:pos + k], "f": f, "max_prob": snaps["max_prob"][rows, first:pos + k],
             "ridge_sum": ridge_sum, "attention": attention[rows]}
      params = [held[name][rows] for name in kernel_names]
      native_kernel.run_chunk_rows(
          params, X[rows], Z[rows], Y[rows], head[rows], params, obs, param=param.name, lr=config.lr,
          ridge=lam or 0.0, every=every, snapshots=k, start=observe_start, loss=config.loss,
          normalized=normalize, head=config.head, authors=config.numerics == "authors", causal=causal)
      snaps["loss"][rows, first:pos + k] = _loss(config.loss, Y[rows], f, lam, ridge_sum)

    if pool:
      list(pool.map(run, range(len(shares))))
    else:
      run(0)

  try:
    chunks.run_chunks(plan, begin, snaps, step, lambda: _state(state, held), checkpoints, progress)
  finally:
    if pool is not None:
      pool.shutdown()
  state = _state(state, held)
  if seq_shape is not None and attention is not None:
    attention = attention.reshape(B, *seq_shape, attention.shape[-1])   # (B, n, K, T)
  return chunks.Trajectory(steps, snaps["W"], snaps["max_prob"], snaps["loss"], attention, state.params,
                           compile_seconds, time.perf_counter() - t0)


def _state(state, held: dict):
  """``state`` with the parameters trained so far."""
  return state._replace(params={**state.params, **held})
