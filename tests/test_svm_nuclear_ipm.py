"""The structured interior point of the nuclear-norm Att-SVM (svmattn.svm.nuclear_ipm): its optimum
against cvxpy's Clarabel, its optimality certificate, stacking that changes no bit, and the fallback,
for both of its iterations (the C one of svm.nuclear_ipm_native and the NumPy one), and the two
against each other."""
import numpy as np
import pytest

import svmattn  # noqa: F401
from svmattn.data import datasets as data_lib
from svmattn.svm import att_svm as svm_lib
from svmattn.svm import nuclear as svm_nuclear
from svmattn.svm import nuclear_ipm
from svmattn.svm import nuclear_ipm_native


@pytest.fixture(params=["native", "numpy"])
def iteration(request, monkeypatch):
  """Runs a test with the C iteration (where a C++ compiler built it) and with the NumPy one."""
  if request.param == "numpy":
    monkeypatch.setattr(nuclear_ipm_native, "available", lambda: False)
  elif not nuclear_ipm_native.available():
    pytest.skip(f"the C interior point is not built here: {nuclear_ipm_native.report()}")
  return request.param


def _cases(n, T, d, count, seed):
  D = data_lib.generate(data_lib.DataSpec(n=n, T=T, d=d), seed, np.arange(count))
  alpha = np.random.RandomState(seed).randint(0, T, (count, n))
  return np.asarray(D.X), np.asarray(D.Z), alpha


# Shapes whose reduced blocks are small (3 + 3), middle (8 + 4) and large (10 + 6), the last with
# more constraints than the reduced W has entries (a degenerate, rank-deficient optimum).
SHAPES = [(3, 2, 3), (4, 3, 8), (6, 5, 10)]


@pytest.mark.parametrize("n,T,d", SHAPES)
def test_optimum_and_certificate(n, T, d, iteration):
  """The optimum is cvxpy's Clarabel's (whose tolerances are 1e-8: compared to 1e-6), the
  multipliers certify it (strong duality and ||sum_j y_j A_j||_2 <= 1, to the method's 1e-9
  infeasibility with margin), and the smallest margin is exactly 1."""
  X, Z, alpha = _cases(n, T, d, 4, seed=n + d)
  for b in range(len(X)):
    ours = svm_lib.att_svm(X[b], Z[b], alpha[b], "nuc", "nuc_ipm")
    ref = svm_lib.att_svm(X[b], Z[b], alpha[b], "nuc", "CLARABEL")
    assert ours.ok and ref.ok and ours.solver == "nuc_ipm"
    assert "nuc_ipm:" in ours.message and "fell back" not in ours.message
    assert np.nanmin(ours.margins) == pytest.approx(1.0, abs=1e-12)
    assert abs(ours.objective / ref.objective - 1) <= 1e-6
    assert abs(ours.dual.sum() / ours.objective - 1) <= 1e-7
    A, keep = svm_lib.margin_matrix(X[b], Z[b], alpha[b])
    assert np.all(ours.dual[keep] >= -1e-9)
    assert np.linalg.norm((ours.dual[keep] @ A).reshape(d, d), 2) <= 1 + 1e-7


def test_stacked_equals_alone_bit_for_bit(iteration):
  """att_svm_batch stacks the problems of one reduced shape; each result is the one att_svm gives
  the data set alone, bit for bit (replay and any batch size rely on it)."""
  X, Z, alpha = _cases(4, 4, 6, 9, seed=5)
  batch = svm_lib.att_svm_batch(X, Z, alpha, "nuc", "nuc_ipm", threads=1)
  for b in range(len(X)):
    alone = svm_lib.att_svm(X[b], Z[b], alpha[b], "nuc", "nuc_ipm")
    assert batch[b].ok and alone.ok
    assert np.array_equal(batch[b].W, alone.W) and np.array_equal(batch[b].dual, alone.dual)
  again = svm_lib.att_svm_batch(X[::-1], Z[::-1], alpha[::-1], "nuc", "nuc_ipm", threads=1)
  assert all(np.array_equal(r.W, s.W) for r, s in zip(again[::-1], batch))


