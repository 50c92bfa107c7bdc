"""`svmattn run --config`: an experiment or a sweep from a config file.

The claims: a sweep is one study whose cells are the combinations; every cell's per-run arrays
and results equal, array by array, those of the binary run with that cell's settings (same seed,
so the same data sets); a sweep killed with SIGKILL and resumed gives the results of an
uninterrupted one; a bad config file, field or value ends with one line naming it.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT
from test_sweep import ENV
from test_sweep import kill_when
from test_sweep import load

SMALL = ("--config.n=3", "--config.T=4", "--config.steps=40", "--config.chunk_steps=20", "--config.runs=3",
         "--config.batch_size=2", "--config.block_size=2", "--config.progress=false")
BINARY_SMALL = ("--n=3", "--T=4", "--steps=40", "--chunk_steps=20", "--runs=3", "--batch_size=2", "--block_size=2",
                "--noprogress")
CONFIG = os.path.join(REPO_ROOT, "experiments", "configs", "e2_lr_d_grid.py")


def svmattn(*args, timeout=600):
  return subprocess.run([sys.executable, "-m", "svmattn", *args], cwd=REPO_ROOT, env=ENV, capture_output=True,
                        text=True, timeout=timeout)


def _sweep_args():
  return ("run", f"--config={CONFIG}", *SMALL, "--config.sweep.lr=0.1,1", "--config.sweep.d=4,5")


@pytest.fixture(scope="module")
def sweep_out(tmp_path_factory):
  out = tmp_path_factory.mktemp("sweep")
  proc = svmattn(*_sweep_args(), f"--out={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  return str(out)


def test_the_shipped_grid_config_is_short_and_names_nine_cells():
  lines = [line for line in open(CONFIG).read().splitlines() if line.strip()]
  assert len(lines) <= 15
  from svmattn.config import config_file
  from svmattn.execution import sweep as sweep_lib
  config = config_file.load(CONFIG)
  assert config.experiment == "local_convergence" and config.runs == 50
  assert len(sweep_lib.grid(dict(config.sweep))) == 9


@pytest.mark.slow   # (its sweep takes 13-23 s; test_sweep.py keeps sweeps in the fast set)
def test_a_sweep_is_one_study_with_a_cell_per_combination(sweep_out):
  with open(os.path.join(sweep_out, "runs", "study.json")) as f:
    record = json.load(f)
  labels = [c["label"] for c in record["cells"]]
  assert sorted(map(json.dumps, labels)) == sorted(json.dumps({"d": d, "lr": lr}, sort_keys=True)
                                                   for lr in (0.1, 1.0) for d in (4, 5))
  with open(os.path.join(sweep_out, "summary.json")) as f:
    summary = json.load(f)
  assert summary["sweep"] == {"d": [4, 5], "lr": [0.1, 1.0]} and len(summary["cells"]) == 4
  assert not os.path.exists(os.path.join(sweep_out, "work"))


@pytest.mark.slow
@pytest.mark.parametrize("lr,d", [(0.1, 4), (1.0, 5)])
def test_every_cell_equals_the_binary_run_of_its_settings(sweep_out, tmp_path, lr, d):
  out = tmp_path / "binary"
  proc = subprocess.run([sys.executable, "-m", "experiments.local_convergence", f"--out={out}", *BINARY_SMALL,
                         f"--lr={lr}", f"--d={d}"], cwd=REPO_ROOT, env=ENV, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(sweep_out, "summary.json")) as f:
    cells = json.load(f)["cells"]
  (row,) = [c for c in cells if c["settings"] == {"d": d, "lr": lr}]
  with open(os.path.join(sweep_out, "runs", "study.json")) as f:
    labels = [c["label"] for c in json.load(f)["cells"]]
  index = labels.index({"d": d, "lr": lr})
  # the per-run record of the cell, array by array
  got, want = load(os.path.join(sweep_out, "runs", f"cell_{index:04d}.npz")), load(out / "runs" / "cell_0000.npz")
  assert sorted(got) == sorted(want)
  for k in want:
    assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k], equal_nan=got[k].dtype.kind == "f"), k
  # and the cell's results.npz, array by array
  got, want = load(os.path.join(sweep_out, row["dir"], "results.npz")), load(out / "results.npz")
  assert sorted(got) == sorted(want)
  for k in want:
    assert np.array_equal(got[k], want[k], equal_nan=got[k].dtype.kind == "f"), k


@pytest.mark.slow
def test_a_sweep_killed_and_resumed_gives_the_same_results(sweep_out, tmp_path):
  out = tmp_path / "killed"
  log = tmp_path / "log"
  proc = subprocess.Popen([sys.executable, "-m", "svmattn", *_sweep_args(), f"--out={out}"], cwd=REPO_ROOT, env=ENV,
                          stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
  proc.log = open(log)
  # killed once the second cell's first batch has been analyzed (a finished cell, a started one)
  frozen = kill_when(proc, str(out), lambda files: any(f == "c0001_b00000.arrays" for f in files))
  assert frozen is not None, "the sweep ended before the kill"
  proc = svmattn(*_sweep_args(), f"--out={out}", "--resume")
  assert proc.returncode == 0, proc.stderr[-3000:]
  names = sorted(os.listdir(os.path.join(sweep_out, "runs")))
  assert names == sorted(os.listdir(out / "runs"))
  for name in names:
    if name.endswith(".npz"):
      got, want = load(out / "runs" / name), load(os.path.join(sweep_out, "runs", name))
      for k in want:
        assert np.array_equal(got[k], want[k], equal_nan=want[k].dtype.kind == "f"), (name, k)


BAD = [
    ((f"--config={CONFIG}", "--config.lrr=0.1"), "no such setting of E2 local_convergence (did you mean lr?)"),
    ((f"--config={CONFIG}", "--config.sweep.dd=1,2"), "--config.sweep.dd: no such setting"),
    ((f"--config={CONFIG}", "--config.sweep.d=0,2"), "config.sweep.d=0: must be >= 1"),
    ((f"--config={CONFIG}", "--config.sweep.out=a,b"), "cannot be swept"),
    ((f"--config={CONFIG}", "--config.lr=-1"), "config.lr=-1.0: must be a finite number > 0"),
    ((f"--config={CONFIG}", "--config.lr=abc"), "--config.lr=abc"),
    (("--config=/nonexistent/grid.py",), "no such file"),
    ((f"--config={CONFIG}",), "--out=DIR (or config.out) is required"),
]


@pytest.mark.parametrize("args,expect", BAD[:1] + [pytest.param(*b, marks=pytest.mark.slow) for b in BAD[1:]])
def test_bad_configs_end_with_one_line(args, expect, tmp_path):
  out = () if "required" in expect else (f"--out={tmp_path / 'o'}",)
  proc = svmattn("run", *args, *out)
  assert proc.returncode != 0
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert expect in proc.stderr, proc.stderr[-2000:]
  assert not os.path.exists(tmp_path / "o")


@pytest.mark.parametrize("body,expect", [
    ("def get_config(:\n", "SyntaxError"),
    ("x = 1\n", "defines no get_config()"),
    ("from ml_collections import ConfigDict\ndef get_config():\n  return ConfigDict({'runs': 2})\n",
     "must name its experiment"),
    ("from ml_collections import ConfigDict\ndef get_config():\n  return ConfigDict({'experiment': 'E99'})\n",
     "unknown experiment 'E99'"),
    ("def get_config():\n  raise RuntimeError('boom')\n", "get_config() raised RuntimeError: boom"),
    ("import sys\ndef get_config():\n  sys.exit('bye')\n", "get_config() called sys.exit('bye')"),
    ("import sys\nsys.exit(3)\n", "the file called sys.exit(3) while it was read"),
])
@pytest.mark.slow
def test_bad_config_files_end_with_one_line(body, expect, tmp_path):
  path = tmp_path / "c.py"
  path.write_text(body)
  proc = svmattn("run", f"--config={path}", f"--out={tmp_path / 'o'}")
  assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert expect in proc.stderr, proc.stderr[-2000:]


def test_a_minimal_config_runs_with_the_other_defaults(tmp_path):
  path = tmp_path / "c.py"
  path.write_text("from ml_collections import ConfigDict\n\ndef get_config():\n"
                  "  return ConfigDict({'experiment': 'local_convergence', 'runs': 2, 'steps': 20, 'n': 3, 'T': 4,"
                  " 'd': 4, 'params': ('W',), 'norms': ('fro',), 'progress': False})\n")
  proc = svmattn("run", f"--config={path}", f"--out={tmp_path / 'o'}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(tmp_path / "o" / "summary.json") as f:
    summary = json.load(f)
  assert summary["flags"]["lr"] == 0.1 and summary["flags"]["runs"] == 2 and summary["flags"]["params"] == ["W"]


def test_e4_block_size_reaches_its_training():
  """E4's --block_size (for a GPU, where one block per pipeline batch beats 64) sets its training's
  block; a block larger than the batch is refused, as in every experiment that trains."""
  from svmattn.config import fields
  from svmattn.studies import overparam
  values = overparam.SETTINGS.validate({**overparam.SETTINGS.defaults(), "block_size": 256})
  study = overparam.build(values)
  (train,) = study.stages(study.cells[0])
  assert train.config.block_size == 256
  default = overparam.build(overparam.SETTINGS.validate(overparam.SETTINGS.defaults()))
  assert default.stages(default.cells[0])[0].config.block_size == 64
  with pytest.raises(fields.ConfigError, match="block_size=2000 exceeds --batch_size=1000"):
    overparam.SETTINGS.validate({**overparam.SETTINGS.defaults(), "block_size": 2000})
