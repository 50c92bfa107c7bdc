"""Tests of svmattn.svm.seq2seq and the seq2seq / causal models of svmattn.models.attention."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import svmattn  # noqa: F401  (float64)
from svmattn.data import datasets as data_lib
from svmattn.models import heads
from svmattn.analysis import metrics
from svmattn.models import attention as model_lib
from svmattn.svm import seq2seq as s2s
from svmattn.svm import att_svm as svm_lib
from svmattn.train import loop as train_lib

N, T, D = 2, 4, 8
SPEC = s2s.Seq2SeqSpec(N, T, D)
HEAD = heads.LINEAR


BATCH = s2s.generate(SPEC, 0, np.arange(4))     # shared: one compiled generator


def _one(run=0):
  return data_lib.take(BATCH, run)


def _W(seed=1, d=D):
  return jax.random.normal(jax.random.PRNGKey(seed), (d, d)) / np.sqrt(d)


# jitted once per model name, shared by the tests
PREDICT = {m: jax.jit(lambda W, ds, m=m: model_lib.get_model(m)(HEAD, W, ds)) for m in s2s.MODES}
PREDICT_SINGLE = jax.jit(lambda W, ds: model_lib.predict_single_query(HEAD, W, ds))


# ----------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------

def test_generate_shapes_queries_labels_and_batch_independence():
  batch = BATCH
  assert batch.X.shape == (4, N, T, D) and batch.Y.shape == (4, N, T)
  assert batch.Z.shape == (4, N, T, D) and batch.v.shape == (4, D)
  np.testing.assert_array_equal(batch.Z, batch.X)
  np.testing.assert_allclose(np.linalg.norm(batch.X, axis=-1), 1.0, atol=1e-12)
  assert set(np.unique(batch.Y)) <= {-1.0, 1.0}
  alone = s2s.generate(SPEC, 0, [2])
  for a, b in zip(alone, batch):
    np.testing.assert_array_equal(np.asarray(a)[0], np.asarray(b)[2])
  s2s.validate(batch)


def test_spec_and_validation_errors_name_the_field(tmp_path):
  with pytest.raises(ValueError, match="Seq2SeqSpec.T"):
    s2s.Seq2SeqSpec(2, 1, 3).validate()
  with pytest.raises(ValueError, match="Seq2SeqSpec.labels"):
    s2s.Seq2SeqSpec(labels="odd").validate()
  batch = BATCH
  with pytest.raises(data_lib.DataError, match="Y must have shape"):
    s2s.validate(batch._replace(Y=batch.Y[:, :, 0]))
  with pytest.raises(data_lib.DataError, match="Z must have the shape of X"):
    s2s.validate(batch._replace(Z=batch.X[:, :, 0]))
  with pytest.raises(data_lib.DataError, match="labels Y must be -1 or \\+1"):
    s2s.validate(batch._replace(Y=2 * batch.Y))
  with pytest.raises(data_lib.DataError, match="'X' has 1 non-finite"):
    s2s.validate(batch._replace(X=batch.X.at[0, 0, 0, 0].set(np.nan)))
  path = tmp_path / "s2s.npz"
  s2s.save_npz(path, batch)
  back = s2s.load_npz(path)
  for a, b in zip(back, batch):
    np.testing.assert_array_equal(a, b)
  np.savez(tmp_path / "noz.npz", X=batch.X, Y=batch.Y, v=batch.v)      # Z defaults to X
  np.testing.assert_array_equal(s2s.load_npz(tmp_path / "noz.npz").Z, batch.X)
  np.savez(tmp_path / "bad.npz", X=batch.X, v=batch.v)
  with pytest.raises(data_lib.DataError, match="missing array"):
    s2s.load_npz(tmp_path / "bad.npz")
  with pytest.raises(ValueError, match="mode must be one of"):
    s2s.optimal_tokens(np.zeros((1, T, T)), "bidirectional")


# ----------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------

def test_causal_mask_future_attention_gradient_and_output():
  ds, W = _one(), _W()
  f, s = PREDICT["causal"](W, ds)
  future = ~np.tril(np.ones((T, T), bool))
  assert np.all(np.asarray(s)[:, future] == 0.0)                      # exactly 0
  assert np.all(np.asarray(s)[:, ~future] > 0)
  np.testing.assert_array_equal(np.asarray(s)[:, 0, 0], 1.0)          # k = 0 sees itself only

  # d f_ik / d x_jt for all (i, k, j, t, :), queries moving with the tokens (Z = X)
  jac = np.asarray(jax.jit(jax.jacobian(lambda X: model_lib.predict_causal(HEAD, W, ds._replace(X=X, Z=X))[0]))(ds.X))
  jac = jac[np.arange(N), :, np.arange(N)]                             # (n, K, T, d): j = i
  for k in range(T - 1):
    assert np.all(jac[:, k, k + 1:] == 0.0)                            # no gradient from t > k
    assert np.all(np.abs(jac[:, k, :k + 1]).sum(-1) > 0)
    X2 = ds.X.at[:, k + 1:].set(ds.X[:, k + 1:] * -3.0 + 0.5)          # change the future tokens
    f2, _ = PREDICT["causal"](W, ds._replace(X=X2, Z=X2))
    np.testing.assert_array_equal(f2[:, :k + 1], f[:, :k + 1])
    assert np.all(np.abs(f2[:, k + 1:] - f[:, k + 1:]) > 0)


def test_seq2seq_position_equals_single_query_model():
  ds, W = _one(), _W()
  for mode in s2s.MODES:
    f, s = PREDICT[mode](W, ds)
    assert f.shape == (N, T) and s.shape == (N, T, T)
    for k in range(T):
      single = data_lib.Dataset(ds.X[:, :k + 1] if mode == "causal" else ds.X, ds.Y[:, k], ds.X[:, k], ds.v)
      f1, s1 = PREDICT_SINGLE(W, single)
      np.testing.assert_allclose(f[:, k], f1, rtol=0, atol=1e-14)
      np.testing.assert_allclose(s[:, k, :s1.shape[1]], s1, rtol=0, atol=1e-14)
  # a seq2seq data set with one query per sequence (K = 1) is the single-query model
  one_query = ds._replace(Y=ds.Y[:, 1:2], Z=ds.X[:, 1:2])
  f, s = PREDICT["seq2seq"](W, one_query)
  f1, s1 = PREDICT_SINGLE(W, data_lib.Dataset(ds.X, ds.Y[:, 1], ds.X[:, 1], ds.v))
  np.testing.assert_allclose(f[:, 0], f1, atol=1e-14)
  np.testing.assert_allclose(s[:, 0], s1, atol=1e-14)


@pytest.mark.parametrize("mode", [s2s.MODES[0]] + [pytest.param(m, marks=pytest.mark.slow) for m in s2s.MODES[1:]])   # (siblings: slow)
def test_gradient_matches_finite_differences(mode):
  ds, W = _one(run=1), _W(seed=2)
  loss = jax.jit(lambda W: model_lib.make_loss(model_lib.W_PARAM, HEAD, "logistic", model=mode)({"W": W}, ds))
  g = np.asarray(jax.grad(loss)(W))
  rng = np.random.default_rng(0)
  h = 1e-5
  for _ in range(3):
    E = rng.standard_normal((D, D))
    fd = (float(loss(W + h * E)) - float(loss(W - h * E))) / (2 * h)
    np.testing.assert_allclose(fd, np.sum(g * E), rtol=1e-7, atol=1e-10)


# ----------------------------------------------------------------------------
# SVMs
# ----------------------------------------------------------------------------

def _random_alpha(rng, n, T, mode):
  hi = np.arange(1, T + 1) if mode == "causal" else np.full(T, T)
  return (rng.random((n, T)) * hi).astype(int)


def test_margin_matrix_matches_single_query_rows():
  X = np.asarray(_one().X)
  rng = np.random.default_rng(1)
  for mode in s2s.MODES:
    alpha = _random_alpha(rng, N, T, mode)
    A, keep = s2s.margin_matrix(X, alpha, mode=mode)
    # the same constraints written as n*T single-query sequences (one per query position)
    Af, keep_f = svm_lib.margin_matrix(np.repeat(X, T, axis=0), X.reshape(N * T, D), alpha.reshape(-1),
                                       keep.reshape(N * T, T))
    np.testing.assert_array_equal(keep_f.reshape(keep.shape), keep)
    np.testing.assert_allclose(A, Af, rtol=0, atol=1e-15)
    expected = N * T * (T - 1) if mode == "seq2seq" else N * T * (T - 1) // 2
    assert A.shape == (expected, D * D)


def test_seq2seq_svm_constraints_and_kkt():
  X = np.asarray(_one().X)
  alpha = _random_alpha(np.random.default_rng(2), N, T, "seq2seq")
  res = s2s.svm(X, alpha)
  assert res.status == "optimal" and res.W.shape == (D, D)
  keep = s2s.constraint_mask(alpha, T)
  assert res.margins.shape == res.dual.shape == res.support.shape == (N, T, T)
  target = X[np.arange(N)[:, None], alpha]                                  # (n,T,d)
  margins = np.einsum("nktd,de,nke->nkt", target[:, :, None] - X[:, None], res.W, X)
  np.testing.assert_allclose(res.margins[keep], margins[keep], atol=1e-12)
  assert np.all(np.isnan(res.margins[~keep]))
  assert margins[keep].min() >= 1 - 1e-10                                  # primal feasible
  assert np.isclose(margins[keep].min(), 1, atol=1e-10)
  lam = res.dual
  assert np.all(lam >= 0) and np.all(lam[~keep] == 0)                     # dual feasible
  W_dual = np.einsum("nkt,nktd,nke->de", lam, target[:, :, None] - X[:, None], X)
  np.testing.assert_allclose(W_dual, res.W, atol=1e-10)                    # stationarity W = sum lam A
  np.testing.assert_allclose(lam[keep] * (margins[keep] - 1), 0, atol=1e-10)  # complementary slackness
  assert np.all(res.support[lam > 1e-9])
  np.testing.assert_allclose(res.objective, np.linalg.norm(res.W), rtol=1e-12)


def test_causal_svm_fewer_constraints_own_feasibility_and_smaller_norm():
  X = np.asarray(_one(run=2).X)
  alpha = _random_alpha(np.random.default_rng(3), N, T, "causal")
  causal, full = s2s.svm(X, alpha, mode="causal"), s2s.svm(X, alpha, mode="seq2seq")
  assert causal.ok and full.ok
  keep_c, keep_s = s2s.constraint_mask(alpha, T, "causal"), s2s.constraint_mask(alpha, T, "seq2seq")
  assert keep_c.sum() < keep_s.sum() and np.all(keep_s[keep_c])
  assert not keep_c[:, 0].any()                                           # k = 0: one visible token
  assert not keep_c[:, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]].any()
  assert np.nanmin(causal.margins) >= 1 - 1e-10 and np.all(np.isnan(causal.margins[~keep_c]))
  assert np.nanmin(full.margins[keep_c]) >= 1 - 1e-10                    # seq2seq W is causal-feasible
  assert causal.objective <= full.objective * (1 + 1e-12)
  lam = causal.dual
  target = X[np.arange(N)[:, None], alpha]
  W_dual = np.einsum("nkt,nktd,nke->de", lam, target[:, :, None] - X[:, None], X)
  np.testing.assert_allclose(W_dual, causal.W, atol=1e-10)
  with pytest.raises(ValueError, match="alpha_ik must be <= k"):
    s2s.svm(X, np.full((N, T), T - 1), mode="causal")


def test_nuclear_svm_and_infeasible_status():
  X = np.asarray(_one(3).X)[:1, :3, :3]
  X = X / np.linalg.norm(X, axis=-1, keepdims=True)
  alpha = np.array([[0, 2, 1]])
  fro = s2s.svm(X, alpha, "fro")
  nuc = s2s.svm(X, alpha, "nuc")
  assert fro.ok and nuc.ok and nuc.margins.shape == (1, 3, 3)
  assert np.nanmin(nuc.margins) >= 1 - 1e-6
  assert nuc.objective <= np.linalg.norm(fro.W, "nuc") * (1 + 1e-5)       # fro solution is feasible
  X_dup = X.copy()
  X_dup[0, 1] = X_dup[0, 0]                                                # x_alpha = x_t: margin 0
  res = s2s.svm(X_dup, alpha, "fro")
  assert res.status == "infeasible" and res.W is None and not res.support.any()


def test_optimal_tokens_and_convergence_type():
  gamma = np.array([[[0., 3., 1.], [2., 1., 5.], [1., 4., 0.]]])          # (n=1, K=3, T=3)
  np.testing.assert_array_equal(s2s.optimal_tokens(gamma, "seq2seq"), [[1, 2, 1]])
  np.testing.assert_array_equal(s2s.optimal_tokens(gamma, "causal"), [[0, 0, 1]])
  np.testing.assert_array_equal(s2s.selects_optimal(gamma, np.array([[2, 0, 1]]), "causal"),
                                [[True, True, True]])                   # k = 0 is not scored
  ok = svm_lib.SVMResult("optimal", np.eye(3), np.zeros((1, 3, 3), bool), None, None, 1.0, "fro", "nnls")
  assert s2s.convergence_type(gamma, np.array([[1, 2, 1]]), ok) == "global"
  support = np.zeros((1, 3, 3), bool)
  support[0, 0, 2] = True                                                 # gamma 1 < gamma 3 of alpha = 1
  local = ok.__class__(**{**ok.__dict__, "support": support})
  assert s2s.convergence_type(gamma, np.array([[1, 0, 1]]), local) == "local"
  support[0, 1, 2] = True                                                 # support token better than alpha
  assert s2s.convergence_type(gamma, np.array([[1, 0, 1]]), local) == "not-local"
  bad = svm_lib.SVMResult("infeasible", None, np.zeros((1, 3, 3), bool), None, None, np.nan, "fro", "nnls")
  assert s2s.convergence_type(gamma, np.array([[1, 0, 1]]), bad) == "not-local"


# ----------------------------------------------------------------------------
# Training through train.train
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [s2s.MODES[0]] + [pytest.param(m, marks=pytest.mark.slow) for m in s2s.MODES[1:]])
def test_train_seq_model_converges_to_its_svm(mode):
  spec = s2s.Seq2SeqSpec(2, 3, 6)
  runs = np.arange(2)
  batch = s2s.generate(spec, 0, runs)
  config = train_lib.TrainConfig(model=mode, steps=2000, snapshot_every=1000, chunk_steps=2000)
  tr = train_lib.train(config, batch, train_lib.init_keys(0, runs))
  assert tr.attention.shape == (2, 2, 3, 3) and tr.selected.shape == (2, 2, 3)
  assert np.all(tr.finite)
  if mode == "causal":
    assert np.all(tr.attention[:, :, np.triu_indices(3, 1)[0], np.triu_indices(3, 1)[1]] == 0)
    assert np.all(tr.selected <= np.arange(3))
  results = s2s.svm_batch(np.asarray(batch.X), tr.selected, mode=mode)
  assert all(r.ok for r in results)
  c = metrics.corr(tr.W_final, np.stack([r.W for r in results]))
  assert np.all(c > 0.99), c
