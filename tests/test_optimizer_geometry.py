"""E10 (experiments.optimizer_geometry) end to end at a tiny size, and its study's pieces."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT
from test_health_studies import check_summary
from svmattn.studies import optimizer_geometry as e10
from test_sweep import ENV

# End to end through the binary (a few seconds to a minute each): with the slow tests, which CI runs;
# the README's test command keeps the library's own tests.
pytestmark = pytest.mark.slow

FLAGS = ["--runs=4", "--n=3", "--T=4", "--d=5", "--steps=150", "--chunk_steps=50", "--snapshot_every=10",
         "--block_size=4", "--optimizers=normalized_gd,sd_linf,md_l3", "--norms=fro,linf,l3,spectral",
         "--params=W", "--noprogress"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  out = tmp_path_factory.mktemp("e10")
  proc = subprocess.run([sys.executable, "-m", "experiments.optimizer_geometry", f"--out={out}", *FLAGS],
                        cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return out, proc.stdout


def test_outputs_and_tables(run):
  out, stdout = run
  for name in ("results.npz", "summary.json", "geometry.png", "curves.png"):
    assert os.path.getsize(out / name) > 0
  summary = json.loads((out / "summary.json").read_text())
  a = np.load(out / "results.npz")
  S = len(a["steps"])
  for opt in ("normalized_gd", "sd_linf", "md_l3"):
    assert a[f"W_final_{opt}"].shape == (4, 5, 5) and a[f"selected_{opt}"].shape == (4, 3)
    for norm in ("fro", "linf", "l3", "spectral"):
      corr = a[f"corr_{opt}_{norm}"]
      assert corr.shape == (4, S)
      ok = a[f"svm_{norm}_{opt}_status"] == "optimal"
      assert np.all(np.abs(corr[ok]) <= 1 + 1e-12)
      # the table is the mean final corr over the solved runs
      want = np.mean(corr[ok, -1]) if ok.any() else None
      got = summary["tables"]["corr"][opt][norm]
      assert (got is None and want is None) or got == pytest.approx(want, rel=1e-12)
      assert np.all(a[f"dist_{opt}_{norm}"][ok] >= 0)
    assert f"bregman_{opt}_l3" in a.files and f"bregman_{opt}_linf" not in a.files
  assert summary["nearest"]["md_l3"]["predicted"] == "l3"
  assert summary["nearest"]["sd_linf"]["predicted"] == "linf"
  for c in summary["checks"]:
    assert c["ok"] == (c["value"] == c["expected"].split(" ")[0])
  assert "E10 optimizer geometry" in stdout
  check_summary(summary, a, {opt: 4 for opt in ("normalized_gd", "sd_linf", "md_l3")})


def test_predicted_norms():
  assert e10.predicted_norm("normalized_gd") == "fro" and e10.predicted_norm("sd_l2") == "fro"
  assert e10.predicted_norm("md_l1.75") == "l1.75" and e10.predicted_norm("sd_l1") == "l1"
  assert e10.predicted_norm("sd_spectral") == e10.predicted_norm("muon") == "spectral"
  assert e10.predicted_norm("adam") == "linf" and e10.predicted_norm("sgd") is None
  assert e10.lp_of("fro") == 2.0 and e10.lp_of("l1.75") == 1.75 and e10.lp_of("linf") is None


@pytest.mark.parametrize("flag", ["--optimizers=bogus", "--norms=l0.5", "--norms=fro,fro", "--lr=0"])
def test_bad_flags(tmp_path, flag):
  proc = subprocess.run([sys.executable, "-m", "experiments.optimizer_geometry", f"--out={tmp_path / 'o'}", flag],
                        cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr and flag.split("=")[0] in proc.stderr
  assert not os.path.exists(tmp_path / "o")
