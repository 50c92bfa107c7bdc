"""Packaging: the wheel installs the library (nothing named experiments or benchmarks in site-packages)
and a 'svmattn' command that runs every experiment of the registry from any directory.

The wheel goes into a fresh virtual environment with --no-deps; the environment sees this
environment's dependencies through a .pth file (the wheel's svmattn comes first on its path), so
the test takes seconds instead of a full dependency install."""
import glob
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig

import pytest

from conftest import NO_NATIVE, REPO_ROOT

pytestmark = pytest.mark.slow


def test_wheel_installs_a_command_that_runs_from_anywhere(tmp_path):
  wheels = tmp_path / "wheels"
  # built from a copy of the sources (no build/ or egg-info left by an earlier build can fill gaps)
  source = tmp_path / "source"
  shutil.copytree(REPO_ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "_build",
                                                                   "__pycache__", "runs", "results", "out"))
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels),
                  str(source)], check=True, capture_output=True, text=True, timeout=300)
  wheel = glob.glob(str(wheels / "svmattn-*.whl"))
  assert len(wheel) == 1
  env_dir = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
  py = env_dir / "bin" / "python"
  purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           check=True, capture_output=True, text=True).stdout.strip()
  subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", wheel[0]],
                 check=True, capture_output=True, text=True, timeout=300)
  # this environment's dependencies (but not its editable svmattn: .pth lines of an added directory are not run)
  ours = [p for p in site.getsitepackages() + [sysconfig.get_paths()["purelib"]] if os.path.isdir(p)]
  with open(os.path.join(purelib, "zz_deps.pth"), "w") as f:
    f.write("\n".join(dict.fromkeys(ours)) + "\n")
  installed = sorted(os.listdir(purelib))
  assert "svmattn" in installed and not any(n.split(".")[0] in ("experiments", "benchmarks") for n in installed)
  assert not os.path.exists(os.path.join(purelib, "svmattn", "experiments"))
  for package in ("config", "figures", "report", "studies"):
    assert os.path.isdir(os.path.join(purelib, "svmattn", package)), package
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SVMATTN_NATIVE_KERNEL")}
  env["JAX_PLATFORMS"] = "cpu"
  where = subprocess.run([str(py), "-c", "import svmattn; print(svmattn.__file__)"], cwd=elsewhere, env=env,
                         check=True, capture_output=True, text=True).stdout
  assert where.startswith(purelib), where                          # the wheel's copy, not the clone
  cmd = env_dir / "bin" / "svmattn"
  listing = subprocess.run([str(cmd), "list"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
  assert listing.returncode == 0 and "local_convergence" in listing.stdout and "reproduce" in listing.stdout
  out = elsewhere / "e2"
  run = subprocess.run([str(cmd), "E2", f"--out={out}", "--runs=2", "--steps=50", "--chunk_steps=50", "--noprogress",
                        "--nocompilation_cache"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  assert (out / "results.npz").exists() and "corr" in run.stdout
  # the wheel ships every native source with the headers it includes, and trains on the native kernel
  for source in ("train/native/gd_block.cc", "train/native/lanes.h"):
    assert os.path.isfile(os.path.join(purelib, "svmattn", source)), f"the wheel lacks svmattn/{source}"
  with open(out / "summary.json") as f:
    kernel = json.load(f)["environment"]["gd_kernel"]
  if NO_NATIVE is None:
    assert kernel == "native-cpu", kernel
  else:
    assert kernel == "xla", kernel
  assert "Unable to initialize backend" not in run.stderr
  bad = subprocess.run([str(cmd), "no_such_experiment"], cwd=elsewhere, env=env, capture_output=True, text=True)
  assert bad.returncode != 0 and "unknown command" in bad.stderr and "Traceback" not in bad.stderr


# Heavy libraries an experiment imports where it uses them, not at the top of a module: every process
# imports every study (the registry finds the experiments there), and these took 1.6 s of each start.
LAZY = ("scipy.stats", "scipy.optimize", "scipy.sparse", "flax", "cvxpy", "matplotlib.pyplot", "pandas")


def test_the_registry_imports_no_heavy_library():
  code = ("import sys\nfrom svmattn import registry\nregistry.experiments()\n"
          f"print(','.join(m for m in {LAZY!r} if m in sys.modules))")
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.strip() == "", f"imported by the registry: {proc.stdout.strip()}"
