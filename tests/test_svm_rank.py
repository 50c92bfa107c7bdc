"""End-to-end test of experiments/svm_rank.py (E3) at a tiny size, in a subprocess."""
import os
import time

import jax
import numpy as np
import pytest

from conftest import run_binary

import svmattn  # noqa: F401  (float64)
from svmattn.data import datasets as data_lib
from svmattn.svm import feasibility as feas_lib
from svmattn.models import heads
from svmattn.analysis import metrics
from svmattn.svm import att_svm as svm_lib

# End to end through the binary (a few seconds to a minute each): with the slow tests, which CI runs;
# the README's test command keeps the library's own tests.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def check_summary_layout(summary):
  for key in ("experiment", "flags", "timings_s", "environment", "checks"):
    assert key in summary
  assert summary["checks"]
  for c in summary["checks"]:
    assert set(c) - {"note"} == {"name", "value", "expected", "ok"}
    assert isinstance(c["name"], str) and isinstance(c["expected"], str) and isinstance(c["ok"], bool)
    assert isinstance(c["value"], (int, float, str))


def test_svm_rank_end_to_end(tmp_path):
  n, T, runs, factor, seed = 4, 3, 3, 4, 5
  summary, a = run_binary("experiments.svm_rank", tmp_path, f"--runs={runs}", "--ds=1,2,4",
                          f"--shapes={n}:{T}", f"--max_draws_factor={factor}", "--batch=5", f"--seed={seed}")
  check_summary_layout(summary)
  assert summary["rank_rtol"] == 1e-4
  assert os.path.getsize(tmp_path / "rank.png") > 0
  rtol = float(a["rtol"])
  for c, (cn, cT, d) in enumerate(a["cells"]):
    kept = a["kept_runs"][c][a["kept_runs"][c] >= 0]
    draws = int(a["draws"][c])
    assert len(kept) + int(a["infeasible_draws"][c]) == draws        # no failed checks here
    assert len(kept) == runs or draws == factor * runs               # complete, or stopped at the cap
    # replay the draws: the kept runs are exactly the feasible ones among runs 0 .. draws-1
    spec = data_lib.DataSpec(int(cn), int(cT), int(d))
    ds = data_lib.generate(spec, seed, np.arange(draws))
    gamma = np.asarray(jax.vmap(lambda v, X, Y: heads.token_scores(heads.LINEAR, v, X, Y))(ds.v, ds.X, ds.Y))
    opt = metrics.optimal_tokens(gamma)
    X, Z = np.asarray(ds.X), np.asarray(ds.Z)
    np.testing.assert_array_equal(np.flatnonzero(feas_lib.is_feasible(X, Z, opt)), kept)
    for b, r in enumerate(kept):
      assert a["status_fro"][c, b] == "optimal"
      for norm in ("fro", "nuc"):
        s = a[f"singular_values_{norm}"][c, b, :d]
        if a[f"status_{norm}"][c, b] == "optimal":
          assert a[f"rank_{norm}"][c, b] == np.sum(s > rtol * s[0])
          assert 1 <= a[f"rank_{norm}"][c, b] <= d
      assert a["rank_fro"][c, b] <= min(n, d)                        # W = sum_i u_i z_i^T
      if b == 0:                                                     # the stored rank is the SVM's
        ref = svm_lib.att_svm(X[r], Z[r], opt[r], "fro")
        assert metrics.numerical_rank(ref.W, rtol) == a["rank_fro"][c, b]
  cells = summary["cells"]
  assert [x["d"] for x in cells] == [1, 2, 4]
  d1 = cells[0]
  assert not d1["complete"] and d1["draws"] == factor * runs   # d = 1, unit tokens: ties, always infeasible
  assert any("d=1" in s for s in summary["incomplete_cells"])


# ----------------------------------------------------------------------------
# Killed with SIGKILL at a random moment, then --resume: the results of an uninterrupted run
# ----------------------------------------------------------------------------

# Cells d = 1 (never feasible: 8 batches up to the cap of 16 draws), d = 2 (some feasible) and
# d = 3 = max(T-1, n) (always feasible: it stops after its second batch of 2).
# SCS through cvxpy (slower than the default nuc_auto) keeps the run long enough to be killed twice
KILL_FLAGS = ("--runs=4", "--shapes=3:3", "--ds=1,2,3", "--max_draws_factor=4", "--batch_size=2", "--seed=1",
              "--noprogress", "--nuc_solver=SCS")


