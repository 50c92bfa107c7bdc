"""svmattn.svm.graph_svm (token graphs, the graph SVM, its finite part) and the next-token models.

Checks:
  token_graph: hand-built graphs with known SCCs, ranks and reachability (a cycle, a chain, two
    separate 2-cycles, the query inside a cycle, a second query kept apart), and random graphs
    against an SCC computation written here (mutual reachability by transitive closure).
  graph_svm on a random data set (K=6, d=8, n=6, T=4): the constraints built here from the
    definition (equalities inside an SCC, margins >= 1 across SCCs) hold, the smallest margin is
    1, W^svm equals an independent cvxpy solve and is orthogonal to S_fin; the finite part W^fin
    lies in S_fin and zeroes the projected gradient of the reduced loss (the library's and one
    computed here); the nuclear-norm solution is feasible with no larger nuclear norm.
  check_data: the errors for absent labels, repeated tokens, ids out of range, NaN embeddings.
  the next_token and next_token_lsq models: loss values against NumPy, jax.grad and make_grad
    against central finite differences (W and (K,Q)), a label on several positions, and the
    log mass of a saturated softmax.
"""
import warnings

import cvxpy as cp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from svmattn.data import datasets as data_lib
from svmattn.models import attention as model_lib
from svmattn.models import heads
from svmattn.svm import graph_svm

Q, A, B, C, D = 0, 1, 2, 3, 4     # token ids of the hand-built graphs (Q the query)


def _my_graph(tokens, labels, query):
  """(nodes, edge set, SCCs as frozensets, {SCC: rank}, {(SCC, SCC) reachable}) from the definition."""
  rows = [i for i in range(len(tokens)) if tokens[i][-1] == query]
  nodes = sorted({int(t) for i in rows for t in tokens[i]})
  edges = {(int(labels[i]), int(t)) for i in rows for t in tokens[i] if int(t) != int(labels[i])}
  idx = {t: a for a, t in enumerate(nodes)}
  m = len(nodes)
  R = np.eye(m, dtype=bool)
  for u, v in edges:
    R[idx[u], idx[v]] = True
  for _ in range(m):                        # transitive closure by repeated squaring
    R = R | ((R.astype(int) @ R.astype(int)) > 0)
  scc = {t: frozenset(s for s in nodes if R[idx[t], idx[s]] and R[idx[s], idx[t]]) for t in nodes}
  comps = set(scc.values())
  reach = {(scc[u], scc[v]) for u in nodes for v in nodes if R[idx[u], idx[v]] and scc[u] != scc[v]}
  preds = {c: {scc[u] for u, v in edges if scc[v] == c and scc[u] != c} for c in comps}
  rank = {}

  def longest(c):                           # the longest path from a source SCC to c
    if c not in rank:
      rank[c] = 0 if not preds[c] else 1 + max(longest(p) for p in preds[c])
    return rank[c]

  for c in comps:
    longest(c)
  return nodes, edges, comps, rank, reach


def _lib_graph(g):
  """The same description of a TokenGraph."""
  comps = [frozenset(int(t) for t in c) for c in g.components]
  edges = {(int(g.nodes[a]), int(g.nodes[b])) for a, b in zip(*np.nonzero(g.edges))}
  rank = {c: int(g.rank[i]) for i, c in enumerate(comps)}
  reach = {(comps[a], comps[b]) for a, b in zip(*np.nonzero(g.reach))}
  assert len(set(comps)) == len(comps)
  for i, c in enumerate(comps):
    for t in c:
      assert g.scc_of(t) == i
  return [int(t) for t in g.nodes], edges, set(comps), rank, reach


def _fs(*groups):
  return {frozenset(x) for x in groups}


def _check_hand_built(tokens, labels, parts, ranks, reach):
  g = graph_svm.token_graph(np.array(tokens), np.array(labels), Q)
  nodes, edges, comps, rank, rch = _lib_graph(g)
  assert comps == parts
  assert rank == {frozenset(k): v for k, v in ranks}
  assert rch == {(frozenset(a), frozenset(b)) for a, b in reach}
  assert (nodes, edges, comps, rank, rch) == _my_graph(tokens, labels, Q)
  return g


