"""svmattn.svm.joint and joint training of head and attention (train_head, prompt attention).

Checks:
  max_margin_head: on random separable data the KKT conditions hold (feasibility, v = A^T lambda
    with lambda >= 0, complementary slackness, support = the rows of margin 1, multipliers only on
    the support), and v equals an independent cvxpy (CLARABEL) solve; inseparable selected tokens
    give the status "infeasible" (no exception).
  relaxed_att_svm (W form): bounds 1 on the support sequences and 0 elsewhere, KKT with the
    constraint rows built here from the definition, optimality against cvxpy; with every sequence
    in the support it is att_svm's Frobenius SVM; the nuclear form is feasible, has a nuclear norm
    no larger than the Frobenius solution's and matches att_svm(..., "nuc") with a full support.
  prompt form: the public code's hand-solved toy (n=3, T=2, d=2): full and relaxed p-SVMs and
    v^mm with its support vectors, tight and non-tight.
  joint training on the non-tight toy: p goes to the relaxed SVM's direction (not the full one's),
    v to v^mm's; the trajectory of the head is recorded. make_grad(train_head=True) returns a
    head gradient equal to finite differences of make_loss, and the ridge leaves the head out.
  TrainConfig validation of the prompt parameterization and of train_head.
"""
import warnings

import cvxpy as cp
import jax
import numpy as np
import pytest

from svmattn.data import datasets as data_lib
from svmattn.models import attention as model_lib
from svmattn.models import heads
from svmattn.svm import att_svm as svm_lib
from svmattn.svm import joint as joint_lib
from svmattn.train import loop as train_lib


def _unit(a):
  return a / np.linalg.norm(a, axis=-1, keepdims=True)


def _cvx_least_distance(A, b):
  """min ||w||_2 s.t. A w >= b, solved by CLARABEL (an independent check of the NNLS solves)."""
  w = cp.Variable(A.shape[1])
  prob = cp.Problem(cp.Minimize(cp.sum_squares(w)), [A @ w >= b])
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    prob.solve(solver="CLARABEL")
  assert prob.status == cp.OPTIMAL, prob.status
  return np.asarray(w.value)


def _att_rows(X, Z, alpha):
  """(A, seq): rows vec((x_{i,alpha_i} - x_it) z_i^T) (row-major) for t != alpha_i, in the order
  i, then t, and the sequence of each row; built from the definition."""
  rows, seq = [], []
  n, T, _ = X.shape
  for i in range(n):
    for t in range(T):
      if t != alpha[i]:
        rows.append(np.outer(X[i, alpha[i]] - X[i, t], Z[i]).reshape(-1))
        seq.append(i)
  return np.array(rows), np.array(seq)


def _check_kkt(w, lam, A, b, tol=1e-9):
  """Feasibility, stationarity w = A^T lambda, dual feasibility, complementary slackness."""
  margins = A @ w
  assert np.min(margins - b) >= -tol
  assert np.min(lam) >= 0
  np.testing.assert_allclose(A.T @ lam, w, rtol=0, atol=1e-9)
  assert np.max(np.abs(lam * (margins - b))) < 1e-9
  return margins


# ----------------------------------------------------------------------------
# max_margin_head
# ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def head_cases():
  """Three random separable data sets (n=5, T=3, d=8, unit Gaussian tokens, random alpha, +-1)."""
  out = []
  for seed in range(3):
    rng = np.random.default_rng(seed)
    X = _unit(rng.standard_normal((5, 3, 8)))
    out.append((X, rng.choice([-1.0, 1.0], 5), rng.integers(0, 3, 5)))
  return out


def test_max_margin_head_kkt(head_cases):
  non_support = 0
  for X, Y, alpha in head_cases:
    r = joint_lib.max_margin_head(X, Y, alpha)
    assert r.ok and r.status == "optimal", r.message
    A = Y[:, None] * X[np.arange(5), alpha]
    margins = _check_kkt(r.w, r.dual, A, np.ones(5))
    np.testing.assert_allclose(r.margins, margins, rtol=0, atol=1e-12)
    tight = np.abs(margins - 1) < 1e-7
    np.testing.assert_array_equal(r.support, tight)
    assert not np.any((r.dual > 1e-9) & ~r.support)        # multipliers only on support vectors
    assert r.support.sum() >= 1
    non_support += int(np.sum(~r.support))
    np.testing.assert_allclose(r.w, _cvx_least_distance(A, np.ones(5)), rtol=0, atol=1e-6)
  assert non_support > 0     # the data sets exercise a proper support


