"""The graph SVM of next-token prediction (docs/science.md section 12; Li, Huang, Ildiz, Rawat, Oymak,
AISTATS 2024, arXiv 2403.08081). Host side: NumPy, SciPy, cvxpy; never traces JAX.

One data set: a vocabulary of K tokens with embeddings E (K,d), n sequences of T token ids
``tokens`` (n,T) whose last id is the query k, and labels (n,) (token ids occurring in their
sequence).

  token graph of query k: for every sequence ending in k with label y, an edge y -> j to each
    other token j of the sequence; its strongly connected components (SCCs) are ordered by
    reachability (y outranks j when j is reachable from y but not the reverse);
  graph SVM:  W^svm = argmin ||W||  s.t. for every sequence (query k, label y), other token j:
              (E_y - E_j)^T W E_k = 0 when y and j share an SCC of k's graph, >= 1 otherwise;
  finite part W^fin: in S_fin = span{(E_u - E_j) E_k^T : u, j in one SCC of k's graph}, the
    minimizer of the loss of the sequences reduced to their label's SCC (a convex program,
    solved by cvxpy to the solver's accuracy).

Gradient descent predicts W(tau) ~ C(tau) W^svm / ||W^svm|| + W^fin (W^svm is orthogonal to
S_fin). Outcomes ("optimal", "infeasible", "failed") are recorded, never raised.
"""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from svmattn.data.token_graph import TokenGraph, check_data, graphs, targets_of, token_graph  # noqa: F401
from svmattn.svm import att_svm as svm_lib

STATUSES = ("optimal", "infeasible", "failed")


@dataclasses.dataclass
class GraphSVMResult:
  """W (d,d) or None, status, the graphs of every query token ({query id: TokenGraph}), the
  constraint rows (for checks): equality rows ``A_eq`` and inequality rows ``A_ge`` of vec(W),
  the objective ||W^svm||, and the finite part (``W_fin``, ``fin_status``, ``fin_basis``)."""
  status: str
  W: np.ndarray | None
  graphs: dict
  A_eq: np.ndarray
  A_ge: np.ndarray
  objective: float
  norm: str
  message: str = ""
  W_fin: np.ndarray | None = None
  fin_status: str = "not solved"
  fin_basis: np.ndarray | None = None

  @property
  def ok(self) -> bool:
    return self.status == "optimal"


def constraint_rows(E, tokens, labels, graph_of: dict, ignore=None) -> tuple[np.ndarray, np.ndarray]:
  """(A_eq, A_ge): rows vec((E_y - E_j) E_k^T) (row-major) of the equality constraints (y, j in
  one SCC) and of the margin constraints (>= 1) for every label y and other token j of a
  sequence, each distinct row once."""
  E = np.asarray(E, np.float64)
  d = E.shape[1]
  target = targets_of(tokens, labels)
  ignore = np.zeros(np.shape(tokens), bool) if ignore is None else np.asarray(ignore, bool)
  eq, ge = {}, {}
  for i in range(tokens.shape[0]):
    k = int(tokens[i, -1])
    g = graph_of[k]
    for y in tokens[i][target[i]]:
      y = int(y)
      for j, skip in zip(tokens[i], ignore[i]):
        j = int(j)
        if j == y or skip:
          continue
        row = np.outer(E[y] - E[j], E[k]).reshape(-1)
        (eq if g.scc_of(j) == g.scc_of(y) else ge).setdefault((k, y, j), row)
  stack = lambda rows: np.array(list(rows.values())).reshape(-1, d * d)  # noqa: E731
  return stack(eq), stack(ge)


def _null_space(A: np.ndarray, D: int, tol: float = 1e-10) -> np.ndarray:
  """(D, r) orthonormal basis of {w : A w = 0}."""
  if A.shape[0] == 0:
    return np.eye(D)
  _, s, vt = np.linalg.svd(A, full_matrices=True)
  rank = int(np.sum(s > tol * max(1.0, s[0])))
  return vt[rank:].T


def _range(A: np.ndarray, tol: float = 1e-10) -> np.ndarray:
  """(D, r) orthonormal basis of the row space of A (rows: vec'd matrices)."""
  if A.shape[0] == 0:
    return np.zeros((A.shape[1], 0))
  _, s, vt = np.linalg.svd(A, full_matrices=False)
  rank = int(np.sum(s > tol * max(1.0, s[0])))
  return vt[:rank].T


