"""The on-device dual solver of the Frobenius Att-SVM against the exact NNLS solver."""
import numpy as np
import pytest

import svmattn  # noqa: F401
from svmattn.data import datasets as data_lib
from svmattn.svm import att_svm as svm_lib
from svmattn.svm import dual as svm_dual


@pytest.fixture(scope="module")
def batch():
  D = data_lib.generate(data_lib.DataSpec(n=4, T=5, d=6), 1, np.arange(24))
  alpha = np.random.RandomState(0).randint(0, 5, (24, 4))
  return np.asarray(D.X), np.asarray(D.Z), alpha


def test_matches_nnls_and_satisfies_kkt(batch):
  X, Z, alpha = batch
  W, lam, res, iters = (np.asarray(a) for a in svm_dual.solve_dual_batch(X, Z, alpha))
  assert np.all(res <= 1e-10), res
  for b in range(len(X)):
    ref = svm_lib.att_svm(X[b], Z[b], alpha[b], "fro")
    assert ref.ok
    np.testing.assert_allclose(W[b], ref.W, rtol=0, atol=1e-8 * np.abs(ref.W).max())
    A, keep = svm_lib.margin_matrix(X[b], Z[b], alpha[b])
    margins = A @ W[b].reshape(-1)
    assert margins.min() >= 1 - 1e-8
    duals = lam[b][keep]
    assert duals.min() >= 0
    np.testing.assert_allclose(A.T @ duals, W[b].reshape(-1), atol=1e-10)   # stationarity
    assert np.max(np.abs(duals * (margins - 1))) <= 1e-8                     # complementarity
    assert np.all(lam[b][np.arange(4), alpha[b]] == 0)


def test_batch_entry_point_falls_back_for_infeasible(batch):
  X, Z, alpha = (a.copy() for a in batch)
  X[3, 0, 1] = X[3, 0, alpha[3, 0]]   # a duplicate of the selected token: infeasible
  if alpha[3, 0] == 1:
    X[3, 0, 2] = X[3, 0, 1]
  out = svm_dual.att_svm_fro_batch(X, Z, alpha)
  assert out["status"][3] == "infeasible" and out["fallback"][3]
  assert np.all(np.isnan(out["W"][3]))
  others = np.delete(np.arange(len(X)), 3)
  assert np.all(out["status"][others] == "optimal")
  assert not np.any(out["fallback"][others])