def test_token_graph_cycle():
  # a -> b, b -> c, c -> a, each label also -> the query (the query has no outgoing edge)
  tokens = [[A, B, Q], [B, C, Q], [C, A, Q], [A, D, 5]]       # the last sequence has another query
  g = _check_hand_built(tokens, [A, B, C, A], _fs({A, B, C}, {Q}),
                        [({A, B, C}, 0), ({Q}, 1)], [({A, B, C}, {Q})])
  assert g.query == Q and D not in g.nodes
  all_graphs = graph_svm.graphs(np.array(tokens), np.array([A, B, C, A]))
  assert set(all_graphs) == {Q, 5}
  assert {frozenset(int(t) for t in c) for c in all_graphs[5].components} == _fs({A}, {D}, {5})


def test_token_graph_chain():
  g = _check_hand_built([[A, B, Q], [B, C, Q]], [A, B], _fs({A}, {B}, {C}, {Q}),
                        [({A}, 0), ({B}, 1), ({C}, 2), ({Q}, 2)],
                        [({A}, {B}), ({A}, {C}), ({A}, {Q}), ({B}, {C}), ({B}, {Q})])
  assert g.reach[g.scc_of(A), g.scc_of(C)] and not g.reach[g.scc_of(C), g.scc_of(A)]


def test_token_graph_two_components():
  _check_hand_built([[A, B, Q], [B, A, Q], [C, D, Q], [D, C, Q]], [A, B, C, D], _fs({A, B}, {C, D}, {Q}),
                    [({A, B}, 0), ({C, D}, 0), ({Q}, 1)], [({A, B}, {Q}), ({C, D}, {Q})])


def test_token_graph_query_in_cycle():
  # a -> c, a -> q (label a); q -> b, q -> a (label q): {a, q} is one SCC above b and c
  _check_hand_built([[A, C, Q], [B, A, Q]], [A, Q], _fs({A, Q}, {B}, {C}),
                    [({A, Q}, 0), ({B}, 1), ({C}, 1)], [({A, Q}, {B}), ({A, Q}, {C})])


def test_token_graph_random():
  rng = np.random.default_rng(11)
  sizes = []
  for _ in range(20):
    rows = []
    for _ in range(9):                     # queries 0 or 1: large graphs with cycles
      q = int(rng.integers(0, 2))
      rows.append(list(rng.permutation([t for t in range(7) if t != q])[:3]) + [q])
    tokens = np.array(rows)
    labels = np.array([rng.choice(r) for r in tokens])
    for k, g in graph_svm.graphs(tokens, labels).items():
      sizes += [len(c) for c in g.components]
      assert _lib_graph(g) == _my_graph(tokens.tolist(), labels.tolist(), k)
  assert max(sizes) >= 3 and min(sizes) == 1


# ----------------------------------------------------------------------------
# The graph SVM
# ----------------------------------------------------------------------------

K, DIM, N, T = 6, 8, 6, 4


def _random_data(seed):
  rng = np.random.default_rng(seed)
  E = rng.standard_normal((K, DIM))
  E /= np.linalg.norm(E, axis=1, keepdims=True)
  tokens = np.stack([rng.permutation(K)[:T] for _ in range(N)])
  labels = np.array([rng.choice(r) for r in tokens])
  return E, tokens, labels


@pytest.fixture(scope="module")
def data():
  return _random_data(0)


@pytest.fixture(scope="module")
def scc(data):
  """{query: {token: its SCC (frozenset)}} computed here."""
  E, tokens, labels = data
  out = {}
  for k in np.unique(tokens[:, -1]):
    _, _, comps, _, _ = _my_graph(tokens.tolist(), labels.tolist(), int(k))
    out[int(k)] = {t: c for c in comps for t in c}
  return out