def test_max_margin_head_infeasible():
  rng = np.random.default_rng(1)
  X = _unit(rng.standard_normal((3, 2, 4)))
  X[1, 0] = X[0, 1]                   # sequence 1 selects the token sequence 0 selects
  r = joint_lib.max_margin_head(X, np.array([1.0, -1.0, 1.0]), np.array([1, 0, 0]))
  assert r.status == "infeasible" and not r.ok
  assert r.w is None and not r.support.any()
  with pytest.raises(ValueError, match="shape"):
    joint_lib.max_margin_head(X, np.ones(2), np.array([1, 0, 0]))


# ----------------------------------------------------------------------------
# relaxed_att_svm, W form
# ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def att_case():
  """n=4, T=3, d=6: every selection is feasible (d >= max(T-1, n))."""
  rng = np.random.default_rng(3)
  X = _unit(rng.standard_normal((4, 3, 6)))
  Z = _unit(rng.standard_normal((4, 6)))
  return X, Z, rng.integers(0, 3, 4)


SUPPORT = np.array([True, False, True, False])


def test_relaxed_fro_kkt(att_case):
  X, Z, alpha = att_case
  r = joint_lib.relaxed_att_svm(X, Z, alpha, SUPPORT, "fro")
  assert r.ok, r.message
  assert r.w.shape == (36,)
  A, seq = _att_rows(X, Z, alpha)
  b = SUPPORT[seq].astype(float)
  margins = _check_kkt(r.w, r.dual, A, b)
  np.testing.assert_allclose(r.margins, margins, rtol=0, atol=1e-12)
  assert np.min(margins[SUPPORT[seq]]) >= 1 - 1e-9
  assert np.min(margins[~SUPPORT[seq]]) >= -1e-9
  assert np.min(margins[SUPPORT[seq]]) == pytest.approx(1, abs=1e-9)    # some bound 1 is active
  np.testing.assert_array_equal(r.support, SUPPORT[seq] & (np.abs(margins - 1) < 1e-7))
  np.testing.assert_allclose(r.w, _cvx_least_distance(A, b), rtol=0, atol=1e-6)
  full = svm_lib.att_svm(X, Z, alpha, "fro")
  assert np.linalg.norm(r.w) < full.objective - 1e-6      # a strict relaxation here


def test_relaxed_full_support_is_att_svm(att_case):
  X, Z, alpha = att_case
  every = np.ones(4, bool)
  fro = joint_lib.relaxed_att_svm(X, Z, alpha, every, "fro")
  ref = svm_lib.att_svm(X, Z, alpha, "fro")
  assert fro.ok and ref.ok
  np.testing.assert_allclose(fro.w.reshape(6, 6), ref.W, rtol=0, atol=1e-8)
  nuc = joint_lib.relaxed_att_svm(X, Z, alpha, every, "nuc")
  assert nuc.ok, nuc.message
  ref_nuc = svm_lib.att_svm(X, Z, alpha, "nuc")
  Wn = nuc.w.reshape(6, 6)
  assert np.linalg.norm(Wn - ref_nuc.W) <= 1e-4 * np.linalg.norm(ref_nuc.W)
  assert np.linalg.norm(Wn, "nuc") == pytest.approx(ref_nuc.objective, rel=1e-6)
  clar = svm_lib.att_svm(X, Z, alpha, "nuc", solver="CLARABEL")
  assert np.linalg.norm(Wn - clar.W) <= 1e-6 * np.linalg.norm(clar.W)


def test_relaxed_nuclear(att_case):
  X, Z, alpha = att_case
  nuc = joint_lib.relaxed_att_svm(X, Z, alpha, SUPPORT, "nuc")
  fro = joint_lib.relaxed_att_svm(X, Z, alpha, SUPPORT, "fro")
  assert nuc.ok and fro.ok, nuc.message
  A, seq = _att_rows(X, Z, alpha)
  b = SUPPORT[seq].astype(float)
  assert np.min(A @ nuc.w - b) >= -1e-7
  np.testing.assert_allclose(nuc.margins, A @ nuc.w, rtol=0, atol=1e-12)
  Wn, Wf = nuc.w.reshape(6, 6), fro.w.reshape(6, 6)
  assert np.linalg.norm(Wn, "nuc") <= np.linalg.norm(Wf, "nuc") + 1e-6
  assert np.linalg.norm(Wf, "fro") <= np.linalg.norm(Wn, "fro") + 1e-6   # and the reverse for fro
  with pytest.raises(ValueError, match="norm"):
    joint_lib.relaxed_att_svm(X, Z, alpha, SUPPORT, "l1")
  with pytest.raises(ValueError, match="norm"):
    joint_lib.relaxed_att_svm(X[..., :2], Z[:, :2], alpha, SUPPORT, "nuc", prompt=True)