def _solve_nuc(A_eq, A_ge, d, solver):
  import cvxpy as cp
  W = cp.Variable((d, d))
  w = cp.vec(W, order="C")
  cons = [A_ge @ w >= 1] if A_ge.shape[0] else []
  if A_eq.shape[0]:
    cons.append(A_eq @ w == 0)
  prob = cp.Problem(cp.Minimize(cp.normNuc(W)), cons)
  kwargs = {"eps": 1e-9, "max_iters": 200_000} if solver == "SCS" else {}
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")        # "solution may be inaccurate": the status says it
      prob.solve(solver=solver, **kwargs)
  except Exception as e:  # noqa: BLE001
    return "failed", None, f"{solver}: {type(e).__name__}: {e}"
  if prob.status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
    return "infeasible", None, f"{solver}: {prob.status}"
  if prob.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) or W.value is None:
    return "failed", None, f"{solver}: {prob.status}"
  return "optimal", np.asarray(W.value, np.float64).reshape(-1), "" if prob.status == cp.OPTIMAL else prob.status


def graph_svm(E, tokens, labels, norm: str = "fro", solver: str | None = None,
              finite_part: bool = True, ignore=None) -> GraphSVMResult:
  """The graph SVM of one data set (module docstring): E (K,d), tokens (n,T) ids whose last
  column is the query, labels (n,) ids occurring in their sequence.

  norm: "fro" (W-parameterization; default solver "nnls": the equality constraints are
    eliminated by a null-space basis, the rest is a least-distance program solved exactly by
    NNLS) or "nuc" ((K,Q); cvxpy, CLARABEL by default, "SCS" the check). "CLARABEL"/"SCS" also
    solve "fro". finite_part: also solve W^fin (``finite_part_of``; single labels only).
  labels may be an (n,T) bool mask of label positions: the local SVM of the tokens a trained
    model selected (``ignore``: (n,T) bool, tokens left out of the graph and the constraints).
  Returns a GraphSVMResult; bad input raises ValueError, a solver's failure is a status.
  """
  E, tokens, labels = check_data(E, tokens, labels)
  if norm not in ("fro", "nuc"):
    raise ValueError(f"graph_svm: norm must be 'fro' or 'nuc', got {norm!r}")
  solver = solver or ("nnls" if norm == "fro" else "CLARABEL")
  if solver not in ("nnls", "CLARABEL", "SCS"):
    raise ValueError(f"graph_svm: solver must be 'nnls' (fro), 'CLARABEL' or 'SCS', got {solver!r}")
  if solver == "nnls" and norm != "fro":
    raise ValueError("graph_svm: the nnls solver solves the Frobenius problem only; use CLARABEL for 'nuc'")
  d = E.shape[1]
  graph_of = graphs(tokens, labels, ignore)
  A_eq, A_ge = constraint_rows(E, tokens, labels, graph_of, ignore)
  if solver == "nnls":
    try:
      N = _null_space(A_eq, d * d)
      status, u, _, msg = svm_lib.least_distance(A_ge @ N)
      w = None if u is None else N @ u
    except np.linalg.LinAlgError as e:   # an SVD that did not converge: an outcome
      status, w, msg = "failed", None, f"null space (SVD): {e}"
  elif norm == "fro":
    import cvxpy as cp
    wv = cp.Variable(d * d)
    cons = ([A_ge @ wv >= 1] if A_ge.shape[0] else []) + ([A_eq @ wv == 0] if A_eq.shape[0] else [])
    prob = cp.Problem(cp.Minimize(cp.sum_squares(wv)), cons)
    try:
      prob.solve(solver=solver)
      ok = prob.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) and wv.value is not None
      status = "optimal" if ok else ("infeasible" if "infeasible" in str(prob.status) else "failed")
      w, msg = (np.asarray(wv.value, np.float64) if ok else None), str(prob.status)
    except Exception as e:  # noqa: BLE001
      status, w, msg = "failed", None, f"{solver}: {type(e).__name__}: {e}"
  else:
    status, w, msg = _solve_nuc(A_eq, A_ge, d, solver)
  if status == "optimal" and A_ge.shape[0]:
    lowest = float(np.min(A_ge @ w))
    if not lowest > 0.5:
      status, w, msg = "failed", None, f"{solver}: smallest margin {lowest:.3g}"
    else:
      w = w / lowest
  W = None if w is None else w.reshape(d, d)
  objective = float("nan") if W is None else float(np.linalg.norm(W, "nuc" if norm == "nuc" else "fro"))
  out = GraphSVMResult(status, W, graph_of, A_eq, A_ge, objective, norm, msg)
  if finite_part and labels.dtype != bool:
    out.W_fin, out.fin_status, out.fin_basis = finite_part_of(E, tokens, labels, graph_of)
  return out