@pytest.fixture(scope="module")
def rows(data, scc):
  """(A_eq, A_ge): the constraint rows vec((E_y - E_j) E_k^T) from the definition (with repeats)."""
  E, tokens, labels = data
  eq, ge = [], []
  for i in range(N):
    k, y = int(tokens[i, -1]), int(labels[i])
    for j in tokens[i]:
      if j != y:
        (eq if scc[k][int(j)] == scc[k][y] else ge).append(np.outer(E[y] - E[j], E[k]).reshape(-1))
  return np.array(eq), np.array(ge)


@pytest.fixture(scope="module")
def fin_span(data, scc):
  """(d*d, r) orthonormal basis of S_fin = span{(E_u - E_j) E_k^T: u, j in one SCC of k}."""
  E, _, _ = data
  mats = [np.outer(E[u] - E[j], E[k]).reshape(-1) for k, m in scc.items() for c in set(m.values())
          for u in c for j in c if u != j]
  U, s, _ = np.linalg.svd(np.array(mats).T, full_matrices=False)
  return U[:, s > 1e-10 * s[0]]


@pytest.fixture(scope="module")
def fro(data):
  return graph_svm.graph_svm(*data)


def test_data_set_is_nontrivial(data, scc, rows, fin_span):
  assert any(len(c) > 1 for m in scc.values() for c in m.values())
  assert rows[0].shape[0] > 0 and rows[1].shape[0] > 0
  assert fin_span.shape[1] > 0


def test_graph_svm_constraints_and_optimality(data, rows, fro):
  assert fro.status == "optimal" and fro.ok, fro.message
  w = fro.W.reshape(-1)
  A_eq, A_ge = rows
  assert np.max(np.abs(A_eq @ w)) < 1e-8
  assert np.min(A_ge @ w) >= 1 - 1e-8
  assert np.min(A_ge @ w) == pytest.approx(1, abs=1e-8)
  assert fro.objective == pytest.approx(np.linalg.norm(w), rel=1e-14)
  # the same constraint sets as the library's (each distinct row once there)
  for mine, lib in ((A_eq, fro.A_eq), (A_ge, fro.A_ge)):
    uniq = np.unique(np.round(mine, 12), axis=0)
    assert len(uniq) == len(lib)
    assert all(np.min(np.linalg.norm(lib - r, axis=1)) < 1e-12 for r in mine)
  # an independent solve
  wv = cp.Variable(DIM * DIM)
  prob = cp.Problem(cp.Minimize(cp.norm(wv, 2)), [A_ge @ wv >= 1, A_eq @ wv == 0])
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    prob.solve(solver="CLARABEL")
  assert prob.status == cp.OPTIMAL
  assert np.linalg.norm(w - wv.value) <= 1e-5 * np.linalg.norm(wv.value)


def test_graph_svm_orthogonal_to_finite_part(data, scc, fro, fin_span):
  E, _, _ = data
  for k, m in scc.items():
    for c in set(m.values()):
      for u in c:
        for j in c:
          assert abs(np.sum(fro.W * np.outer(E[u] - E[j], E[k]))) < 1e-8
  assert np.max(np.abs(fro.fin_basis.T @ fro.W.reshape(-1))) < 1e-8
  assert fro.fin_basis.shape[1] == fin_span.shape[1]


def _reduced_gradient(W, E, tokens, labels, scc):
  """The gradient of sum_i -log softmax_y(E_t^T W E_k, t in the sequence's tokens of y's SCC)."""
  G = np.zeros_like(W)
  for i in range(N):
    k, y = int(tokens[i, -1]), int(labels[i])
    same = [int(t) for t in tokens[i] if scc[k][int(t)] == scc[k][y]]
    if len(same) < 2:
      continue
    z = np.array([E[t] @ W @ E[k] for t in same])
    p = np.exp(z - z.max())
    p /= p.sum()
    for t, pt in zip(same, p):
      G += (pt - (t == y)) * np.outer(E[t], E[k])
  return G


