"""Bad input, everywhere: every binary answers a bad flag value, a bad --out or a bad data file
with ONE clear line naming the problem, a non-zero exit, no traceback, and nothing written.

Flag checks run in one process per binary (``_parse_all``: the binary's flags parsed once per
bad value, as absl parses them before main), so that the whole table costs one import per
binary; a few cases run the binaries end to end. The runs that start work (interrupted,
damaged, failed then corrected) are marked slow.
"""
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from conftest import REPO_ROOT
from svmattn.execution import run_experiment

ENV = dict(os.environ, JAX_PLATFORMS="cpu")
PY = sys.executable


def _run(binary, *args, timeout=300):
  return subprocess.run([PY, "-m", f"experiments.{binary}", *args], cwd=REPO_ROOT, env=ENV, capture_output=True,
                        text=True, timeout=timeout)


def _assert_clean_error(proc, expect):
  assert proc.returncode != 0, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert expect in proc.stderr, proc.stderr[-2000:]


# ----------------------------------------------------------------------------
# The table: (flags, what the error must name), per binary, checked at flag parsing
# ----------------------------------------------------------------------------

OUT_AND_SEED = [("--out=@FILE", "is an existing file"), ("--out=/sys/svmattn_bad_input/out", "cannot write in /sys"),
                ("--out=", "must name a directory"), ("--seed=-1", "[0, 4294967296)"),
                (f"--seed={2 ** 64 + 5}", "[0, 4294967296)"), (f"--seed={2 ** 32}", "[0, 4294967296)")]
PIPELINE = [("--process_id=5", "--process_id < --num_processes"), ("--batch_size=0", "batch_size"),
            ("--svm_workers=-1", "svm_workers")]
TRAINING = [("--block_size=1000000", "exceeds --batch_size"), ("--block_size=0", "block_size"),
            ("--lr=nan", "--lr")]

