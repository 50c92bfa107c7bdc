"""svmattn.xla_cache: the persistent compilation cache changes no result, and the compile counter."""
import ast
import json
import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r"""
import json, os, sys
import numpy as np
import svmattn
svmattn.configure()
from svmattn import xla_cache
if sys.argv[2] == "shared":
  xla_cache.enable(sys.argv[1])
import jax
from svmattn.data import datasets as data_lib
from svmattn.train import loop as train_lib
config = train_lib.TrainConfig(param="W", steps=25, snapshot_every=10, chunk_steps=20, block_size=2)
data = data_lib.generate(data_lib.DataSpec(3, 4, 6), 0, np.arange(4))
traj = train_lib.train(config, data, train_lib.init_keys(0, np.arange(4)))
entries = [f for f in os.listdir(sys.argv[1]) if f.startswith("jit_run")] if sys.argv[2] == "shared" else []
print(json.dumps({"devices": len(jax.local_devices()), "W": traj.W.tolist(), "run_entries": len(entries)}))
"""


def _run(tmp_path, mode):
  # the XLA block kernel's programs (with the native kernel, train.native_train compiles none)
  env = {**os.environ, "SVMATTN_CPU_DEVICES": "2", "PYTHONPATH": REPO_ROOT, "SVMATTN_NATIVE_KERNEL": "0"}
  out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "cache"), mode], env=env,
                       capture_output=True, text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_persistent_cache_changes_no_result(tmp_path):
  shared, plain = _run(tmp_path, "shared"), _run(tmp_path, "plain")
  assert shared["devices"] == plain["devices"] == 2
  assert shared["run_entries"] >= 2                    # the chunk programs went into the cache
  assert shared["W"] == plain["W"]   # bit for bit (JSON floats round-trip exactly)


def test_the_counter_tells_compiles_from_cache_loads(tmp_path):
  """A program a first process compiled is loaded from the persistent cache by a second process:
  a load there, not a compile (``compile_stats``)."""
  code = (
      "import jax, jax.numpy as jnp, numpy as np\n"
      "from svmattn import xla_cache\n"
      f"xla_cache.enable({str(tmp_path)!r}); xla_cache.count_compiles()\n"
      "f = jax.jit(lambda x: jnp.cos(x) * 5 - 2)\n"
      "f.lower(np.ones(3)).compile()\n"
      "print(xla_cache.compile_stats())\n")
  env = dict(os.environ, JAX_PLATFORMS="cpu", SVMATTN_CPU_DEVICES="1")
  got = []
  for _ in range(2):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    got.append(ast.literal_eval(out.strip().splitlines()[-1]))
  assert got[0]["xla_programs_compiled"] == 1 and got[0]["xla_programs_loaded"] == 0
  assert got[1]["xla_programs_compiled"] == 0 and got[1]["xla_programs_loaded"] == 1


@pytest.mark.parametrize("given, expected", [
    (None, "--xla_gpu_autotune_level=0"),
    ("--xla_force_host_platform_device_count=2", "--xla_force_host_platform_device_count=2 --xla_gpu_autotune_level=0"),
    ("--xla_gpu_autotune_level=4", "--xla_gpu_autotune_level=4")])
def test_gpu_autotuning_is_off_unless_asked_for(given, expected):
  """svmattn.configure() sets XLA's GPU autotuning to level 0 (a GPU program compiled twice must
  round the same: a replay or a resume may compile afresh), keeping every flag already given and
  an explicit level."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  if given is not None:
    env["XLA_FLAGS"] = given
  out = subprocess.run([sys.executable, "-c", "import os, svmattn; svmattn.configure(); print(os.environ['XLA_FLAGS'])"], env=env,
                       capture_output=True, text=True, check=True, timeout=120).stdout.strip()
  assert out == expected


def test_importing_svmattn_changes_no_setting_of_jax():
  """``import svmattn`` (and its training loop) leaves JAX's settings and XLA_FLAGS alone; float64 work
  before ``svmattn.configure()`` is refused in one line that says what to call; after it, it runs."""
  code = ("import os, jax, numpy as np\n"
          "flags, devices = os.environ.get('XLA_FLAGS'), jax.config.jax_num_cpu_devices\n"
          "import svmattn\n"
          "from svmattn.train import loop\n"
          "from svmattn.data import datasets\n"
          "assert not jax.config.jax_enable_x64\n"
          "assert os.environ.get('XLA_FLAGS') == flags and jax.config.jax_num_cpu_devices == devices\n"
          "try:\n"
          "  datasets.generate(datasets.DataSpec(3, 4, 6), 0, [0])\n"
          "except svmattn.ConfigurationError as e:\n"
          "  print('refused:', e)\n"
          "svmattn.configure()\n"
          "print(datasets.generate(datasets.DataSpec(3, 4, 6), 0, [0]).X.dtype)\n")
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_ENABLE_X64")}
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  lines = out.stdout.strip().splitlines()
  assert lines[0].startswith("refused: float64 needs JAX's x64 mode: call svmattn.configure()"), lines
  assert lines[-1] == "float64"