def test_finite_part(data, scc, fro, fin_span):
  E, tokens, labels = data
  assert fro.fin_status == "optimal"
  w = fro.W_fin.reshape(-1)
  assert np.linalg.norm(w) > 0.1                     # a nontrivial finite part here
  assert np.linalg.norm(w - fin_span @ (fin_span.T @ w)) < 1e-10 * np.linalg.norm(w)
  assert np.linalg.norm(graph_svm.finite_part_gradient(fro.W_fin, E, tokens, labels, fro.graphs)) < 1e-7
  G = _reduced_gradient(fro.W_fin, E, tokens, labels, scc).reshape(-1)
  assert np.linalg.norm(fin_span.T @ G) < 1e-7
  G0 = _reduced_gradient(np.zeros_like(fro.W_fin), E, tokens, labels, scc).reshape(-1)
  assert np.linalg.norm(fin_span.T @ G0) > 1e-2      # (W = 0 is not the minimizer)


def test_graph_svm_nuclear(data, rows, fro):
  nuc = graph_svm.graph_svm(*data, norm="nuc", finite_part=False)
  assert nuc.ok, nuc.message
  w = nuc.W.reshape(-1)
  A_eq, A_ge = rows
  assert np.max(np.abs(A_eq @ w)) < 1e-6
  assert np.min(A_ge @ w) >= 1 - 1e-6
  assert nuc.objective == pytest.approx(np.linalg.norm(nuc.W, "nuc"), rel=1e-12)
  assert np.linalg.norm(nuc.W, "nuc") <= np.linalg.norm(fro.W, "nuc") + 1e-6
  assert np.linalg.norm(fro.W) <= np.linalg.norm(nuc.W) + 1e-6


def test_check_data_errors(data):
  E, tokens, labels = data
  bad = labels.copy()
  bad[2] = next(t for t in range(K) if t not in tokens[2])
  with pytest.raises(ValueError, match="does not occur"):
    graph_svm.graph_svm(E, tokens, bad)
  rep = tokens.copy()
  rep[1, 0] = rep[1, 1]
  with pytest.raises(ValueError, match="distinct"):
    graph_svm.check_data(E, rep, rep[:, 1])
  big = tokens.copy()
  big[0, 0] = K
  with pytest.raises(ValueError, match="token ids"):
    graph_svm.graph_svm(E, big, labels)
  neg = tokens.copy()
  neg[0, 0] = -1
  with pytest.raises(ValueError, match="token ids"):
    graph_svm.check_data(E, neg, labels)
  nan = E.copy()
  nan[3, 2] = np.nan
  with pytest.raises(ValueError, match="finite"):
    graph_svm.graph_svm(nan, tokens, labels)
  with pytest.raises(ValueError, match="integer"):
    graph_svm.check_data(E, tokens.astype(float), labels)
  E2, t2, l2 = graph_svm.check_data(E, tokens.astype(np.int32), labels)
  assert E2.dtype == np.float64 and t2.dtype == np.int64 and l2.dtype == np.int64


# ----------------------------------------------------------------------------
# Next-token models
# ----------------------------------------------------------------------------

def _next_token_data(E, tokens, labels):
  return data_lib.Dataset(E[tokens], (tokens == labels[:, None]).astype(np.float64), E[tokens[:, -1]], E)


def _fd_grad(loss, params, data, h=1e-6):
  f = jax.jit(loss)
  out = {}
  for name, p in params.items():
    g = np.zeros(p.size)
    for a in range(p.size):
      e = np.zeros(p.size)
      e[a] = h
      plus = {**params, name: p + e.reshape(p.shape)}
      minus = {**params, name: p - e.reshape(p.shape)}
      g[a] = (float(f(plus, data)) - float(f(minus, data))) / (2 * h)
    out[name] = g.reshape(p.shape)
  return out


def _rel_close(got, want, rtol=1e-6):
  for k in want:
    assert np.linalg.norm(np.asarray(got[k]) - want[k]) <= rtol * np.linalg.norm(want[k]), k


