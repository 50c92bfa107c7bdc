"""E13 (experiments.real_data) end to end on a few digits subsets, its export to the --data format
(read back by E2's binary), the missing-Fashion-MNIST error, and the study's pieces."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import REPO_ROOT
from svmattn.data import datasets as data_lib
from svmattn.data import images as images_lib
from svmattn.studies import real_data
from test_health_studies import check_summary
from test_sweep import ENV

# End to end through the binary (a few seconds to a minute each): with the slow tests, which CI runs;
# the README's test command keeps the library's own tests.
pytestmark = pytest.mark.slow

FLAGS = ["--runs=2", "--n_values=2,6", "--steps=120", "--chunk_steps=60", "--snapshot_every=20", "--block_size=2",
         "--noprogress"]


def _run(out, *flags, module="real_data", timeout=600):
  return subprocess.run([sys.executable, "-m", f"experiments.{module}", f"--out={out}", *flags],
                        cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  out = tmp_path_factory.mktemp("e13")
  proc = _run(out, *FLAGS, f"--export={out}/export")
  assert proc.returncode == 0, proc.stderr[-3000:]
  return out, proc.stdout


def test_outputs(run):
  out, stdout = run
  for name in ("results.npz", "summary.json", "vs_n.png", "attention.png"):
    assert os.path.getsize(out / name) > 0
  a = np.load(out / "results.npz")
  summary = json.loads((out / "summary.json").read_text())
  assert summary["T"] == 16 and summary["d"] == 20           # digits 8x8, p=2: 16 patches of 4 pixels + one-hot
  S = len(a["steps"])
  for n in (2, 6):
    assert a[f"W_final_W_n{n}"].shape == (2, 20, 20) and a[f"attention_W_n{n}"].shape == (2, n, 16)
    assert a[f"corr_W_n{n}"].shape == (2, S) and a[f"image_n{n}"].shape == (2, n)
    for k in ("train_acc_W", "test_acc_W", "max_prob_W"):
      x = a[f"{k}_n{n}"]
      assert np.all((x >= 0) & (x <= 1))
    assert np.all(a[f"max_prob_W_n{n}"] >= 1 / 16)
    # labels: +1 for digit 0, -1 for digit 1, of the images drawn
    digits = images_lib.load_images("digits")[1]
    np.testing.assert_array_equal(a[f"Y_n{n}"], np.where(digits[a[f"image_n{n}"]] == 0, 1.0, -1.0))
    row = summary["per_n"][str(n)]
    assert row["constraints"] == n * 15 and row["unknowns"] == 400
    assert row["W"]["feasible_fraction"] == np.mean(a[f"svm_W_status_n{n}"] == "optimal")
  assert "E13 real data: digits classes 0,1" in stdout
  check_summary(summary, a, {f"{p}_n{n}": 2 for p in summary["flags"]["params"] for n in (2, 6)}, threshold=0.0)


def test_export_runs_in_another_binary(run, tmp_path):
  out, _ = run
  data = data_lib.load_npz(out / "export_n6.npz")
  assert data.X.shape == (2, 6, 16, 20) and data.v.shape == (2, 20)
  np.testing.assert_allclose(np.linalg.norm(data.X, axis=-1), 1, atol=1e-12)   # no blank patch with one-hot positions
  proc = _run(tmp_path / "e2", f"--data={out}/export_n6.npz", "--steps=50", "--chunk_steps=50", "--params=W",
              "--block_size=2", "--noprogress", module="local_convergence")
  assert proc.returncode == 0, proc.stderr[-3000:]


def test_subsets_and_selections_are_the_jax_draws():
  # computed on the host (numerics version 13 drew them in a program per cell): the same integers
  runs, seed = np.array([0, 3, 7]), 5

  def keys(half, n):
    return jax.vmap(lambda r: jax.random.fold_in(jax.random.split(jax.random.fold_in(
        jax.random.PRNGKey(seed), r))[half], n))(jnp.asarray(runs, jnp.uint32))

  perm = jax.vmap(lambda k: jax.random.permutation(k, 40))(keys(0, 6))
  np.testing.assert_array_equal(real_data.subsets(seed, 6, runs, 40), np.asarray(perm)[:, :6])
  tokens = jax.vmap(lambda k: jax.random.randint(k, (6,), 0, 9))(keys(1, 6))
  np.testing.assert_array_equal(real_data.random_selections(seed, 6, runs, 9), np.asarray(tokens))


def test_subsets_and_heads():
  a = real_data.subsets(0, 5, np.arange(3), 40)
  b = real_data.subsets(0, 5, np.array([2, 0]), 40)
  np.testing.assert_array_equal(a[[2, 0]], b)                 # run r: the same in any batch
  assert all(len(set(row)) == 5 for row in a.tolist())       # without replacement
  assert not np.array_equal(real_data.subsets(0, 6, np.arange(1), 40)[0, :5], a[0])   # n enters the key
  rng = np.random.default_rng(0)
  X = rng.standard_normal((10, 4, 3))
  Y = np.where(rng.standard_normal(10) > 0, 1.0, -1.0)
  for kind in ("fit", "fixed"):
    v = real_data.fit_head(X, Y, kind)
    assert v.shape == (3,) and np.linalg.norm(v) == pytest.approx(1)
  one = real_data.fit_head(X, np.ones(10), "fit")                   # one class: the class-mean direction
  np.testing.assert_allclose(one, X.mean(1).mean(0) / np.linalg.norm(X.mean(1).mean(0)))


def test_missing_fashion_mnist_is_one_line(tmp_path):
  proc = _run(tmp_path / "o", "--dataset=fashion_mnist", f"--data_dir={tmp_path / 'nowhere'}", timeout=120)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr
  assert images_lib.FASHION_INSTALL in proc.stderr


@pytest.mark.parametrize("flags, needle", [(["--classes=0,0"], "two different classes"), (["--n_values=2,5000"], "exceeds"),
                                           pytest.param(["--classes=zero,one"], "--classes", marks=pytest.mark.slow)])
def test_bad_input(tmp_path, flags, needle):
  proc = _run(tmp_path / "o", *flags, timeout=120)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr and needle in proc.stderr
  assert not os.path.exists(tmp_path / "o" / "results.npz")


@pytest.mark.slow
def test_cls_query_and_joint_head(tmp_path):
  proc = _run(tmp_path / "o", "--runs=2", "--n_values=4", "--steps=100", "--chunk_steps=50", "--block_size=2",
              "--query=cls", "--head=joint", "--pos=sincos", "--classes=3,rest", "--noprogress")
  assert proc.returncode == 0, proc.stderr[-3000:]
  a = np.load(tmp_path / "o" / "results.npz")
  assert a["attention_W_n4"].shape == (2, 4, 17) and a["W_final_W_n4"].shape == (2, 5, 5)