TABLE = {
    "paths_2d": OUT_AND_SEED + PIPELINE + [("--lr=nan", "--lr")],
    "local_convergence": OUT_AND_SEED + PIPELINE + TRAINING + [
        ("--params=W,W", "repeats W"), ("--optimizer=bogus", "optimizer"), ("--runs=0", "--runs"),
        ("--precision=float16", "precision"), ("--data=/nonexistent.npz", "no such file")],
    "svm_rank": OUT_AND_SEED + [("--ds=2,2", "distinct"), ("--shapes=3:3,3:3", "repeats 3:3"),
                                ("--rtol=nan", "rtol")],
    "overparam": OUT_AND_SEED + PIPELINE + [("--n_values=5,5", "distinct")],
    "multi_token": OUT_AND_SEED + [("--ds=4,4", "distinct"), ("--tau_L=nan", "tau_L")],
    "lambda_head": OUT_AND_SEED + PIPELINE + [("--lams=0,0", "distinct"), ("--lams=0,0.0", "distinct")],
    "reg_path": OUT_AND_SEED + PIPELINE + [("--params=W,W", "repeat"), ("--r_min=nan", "r_min")],
    "seq_causal": OUT_AND_SEED + PIPELINE + [("--modes=causal,causal", "modes")],
    "feasibility": OUT_AND_SEED + PIPELINE + [("--shapes=3:3,3:3", "repeats 3:3"), ("--alphas=opt,opt", "alphas")],
    "optimizer_geometry": OUT_AND_SEED + PIPELINE + [
        ("--norms=l1e400", "1 < p <= 100"), ("--norms=lnan", "1 < p <= 100"), ("--norms=fro,fro", "norms"),
        ("--optimizers=adam,adam", "optimizers")],
    "joint_training": OUT_AND_SEED + PIPELINE + TRAINING + [("--params=W,W", "params")],
    "next_token": OUT_AND_SEED + PIPELINE + TRAINING + [("--params=W,W", "repeats W")],
    "real_data": OUT_AND_SEED + PIPELINE + [("--block_size=1000000", "exceeds --batch_size"),
                                            ("--n_values=2,2", "n_values"), ("--params=W,W", "repeats W")],
    "multi_head": OUT_AND_SEED + PIPELINE + TRAINING + [("--params=KQ,KQ", "repeats KQ"), ("--heads=0", "heads")],
    "two_layer": OUT_AND_SEED + PIPELINE + TRAINING + [("--params=W,W", "repeats W")],
    "precision": OUT_AND_SEED + [
        ("--threshold=nan", "correlation in [-1, 1]"), ("--threshold=2", "correlation in [-1, 1]"),
        ("--n=0", ">= 1"), ("--T=1", ">= 2"), ("--d=0", ">= 1"), ("--m=0", ">= 1"), ("--steps=-1", ">= 0"),
        ("--lr=-1", "finite number > 0"), ("--params=XX", "parameterizations"), ("--variants=bogus", "variants"),
        ("--variants=float32,float32", "repeats float32"), ("--static_scale=inf", "finite number > 0"),
        ("--check_step=-3", ">= 0"), ("--snapshot_every=0", ">= 1"), ("--chunk_steps=0", ">= 1")],
    "benchmark": [("--out=@FILE", "is an existing file"), ("--block_size=0", "block_size"),
                  ("--batch_sizes=-5", "integers >= 1"), ("--batch_sizes=10,10", "distinct"),
                  ("--repeats=0", "repeats"), ("--svm_sets=0", "svm_sets"), ("--suites=bogus", "suites"),
                  ("--suites=svm,svm", "repeats svm"), ("--norms=l1e400", "1 < p <= 100"),
                  ("--suites=stages", "reproduce_json"), ("--floor_kernels=gpu", "among vmapped, block, native"),
                  ("--floor_kernels=native,native", "repeats native")],
    "gpu": [("--parts=foo", "must list among gd"), ("--gd_rows=W:10:0:block", "is not PARAM:B:BLOCK:KERNEL"),
            ("--e2_runs=bad", "is not SETTING:CACHE"), ("--cpu_e2=@FILE", "holds no results.npz"),
            ("--repeats=0", "an integer >= 1"), ("--out=@FILE", "is an existing file"),
            ("--det_labels=engine,engine", "repeats engine"), ("--resume_runs=0", "an integer >= 1"),
            ("--kill_after_s=0", "a number of seconds >= 1"), ("--parts=gd,resume,gd", "repeats gd"), ("--pad_runs=0", "an integer >= 1")],
    "reproduce": [("--out=@FILE", "is an existing file"), ("--seed=-1", "[0, 4294967296)"),
                  ("--only=E1,E1", "repeats E1"), ("--jobs=-1", "not a non-negative integer")],
}

# The binaries whose table runs in the default suite (one import each); the others are slow.
QUICK = ("local_convergence", "benchmark")   # (an experiment and a tool; the other binaries: slow tests)

DRIVER = textwrap.dedent("""
    import json, sys
    from absl import flags
    import importlib
    tools = ("precision", "benchmark", "gpu")   # benchmarks/; the experiments' front ends are in experiments/
    importlib.import_module(("benchmarks." if sys.argv[1] in tools else "experiments.") + sys.argv[1])
    out = []
    for args in json.loads(sys.argv[2]):
      flags.FLAGS.unparse_flags()
      try:
        flags.FLAGS(["prog"] + args)
        out.append(None)
      except flags.Error as e:
        out.append(str(e))
    print(json.dumps(out))
""")