def _softmax(z):
  p = np.exp(z - z.max(axis=-1, keepdims=True))
  return p / p.sum(axis=-1, keepdims=True)


def _numpy_loss(model, W, d):
  X, Y, Z, V = (np.asarray(a) for a in d)
  s = _softmax(np.einsum("ntd,de,ne->nt", X, W, Z))
  if model == "next_token":
    return -np.mean(np.log(np.sum(s * (Y > 0), axis=-1)))
  r = np.einsum("nt,ntd->nd", s, X)
  e_y = np.einsum("nt,ntd->nd", Y, X) / Y.sum(-1, keepdims=True)
  f = np.exp(np.sum(r * e_y, -1)) / np.sum(np.exp(r @ V.T), -1)
  return np.mean((1 - f) ** 2)


@pytest.mark.slow   # (CI runs it with the slow tests: the test command stays under 5 minutes)
@pytest.mark.parametrize("model", ["next_token", "next_token_lsq"])
def test_next_token_loss_and_gradients(data, model):
  E, tokens, labels = data
  d = _next_token_data(E, tokens, labels)
  rng = np.random.default_rng(2)
  head = heads.get_head("linear")
  W = rng.standard_normal((DIM, DIM))
  wp = model_lib.get_parameterization("W")
  loss = model_lib.make_loss(wp, head, model=model)
  assert float(loss({"W": W}, d)) == pytest.approx(_numpy_loss(model, W, d), rel=1e-12)
  fd = _fd_grad(loss, {"W": W}, d)
  _rel_close(jax.grad(loss)({"W": W}, d), fd)
  _rel_close(model_lib.make_grad(wp, head, model=model)({"W": W}, d), fd)
  # a label on two positions (the model allows repeated tokens): its mass is the sum
  Y2 = np.array(d.Y)
  Y2[0, (np.argmax(Y2[0]) + 1) % T] = 1.0
  d2 = d._replace(Y=Y2)
  assert float(loss({"W": W}, d2)) == pytest.approx(_numpy_loss(model, W, d2), rel=1e-12)
  assert abs(float(loss({"W": W}, d2)) - float(loss({"W": W}, d))) > 1e-6
  _rel_close(jax.grad(loss)({"W": W}, d2), _fd_grad(loss, {"W": W}, d2))
  # (K,Q): W = K Q^T (with its ridge)
  kq = model_lib.get_parameterization("KQ")
  params = {"K": rng.standard_normal((DIM, 3)), "Q": rng.standard_normal((DIM, 3))}
  kq_loss = model_lib.make_loss(kq, head, model=model)
  assert float(kq_loss(params, d)) == pytest.approx(
      _numpy_loss(model, params["K"] @ params["Q"].T, d) + model_lib.KQ_RIDGE * sum(np.sum(p * p) for p in
                                                                                 params.values()), rel=1e-12)
  _rel_close(model_lib.make_grad(kq, head, model=model)(params, d), _fd_grad(kq_loss, params, d))


def test_next_token_log_mass_saturated(data):
  E, tokens, labels = data
  d = _next_token_data(E, tokens, labels)
  W = 2000.0 * np.random.default_rng(4).standard_normal((DIM, DIM))
  f, s = model_lib.next_token_log_mass(jnp.asarray(W), d)
  logits = np.einsum("ntd,de,ne->nt", d.X, W, d.Z)
  on = np.asarray(d.Y) > 0

  def lse(z):
    return z.max(-1) + np.log(np.sum(np.exp(z - z.max(-1, keepdims=True)), -1))

  want = lse(np.where(on, logits, -np.inf)) - lse(logits)
  assert np.all(np.isfinite(np.asarray(f)))
  assert np.min(want) < -800                  # exp of it underflows: log(s) would be -inf
  np.testing.assert_allclose(f, want, rtol=1e-12, atol=1e-9)
  np.testing.assert_allclose(np.sum(s, -1), 1.0, rtol=0, atol=1e-12)
