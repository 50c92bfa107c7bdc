"""E12 (experiments.next_token) end to end at a tiny size, its data generator and data files."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT
from svmattn.data import datasets as data_lib
from svmattn.data import next_token as next_token_data
from test_health_studies import check_summary
from test_sweep import ENV

# End to end through the binary (a few seconds to a minute each): with the slow tests, which CI runs;
# the README's test command keeps the library's own tests.
pytestmark = pytest.mark.slow


def _run(out, *flags, timeout=600):
  return subprocess.run([sys.executable, "-m", "experiments.next_token", f"--out={out}", "--noprogress", *flags],
                        cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


def test_generator_follows_the_public_code():
  spec = next_token_data.TokenSpec(K=6, d=8, n=6, T=4)
  d = next_token_data.generate(spec, 0, np.arange(6))
  assert d.E.shape == (6, 6, 8) and d.tokens.shape == (6, 6, 4) and d.labels.shape == (6, 6)
  np.testing.assert_allclose(np.linalg.norm(d.E, axis=-1), 1, atol=1e-12)
  for b in range(6):
    assert all(len(set(row)) == 4 for row in d.tokens[b].tolist())            # distinct tokens
    assert np.all(np.any(d.tokens[b] == d.labels[b][:, None], axis=1))         # labels occur in the sequence
    assert next_token_data.has_cycle(d.tokens[b], d.labels[b])                              # redrawn until a cycle
  again = next_token_data.generate(spec, 0, np.array([4, 2]))                                # run r: the same in any batch
  for field in next_token_data.FIELDS:
    np.testing.assert_array_equal(getattr(again, field), getattr(d, field)[[4, 2]])
  ds = next_token_data.to_dataset(d)
  np.testing.assert_array_equal(ds.X[1, 2, 3], d.E[1, d.tokens[1, 2, 3]])
  np.testing.assert_array_equal(ds.Z, ds.X[:, :, -1])
  assert np.all(ds.Y.sum(-1) == 1)
  with pytest.raises(ValueError, match="K >= T"):
    next_token_data.TokenSpec(K=3, T=4).validate()


def _bad(tmp_path, **arrays):
  path = tmp_path / "bad.npz"
  np.savez(path, **arrays)
  with pytest.raises(data_lib.DataError) as e:
    next_token_data.load_npz(path)
  return str(e.value)


def test_the_host_generator_draws_jaxs_tokens_and_labels():
  """next_token's generator runs on the host (numerics version 9): its tokens and labels are those
  of the JAX calls it stands for (split, permutation, randint, fold_in per attempt) exactly, on 40
  runs of two sizes (K = 2000 takes two shuffle rounds), and its embeddings are unit rows of JAX's
  normal draw to rounding."""
  import jax
  import jax.numpy as jnp
  from svmattn import rng

  def reference(spec, key):
    ke, kt, kl, kr = jax.random.split(key, 4)
    E = rng.normal(ke, (spec.K, spec.d), jnp.float64)
    E = E / jnp.linalg.norm(E, axis=-1, keepdims=True)
    tokens = jax.vmap(lambda k: jax.random.permutation(k, spec.K)[:spec.T])(jax.random.split(kt, spec.n))
    labels = jax.random.randint(kl, (spec.n,), 0, spec.K)
    present = jnp.any(tokens == labels[:, None], axis=1)
    pos = jax.random.randint(kr, (spec.n,), 0, spec.T)
    return E, tokens, jnp.where(present, labels, tokens[jnp.arange(spec.n), pos])

  for spec in (next_token_data.TokenSpec(K=6, d=8, n=6, T=4), next_token_data.TokenSpec(K=2000, d=3, n=2, T=3)):
    keys = jax.vmap(lambda r: jax.random.fold_in(rng.split_run_key(rng.run_key(5, r))[0], 3))(jnp.arange(40))
    want = jax.jit(jax.vmap(lambda k: reference(spec, k)))(keys)
    got = next_token_data._draw(spec, np.asarray(keys))
    np.testing.assert_array_equal(got[1], np.asarray(want[1]))
    np.testing.assert_array_equal(got[2], np.asarray(want[2]))
    np.testing.assert_allclose(got[0], np.asarray(want[0]), rtol=0, atol=1e-15)   # unit rows: a few ulps


def test_has_cycle_is_an_scc_of_two_tokens_or_more():
  """next_token.has_cycle (Warshall on each query's graph) answers as the SCCs of token_graph.graphs
  do, on 400 random data sets of several sizes, with and without cycles."""
  from svmattn.data import token_graph
  gen = np.random.default_rng(2)
  seen = set()
  for _ in range(400):
    K, n, T = int(gen.integers(3, 9)), int(gen.integers(1, 8)), int(gen.integers(2, 4))
    tokens = np.stack([gen.permutation(K)[:T] for _ in range(n)])
    labels = tokens[np.arange(n), gen.integers(0, T, n)]
    want = any(len(c) > 1 for g in token_graph.graphs(tokens, labels).values() for c in g.components)
    assert next_token_data.has_cycle(tokens, labels) == want
    seen.add(want)
  assert seen == {True, False}


def test_data_file_errors(tmp_path):
  d = next_token_data.generate(next_token_data.TokenSpec(), 1, np.arange(2))
  good = {"E": d.E, "tokens": d.tokens, "labels": d.labels}
  assert "missing array" in _bad(tmp_path, E=d.E, tokens=d.tokens)
  labels = d.labels.copy()
  absent = [t for t in range(6) if t not in d.tokens[1, 2]][0]
  labels[1, 2] = absent
  assert "does not occur" in _bad(tmp_path, **{**good, "labels": labels})
  tokens = d.tokens.copy()
  tokens[0, 0, 1] = tokens[0, 0, 0]
  assert "distinct" in _bad(tmp_path, **{**good, "tokens": tokens})
  assert "integer" in _bad(tmp_path, **{**good, "tokens": d.tokens.astype(float)})
  E = d.E.copy()
  E[0, 0, 0] = np.nan
  assert "finite" in _bad(tmp_path, **{**good, "E": E})
  assert "shape" in _bad(tmp_path, **{**good, "labels": d.labels[:, :3]})
  tokens = d.tokens.copy()
  tokens[0, 0, 0] = 9
  assert "[0, K=6)" in _bad(tmp_path, **{**good, "tokens": tokens})
  path = tmp_path / "good.npz"
  next_token_data.save_npz(path, d)
  back = next_token_data.load_npz(path)
  np.testing.assert_array_equal(back.tokens, d.tokens)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  out = tmp_path_factory.mktemp("e12")
  proc = _run(out, "--runs=3", "--steps=300", "--chunk_steps=100", "--block_size=4", "--params=W,KQ")
  assert proc.returncode == 0, proc.stderr[-3000:]
  return out, proc.stdout


def test_outputs(run):
  out, stdout = run
  for name in ("results.npz", "summary.json", "corr.png", "residual.png", "graph.png"):
    assert os.path.getsize(out / name) > 0
  a = np.load(out / "results.npz")
  S = len(a["steps"])
  assert a["steps"][-1] == 300
  for p in ("W", "KQ"):
    assert a[f"W_final_{p}"].shape == (3, 8, 8)
    assert a[f"corr_{p}"].shape == a[f"resid_{p}"].shape == a[f"fin_gap_{p}"].shape == (3, S)
    assert np.all(a[f"svm_{p}_status"] == "optimal")
  # the graph SVM of the results equals graph_svm of the stored data
  from svmattn.svm import graph_svm
  r = graph_svm.graph_svm(a["E"][1], a["tokens"][1], a["labels"][1])
  np.testing.assert_allclose(a["W_svm_W"][1], r.W, atol=1e-10)
  summary = json.loads((out / "summary.json").read_text())
  assert summary["params"]["W"]["corr_final"]["mean"] == pytest.approx(float(np.mean(a["corr_W"][:, -1])))
  assert summary["public"]["corr_final"]["min"] == 0.97615
  assert "E12 next-token prediction (global)" in stdout
  check_summary(summary, a, {"W": 3, "KQ": 3}, threshold=0.0)


@pytest.mark.slow   # a second end-to-end run (.ci/run runs the slow tests too)
def test_local_setting_and_data_file(tmp_path):
  d = next_token_data.generate(next_token_data.TokenSpec(), 5, np.arange(2))
  path = tmp_path / "d.npz"
  next_token_data.save_npz(path, d)
  proc = _run(tmp_path / "o", f"--data={path}", "--setting=local", "--steps=200", "--chunk_steps=100",
              "--block_size=2")
  assert proc.returncode == 0, proc.stderr[-3000:]
  a = np.load(tmp_path / "o" / "results.npz")
  np.testing.assert_array_equal(a["tokens"], d.tokens)
  assert a["corr_local_W"].shape == a["corr_W"].shape and "label_selected_W" in a.files


@pytest.mark.parametrize("flags, needle", [
    (["--K=3", "--T=4"], "T <= K"),
    pytest.param(["--params=X"], "--params", marks=pytest.mark.slow),
    pytest.param(["--setting=bogus"], "--setting", marks=pytest.mark.slow),
    pytest.param(["--lr=0"], "--lr", marks=pytest.mark.slow)])
def test_bad_flags(tmp_path, flags, needle):
  proc = _run(tmp_path / "o", *flags, timeout=120)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr and needle in proc.stderr


def test_bad_data_file_is_one_line(tmp_path):
  d = next_token_data.generate(next_token_data.TokenSpec(), 1, np.arange(1))
  labels = d.labels.copy()
  labels[0, 0] = [t for t in range(6) if t not in d.tokens[0, 0]][0]
  path = tmp_path / "bad.npz"
  np.savez(path, E=d.E, tokens=d.tokens, labels=labels)
  proc = _run(tmp_path / "o", f"--data={path}", timeout=120)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr and "does not occur" in proc.stderr
