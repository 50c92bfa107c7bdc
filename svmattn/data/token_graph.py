"""Token graphs of next-token data (docs/science.md section 12): for each query token k, an edge
y -> j from the label y of every sequence ending in k to each other token j of it; the strongly
connected components (SCCs) of the graph, ordered by reachability. Also the checks of a
next-token data set. Used by the generator (``data.next_token``) and the graph SVM
(``svm.graph_svm``).
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class TokenGraph:
  """The token graph of one query token.

  nodes:      (m,) the token ids of the graph (every token of a sequence ending in the query)
  edges:      (m,m) bool, edges[a, b]: an edge nodes[a] -> nodes[b]
  component:  (m,) the SCC index of each node
  components: list of SCCs (arrays of token ids), index = SCC index
  rank:       (number of SCCs,) 0 for SCCs no other SCC reaches, else 1 + the largest rank of an
              SCC that reaches it (a topological order of the condensation)
  reach:      (c,c) bool, reach[a, b]: SCC b is reachable from SCC a (a != b)
  """
  query: int
  nodes: np.ndarray
  edges: np.ndarray
  component: np.ndarray
  components: list
  rank: np.ndarray
  reach: np.ndarray

  def scc_of(self, token: int) -> int:
    return int(self.component[int(np.flatnonzero(self.nodes == token)[0])])


def check_data(E, tokens, labels, where: str = "graph_svm"):
  """(E (K,d) float64, tokens (n,T) int64, labels (n,) int64), or ValueError naming the problem.
  ``labels`` may also be an (n,T) bool mask of label positions (label sets, ``targets``)."""
  if np.asarray(labels).dtype == bool:
    E, tokens, _ = check_data(E, tokens, np.asarray(tokens)[:, -1], where)
    mask = np.asarray(labels)
    if mask.shape != tokens.shape or not mask.any(axis=1).all():
      raise ValueError(f"{where}: a label mask must have shape (n, T) = {tokens.shape} with a label in every "
                       f"sequence, got shape {mask.shape}")
    return E, tokens, mask
  E = np.asarray(E)
  tokens = np.asarray(tokens)
  labels = np.asarray(labels)
  if E.ndim != 2 or E.shape[0] < 2 or E.shape[1] < 1:
    raise ValueError(f"{where}: E must have shape (K, d) with K >= 2, got {E.shape}")
  if tokens.ndim != 2 or tokens.shape[1] < 2:
    raise ValueError(f"{where}: tokens must have shape (n, T) with T >= 2, got {tokens.shape}")
  if labels.shape != (tokens.shape[0],):
    raise ValueError(f"{where}: labels must have shape (n,) = ({tokens.shape[0]},), got {labels.shape}")
  for name, a in (("tokens", tokens), ("labels", labels)):
    if a.dtype.kind not in "iu":
      raise ValueError(f"{where}: {name} must be integer token ids, got dtype {a.dtype}")
    if a.size and (a.min() < 0 or a.max() >= E.shape[0]):
      raise ValueError(f"{where}: {name} must be token ids in [0, K={E.shape[0]}), got values from "
                       f"{a.min()} to {a.max()}")
  if not np.all(np.isfinite(E)):
    raise ValueError(f"{where}: E must be finite (found NaN or inf)")
  srt = np.sort(tokens, axis=1)
  dup = np.flatnonzero(np.any(srt[:, 1:] == srt[:, :-1], axis=1))
  if dup.size:
    i = int(dup[0])
    raise ValueError(f"{where}: the tokens of a sequence must be distinct; sequence {i} is {tokens[i].tolist()} "
                     f"({dup.size} such sequence(s))")
  absent = np.flatnonzero(~np.any(tokens == labels[:, None], axis=1))
  if absent.size:
    i = int(absent[0])
    raise ValueError(f"{where}: the label of sequence {i} ({int(labels[i])}) does not occur in it "
                     f"(tokens {tokens[i].tolist()}); {absent.size} such sequence(s)")
  return E.astype(np.float64), tokens.astype(np.int64), labels.astype(np.int64)


def targets_of(tokens, labels) -> np.ndarray:
  """(n,T) bool: the positions holding a label (``labels`` (n,) ids, or already such a mask)."""
  labels = np.asarray(labels)
  if labels.dtype == bool:
    return labels
  return np.asarray(tokens) == labels[:, None]


def token_graph(tokens: np.ndarray, labels: np.ndarray, query: int, ignore: np.ndarray | None = None) -> TokenGraph:
  """The token graph of query token ``query`` and its ordered SCCs (scipy's strong components).

  labels: (n,) ids, or an (n,T) bool mask of label positions (several labels per sequence: an
  edge from each to every other token). ignore: optional (n,T) bool, tokens that get no edge."""
  tokens = np.asarray(tokens, np.int64)
  target = targets_of(tokens, labels)
  ignore = np.zeros(tokens.shape, bool) if ignore is None else np.asarray(ignore, bool)
  rows = np.flatnonzero(tokens[:, -1] == query)
  nodes = np.unique(tokens[rows]) if rows.size else np.array([query], np.int64)
  index = {int(t): a for a, t in enumerate(nodes)}
  m = len(nodes)
  edges = np.zeros((m, m), bool)
  for i in rows:
    for c in tokens[i][target[i]]:
      for t, skip in zip(tokens[i], ignore[i]):
        if int(t) != int(c) and not skip:
          edges[index[int(c)], index[int(t)]] = True
  from scipy.sparse import csgraph, csr_matrix   # here: 0.25 s of every process that imports the registry
  count, component = csgraph.connected_components(csr_matrix(edges.astype(np.int8)), directed=True,
                                                  connection="strong")
  components = [nodes[component == c] for c in range(count)]
  cond = np.zeros((count, count), bool)
  a, b = np.nonzero(edges)
  cond[component[a], component[b]] = True
  np.fill_diagonal(cond, False)
  reach = cond.copy()          # transitive closure (Warshall; the graphs are small)
  for k in range(count):
    reach |= reach[:, k:k + 1] & reach[k:k + 1, :]
  rank = np.zeros(count, np.int64)
  for _ in range(count):       # longest path from a source SCC
    for c in range(count):
      preds = np.flatnonzero(cond[:, c])
      if preds.size:
        rank[c] = max(rank[c], 1 + rank[preds].max())
  return TokenGraph(int(query), nodes, edges, component.astype(np.int64), components, rank, reach)


def graphs(tokens, labels, ignore=None) -> dict:
  """{query token id: TokenGraph} for every query token of the data set."""
  tokens = np.asarray(tokens, np.int64)
  return {int(k): token_graph(tokens, labels, int(k), ignore) for k in np.unique(tokens[:, -1])}