def _parse_all(binary, cases, tmp_path):
  """The flag-parsing error of each case (None: accepted), in one process."""
  afile = tmp_path / "afile"
  afile.write_text("x")
  out = str(tmp_path / "out")
  argvs = []
  for arg, _ in cases:
    args = [arg.replace("@FILE", str(afile))]
    if binary != "benchmark" and not arg.startswith("--out="):
      args.append(f"--out={out}")
    argvs.append(args)
  proc = subprocess.run([PY, "-c", DRIVER, binary, json.dumps(argvs)], cwd=REPO_ROOT, env=ENV, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert not os.path.exists(out), "a refused flag left an output directory"
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("binary", [pytest.param(b, marks=() if b in QUICK else pytest.mark.slow) for b in TABLE])
def test_bad_flags_are_refused_when_parsed(binary, tmp_path):
  cases = TABLE[binary]
  errors = _parse_all(binary, cases, tmp_path)
  wrong = [(arg, expect, err) for (arg, expect), err in zip(cases, errors) if err is None or expect not in err]
  assert not wrong, "\n".join(f"{a}: expected {e!r}, got {g!r}" for a, e, g in wrong)
  assert all("\n" not in e for e in errors), errors      # one line each


# ----------------------------------------------------------------------------
# End to end: absl's one line, exit status 1, nothing written
# ----------------------------------------------------------------------------

def test_a_bad_flag_ends_the_binary_with_one_line(tmp_path):
  (tmp_path / "afile").write_text("x")
  proc = _run("local_convergence", f"--out={tmp_path / 'afile'}")
  _assert_clean_error(proc, "is an existing file")
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert lines[0].startswith("FATAL Flags parsing error: flag --out="), proc.stderr
  assert (tmp_path / "afile").read_text() == "x"


def _data(tmp_path, name, **change):
  rng = np.random.default_rng(0)
  B, n, T, d = 2, 3, 3, 4
  arrays = {"X": rng.normal(size=(B, n, T, d)), "Y": np.where(rng.random((B, n)) < 0.5, 1.0, -1.0),
            "Z": rng.normal(size=(B, n, d)), "v": rng.normal(size=(B, d))}
  arrays.update(change)
  path = tmp_path / f"{name}.npz"
  np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
  return path


BAD_FILES = {
    "v_shape": ({"v": np.ones((2, 4, 3))}, "v must have shape (2, 4)"),
    "nan": ({"X": np.full((2, 3, 3, 4), np.nan)}, "non-finite"),
    "labels": ({"Y": np.zeros((2, 3))}, "labels Y must be -1 or +1"),
    "huge": ({"X": np.full((2, 3, 3, 4), 1e300)}, "|values| <= 1e+51"),
    "missing": ({"Z": None}, "missing array(s) ['Z']"),
    "empty": ({"X": np.ones((0, 3, 3, 4)), "Y": np.ones((0, 3)), "Z": np.ones((0, 3, 4)), "v": np.ones((0, 4))},
              "holds no data set"),
    "text": (None, "not a readable .npz"),
    "member": ("member", "its member 'v' is not an array (.npy)"),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_bad_data_files_are_named_in_one_line(tmp_path, name):
  from svmattn.data import datasets as data_lib
  change, expect = BAD_FILES[name]
  if change is None:
    path = tmp_path / "text.npz"
    path.write_text("not an npz")
  elif change == "member":           # a zip member that is no .npy: np.load hands back its bytes
    import zipfile
    path = _data(tmp_path, name, v=None)
    with zipfile.ZipFile(path, "a") as z:
      z.writestr("v", b"raw bytes")
  else:
    path = _data(tmp_path, name, **change)
  with pytest.raises(data_lib.DataError) as e:
    data_lib.load_npz(path)
  assert expect in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_float32_refuses_values_that_overflow_it(tmp_path):
  from svmattn.data import datasets as data_lib
  path = _data(tmp_path, "big", X=np.full((2, 3, 3, 4), 1e39))
  data_lib.load_npz(path, np.float64)       # fine in float64
  with pytest.raises(data_lib.DataError, match=r"float32 models need \|values\| <= 1e\+06"):
    data_lib.load_npz(path, np.float32)


def test_a_bad_data_file_ends_the_binary_with_one_line(tmp_path):
  path = _data(tmp_path, "v_shape", v=np.ones((2, 4, 3)))
  out = tmp_path / "out"
  proc = _run("local_convergence", f"--out={out}", f"--data={path}", "--noprogress")
  _assert_clean_error(proc, "v must have shape (B, d)")
  assert not (out / "work").exists() and not (out / "results.npz").exists()


# ----------------------------------------------------------------------------
# Runs that started: interrupted, failed then corrected, damaged work files
# ----------------------------------------------------------------------------

SMALL = ("--runs=4", "--batch_size=2", "--n=3", "--T=3", "--d=4", "--params=W", "--noprogress")


@pytest.mark.slow
def test_sigint_stops_with_one_line_naming_resume(tmp_path):
  out = tmp_path / "out"
  proc = subprocess.Popen([PY, "-m", "experiments.local_convergence", f"--out={out}", *SMALL, "--steps=200000",
                           "--chunk_steps=100"], cwd=REPO_ROOT, env=ENV, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.monotonic() + 240
    while not list(out.glob("work/ckpt_*")) and time.monotonic() < deadline and proc.poll() is None:
      time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    # (multiprocessing's, for the SVM workers)
    helpers = run_experiment.helper_processes("resource_tracker", parent=proc.pid)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode != 0
  assert "Traceback" not in err and "leaked" not in err, err[-3000:]
  assert "the same command with --resume" in err.strip().splitlines()[-1], err[-2000:]
  assert (out / "work" / "run.json").exists()                 # kept for --resume
  time.sleep(0.5)
  assert not [pid for pid in helpers if os.path.exists(f"/proc/{pid}")], helpers   # none outlives the run


@pytest.mark.slow
def test_a_failed_runs_directory_is_usable_by_the_corrected_command(tmp_path):
  """A run killed after it started leaves OUT/work; the corrected command (other flags) starts
  afresh over it without --resume, and --resume with other flags says to drop --resume."""
  out = tmp_path / "out"
  proc = subprocess.Popen([PY, "-m", "experiments.local_convergence", f"--out={out}", *SMALL, "--steps=200000",
                           "--chunk_steps=100", "--seed=1"], cwd=REPO_ROOT, env=ENV, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  try:
    deadline = time.monotonic() + 240
    while not (out / "work" / "run.json").exists() and time.monotonic() < deadline:
      time.sleep(0.2)
  finally:
    proc.kill()
    proc.wait()
  assert (out / "work").exists()
  refused = _run("local_convergence", f"--out={out}", *SMALL, "--steps=20", "--resume")
  _assert_clean_error(refused, "Drop --resume")
  fixed = _run("local_convergence", f"--out={out}", *SMALL, "--steps=20")
  assert fixed.returncode == 0, fixed.stderr[-3000:]
  assert "replacing it with this run" in fixed.stderr
  assert not (out / "work").exists() and (out / "results.npz").exists()
  with open(out / "runs" / "study.json") as f:
    assert json.load(f)["seed"] == 0                 # the corrected command's run, not the failed one's


@pytest.mark.slow
def test_resume_over_a_damaged_work_file_recomputes_it(tmp_path):
  """A finished batch's file in OUT/work overwritten: --resume computes that batch again and
  the results equal an undamaged run's."""
  ref = tmp_path / "ref"
  assert _run("local_convergence", f"--out={ref}", *SMALL, "--steps=20").returncode == 0
  out = tmp_path / "out"
  # an unfinished run: the binary killed once a batch's results exist
  proc = subprocess.Popen([PY, "-m", "experiments.local_convergence", f"--out={out}", *SMALL, "--steps=20",
                           "--svm_workers=0"], cwd=REPO_ROOT, env=ENV, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  try:
    deadline = time.monotonic() + 240
    while not (out / "work" / "c0000_b00000.arrays").exists() and proc.poll() is None and time.monotonic() < deadline:
      time.sleep(0.05)
    os.kill(proc.pid, signal.SIGSTOP)
  finally:
    proc.kill()
    proc.wait()
  damaged = out / "work" / "c0000_b00000.arrays"
  if not damaged.exists():
    pytest.skip("the run finished before it could be stopped")
  damaged.write_bytes(damaged.read_bytes()[:64])
  again = _run("local_convergence", f"--out={out}", *SMALL, "--steps=20", "--resume")
  assert again.returncode == 0, again.stderr[-3000:]
  assert "Traceback" not in again.stderr
  with np.load(ref / "results.npz") as a, np.load(out / "results.npz") as b:
    for k in a.files:
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)


# ----------------------------------------------------------------------------
# A numerical failure inside the analysis is a status of that data set, never a crash
# ----------------------------------------------------------------------------

def _svd_fails(*args, **kwargs):
  raise np.linalg.LinAlgError("SVD did not converge")


def test_a_failed_svd_is_a_failed_status(monkeypatch, batch):
  from svmattn.svm import att_svm as svm_lib
  from svmattn.svm import gensvm
  X, Z = np.asarray(batch.X[0]), np.asarray(batch.Z[0])
  alpha = np.zeros(X.shape[0], int)
  monkeypatch.setattr(svm_lib, "solve_margin_program", _svd_fails)
  result = svm_lib.att_svm(X, Z, alpha, "nuc")
  assert result.status == "failed" and "LinAlgError" in result.message
  monkeypatch.setattr(gensvm, "null_space", _svd_fails)
  status, W, _, message = gensvm.equality_margin_svm(np.ones((2, 4)), np.ones((1, 4)), 2)
  assert status == "failed" and W is None and "SVD" in message


def test_a_matrix_head_is_refused_where_the_head_is_a_vector(tmp_path):
  from svmattn.data import datasets as data_lib
  path = _data(tmp_path, "v_dd", v=np.ones((2, 4, 4)))
  data_lib.load_npz(path)                      # a valid file (a matrix head's format) ...
  with pytest.raises(data_lib.DataError, match=r"v must have shape \(B, d\).*got \(2, 4, 4\)"):
    data_lib.check_vector_head(path)           # ... but not for a linear head (E2, E15, precision, ...)


@pytest.fixture
def small_disk(tmp_path):
  """A 120 KB tmpfs (needs the right to mount: skipped, with the reason, where there is none)."""
  where = tmp_path / "disk"
  where.mkdir()
  got = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=120k", "tmpfs", str(where)], capture_output=True, text=True)
  if got.returncode != 0:
    pytest.skip(f"cannot mount a small tmpfs here ({got.stderr.strip() or got.returncode})")
  yield where
  subprocess.run(["umount", str(where)], capture_output=True)


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_resume_completes_the_run(small_disk, tmp_path):
  """E2 on a disk that fills in its write phase: one line naming the cause, exit 1; once there is
  space, --resume completes it, bit for bit the run made on a roomy disk."""
  out = small_disk / "e2"
  args = ("--runs=4", "--steps=40", "--noprogress")
  full = _run("local_convergence", f"--out={out}", *args)
  _assert_clean_error(full, "No space left on device: nothing finished was lost")
  subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)
  resumed = _run("local_convergence", f"--out={out}", *args, "--resume")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  roomy = _run("local_convergence", f"--out={tmp_path / 'roomy'}", *args)
  assert roomy.returncode == 0, roomy.stderr[-3000:]
  for name in ("results.npz", "runs/cell_0000.npz"):
    with np.load(out / name) as a, np.load(tmp_path / "roomy" / name) as b:
      assert sorted(a.files) == sorted(b.files)
      for k in a.files:
        assert np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f"), (name, k)


@pytest.mark.slow
def test_a_run_into_a_finished_directory_keeps_it(tmp_path):
  """Other settings into a finished --out: refused in one line naming them, nothing touched; the
  same settings: "already complete", exit 0."""
  out = tmp_path / "e2"
  args = ("--runs=2", "--steps=20", "--noprogress")
  assert _run("local_convergence", f"--out={out}", *args).returncode == 0
  before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
  other = _run("local_convergence", f"--out={out}", "--runs=2", "--steps=30", "--noprogress")
  _assert_clean_error(other, "holds a finished run with other settings: identity.steps: the finished run has 20, "
                             "this command has 30. Nothing was changed")
  same = _run("local_convergence", f"--out={out}", *args)
  assert same.returncode == 0 and "already complete" in same.stdout, same.stderr[-2000:]
  assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def _files(directory):
  return {p.relative_to(directory): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_overwrite_keeps_the_old_run_until_the_new_one_is_complete(tmp_path):
  """--overwrite over a finished run, killed with SIGKILL mid-training: the old run is intact (bytes
  and ``results.load``); --overwrite --resume completes the new run, which then replaces the old
  one whole (a stale replay file included), bit for bit a run made into an empty directory."""
  from svmattn import results
  out = tmp_path / "lc"
  old_args = ("--runs=4", "--batch_size=2", "--n=3", "--T=3", "--d=4", "--params=W", "--noprogress", "--steps=20")
  assert _run("local_convergence", f"--out={out}", *old_args).returncode == 0
  (out / "replay_3.npz").write_bytes(b"a replay of the old run")
  before = _files(out)
  new_args = (*old_args[:-1], "--steps=20000", "--chunk_steps=100", "--checkpoint_every_s=0")
  proc = subprocess.Popen([PY, "-m", "experiments.local_convergence", f"--out={out}", *new_args, "--overwrite"],
                          cwd=REPO_ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  stage = tmp_path / ".lc.overwrite"
  try:
    deadline = time.monotonic() + 240
    while not list(stage.glob("work/ckpt_*")) and time.monotonic() < deadline and proc.poll() is None:
      time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    proc.kill()
    proc.wait(60)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert _files(out) == before                                   # the old run, untouched
  assert len(results.load(str(out))) == 4
  plain = _run("local_convergence", f"--out={out}", *new_args, "--resume")       # without --overwrite: named
  _assert_clean_error(plain, "an unfinished --overwrite run is staged beside it")
  resumed = _run("local_convergence", f"--out={out}", *new_args, "--overwrite", "--resume")
  assert resumed.returncode in (0, 1) and "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
  assert "replaced by this one" in resumed.stdout, resumed.stdout[-2000:]
  assert not stage.exists() and not (out / "replay_3.npz").exists() and not (out / "work").exists()
  fresh = _run("local_convergence", f"--out={tmp_path / 'fresh'}", *new_args)
  assert fresh.returncode in (0, 1), fresh.stderr[-3000:]
  for name in ("results.npz", "runs/cell_0000.npz"):
    with np.load(out / name) as a, np.load(tmp_path / "fresh" / name) as b:
      assert sorted(a.files) == sorted(b.files)
      for k in a.files:
        assert np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f"), (name, k)


@pytest.mark.slow
def test_overwrite_on_a_full_disk_keeps_the_old_run(small_disk, tmp_path):
  """--overwrite over a finished run on a disk that fills: one line, the old run intact; once there
  is space, --overwrite --resume completes the new run and replaces the old one."""
  from svmattn import results
  out = small_disk / "e2"
  subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)
  assert _run("local_convergence", f"--out={out}", "--runs=4", "--steps=20", "--noprogress").returncode in (0, 1)
  before, rows = _files(out), len(results.load(str(out)))
  used = sum(len(b) for b in before.values())
  subprocess.run(["mount", "-o", f"remount,size={used // 1024 + 120}k", str(small_disk)], check=True)
  args = ("--runs=4", "--steps=40", "--noprogress", "--overwrite")
  full = _run("local_convergence", f"--out={out}", *args)
  _assert_clean_error(full, "No space left on device: nothing finished was lost")
  assert _files(out) == before and len(results.load(str(out))) == rows
  subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], check=True)
  resumed = _run("local_convergence", f"--out={out}", *args, "--resume")
  assert resumed.returncode in (0, 1) and "replaced by this one" in resumed.stdout, resumed.stderr[-3000:]
  assert json.loads((out / "summary.json").read_text())["flags"]["steps"] == 40
  assert not (small_disk / ".e2.overwrite").exists()


def test_checks_over_runs_that_never_trained_are_not_evaluated(tmp_path):
  """E2 at --lr=1e300: W stalls, (K,Q) overflows; every check says "not evaluated" with the reason,
  none is [ok] or [FAIL], and no NumPy warning reaches stderr."""
  got = _run("local_convergence", f"--out={tmp_path / 'e2'}", "--runs=3", "--steps=20", "--lr=1e300", "--noprogress")
  assert got.returncode == 0, got.stderr[-3000:]
  lines = [ln for ln in got.stdout.splitlines() if ln.strip().startswith("[")]
  assert lines and all(ln.strip().startswith("[not evaluated]") for ln in lines), got.stdout
  assert "3 stalled of its 3 runs" in got.stdout
  assert "Warning" not in got.stderr, got.stderr[-2000:]
  summary = json.loads((tmp_path / "e2" / "summary.json").read_text())
  assert all(c["ok"] is None and c["reason"] for c in summary["checks"])


@pytest.mark.slow
def test_replay_on_a_full_disk_is_one_line_before_any_verdict(small_disk, tmp_path):
  """A replay whose record cannot be written (the disk is full): one line, no verdict printed, no
  replay file left."""
  import shutil
  roomy = tmp_path / "e2"
  assert _run("local_convergence", f"--out={roomy}", "--runs=2", "--steps=20", "--noprogress").returncode == 0
  subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)
  out = small_disk / "e2"
  shutil.copytree(roomy, out)
  with open(small_disk / "filler", "wb", buffering=0) as f:       # the rest of the disk
    try:
      while True:
        f.write(b"\0" * 4096)
    except OSError:
      pass
  got = _run("replay", f"--out={out}", "--run=1")
  _assert_clean_error(got, "cannot write the replay's record")
  assert "identical" not in got.stdout, got.stdout
  assert not list(out.glob("replay_1*"))


@contextlib.contextmanager
def _sigint_not_ignored():
  """Children started in the block get SIGINT's default disposition. A test run started in the
  background by a non-interactive shell (`cmd &`) ignores SIGINT, its children inherit that, and the
  programs rightly leave an ignored SIGINT ignored (svmattn.interrupts): the run then finished and
  exited 0. A handler of this process (unlike SIG_IGN) is reset to the default on exec."""
  before = signal.getsignal(signal.SIGINT)
  if before == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, before)


