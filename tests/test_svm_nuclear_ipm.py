"""The structured interior point of the nuclear-norm Att-SVM (svmattn.svm.nuclear_ipm): its optimum
against cvxpy's Clarabel, its optimality certificate, stacking that changes no bit, and the fallback."""
import numpy as np
import pytest

import svmattn  # noqa: F401
from svmattn.data import datasets as data_lib
from svmattn.svm import att_svm as svm_lib
from svmattn.svm import nuclear as svm_nuclear
from svmattn.svm import nuclear_ipm


def _cases(n, T, d, count, seed):
  D = data_lib.generate(data_lib.DataSpec(n=n, T=T, d=d), seed, np.arange(count))
  alpha = np.random.RandomState(seed).randint(0, T, (count, n))
  return np.asarray(D.X), np.asarray(D.Z), alpha


# Shapes whose reduced blocks are small (3 + 3), middle (8 + 4) and large (10 + 6), the last with
# more constraints than the reduced W has entries (a degenerate, rank-deficient optimum).
SHAPES = [(3, 2, 3), (4, 3, 8), (6, 5, 10)]


@pytest.mark.parametrize("n,T,d", SHAPES)
def test_optimum_and_certificate(n, T, d):
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


def test_stacked_equals_alone_bit_for_bit():
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


def test_shares_on_threads_equal_one_thread_bit_for_bit():
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


def test_unfinished_solves_fall_back(monkeypatch):
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
