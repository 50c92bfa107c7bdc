"""float32 and loss scaling (issue 4): make_loss(loss_scale="auto") and benchmarks/precision.py.

Claim: normalized GD is invariant to a positive scale of the loss, so the "auto"
objective (value L, gradient exp(c) grad L with c a per-step shift computed in
log space) trains exactly like the default one in exact arithmetic, and in
float32 it keeps tracking float64 after the softmax tails exp(-c) fall below
float32's smallest normal number (c > 87.3), where the default float32 gradient
is exactly zero and W stops moving.
"""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

from conftest import REPO_ROOT, host
from svmattn.data import datasets as data_lib
from svmattn.models import heads
from svmattn.analysis import metrics
from svmattn.models import attention as model_lib
from svmattn.svm import att_svm as svm_lib

FLOAT32_UNDERFLOW = -np.log(np.finfo(np.float32).tiny)  # 87.3: exp(-c) is subnormal beyond


def _to32(tree):
  return jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), tree)


def _tail_exponent(W, X, Z):
  """c = min_i log sum_t exp(l_it) - l_{i,2nd}, float64 (exp(-c): the largest non-top weight)."""
  logits = np.einsum("...ntd,...de,...ne->...nt", X, W, Z)
  return np.min(scipy.special.logsumexp(logits, -1) - np.sort(logits, -1)[..., -2], -1)


@pytest.mark.parametrize("name, param", [("single_query", "W"), pytest.param("single_query", "KQ", marks=pytest.mark.slow),
                                         pytest.param("causal", "W", marks=pytest.mark.slow)])   # (siblings: slow)
def test_auto_objective_has_the_value_and_a_scaled_gradient(batch, name, param):
  """Value: the default objective's, bit for bit. Gradient: exp(c) times the default one,
  with c = -max over rows of the largest non-top log-probability (capped by -log ridge)."""
  ds = data_lib.Dataset(*(a[1] for a in host(batch)))
  if name != "single_query":  # every position a query (Z = X), one label per position
    ds = data_lib.Dataset(ds.X, np.repeat(ds.Y[:, None], ds.X.shape[1], 1) * np.array([1, -1, 1, 1]), ds.X, ds.v)
  p = model_lib.get_parameterization(param)
  params = jax.tree_util.tree_map(lambda a: 3.0 * a, p.init(jax.random.PRNGKey(2), 6, 6, jnp.float64))
  base = model_lib.make_loss(p, heads.LINEAR, model=name)
  auto = model_lib.make_loss(p, heads.LINEAR, model=name, loss_scale="auto")
  v0, g0 = jax.jit(jax.value_and_grad(base))(params, ds)
  v1, g1 = jax.jit(jax.value_and_grad(auto))(params, ds)
  assert float(v0) == float(v1)
  if name == "single_query":
    logits = np.asarray(model_lib.attention_logits(p.to_W(params), ds.X, ds.Z))
  else:
    logits = np.asarray(model_lib.seq2seq_logits(p.to_W(params), ds.X, ds.Z, causal=True))
  ls = logits - scipy.special.logsumexp(logits, -1, keepdims=True)
  rest = np.where(np.arange(ls.shape[-1]) == np.argmax(logits, -1)[..., None], -np.inf, ls)
  c = min(-np.max(rest), -np.log(p.ridge)) if p.ridge else -np.max(rest)
  for k in g0:
    np.testing.assert_allclose(np.asarray(g1[k]), np.exp(c) * np.asarray(g0[k]), rtol=1e-9, atol=1e-14)


def test_saturated_gradient_underflows_in_float32_unless_auto(batch):
  """W = R W^mm with tails exp(-c) far below float32's smallest number: the default float32
  gradient is exactly zero (the float64 one is not), the auto one has float64's direction."""
  ds = data_lib.Dataset(*(a[0] for a in host(batch)))
  gamma = np.asarray(heads.token_scores(heads.LINEAR, ds.v, ds.X, ds.Y))
  Wmm = svm_lib.att_svm(ds.X, ds.Z, gamma.argmax(-1)).W
  base = jax.jit(jax.grad(model_lib.make_loss(model_lib.W_PARAM, heads.LINEAR)))
  auto = jax.jit(jax.grad(model_lib.make_loss(model_lib.W_PARAM, heads.LINEAR, loss_scale="auto")))
  for R in (120.0, 300.0):
    W = R * Wmm
    assert _tail_exponent(W, ds.X, ds.Z) > 110  # beyond subnormals too (exp(-103.3) = 1.4e-45)
    g64 = np.asarray(base({"W": jnp.asarray(W)}, ds)["W"])
    g32 = np.asarray(base(_to32({"W": W}), _to32(ds))["W"])
    a32 = np.asarray(auto(_to32({"W": W}), _to32(ds))["W"], np.float64)
    a64 = np.asarray(auto({"W": jnp.asarray(W)}, ds)["W"])
    assert np.all(g32 == 0)
    assert np.max(np.abs(g64)) > 0 and np.all(np.isfinite(a32))
    assert metrics.corr(a64, g64) > 1 - 1e-12
    assert metrics.corr(a32, a64) > 1 - 1e-9