# ----------------------------------------------------------------------------
# The public code's toy (prompt attention): n=3, T=2, d=2, alpha = second token
# ----------------------------------------------------------------------------

TOY_Y = np.array([1.0, -1.0, 1.0])
ALPHA = np.array([1, 1, 1])


def _toy(last):
  """x_i1 = (0,0); x_i2 = (1,1), (1,-1), (0.5, last) (last 1: tight, 1.5: non-tight)."""
  X = np.zeros((3, 2, 2))
  X[:, 1] = [[1, 1], [1, -1], [0.5, last]]
  return X


@pytest.mark.parametrize("last,full_p,head_support", [(1.0, (4 / 3, 1 / 3), (True, True, True)),
                                                      (1.5, (1.25, 0.25), (True, True, False))])
def test_toy_prompt_svms(last, full_p, head_support):
  X = _toy(last)
  Z = np.zeros((3, 2))
  full = joint_lib.relaxed_att_svm(X, Z, ALPHA, np.ones(3, bool), prompt=True)
  assert full.ok
  np.testing.assert_allclose(full.w, full_p, rtol=0, atol=1e-12)
  A = X[:, 1] - X[:, 0]
  _check_kkt(full.w, full.dual, A, np.ones(3))
  relaxed = joint_lib.relaxed_att_svm(X, Z, ALPHA, np.array([True, True, False]), prompt=True)
  assert relaxed.ok
  np.testing.assert_allclose(relaxed.w, (1, 0), rtol=0, atol=1e-12)
  _check_kkt(relaxed.w, relaxed.dual, A, np.array([1.0, 1.0, 0.0]))
  vmm = joint_lib.max_margin_head(X, TOY_Y, ALPHA)
  assert vmm.ok
  np.testing.assert_allclose(vmm.w, (0, 1), rtol=0, atol=1e-12)
  np.testing.assert_array_equal(vmm.support, head_support)


@pytest.fixture(scope="module")
def toy_run():
  """1000 normalized GD steps on the non-tight toy from p(0) = (0,-1), v(0) = (-1,0)."""
  cfg = train_lib.TrainConfig(param="p", model="prompt", train_head=True, steps=1000, snapshot_every=100,
                              chunk_steps=1000, block_size=1)
  data = data_lib.Dataset(_toy(1.5)[None], TOY_Y[None], np.zeros((1, 3, 2)), np.array([[-1.0, 0.0]]))
  start = train_lib.start_state(cfg, {"p": np.array([[0.0, -1.0]]), "v": np.array([[-1.0, 0.0]])})
  return train_lib.train(cfg, data, train_lib.init_keys(0, [0]), start=start)


def _cos(a, b):
  return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_toy_joint_training(toy_run):
  t = toy_run
  S = len(t.steps)
  assert S == 11 and t.steps[-1] == 1000
  assert t.W.shape == (1, S, 2) and t.V.shape == (1, S, 2)
  np.testing.assert_array_equal(t.W[0, 0], (0, -1))       # the given start, recorded at step 0
  np.testing.assert_array_equal(t.V[0, 0], (-1, 0))
  np.testing.assert_array_equal(t.params["p"][0], t.W[0, -1])
  np.testing.assert_array_equal(t.params["v"][0], t.V[0, -1])
  np.testing.assert_array_equal(t.selected[0], ALPHA)
  # normalized GD, each parameter by its own gradient norm: 100 steps of length 0.1 per snapshot
  for traj in (t.W[0], t.V[0]):
    moves = np.linalg.norm(np.diff(traj, axis=0), axis=-1)
    assert np.all(moves <= 10 + 1e-9) and moves[-1] > 10 - 1e-6    # (straight once the direction settles)
  X = _toy(1.5)
  relaxed = joint_lib.relaxed_att_svm(X, np.zeros((3, 2)), ALPHA, np.array([True, True, False]), prompt=True).w
  full = joint_lib.relaxed_att_svm(X, np.zeros((3, 2)), ALPHA, np.ones(3, bool), prompt=True).w
  vmm = joint_lib.max_margin_head(X, TOY_Y, ALPHA).w
  p, v = t.W[0, -1], t.V[0, -1]
  assert 1 - _cos(p, relaxed) < 1e-3
  assert 1 - _cos(v, vmm) < 1e-3
  assert _cos(p, full) < 0.99                    # the full SVM is not where p goes
  assert np.linalg.norm(p) > 10 and np.linalg.norm(v) > 10    # both diverge in norm
  assert t.loss[0, -1] < t.loss[0, 0] and np.all(np.isfinite(t.loss))


