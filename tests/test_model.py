"""svmattn.models.attention (and heads.token_scores): attention, pooling, W vs (K,Q), objective."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import host
from svmattn.data import datasets as data_lib
from svmattn.models import heads
from svmattn.models import attention as model_lib


def _one(batch, b=0):
  return data_lib.Dataset(*(np.asarray(a[b]) for a in host(batch)))


def _reference(W, X, Z, v, Y):
  """Plain NumPy: logits x_it^T W z_i, softmax, r_i = X_i^T s_i, f_i = v^T r_i, logistic loss."""
  n, T, _ = X.shape
  logits = np.array([[X[i, t] @ W @ Z[i] for t in range(T)] for i in range(n)])
  e = np.exp(logits - logits.max(1, keepdims=True))
  s = e / e.sum(1, keepdims=True)
  r = np.einsum("nt,ntd->nd", s, X)
  f = r @ v
  return logits, s, f, np.mean(np.log1p(np.exp(-Y * f)))


def test_attention_and_predict_match_reference(batch):
  ds = _one(batch)
  W = np.random.default_rng(0).normal(size=(6, 6))
  logits, s, f, loss = _reference(W, ds.X, ds.Z, ds.v, ds.Y)
  np.testing.assert_allclose(model_lib.attention_logits(W, ds.X, ds.Z), logits, rtol=1e-13, atol=1e-14)
  np.testing.assert_allclose(model_lib.attention(W, ds.X, ds.Z), s, rtol=1e-12, atol=1e-15)
  f_model, s_model = model_lib.predict(heads.LINEAR, W, ds.X, ds.Z, ds.v)
  np.testing.assert_allclose(f_model, f, rtol=1e-12, atol=1e-14)
  np.testing.assert_allclose(s_model, s, rtol=1e-12, atol=1e-15)
  objective = model_lib.make_loss(model_lib.W_PARAM, heads.LINEAR, "logistic")
  np.testing.assert_allclose(objective({"W": jnp.asarray(W)}, ds), loss, rtol=1e-12)


def test_attention_is_a_distribution(batch):
  ds = _one(batch)
  s = np.asarray(model_lib.attention(50.0 * np.random.default_rng(1).normal(size=(6, 6)), ds.X, ds.Z))
  assert np.all(s >= 0)
  np.testing.assert_allclose(s.sum(-1), 1.0, atol=1e-14)


def test_pooled_token_equals_XTs_and_is_exact_when_saturated(batch):
  ds = _one(batch)
  rng = np.random.default_rng(2)
  s = rng.dirichlet(np.ones(4), size=3)
  np.testing.assert_allclose(model_lib.pooled_token(s, ds.X), np.einsum("nt,ntd->nd", s, ds.X), rtol=1e-13, atol=1e-15)
  # a saturated softmax: the pooled token is the selected token, exactly
  s = np.zeros((3, 4))
  s[np.arange(3), [2, 0, 3]] = 1.0
  np.testing.assert_array_equal(model_lib.pooled_token(s, ds.X), ds.X[np.arange(3), [2, 0, 3]])


def test_W_and_KQ_scores_agree(batch):
  """W = K Q^T gives the same logits, attention, predictions and (ridge-free) loss."""
  ds = _one(batch, 1)
  kk, kq = jax.random.split(jax.random.PRNGKey(5))
  K = jax.random.normal(kk, (6, 4), jnp.float64)  # m = 4 < d as well
  Q = jax.random.normal(kq, (6, 4), jnp.float64)
  W = model_lib.KQ_PARAM.to_W({"K": K, "Q": Q})
  np.testing.assert_allclose(W, np.asarray(K) @ np.asarray(Q).T, rtol=1e-14, atol=1e-15)
  np.testing.assert_allclose(model_lib.attention_logits(W, ds.X, ds.Z),
                             np.einsum("ntd,nd->nt", ds.X @ np.asarray(K), ds.Z @ np.asarray(Q)),
                             rtol=1e-12, atol=1e-13)
  f_w, s_w = model_lib.predict(heads.LINEAR, model_lib.W_PARAM.to_W({"W": W}), ds.X, ds.Z, ds.v)
  f_kq, s_kq = model_lib.predict(heads.LINEAR, model_lib.KQ_PARAM.to_W({"K": K, "Q": Q}), ds.X, ds.Z, ds.v)
  np.testing.assert_allclose(f_w, f_kq, rtol=1e-13, atol=1e-15)
  np.testing.assert_allclose(s_w, s_kq, rtol=1e-13, atol=1e-15)
  l_w = model_lib.make_loss(model_lib.W_PARAM, heads.LINEAR)({"W": W}, ds)
  l_kq = model_lib.make_loss(model_lib.KQ_PARAM, heads.LINEAR, ridge=0.0)({"K": K, "Q": Q}, ds)
  np.testing.assert_allclose(l_w, l_kq, rtol=1e-13)
  # the ridge adds lam * (||K||^2 + ||Q||^2); the default lam is float64's machine epsilon
  l_ridge = model_lib.make_loss(model_lib.KQ_PARAM, heads.LINEAR, ridge=0.25)({"K": K, "Q": Q}, ds)
  np.testing.assert_allclose(l_ridge - l_kq, 0.25 * (jnp.sum(K * K) + jnp.sum(Q * Q)), rtol=1e-12)
  assert model_lib.KQ_PARAM.ridge == np.finfo(np.float64).eps and model_lib.W_PARAM.ridge == 0.0


def test_token_scores(batch):
  ds = _one(batch, 2)
  gamma = np.asarray(heads.token_scores(heads.LINEAR, ds.v, ds.X, ds.Y))
  np.testing.assert_allclose(gamma, ds.Y[:, None] * np.einsum("ntd,d->nt", ds.X, ds.v), rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_init_schemes(dtype):
  key = jax.random.PRNGKey(0)
  d, m = 5, 3
  p = model_lib.W_PARAM.init(key, d, m, dtype)
  assert p["W"].shape == (d, d) and p["W"].dtype == dtype
  assert np.all(np.abs(np.asarray(p["W"])) <= 1 / np.sqrt(d)) and np.std(np.asarray(p["W"])) > 0
  p = model_lib.KQ_PARAM.init(key, d, m, dtype)
  assert p["K"].shape == (d, m) and p["Q"].shape == (d, m) and p["K"].dtype == dtype
  assert not np.array_equal(np.asarray(p["K"]), np.asarray(p["Q"]))
  assert np.all(np.abs(np.asarray(p["Q"])) <= 1 / np.sqrt(d))
  p = model_lib.W_PARAM.init(key, d, m, dtype, "zero")
  assert np.all(np.asarray(p["W"]) == 0) and p["W"].dtype == dtype
  p = model_lib.KQ_PARAM.init(key, d, m, dtype, "zero")
  assert np.all(np.asarray(p["Q"]) == 0) and np.any(np.asarray(p["K"]) != 0)


def test_unknown_names():
  with pytest.raises(ValueError, match="unknown init scheme 'gauss'"):
    model_lib.W_PARAM.init(jax.random.PRNGKey(0), 3, 3, jnp.float64, "gauss")
  with pytest.raises(ValueError, match="unknown parameterization 'V'"):
    model_lib.get_parameterization("V")
  with pytest.raises(ValueError, match="unknown model 'decoder'"):
    model_lib.get_model("decoder")
  with pytest.raises(ValueError, match="unknown head 'tanh'"):
    heads.get_head("tanh")
  assert model_lib.get_parameterization("W").svm_norm == "fro"
  assert model_lib.get_parameterization("KQ").svm_norm == "nuc"


@pytest.mark.parametrize("param_name", ["W", "KQ"])
@pytest.mark.parametrize("loss", ["logistic", pytest.param("exponential", marks=pytest.mark.slow),
                                  pytest.param("correlation", marks=pytest.mark.slow)])   # (siblings: slow tests)
def test_closed_form_gradient_equals_autodiff(param_name, loss):
  import jax
  from svmattn.models import heads
  from svmattn.models import attention as model_lib
  spec = data_lib.DataSpec(n=4, T=5, d=6)
  D = data_lib.generate(spec, 3, np.arange(3))
  param = model_lib.get_parameterization(param_name)
  closed = model_lib.make_grad(param, heads.LINEAR, loss)
  assert closed.__qualname__.startswith("_linear_head_grad")        # the fast path is the one in use
  auto = jax.grad(model_lib.make_loss(param, heads.LINEAR, loss))
  for b in range(3):
    one = data_lib.take(D, b)
    params = param.init(jax.random.PRNGKey(b), 6, 6, np.float64, "uniform")
    params = jax.tree_util.tree_map(lambda p: 8.0 * p, params)      # far enough to saturate partly
    g1, g2 = closed(params, one), auto(params, one)
    for k in g1:
      np.testing.assert_allclose(np.asarray(g1[k]), np.asarray(g2[k]), rtol=1e-10,
                                 atol=1e-13 * float(np.max(np.abs(np.asarray(g2[k])))))