def test_bad_loss_scale():
  for bad in ("Auto", "dynamic", 0.0, -2.0, float("nan"), float("inf"), None):
    with pytest.raises(ValueError, match="loss_scale"):
      model_lib.make_loss(model_lib.W_PARAM, heads.LINEAR, loss_scale=bad)


def test_auto_needs_a_model_it_knows(monkeypatch):
  monkeypatch.setitem(model_lib.MODELS, "mine", model_lib.predict_single_query)
  model_lib.make_loss(model_lib.W_PARAM, heads.LINEAR, model="mine")  # the default path takes any model
  with pytest.raises(ValueError, match="loss_scale='auto'"):
    model_lib.make_loss(model_lib.W_PARAM, heads.LINEAR, model="mine", loss_scale="auto")


# ----------------------------------------------------------------------------
# The binary, end to end
# ----------------------------------------------------------------------------

@pytest.mark.slow   # (the fast set keeps a sibling of this check; CI runs the slow ones too)
def test_binary_end_to_end(tmp_path):
  """E2 at tiny size, lr 1 for 300 steps so that the float64 tails pass exp(-87.3): plain float32
  stops (zero gradients, W frozen) once the reference's tail exponent c nears 87.3; float32 with
  loss_scale="auto" stays on the float64 trajectory; both start at the float64 initialization."""
  flags = ["--runs=2", "--n=3", "--T=4", "--d=6", "--steps=300", "--lr=1.0", "--snapshot_every=30",
           "--check_step=300", "--params=W", "--variants=float64,float32,float32_auto", "--noprogress"]
  env = dict(os.environ, PYTHONPATH=REPO_ROOT)
  proc = subprocess.run([sys.executable, "-m", "benchmarks.precision", f"--out={tmp_path}", *flags],
                        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert sorted(os.listdir(tmp_path)) == ["corr_ref.png", "corr_svm.png", "results.npz", "saturation.png",
                                          "summary.json"]
  with open(tmp_path / "summary.json") as f:
    summary = json.load(f)
  with np.load(tmp_path / "results.npz") as f:
    arrays = {k: f[k] for k in f.files}
  np.testing.assert_array_equal(arrays["steps"], np.arange(0, 301, 30))
  assert summary["flags"]["steps"] == 300 and summary["data_sets"] == 2
  assert {"experiment", "flags", "timings_s", "environment", "checks"} <= set(summary)
  checks = summary["checks"]
  assert checks and all(set(c) >= {"name", "value", "expected", "ok"} for c in checks)
  assert all(c["ok"] for c in checks), [c for c in checks if not c["ok"]]

  # the reference saturates far past float32's underflow and keeps moving (lr per step)
  tail = arrays["tail_exponent_W"]
  assert tail.shape == (2, 11) and np.all(tail[:, -1] > 1.5 * FLOAT32_UNDERFLOW)
  assert np.all(np.diff(arrays["norm_W_float64"][:, 1:], axis=1) > 0.9 * 30)
  # plain float32 froze (W identical at the last snapshots, norm left behind) after leaving
  # float64 where c neared 87.3
  per = summary["variants"]["W"]
  assert per["float32"]["runs_stalled"] == 2 and per["float32_auto"]["runs_stalled"] == 0
  assert np.all(arrays["norm_W_float32"][:, -1] < 0.8 * arrays["norm_W_float64"][:, -1])
  assert per["float32"]["tail_exponent_at_departure"]["min"] > 0.6 * FLOAT32_UNDERFLOW
  # float32 with auto scaling: on the float64 trajectory at every snapshot
  assert np.min(arrays["corr_ref_W_float32_auto"]) >= 1 - 1e-9
  assert per["float32_auto"]["final_corr_ref"]["min"] >= 0.999
  np.testing.assert_allclose(per["float32_auto"]["final_corr_ref"]["min"],
                             np.min(arrays["corr_ref_W_float32_auto"][:, -1]), rtol=1e-12)
  assert summary["final_corr_min"]["W"]["float32_auto"]["float64"] >= 1 - 1e-9