def test_make_grad_with_head_matches_finite_differences():
  rng = np.random.default_rng(5)
  n, T, d = 3, 4, 5
  data = data_lib.Dataset(_unit(rng.standard_normal((n, T, d))), rng.choice([-1.0, 1.0], n),
                          _unit(rng.standard_normal((n, d))), _unit(rng.standard_normal(d)))
  params = {"W": rng.standard_normal((d, d)), "v": rng.standard_normal(d)}
  param, head = model_lib.get_parameterization("W"), heads.get_head("linear")
  loss = jax.jit(model_lib.make_loss(param, head))
  g = model_lib.make_grad(param, head, train_head=True)(params, data)
  assert set(g) == {"W", "v"}
  h = 1e-6
  fd = np.zeros(d)
  for k in range(d):
    e = np.zeros(d)
    e[k] = h
    fd[k] = (loss({**params, "v": params["v"] + e}, data) - loss({**params, "v": params["v"] - e}, data)) / (2 * h)
  assert np.linalg.norm(np.asarray(g["v"]) - fd) <= 1e-6 * np.linalg.norm(fd)
  # the W part: the closed form of the fixed head at v = params["v"]
  closed = model_lib.make_grad(param, head)({"W": params["W"]}, data._replace(v=params["v"]))
  np.testing.assert_allclose(g["W"], closed["W"], rtol=1e-10, atol=1e-13)
  # the loss uses params["v"], not data.v
  assert float(loss(params, data)) == pytest.approx(float(loss({"W": params["W"]}, data._replace(v=params["v"]))),
                                                   rel=1e-14)
  assert abs(float(loss(params, data)) - float(loss({"W": params["W"]}, data))) > 1e-6
  # a ridge applies to the attention weights only, never to the head
  kq = model_lib.get_parameterization("KQ")
  kq_params = {"K": rng.standard_normal((d, 2)), "Q": rng.standard_normal((d, 2)), "v": params["v"]}
  plain = model_lib.make_loss(kq, head, ridge=0.0)(kq_params, data)
  ridged = model_lib.make_loss(kq, head, ridge=0.1)(kq_params, data)
  ridge = 0.1 * (np.sum(kq_params["K"] ** 2) + np.sum(kq_params["Q"] ** 2))
  assert float(ridged) == pytest.approx(float(plain) + ridge, rel=1e-13)
  gv = model_lib.make_grad(kq, head, ridge=0.1, train_head=True)(kq_params, data)["v"]
  gv0 = model_lib.make_grad(kq, head, ridge=0.0, train_head=True)(kq_params, data)["v"]
  np.testing.assert_allclose(gv, gv0, rtol=1e-13, atol=1e-15)


def test_train_config_validation():
  with pytest.raises(ValueError, match="prompt"):
    train_lib.TrainConfig(param="p", model="single_query").validate()
  with pytest.raises(ValueError, match="prompt"):
    train_lib.TrainConfig(param="W", model="prompt").validate()
  with pytest.raises(ValueError, match="no head to train"):
    train_lib.TrainConfig(model="next_token", train_head=True).validate()
  with pytest.raises(ValueError, match="no head to train"):
    train_lib.TrainConfig(model="next_token_lsq", train_head=True).validate()
  train_lib.TrainConfig(param="p", model="prompt", train_head=True).validate()
  train_lib.TrainConfig(model="next_token").validate()


def test_bad_selections_are_errors():
  X = np.zeros((3, 2, 2))
  X[:, 1] = 1.0
  Z = np.zeros((3, 2))
  for alpha, needle in (([-1, 0, 1], "in \\[0, T=2\\)"), ([0, 1.7, 1], "integer"), ([0, 1], "shape")):
    with pytest.raises(ValueError, match=needle):
      joint_lib.max_margin_head(X, np.ones(3), alpha)
    with pytest.raises(ValueError, match=needle):
      joint_lib.relaxed_att_svm(X, Z, alpha, np.ones(3, bool))
