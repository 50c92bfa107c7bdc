"""The starting parameters of a batch of runs, drawn in programs that serve every shape.

A run starts at ``Parameterization.init(key, d, m, dtype, scheme)`` of its initialization key
(``models.attention``): uniform, normal or zero draws, flat and reshaped. Drawn inside each
training chunk's program, those draws (threefry, and the normals' inverse error function) were
compiled again for every shape and configuration, about 0.3 s each. Here they are drawn before
training by ``rng.normals`` and ``rng.uniforms`` (flat draws of many keys at a time), one
program for every shape; element i of a flat draw depends on the key and
i alone, so every run starts where ``Parameterization.init`` puts it, bit for bit
(tests/test_host_init.py).
The built-in parameterizations (W, (K,Q), the prompt p) are drawn here; a flax module's own
initialization stays in the training program (``train.loop``).
"""
from __future__ import annotations

import numpy as np

from svmattn import rng
from svmattn.models import attention as model_lib

PARAMS = ("W", "KQ", "p")


def supports(config) -> bool:
  """True when ``config``'s parameters are drawn here (a built-in parameterization)."""
  return config.module is None and config.param in PARAMS


def _draw(kind: str, keys: np.ndarray, count: int, bound: float | None = None, scale: float | None = None):
  """(B, count) float64 flat draws of each key: "normal" (times ``scale``) or "uniform" on
  [-bound, bound)."""
  if kind == "normal":
    return rng.normals(keys, count, np.float64, scale)
  return rng.uniforms(keys, count, np.float64, -bound, bound)


def _matrix(kind: str, keys: np.ndarray, shape: tuple[int, ...], dtype, bound=None, scale=None) -> np.ndarray:
  """(B,) + shape: zeros, normals (times ``scale``) or uniforms on [-bound, bound) of every key,
  drawn in float64 and rounded to ``dtype`` (as ``models.attention``'s inits do)."""
  B, count = len(keys), int(np.prod(shape))
  if kind == "zero":
    return np.zeros((B,) + shape, dtype)
  return _draw(kind, keys, count, bound, scale).reshape((B,) + shape).astype(dtype, copy=False)


def init_params(param: str, scheme: str, keys: np.ndarray, d: int, m: int, dtype) -> dict:
  """``model_lib.get_parameterization(param).init`` of every key (B, 2), as NumPy leaves (B, ...)."""
  if scheme not in model_lib.INIT_SCHEMES:
    raise ValueError(f"unknown init scheme {scheme!r}; known: {model_lib.INIT_SCHEMES}")
  keys = np.asarray(keys, np.uint32)
  bound = 1.0 / np.sqrt(np.float64(d))              # 1 / sqrt(d), as jnp computes it in the init
  if param == "W":
    return {"W": _matrix(scheme, keys, (d, d), dtype, bound)}
  if param == "p":
    return {"p": _matrix(scheme, keys, (d,), dtype, bound)}
  kk, kq = np.moveaxis(rng.split_keys(keys), 1, 0)
  if scheme == "zero":                              # Q = 0, K = 0.1 N(0, 1) (E1)
    return {"K": _matrix("normal", kk, (d, m), dtype, scale=0.1), "Q": _matrix("zero", kq, (d, m), dtype)}
  return {"K": _matrix(scheme, kk, (d, m), dtype, bound), "Q": _matrix(scheme, kq, (d, m), dtype, bound)}


def init_params_of(config, keys, data) -> dict:
  """The starting parameters of every run of ``config`` on ``data`` (NumPy leaves with a leading
  axis B): the parameters of ``train.loop.Trainer.init_one``, drawn here."""
  d = data.X.shape[-1]
  params = model_lib.scaled(init_params(config.param, config.init, np.asarray(keys), d, config.m or d,
                                        np.asarray(data.X).dtype), config.init_scale)
  if config.train_head:
    params = {**params, model_lib.HEAD_KEY: np.asarray(data.v)}     # the data set's head is the start
  return params