def test_shares_on_threads_equal_one_thread_bit_for_bit(iteration):
  """att_svm_many splits the stacked nuclear solves into one share per thread (and solves the
  Frobenius ones beside them): every result, in job order, is the one thread's, bit for bit."""
  X, Z, alpha = _cases(4, 4, 6, 9, seed=6)
  jobs = [(X[b], Z[b], alpha[b], norm) for b in range(len(X)) for norm in ("nuc", "fro")]
  one = svm_lib.att_svm_many(jobs, threads=1)
  done = []
  for threads in (2, 3):
    many = svm_lib.att_svm_many(jobs, threads=threads, progress=done.append)
    assert len(done) == len(jobs) and [r.norm for r in many] == [job[3] for job in jobs]
    for a, b in zip(one, many):
      assert a.ok and b.ok and a.solver == b.solver
      assert np.array_equal(a.W, b.W) and np.array_equal(a.dual, b.dual) and np.array_equal(a.support, b.support)
    done.clear()


def test_unfinished_solves_fall_back(monkeypatch, iteration):
  """A solve the interior point does not finish is nuc_auto's, and says so."""
  X, Z, alpha = _cases(3, 3, 4, 2, seed=1)
  ref = svm_lib.att_svm(X[0], Z[0], alpha[0], "nuc", "nuc_auto")
  monkeypatch.setattr(nuclear_ipm, "MAX_ITER", 2)
  res = svm_lib.att_svm(X[0], Z[0], alpha[0], "nuc", "nuc_ipm")
  assert res.ok and "fell back to nuc_auto" in res.message
  assert np.array_equal(res.W, ref.W)


def test_rows_that_are_not_rank_one_fall_back():
  """The method needs rank-one rows (every Att-SVM has them); other rows go to nuc_auto."""
  rng = np.random.RandomState(0)
  A = rng.randn(6, 9)
  assert nuclear_ipm.rank_one_factors(svm_nuclear.reduce(A, 3)[2], 3, 3) is None
  ours, ref = svm_nuclear.solve_ipm(A, 3), svm_nuclear.solve_auto(A, 3)
  assert ours[0] == ref[0] == "optimal" and np.array_equal(ours[1], ref[1])


def test_infeasible():
  """Two tokens with equal keys: no W separates them."""
  X = np.zeros((1, 2, 3))
  X[0, :, 0] = 1.0
  res = svm_lib.att_svm(X, np.ones((1, 3)), np.array([0]), "nuc", "nuc_ipm")
  assert res.status == "infeasible" and res.W is None


def test_one_failing_problem_changes_no_other():
  """A linear-algebra failure in one problem of a stack (here a singular matrix) gives NaN for it
  alone, and the others the bits they get without it."""
  rng = np.random.RandomState(0)
  M = rng.randn(3, 4, 4) + 4 * np.eye(4)
  M[1] = 0.0
  rhs = rng.randn(3, 4, 1)
  got = nuclear_ipm._each(np.linalg.solve, (4, 1), M, rhs)
  assert np.all(np.isnan(got[1]))
  for i in (0, 2):
    assert np.array_equal(got[i], np.linalg.solve(M[i:i + 1], rhs[i:i + 1])[0])


def test_many_constraints_go_to_nuc_auto(monkeypatch):
  """Above MAX_CONSTRAINTS constraints the dense Newton system costs more than SCS: such a problem
  is nuc_auto's, alone or in a stack, and says so."""
  X, Z, alpha = _cases(3, 4, 4, 2, seed=2)                     # 9 constraints each
  ref = svm_lib.att_svm(X[0], Z[0], alpha[0], "nuc", "nuc_auto")
  monkeypatch.setattr(nuclear_ipm, "MAX_CONSTRAINTS", 8)
  res = svm_lib.att_svm_batch(X, Z, alpha, "nuc", "nuc_ipm", threads=1)
  assert res[0].ok and "solved by nuc_auto" in res[0].message
  assert np.array_equal(res[0].W, ref.W)