def _wait_for_program(proc, library: str = "numpy", timeout: float = 60.0) -> None:
  """Until the child runs the program itself: a shared library of ``library`` is mapped into it
  (/proc/PID/maps; Linux; elsewhere a fixed 0.2 s). The programs install their interrupt handler
  before they import NumPy, so from then on an interrupt is theirs. (Counted from Popen, the first
  delay fell, under load, in the fork-to-exec gap, where the SIGINT went to the parent's copy and
  was lost, or in Python's own start-up, where the interrupt is Python's.)"""
  if not os.path.exists("/proc/self/maps"):
    time.sleep(0.2)
    return
  end = time.monotonic() + timeout
  while time.monotonic() < end:
    try:
      with open(f"/proc/{proc.pid}/maps", "rb") as f:
        if library.encode() in f.read():
          return
    except OSError:
      return                       # (already ended: the assertions below say how)
    time.sleep(0.002)


@pytest.mark.slow
@pytest.mark.parametrize("entry", [["-m", "svmattn", "local_convergence"], ["-m", "experiments.local_convergence"]])
def test_ctrl_c_at_any_moment_of_start_up_is_one_line(entry, tmp_path):
  """SIGINT while the program imports JAX, parses its flags, builds and compiles (0.1 to 3 s in):
  one line naming it and exit status 1, never a traceback, a crash or a swallowed interrupt
  (svmattn.interrupts). The delays count from the moment the child maps NumPy (``_wait_for_program``).
  (Before the program's first line runs, about the first 30 ms, the interrupt is Python's own.)"""
  for k, delay in enumerate((0.1, 0.25, 0.5, 0.8, 1.2, 1.8, 3.0)):
    with _sigint_not_ignored():
      proc = subprocess.Popen([PY, *entry, f"--out={tmp_path / str(k)}", "--runs=4", "--steps=2000000",
                               "--noprogress"], cwd=REPO_ROOT, env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    _wait_for_program(proc)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 1, (delay, proc.returncode, err[-2000:])
    assert len(lines) == 1 and "error: stopped by SIGINT" in lines[0], (delay, err[-2000:])


def test_the_interrupt_handler_leaves_other_handlers_alone():
  from svmattn import interrupts
  mine = lambda signum, frame: None  # noqa: E731
  before = signal.signal(signal.SIGINT, mine)
  try:
    interrupts.install()
    assert signal.getsignal(signal.SIGINT) is mine
    signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupts.install("a hint")
    assert signal.getsignal(signal.SIGINT).func is interrupts.stop
  finally:
    signal.signal(signal.SIGINT, before)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