def _e3(out, *args):
  import subprocess
  import sys
  from test_sweep import ENV
  return subprocess.run([sys.executable, "-m", "experiments.svm_rank", f"--out={out}", *KILL_FLAGS, *args],
                        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)


@pytest.mark.slow   # kill -9 and --resume end to end (.ci/run runs it; E4's runs in the default suite)
def test_killed_then_resumed_equals_uninterrupted(tmp_path):
  """SIGKILL (the whole process group: the SVM worker too) at a random moment after the first
  batch was analyzed, then --resume until it ends: results.npz is an uninterrupted run's,
  array by array. The uninterrupted run solves inline (--svm_workers=0), the killed one in a
  worker: the worker count changes nothing either."""
  import random
  import re
  import subprocess
  import sys
  from test_sweep import ENV, assert_finished, assert_same_results, kill_when, listing

  reference = tmp_path / "reference"
  proc = _e3(reference, "--svm_workers=0")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert_finished(reference)

  rng = random.Random(7103)
  out = tmp_path / "killed"
  kills = []
  for attempt in range(2):
    log = open(tmp_path / f"log_{attempt}.txt", "w")
    proc = subprocess.Popen([sys.executable, "-m", "experiments.svm_rank", f"--out={out}", *KILL_FLAGS,
                             "--svm_workers=1", *(["--resume"] if attempt else [])],
                            cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = log
    before, seen, delay = set(listing(out)), [], rng.uniform(0.0, 0.4)

    def condition(paths, before=before, seen=seen, delay=delay):
      # an analyzed batch that was not there before, then a random delay
      if not seen and any(re.fullmatch(r"c\d+_b\d+\.arrays", p) for p in set(paths) - before):
        seen.append(time.monotonic())
      return bool(seen) and time.monotonic() >= seen[0] + delay

    killed = kill_when(proc, out, condition)
    if killed is None:       # it ended first
      break
    kills.append(killed)
  assert kills, "the run ended before it could be killed"
  print("killed with", [sorted(p for p in k if p.endswith(".arrays")) for k in kills])   # pytest -s
  if len(kills) == 2:              # killed twice: resume once more to the end (the second kill may
    # also have landed after results.npz was written, while the run cleaned up: resume finishes that)
    proc = _e3(out, "--resume", "--svm_workers=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
  else:                            # the resumed run (attempt 1) ran to the end before its kill
    assert proc.wait() == 0, open(tmp_path / "log_1.txt").read()[-3000:]
  assert_finished(out)
  assert_same_results(out, reference)
  with np.load(out / "results.npz") as a:
    assert list(a["draws"])[0] == 16 and np.all(a["kept_runs"][2] == np.arange(4))   # d=1 capped, d=3 all feasible


# ----------------------------------------------------------------------------
# Bad flags: one clear line, nothing written
# ----------------------------------------------------------------------------


def bad_flags_fail_cleanly(module, base, cases, out):
  """Run ``module`` with each of ``cases`` ((flags, the flag named in the error), all at once):
  exit status != 0, absl's one-line flag error naming the flag, no traceback, no ``out``."""
  import subprocess
  import sys
  from test_sweep import ENV
  procs = [(flag, named, subprocess.Popen([sys.executable, "-m", module, f"--out={out}", *base, *flag.split()],
                                          cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
           for flag, named in cases]
  for flag, named, proc in procs:
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0, flag
    assert "Traceback" not in stderr, stderr[-3000:]
    error = f"FATAL Flags parsing error: {named}" if named.startswith("flags ") else \
        f"FATAL Flags parsing error: flag --{named}="
    assert error in stderr, stderr[-3000:]
  assert not os.path.exists(out)


def test_bad_flags_fail_cleanly(tmp_path):
  data = tmp_path / "data.npz"
  data.write_bytes(b"")
  bad_flags_fail_cleanly("experiments.svm_rank", ("--runs=2", "--ds=2", "--shapes=3:3"), [
      ("--runs=0", "runs"), ("--shapes=5:1", "shapes"), ("--ds=1,0", "ds"), ("--batch=0", "batch_size"),
      (f"--data={data}", "data")],
      tmp_path / "out")
