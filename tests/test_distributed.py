"""Many devices and many processes give the one-device results bit for bit."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(devices):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  return env


@pytest.mark.slow   # 20 s; tests/test_study.py runs E4 on two processes of two forced devices in the default suite
def test_four_forced_devices_equal_one(tmp_path):
  script = textwrap.dedent("""
      import sys, numpy as np, jax
      import svmattn
      svmattn.configure()
      from svmattn.data import datasets as data_lib
      from svmattn.train import loop as train_lib
      assert len(jax.devices()) == 4, jax.devices()
      # fewer blocks than devices: only as many devices as blocks
      assert [train_lib.batch_mesh(B, 8).size for B in (1, 8, 9, 24, 70)] == [1, 1, 2, 3, 4]
      runs = np.arange(70)                       # not a multiple of 4 x block: padding is exercised
      D = data_lib.generate(data_lib.DataSpec(n=3, T=4, d=5), 0, runs)
      keys = train_lib.init_keys(0, runs)
      for p in ("W", "KQ"):
        cfg = train_lib.TrainConfig(param=p, steps=60, snapshot_every=20, chunk_steps=40, block_size=8)
        four = train_lib.train(cfg, D, keys)                                   # every local device
        two = train_lib.train(cfg, type(D)(*(a[:9] for a in D)), keys[:9])   # 2 blocks: 2 of the 4 devices
        one = train_lib.train(cfg, D, keys, mesh=train_lib.data_mesh(jax.devices()[:1]))
        for a, b in ((four.W, one.W), (four.max_prob, one.max_prob), (four.attention, one.attention)):
          assert np.array_equal(a, b), p
        assert np.array_equal(two.W, one.W[:9]) and np.array_equal(two.attention, one.attention[:9]), p
      print("identical")
  """)
  proc = subprocess.run([sys.executable, "-c", script], env=_env(4), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "identical" in proc.stdout


@pytest.mark.slow   # 20 s; tests/test_study.py runs two processes of E4 in the default suite
def test_two_processes_equal_one(tmp_path):
  args = ["--runs=10", "--batch_size=4", "--steps=60", "--chunk_steps=30", "--snapshot_every=10", "--n=3",
          "--T=4", "--d=5", "--block_size=4", "--params=W", "--noprogress"]
  one = tmp_path / "one"
  two = tmp_path / "two"
  proc = subprocess.run([sys.executable, "-m", "experiments.local_convergence", f"--out={one}", *args],
                        env=_env(1), capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  import socket
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  procs = [subprocess.Popen([sys.executable, "-m", "experiments.local_convergence", f"--out={two}", *args,
                             f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={p}"],
                            env=_env(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
           for p in range(2)]
  for p in procs:
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
  a, b = np.load(one / "results.npz"), np.load(two / "results.npz")
  assert sorted(a.files) == sorted(b.files)
  for key in a.files:
    assert np.array_equal(a[key], b[key], equal_nan=a[key].dtype.kind == "f"), key
  assert not (two / "work").exists()


def _devices_in_subprocess(env):
  script = "import jax, svmattn; svmattn.configure(); print(len(jax.devices('cpu')))"
  env = dict({k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "SVMATTN_CPU_DEVICES")},
             PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", **env)
  return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow   # (CI runs it with the slow tests: the test command stays under 5 minutes)
def test_cpu_devices_default_override_and_explicit_xla_flag():
  default = _devices_in_subprocess({})
  assert default.returncode == 0, default.stderr[-2000:]
  assert int(default.stdout) == len(os.sched_getaffinity(0))
  three = _devices_in_subprocess({"SVMATTN_CPU_DEVICES": "3"})
  assert int(three.stdout) == 3, three.stderr[-2000:]
  explicit = _devices_in_subprocess({"SVMATTN_CPU_DEVICES": "3",
                                     "XLA_FLAGS": "--xla_force_host_platform_device_count=5"})
  assert int(explicit.stdout) == 5, explicit.stderr[-2000:]
  bad = _devices_in_subprocess({"SVMATTN_CPU_DEVICES": "two"})
  assert bad.returncode != 0 and "SVMATTN_CPU_DEVICES must be a positive integer" in bad.stderr