# E3's reduced shapes (n, T, d): few unknowns and many constraints (degenerate optima), square
# blocks, and the widest (k = p + q up to 35, N up to 70)
E3_SHAPES = [(5, 5, 3), (10, 5, 10), (5, 15, 20), (15, 5, 4), (15, 5, 20)]


@pytest.mark.parametrize("n,T,d", E3_SHAPES)
def test_the_c_iteration_agrees_with_numpy(n, T, d):
  """The C iteration and the NumPy one stop at the same rule (relative gap 1e-10, relative
  infeasibility 1e-9), each within that of the optimum, so their objectives (the nuclear norms
  of W and the sums of the multipliers) agree to 1e-8 relative: 10x the gap tolerance plus the
  infeasibility's share, and 20x the largest difference measured on E3's shapes (5e-10). Where
  one of them does not finish (near the optimum a factorization fails in either, on a few
  degenerate problems, which then fall back to nuc_auto), the other must reach the same optimum."""
  if not nuclear_ipm_native.available():
    pytest.skip(f"the C interior point is not built here: {nuclear_ipm_native.report()}")
  from svmattn.analysis import metrics
  from svmattn.svm import feasibility
  D = data_lib.generate(data_lib.DataSpec(n=n, T=T, d=d), 3, np.arange(80))
  X, Z = np.asarray(D.X), np.asarray(D.Z)
  alpha = metrics.optimal_tokens(metrics.linear_token_scores(np.asarray(D.v), X, np.asarray(D.Y)))
  both = 0
  for b in np.flatnonzero(feasibility.check(X, Z, alpha).feasible)[:12]:
    A, _ = svm_lib.margin_matrix(X[b], Z[b], alpha[b])
    QL, QR, Ar = svm_nuclear.reduce(A, d)
    p, q = QL.shape[1], QR.shape[1]
    f = nuclear_ipm.rank_one_factors(Ar, p, q)
    assert f is not None
    ours = nuclear_ipm_native.solve(*f, nuclear_ipm.MAX_ITER, nuclear_ipm.TOL_GAP, nuclear_ipm.TOL_FEAS,
                                    nuclear_ipm.STEP)
    ref = nuclear_ipm._ipm(f[0][None], f[1][None], p, q)[0]
    assert ours is not None or ref is not None
    if ours is None or ref is None:
      done = ref if ours is None else ours
      auto = svm_nuclear._auto_pick(p, q)(Ar, p, q)
      nuc = [np.linalg.svd(r[1].reshape(p, q), compute_uv=False).sum() for r in (done, auto)]
      assert abs(nuc[0] / nuc[1] - 1) <= 1e-6     # (nuc_auto's own accuracy)
      continue
    both += 1
    nuc = [np.linalg.svd(r[1].reshape(p, q), compute_uv=False).sum() for r in (ours, ref)]
    assert abs(nuc[0] / nuc[1] - 1) <= 1e-8
    assert abs(ours[2].sum() / ref[2].sum() - 1) <= 1e-8
    # the stopping rule bounds the primal residual ||rp|| <= TOL_FEAS (1 + sqrt(N)), and margin_j >= 1 - |rp_j|
    assert np.min(Ar @ ours[1]) >= 1 - 2 * nuclear_ipm.TOL_FEAS * (1 + np.sqrt(len(Ar)))
    again = nuclear_ipm_native.solve(*f, nuclear_ipm.MAX_ITER, nuclear_ipm.TOL_GAP, nuclear_ipm.TOL_FEAS,
                                     nuclear_ipm.STEP)
    assert np.array_equal(again[1], ours[1]) and np.array_equal(again[2], ours[2])
  assert both >= 6
