"""--minibatch and --sampling in every study that trains (besides E2, Q1, E10 and E16, tested with
their own studies): the settings take them, a mini-batch larger than a data set is refused in one
sentence naming the flag, and the studies' TrainConfigs get them (``svmattn.config.minibatch``)."""
import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT
from svmattn.config import fields as F
from svmattn.data import datasets as data_lib

# study: (settings that keep its build small, a minibatch larger than its smallest data set)
STUDIES = {
    "joint_training": ({}, 7),
    "lambda_head": ({}, 4),
    "multi_head": ({}, 7),
    "multi_token": ({"ds": [4]}, 4),
    "next_token": ({}, 7),
    "overparam": ({"n_values": [5, 10], "d_max": 3}, 6),     # the smallest cell's n
    "paths_2d": ({}, 3),
    "real_data": ({"n_values": [2, 8]}, 3),
    "seq_causal": ({}, 5),
    "two_layer": ({}, 7),
}


def _settings(name):
  return importlib.import_module(f"svmattn.studies.{name}").SETTINGS


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_settings_take_minibatch(name):
  settings = _settings(name)
  assert settings.validate({})["minibatch"] == 0 and settings.validate({})["sampling"] == "without"
  for sampling in ("with", "without", "cyclic"):
    got = settings.validate({**STUDIES[name][0], "minibatch": 1, "sampling": sampling})
    assert (got["minibatch"], got["sampling"]) == (1, sampling)
  too_big = STUDIES[name][1]
  with pytest.raises(F.ConfigError, match=f"--minibatch={too_big} exceeds"):
    settings.validate({**STUDIES[name][0], "minibatch": too_big})
  settings.validate({**STUDIES[name][0], "minibatch": too_big - 1})      # the largest allowed
  with pytest.raises(F.ConfigError, match="minibatch"):
    settings.validate({**STUDIES[name][0], "minibatch": -1})
  with pytest.raises(F.ConfigError, match="sampling"):
    settings.validate({**STUDIES[name][0], "minibatch": 1, "sampling": "shuffle"})


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_train_configs_get_minibatch(name):
  """Every training stage of every cell trains with the settings' minibatch and sampling."""
  module = importlib.import_module(f"svmattn.studies.{name}")
  for mb, sampling in ((0, "without"), (1, "cyclic")):
    fl = module.SETTINGS.validate({**STUDIES[name][0], "minibatch": mb, "sampling": sampling})
    study = module.build(fl)
    configs = [s.config for cell in study.cells for s in study.stages(cell)]
    assert configs and all((c.minibatch, c.sampling) == (mb, sampling) for c in configs)


def test_limits_of_other_sizes():
  joint = _settings("joint_training")
  with pytest.raises(F.ConfigError, match=r"--minibatch=4 exceeds the n=3 sequences of --setting=toy"):
    joint.validate({"setting": "toy", "minibatch": 4})
  joint.validate({"setting": "toy", "minibatch": 3, "n": 2})     # toy: its own n=3, whatever --n
  real = _settings("real_data")
  with pytest.raises(F.ConfigError, match=r"--minibatch=3 exceeds --n_values' smallest n=2 \(the default"):
    real.validate({"minibatch": 3})
  real.validate({"minibatch": 3, "dataset": "digits", "n_values": [4, 16]})


def test_data_file_n(tmp_path):
  """With --data the flags' --n is not the limit; the file's n is, once loaded (one sentence)."""
  from svmattn.studies import paths_2d
  batch = data_lib.generate(data_lib.DataSpec(4, 3, 2), 0, np.arange(2))
  path = str(tmp_path / "d.npz")
  np.savez(path, **{k: np.asarray(v) for k, v in batch._asdict().items()})
  fl = paths_2d.SETTINGS.validate({"data": path, "minibatch": 4})        # > --n=2, but the file has n=4
  assert [s.config.minibatch for s in paths_2d.build(fl).stages(None)] == [4, 4]
  with pytest.raises(ValueError, match=r"--minibatch=5 exceeds the n=4 sequences of each data set of --data"):
    paths_2d.build(paths_2d.SETTINGS.validate({"data": path, "minibatch": 5}))


# End to end through the binaries: a flax model (E14), seq2seq and causal attention (E8), a
# trained head with prompt attention (E11 toy).
ENV = dict(os.environ, PYTHONPATH=REPO_ROOT)
RUNS = {
    "multi_head": ["--runs=2", "--steps=20", "--snapshot_every=10"],
    "seq_causal": ["--runs=2", "--steps=20", "--snapshot_every=10"],
    "joint_training": ["--setting=toy", "--steps=20", "--snapshot_every=10"],
}


def _binary(name, out, *flags):
  return subprocess.run([sys.executable, "-m", f"experiments.{name}", f"--out={out}", "--noprogress",
                         "--nocompilation_cache", *RUNS[name], *flags],
                        cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_binary_minibatch(name, tmp_path):
  full = _binary(name, tmp_path / "full")
  mini = _binary(name, tmp_path / "mini", "--minibatch=1", "--sampling=with")
  assert full.returncode == 0, full.stderr[-3000:]
  assert mini.returncode == 0, mini.stderr[-3000:]
  with open(tmp_path / "mini" / "summary.json") as f:
    flags = json.load(f)["flags"]
  assert (flags["minibatch"], flags["sampling"]) == (1, "with")
  with np.load(tmp_path / "full" / "results.npz") as a, np.load(tmp_path / "mini" / "results.npz") as b:
    assert sorted(a.files) == sorted(b.files)
    finals = [k for k in a.files if "final" in k and a[k].dtype.kind == "f"]     # the trained parameters
    assert finals and all(not np.array_equal(a[k], b[k]) for k in finals)
  bad = _binary(name, tmp_path / "bad", "--minibatch=9")
  assert bad.returncode != 0 and "Traceback" not in bad.stderr
  assert "--minibatch=9 exceeds" in bad.stderr and len(bad.stderr.strip().splitlines()) <= 2