def finite_basis(E, tokens, labels, graph_of: dict) -> np.ndarray:
  """(d*d, r) orthonormal basis of S_fin = span{vec((E_u - E_j) E_k^T): u, j in one SCC of k's graph}."""
  E = np.asarray(E, np.float64)
  d = E.shape[1]
  rows = []
  for k, g in graph_of.items():
    for comp in g.components:
      for u in comp[1:]:       # differences to the SCC's first token span every difference in it
        rows.append(np.outer(E[int(u)] - E[int(comp[0])], E[k]).reshape(-1))
  return _range(np.array(rows).reshape(-1, d * d))


def reduced_sequences(tokens, labels, graph_of: dict) -> list[tuple[int, int, np.ndarray]]:
  """(query k, label y, the distinct tokens of the sequence in y's SCC) of every sequence whose
  label's SCC holds another token of it (the others add a constant to the reduced loss)."""
  out = []
  for i in range(tokens.shape[0]):
    k, y = int(tokens[i, -1]), int(labels[i])
    g = graph_of[k]
    c = g.scc_of(y)
    same = np.array([int(t) for t in np.unique(tokens[i]) if g.scc_of(int(t)) == c])
    if same.size > 1:
      out.append((k, y, same))
  return out


def finite_part_of(E, tokens, labels, graph_of: dict):
  """(W^fin (d,d) or None, status, basis (d*d, r)): the minimizer over S_fin of
  sum_i -log softmax_y(E_t^T W E_k over the tokens t of sequence i in its label's SCC).

  Solved by cvxpy (CLARABEL, exponential cones) in the basis coordinates; the minimizer is
  unique in S_fin when it exists (the loss is strictly convex there on generic embeddings)."""
  import cvxpy as cp
  E = np.asarray(E, np.float64)
  d = E.shape[1]
  basis = finite_basis(E, tokens, labels, graph_of)
  seqs = reduced_sequences(tokens, labels, graph_of)
  if basis.shape[1] == 0 or not seqs:
    return np.zeros((d, d)), "optimal", basis
  a = cp.Variable(basis.shape[1])
  terms = []
  for k, y, same in seqs:
    # logits E_t^T W E_k = <vec(E_t E_k^T), basis a>
    F = np.stack([np.outer(E[t], E[k]).reshape(-1) for t in same]) @ basis    # (m, r)
    Fy = np.outer(E[y], E[k]).reshape(-1) @ basis
    terms.append(cp.log_sum_exp(F @ a) - Fy @ a)
  prob = cp.Problem(cp.Minimize(cp.sum(cp.hstack(terms))))
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")     # "may be inaccurate": Newton steps below polish the solution
      prob.solve(solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12, max_iter=500)
  except Exception as e:  # noqa: BLE001
    return None, f"failed: {type(e).__name__}: {e}", basis
  if prob.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) or a.value is None:
    return None, f"failed: {prob.status}", basis
  coef = np.asarray(a.value, np.float64)
  coef = _newton_polish(coef, E, seqs, basis)
  return (basis @ coef).reshape(d, d), "optimal", basis


def _newton_polish(coef, E, seqs, basis, iters: int = 8):
  """A few Newton steps on the reduced loss from cvxpy's solution (to rounding accuracy)."""
  mats = []
  for k, y, same in seqs:
    F = np.stack([np.outer(E[t], E[k]).reshape(-1) for t in same]) @ basis
    mats.append((F, int(np.flatnonzero(same == y)[0])))

  def grad_hess(c):
    g = np.zeros_like(c)
    H = np.zeros((c.size, c.size))
    for F, iy in mats:
      z = F @ c
      p = np.exp(z - z.max())
      p /= p.sum()
      g += F.T @ p - F[iy]
      H += F.T @ (np.diag(p) - np.outer(p, p)) @ F
    return g, H

  for _ in range(iters):
    g, H = grad_hess(coef)
    if not np.all(np.isfinite(g)) or np.linalg.norm(g) < 1e-14:
      break
    step = np.linalg.lstsq(H, g, rcond=None)[0]
    if not np.all(np.isfinite(step)):
      break
    coef = coef - step
  return coef


def finite_part_gradient(W_fin: np.ndarray, E, tokens, labels, graph_of: dict) -> np.ndarray:
  """The gradient of the reduced loss at W^fin projected on S_fin (0 at the minimizer): for checks."""
  E = np.asarray(E, np.float64)
  basis = finite_basis(E, tokens, labels, graph_of)
  G = np.zeros(W_fin.size)
  for k, y, same in reduced_sequences(tokens, labels, graph_of):
    z = np.array([E[t] @ W_fin @ E[k] for t in same])
    p = np.exp(z - z.max())
    p /= p.sum()
    for t, pt in zip(same, p):
      G += (pt - (t == y)) * np.outer(E[t], E[k]).reshape(-1)
  return basis @ (basis.T @ G)
