"""Attention models: parameterizations of the key-query matrix, attention, loss.

Every function here takes ONE data set (X (n,T,d), Y (n,), Z (n,d), head
parameters v); callers vmap over data sets.

  W-parameterization:    params {"W": (d,d)}
  (K,Q)-parameterization: params {"K": (d,m), "Q": (d,m)}, W = K Q^T

  s_i = softmax(X_i W z_i),  r_i = X_i^T s_i,  f_i = h(r_i),
  L = (1/n) sum_i l(Y_i f_i) + ridge * sum_p ||p||_F^2.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from svmattn import rng
from svmattn.models import heads
from svmattn.models import losses as losses_lib

Params = dict[str, jax.Array]

# The (K,Q) ridge of the authors' experiments: float64 machine epsilon.
KQ_RIDGE = 2.220446049250313e-16

INIT_SCHEMES = ("uniform", "zero", "normal")


class Parameterization(NamedTuple):
  """How the parameters make W, how they are initialized, which SVM norm they
  are biased toward (docs/science.md sections 3-4), and their default ridge."""
  name: str
  init: Callable[..., Params]      # init(key, d, m, dtype, scheme) -> params
  to_W: Callable[[Params], jax.Array]
  svm_norm: str                    # "fro" or "nuc"
  ridge: float


def _check_scheme(scheme):
  if scheme not in INIT_SCHEMES:
    raise ValueError(f"unknown init scheme {scheme!r}; known: {INIT_SCHEMES}")


def _init_w(key, d, m, dtype, scheme="uniform"):
  """uniform: W ~ U(-1/sqrt(d), 1/sqrt(d)) entrywise (a default dense layer); zero: W = 0;
  normal: W ~ N(0, 1) entrywise (the l_p mirror-descent paper's start).

  Random draws are made in float64 and rounded to dtype, so a float32 run starts
  where the float64 run of the same key starts (as the data sets do)."""
  _check_scheme(scheme)
  if scheme == "zero":
    return {"W": jnp.zeros((d, d), dtype)}
  if scheme == "normal":
    return {"W": rng.normal(key, (d, d), jnp.float64).astype(dtype)}
  b = 1.0 / jnp.sqrt(d)
  return {"W": rng.uniform(key, (d, d), jnp.float64, -b, b).astype(dtype)}


def _init_kq(key, d, m, dtype, scheme="uniform"):
  """uniform: K, Q ~ U(-1/sqrt(d), 1/sqrt(d)); zero: Q = 0, K = 0.1 N(0,1) (E1); normal: K, Q ~ N(0,1).

  Drawn in float64 and rounded to dtype (see ``_init_w``)."""
  _check_scheme(scheme)
  kk, kq = jax.random.split(key)
  if scheme == "zero":
    return {"K": (0.1 * rng.normal(kk, (d, m), jnp.float64)).astype(dtype), "Q": jnp.zeros((d, m), dtype)}
  if scheme == "normal":
    return {"K": rng.normal(kk, (d, m), jnp.float64).astype(dtype), "Q": rng.normal(kq, (d, m), jnp.float64).astype(dtype)}
  b = 1.0 / jnp.sqrt(d)
  return {"K": rng.uniform(kk, (d, m), jnp.float64, -b, b).astype(dtype),
          "Q": rng.uniform(kq, (d, m), jnp.float64, -b, b).astype(dtype)}


def _init_p(key, d, m, dtype, scheme="uniform"):
  """The prompt p (d,) of prompt attention: uniform U(-1/sqrt(d), 1/sqrt(d)), zero or N(0,1)."""
  _check_scheme(scheme)
  if scheme == "zero":
    return {"p": jnp.zeros((d,), dtype)}
  if scheme == "normal":
    return {"p": rng.normal(key, (d,), jnp.float64).astype(dtype)}
  b = 1.0 / jnp.sqrt(d)
  return {"p": rng.uniform(key, (d,), jnp.float64, -b, b).astype(dtype)}


W_PARAM = Parameterization("W", _init_w, lambda p: p["W"], "fro", 0.0)
KQ_PARAM = Parameterization("KQ", _init_kq, lambda p: p["K"] @ p["Q"].T, "nuc", KQ_RIDGE)
# Prompt attention (Tarzanagh, Li, Zhang, Oymak 2023, arXiv 2306.13596): s_i = softmax(X_i W p) with W = I
# and a trainable prompt p (d,) shared by the sequences; "W" of this parameterization is p itself (d,).
P_PARAM = Parameterization("p", _init_p, lambda p: p["p"], "fro", 0.0)

PARAMETERIZATIONS = {"W": W_PARAM, "KQ": KQ_PARAM, "p": P_PARAM}
# Parameters that are not attention weights: a trained head (``with_head``); no ridge on them.
HEAD_KEY = "v"


def scaled(params, scale: float):
  """The initialization ``params`` (a mapping, or a flax module's tree) times ``scale`` (``--init_scale``),
  in the parameters' own dtype; the same object where ``scale`` is 1 (today's starts, bit for bit)."""
  if scale == 1:
    return params
  return jax.tree_util.tree_map(lambda a: (a * scale).astype(a.dtype), params)


def get_parameterization(name: str) -> Parameterization:
  if name not in PARAMETERIZATIONS:
    raise ValueError(f"unknown parameterization {name!r}; known: {sorted(PARAMETERIZATIONS)}")
  return PARAMETERIZATIONS[name]


def attention_logits(W: jax.Array, X: jax.Array, Z: jax.Array) -> jax.Array:
  """x_it^T W z_i for one data set: (n,T)."""
  return jnp.einsum("ntd,nd->nt", X, Z @ W.T)


def attention(W: jax.Array, X: jax.Array, Z: jax.Array) -> jax.Array:
  """Softmax attention s_i = softmax(X_i W z_i): (n,T)."""
  return jax.nn.softmax(attention_logits(W, X, Z), axis=-1)


def pooled_token(s: jax.Array, X: jax.Array) -> jax.Array:
  """r_i = X_i^T s_i, computed as x_{i,ref} + sum_t s_it (x_it - x_{i,ref}), ref = argmax_t s_it.

  Equal to X^T s in exact arithmetic, but accurate when the softmax saturates:
  X^T s - x_ref would be pure rounding (1e-16) once the other probabilities fall
  below machine epsilon, and its gradient would then point along x_ref z^T
  instead of the max-margin direction. The differences x_it - x_ref are exact.
  """
  ref = jax.lax.stop_gradient(jnp.argmax(s, axis=-1))
  x_ref = jnp.take_along_axis(X, ref[:, None, None], axis=1)        # (n, 1, d)
  return x_ref[:, 0] + jnp.einsum("nt,ntd->nd", s, X - x_ref)


def pooled_token_plain(s: jax.Array, X: jax.Array) -> jax.Array:
  """r_i = X_i^T s_i as written (the authors' numerics): loses the gradient to rounding once
  the softmax saturates (see ``pooled_token``)."""
  return jnp.einsum("nt,ntd->nd", s, X)


NUMERICS = ("exact", "authors")
POOLING = {"exact": pooled_token, "authors": pooled_token_plain}


def get_pooling(numerics: str) -> Callable:
  """The pooled token of ``numerics``: "exact" (``pooled_token``) or "authors" (X^T s)."""
  if numerics not in POOLING:
    raise ValueError(f"numerics must be one of {NUMERICS}, got {numerics!r}")
  return POOLING[numerics]


def predict(head: heads.Head, W, X, Z, v, pool=pooled_token) -> tuple[jax.Array, jax.Array]:
  """(f (n,), s (n,T)): predictions and attention of one data set."""
  s = attention(W, X, Z)
  r = pool(s, X)
  f = jax.vmap(head.apply, (None, 0))(v, r)
  return f, s


def predict_single_query(head: heads.Head, W, data, pool=pooled_token) -> tuple[jax.Array, jax.Array]:
  """One query per sequence (cross- or self-attention): f (n,), s (n,T); labels Y (n,)."""
  return predict(head, W, data.X, data.Z, data.v, pool)


# A model maps (head, W, one data set, pool=pooled token function) to (predictions f,
# attention s) with f of the shape of data.Y and s (..., T); new architectures are new entries.
MODELS: dict[str, Callable] = {"single_query": predict_single_query}


def predict_prompt(head: heads.Head, p, data, pool=pooled_token) -> tuple[jax.Array, jax.Array]:
  """Prompt attention: s_i = softmax(X_i p) with the prompt p (d,) (data.Z is not used): f (n,), s (n,T)."""
  s = jax.nn.softmax(jnp.einsum("ntd,d->nt", data.X, p), axis=-1)
  f = jax.vmap(head.apply, (None, 0))(data.v, pool(s, data.X))
  return f, s


MODELS["prompt"] = predict_prompt


def next_token_log_mass(W, data) -> tuple[jax.Array, jax.Array]:
  """Next-token prediction (docs/science.md section 12), one data set: X (n,T,d) the embeddings of
  the sequence's tokens, Z (n,d) the query's (the last token's), Y (n,T) 1.0 at the positions
  holding the label. The query attends over all T positions, itself included; the prediction
  for a token is the attention mass on the positions holding it. Returns (log of the label's
  mass (n,), attention s (n,T)), the log mass computed as a difference of log-sum-exps (exact
  when the softmax saturates)."""
  logits = attention_logits(W, data.X, data.Z)
  on = data.Y > 0
  top = jax.nn.logsumexp(jnp.where(on, logits, -jnp.inf), axis=-1)
  return top - jax.nn.logsumexp(logits, axis=-1), jax.nn.softmax(logits, axis=-1)


def predict_next_token(head: heads.Head, W, data, pool=pooled_token) -> tuple[jax.Array, jax.Array]:
  """f (n,) = log of the label's attention mass (the head is not used), s (n,T). Objective -mean f."""
  del head, pool
  return next_token_log_mass(W, data)


def predict_next_token_lsq(head: heads.Head, W, data, pool=pooled_token) -> tuple[jax.Array, jax.Array]:
  """The public code's local next-token setting: the pooled token r_i = X_i^T s_i is read out by
  the vocabulary, p_i = softmax(E r_i) over the K tokens (data.v = E (K,d)), and f (n,) is the
  label's probability p_iy (y's embedding: the token at the label's position). Objective
  mean (1 - f)^2 (non-convex: local minima exist)."""
  del head
  s = attention(W, data.X, data.Z)
  r = pool(s, data.X)                                           # (n,d)
  e_y = jnp.einsum("nt,ntd->nd", data.Y, data.X) / jnp.sum(data.Y, axis=-1, keepdims=True)
  logits = r @ data.v.T                                         # (n,K)
  f = jnp.exp(jnp.sum(r * e_y, axis=-1) - jax.nn.logsumexp(logits, axis=-1))
  return f, s


MODELS["next_token"] = predict_next_token
MODELS["next_token_lsq"] = predict_next_token_lsq
# Models whose objective is their own (not ell(Y f)): the mean over sequences of this function of f.
MODEL_OBJECTIVES: dict[str, Callable] = {"next_token": lambda f: -f, "next_token_lsq": lambda f: (1.0 - f) ** 2}


def with_head(params: Params, data):
  """The data set with the trained head params["v"] in place of data.v (joint training), else as is."""
  return data._replace(v=params[HEAD_KEY]) if HEAD_KEY in params else data


def attention_params(params: Params) -> Params:
  """The attention weights of params (without a trained head)."""
  return {k: v for k, v in params.items() if k != HEAD_KEY}


def get_model(name: str) -> Callable:
  if name not in MODELS:
    raise ValueError(f"unknown model {name!r}; known models: {sorted(MODELS)}")
  return MODELS[name]


def _log_rest(logits: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(log s of the non-top tokens, -inf at the top one; the top one-hot mask) of softmax(logits)
  over its last axis (see ``make_loss``, loss_scale="auto")."""
  ls = jax.nn.log_softmax(logits, axis=-1)
  top = jax.nn.one_hot(jax.lax.stop_gradient(jnp.argmax(logits, axis=-1)), logits.shape[-1], dtype=bool)
  return jnp.where(top, -jnp.inf, ls), top


def auto_shift(logits: jax.Array) -> jax.Array:
  """loss_scale="auto"'s shift c = -max log s_it over the non-top tokens of every row of
  softmax(logits) (no gradient; +inf when no row has a non-top token, see ``auto_softmax``)."""
  return -jnp.max(jax.lax.stop_gradient(_log_rest(logits)[0]))


def auto_softmax(logits: jax.Array, c: jax.Array) -> jax.Array:
  """softmax(logits) over the last axis with the derivative exp(c) ds, computed in log space
  (loss_scale="auto", see ``make_loss``); a non-finite c (no non-top token anywhere) is 0."""
  sg = jax.lax.stop_gradient
  rest, top = _log_rest(logits)                                          # log s of non-top tokens
  c = jnp.where(jnp.isfinite(c), c, 0.0)
  q = jnp.exp(rest + c)                                                  # exp(c) s_it, t != top (0 at top)
  q = q - top * jnp.sum(q, axis=-1, keepdims=True)                       # top: -sum of the others
  return sg(jax.nn.softmax(logits, axis=-1)) + (q - sg(q))              # value s, derivative exp(c) ds


def check_loss_scale(loss_scale) -> None:
  """ValueError unless ``loss_scale`` is a positive finite number or "auto"."""
  if isinstance(loss_scale, str):
    ok = loss_scale == "auto"
  else:
    try:
      ok = 0 < float(loss_scale) < float("inf")
    except (TypeError, ValueError):
      ok = False
  if not ok:
    raise ValueError(f"loss_scale must be a positive finite number or 'auto', got {loss_scale!r}")


def make_loss(param: Parameterization, head: heads.Head, loss: str | Callable = "logistic",
              ridge: float | None = None, model: str = "single_query",
              loss_scale: float | str = 1.0, numerics: str = "exact") -> Callable[[Params, Any], jax.Array]:
  """The training objective of one data set: loss(params, data) -> scalar.

  numerics: "exact" pools with ``pooled_token`` (free of cancellation), "authors" with X^T s
  as the paper's code does (``pooled_token_plain``).

  loss_scale (normalized GD is invariant to any positive scale of the loss, so
  scaling changes nothing in exact arithmetic, only what rounding keeps):
    a positive number S: the objective is S * L (value and gradient scaled; the
      default 1.0 leaves both untouched);
    "auto": the value is L itself but the gradient is exp(c) * grad L, with one
      shift c per data set and call, computed in log space so that it survives
      float32 once the softmax saturates. With ls = log_softmax of the logits and
      top_i = argmax_t of row i, the weights s_it = exp(ls_it) of the non-top tokens
      underflow (XLA flushes exp(x) to 0 below x = -87.3 in float32, -708 in
      float64), and with them the whole gradient, although its direction is well
      defined. Here they enter the gradient as q_it = exp(ls_it + c), t != top_i,
      with c = -max_{i, t != top_i} ls_it (the largest non-top weight becomes 1),
      and q_{i,top_i} = -sum_{t != top_i} q_it (sum_t s_it = 1, so
      d s_{i,top} = -sum_t d s_it); s = stop_gradient(s) + q - stop_gradient(q)
      has the value of s and the derivative exp(c) ds. A ridge lam ||p||^2 gets
      the derivative exp(c) lam 2p, with c <= -log(lam) so that no scaled
      coefficient exceeds 1. Supported models: single_query, seq2seq, causal.
  """
  ell = losses_lib.get_loss(loss) if isinstance(loss, str) else loss
  lam = param.ridge if ridge is None else ridge
  forward = get_model(model)
  pool = get_pooling(numerics)
  check_loss_scale(loss_scale)
  auto = isinstance(loss_scale, str)

  def ridge_sum(params):
    return sum(jnp.sum(p * p) for p in jax.tree_util.tree_leaves(attention_params(params)))

  own = MODEL_OBJECTIVES.get(model)

  def objective(params, data):
    data = with_head(params, data)
    f, _ = forward(head, param.to_W(params), data, pool=pool)
    value = jnp.mean(own(f)) if own is not None else jnp.mean(ell(data.Y * f))
    if lam:
      value = value + lam * ridge_sum(params)
    return value * loss_scale if loss_scale != 1.0 else value

  if not auto:
    return objective

  # "auto": the models' logits and readouts, with the softmax (and its scaling) taken here.
  def readout_single(s, data):
    return jax.vmap(head.apply, (None, 0))(data.v, pool(s, data.X))

  def readout_seq(s, data):
    r = jax.vmap(pool, in_axes=(1, None), out_axes=1)(s, data.X)
    return jax.vmap(jax.vmap(head.apply, (None, 0)), (None, 0))(data.v, r)

  pieces = {
      "single_query": (lambda W, data: attention_logits(W, data.X, data.Z), readout_single),
      "seq2seq": (lambda W, data: seq2seq_logits(W, data.X, data.Z, False), readout_seq),
      "causal": (lambda W, data: seq2seq_logits(W, data.X, data.Z, True), readout_seq),
  }
  if model not in pieces:
    raise ValueError(f"loss_scale='auto' supports the models {sorted(pieces)}, got {model!r}")
  logits_fn, readout = pieces[model]
  sg = jax.lax.stop_gradient

  def auto_objective(params, data):
    data = with_head(params, data)
    logits = logits_fn(param.to_W(params), data)                          # (..., T)
    c = auto_shift(logits)
    if lam:
      c = jnp.minimum(c, -jnp.log(jnp.asarray(lam, logits.dtype)))
    s = auto_softmax(logits, c)                                            # value s, derivative exp(c) ds
    value = jnp.mean(ell(data.Y * readout(s, data)))
    if lam:
      r = ridge_sum(params)
      scaled = lam * jnp.exp(c) * r                                        # lam exp(c) <= 1
      value = value + sg(lam * r) + (scaled - sg(scaled))                  # value lam r, derivative exp(c) lam dr
    return value

  return auto_objective


# ----------------------------------------------------------------------------
# Sequence-to-sequence and causal attention (docs/science.md section 7)
# ----------------------------------------------------------------------------
# One data set: X (n,T,d) tokens, Z (n,K,d) queries (K = T and Z = X: every
# position k is a query z_ik = x_ik), Y (n,K) one label per query, v the head.

def causal_mask(K: int, T: int) -> jax.Array:
  """(K,T) bool: query position k may attend to token t exactly when t <= k."""
  return jnp.arange(T)[None, :] <= jnp.arange(K)[:, None]


def seq2seq_logits(W: jax.Array, X: jax.Array, Z: jax.Array, causal: bool = False) -> jax.Array:
  """x_it^T W z_ik for one data set: X (n,T,d), Z (n,K,d) -> (n,K,T).

  causal: logits of future tokens (t > k) are -inf, so their softmax weight is
  exactly 0 and no gradient reaches them. Position k = 0 attends to itself only.
  """
  logits = jnp.einsum("ntd,nkd->nkt", X, Z @ W.T)
  if causal:
    logits = jnp.where(causal_mask(Z.shape[1], X.shape[1]), logits, -jnp.inf)
  return logits


def seq2seq_attention(W: jax.Array, X: jax.Array, Z: jax.Array, causal: bool = False) -> jax.Array:
  """s_ik = softmax_t(x_it^T W z_ik) (masked to t <= k when causal): (n,K,T)."""
  return jax.nn.softmax(seq2seq_logits(W, X, Z, causal), axis=-1)


def _predict_seq(head: heads.Head, W, data, causal: bool, pool=pooled_token) -> tuple[jax.Array, jax.Array]:
  s = seq2seq_attention(W, data.X, data.Z, causal)                        # (n,K,T)
  r = jax.vmap(pool, in_axes=(1, None), out_axes=1)(s, data.X)            # (n,K,d) r_ik = X_i^T s_ik
  f = jax.vmap(jax.vmap(head.apply, (None, 0)), (None, 0))(data.v, r)     # (n,K) f_ik = h(r_ik)
  return f, s


def predict_seq2seq(head: heads.Head, W, data, pool=pooled_token) -> tuple[jax.Array, jax.Array]:
  """Sequence-to-sequence attention: every position is a query (data.Z (n,T,d) = X).

  f_ik = h(X_i^T softmax(X_i W z_ik)): f (n,T) (labels Y (n,T)), s (n,T,T)."""
  return _predict_seq(head, W, data, False, pool)


def predict_causal(head: heads.Head, W, data, pool=pooled_token) -> tuple[jax.Array, jax.Array]:
  """Causal attention: as ``predict_seq2seq`` with position k attending to t <= k only.

  f (n,T), s (n,T,T) with s_ikt = 0 exactly for t > k."""
  return _predict_seq(head, W, data, True, pool)


MODELS["seq2seq"] = predict_seq2seq
MODELS["causal"] = predict_causal


# ----------------------------------------------------------------------------
# Gradients: a closed form where one is known, autodiff otherwise
# ----------------------------------------------------------------------------

LOSS_DERIVATIVES: dict[str, Callable[[jax.Array], jax.Array]] = {
    "logistic": lambda u: -jax.nn.sigmoid(-u),
    "exponential": lambda u: -jnp.exp(-u),
    "correlation": lambda u: -jnp.ones_like(u),
}


def _linear_head_grad(param: Parameterization, loss: str, lam: float):
  """Closed-form gradient of the single-query model with the linear head.

  With h_it = v^T x_it, ref_i the most-attended token, dh_it = h_it - h_{i,ref}:
    f_i = h_{i,ref} + sum_t s_it dh_it,       a_i = Y_i l'(Y_i f_i) / n  (= dL/df_i),
    dL/dlogit_it = s_it (a_i dh_it - a_i sum_u s_iu dh_iu),
    dL/dW = sum_i (X_i^T dL/dlogit_i) z_i^T,  dL/dK = (dL/dW) Q,  dL/dQ = (dL/dW)^T K,
  plus 2 lam p for the ridge. Equal to autodiff of ``make_loss`` (tests/test_model.py) with
  fewer operations per step, and as free of cancellation as ``pooled_token``.
  """
  dl = LOSS_DERIVATIVES[loss]

  def grad(params, data):
    W = param.to_W(params)
    s = attention(W, data.X, data.Z)                                     # (n,T)
    h = data.X @ data.v                                                  # (n,T)
    ref = jnp.argmax(s, axis=-1)
    h_ref = jnp.take_along_axis(h, ref[:, None], axis=1)                 # (n,1)
    dh = h - h_ref
    sd = jnp.sum(s * dh, axis=-1)                                        # (n,)
    f = h_ref[:, 0] + sd
    a = data.Y * dl(data.Y * f) / f.shape[0]
    delta = s * (a[:, None] * dh - (a * sd)[:, None])                    # dL/dlogits
    G = jnp.einsum("nt,ntd->nd", delta, data.X).T @ data.Z               # dL/dW
    grads = {"W": G} if param.name == "W" else {"K": G @ params["Q"], "Q": G.T @ params["K"]}
    if lam:
      grads = {k: g + 2 * lam * params[k] for k, g in grads.items()}
    return grads

  return grad


def make_grad(param: Parameterization, head: heads.Head, loss: str | Callable = "logistic",
              ridge: float | None = None, model: str = "single_query",
              loss_scale: float | str = 1.0, numerics: str = "exact",
              train_head: bool = False) -> Callable[[Params, Any], Params]:
  """grad(params, data) of ``make_loss(...)``: the closed form for the single-query model with
  the linear head and a named loss (unscaled, exact numerics, fixed head), autodiff for
  everything else (a trained head included)."""
  lam = param.ridge if ridge is None else ridge
  if (not train_head and numerics == "exact" and model == "single_query" and head.name == "linear" and isinstance(loss, str) and loss in LOSS_DERIVATIVES
      and not isinstance(loss_scale, str) and loss_scale == 1.0 and param.name in ("W", "KQ")):
    return _linear_head_grad(param, loss, lam)
  return jax.grad(make_loss(param, head, loss, ridge, model, loss_scale, numerics))
