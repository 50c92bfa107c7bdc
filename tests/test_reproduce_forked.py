"""reproduce's experiments as forks of its own process (``svmattn.report.forked``): the same results
bit for bit as a fresh ``python -m svmattn`` and the same one-line errors (that none outlives a
killed reproduce: tests/test_reproduce_jobs.py).

Each test drives reproduce's launcher from a process of its own: this test process has started
JAX, and a process that has started a JAX backend is never forked.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import REPO_ROOT
from test_sweep import ENV

DRIVER = textwrap.dedent("""
    import json, sys, tempfile
    sys.path.insert(0, {root!r})
    from svmattn.report import forked, reproduce
    results = {{"preload": forked.preload({fork!r})}}
    for key, cmd in {commands!r}:
      out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
      proc = forked.start([sys.executable, "-m", "svmattn", *cmd], out, err, reproduce._environ())
      code = proc.wait(600)
      out.seek(0), err.seek(0)
      results[key] = {{"forked": isinstance(proc, forked.Forked), "code": code, "stdout": out.read(),
                       "stderr": err.read()}}
    print(json.dumps(results))
""")


def _drive(commands, env=ENV, fork=True):
  proc = subprocess.run([sys.executable, "-c", DRIVER.format(root=REPO_ROOT, commands=commands, fork=fork)], env=env,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_forked_experiment_equals_a_fresh_process_and_errors_stay_one_line(tmp_path):
  args = ["paths_2d", "--runs=3", "--noprogress", "--figure_format=png"]
  got = _drive([("ok", [*args, f"--out={tmp_path / 'forked'}"]),
                ("bad", ["paths_2d", f"--out={tmp_path / 'bad'}", "--runs=-3"])])
  assert got["preload"] is None, got["preload"]
  ok, bad = got["ok"], got["bad"]
  assert ok["forked"] and ok["code"] == 0, ok["stderr"][-3000:]
  assert "E1" in ok["stdout"]                               # its output went to its own files
  assert bad["forked"] and bad["code"] != 0
  assert "runs" in bad["stderr"] and "Traceback" not in bad["stderr"], bad["stderr"][-3000:]
  assert not os.path.exists(tmp_path / "bad")

  fresh = subprocess.run([sys.executable, "-m", "svmattn", *args, f"--out={tmp_path / 'fresh'}"], env=ENV,
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
  assert fresh.returncode == 0, fresh.stderr[-3000:]
  a, b = np.load(tmp_path / "forked" / "results.npz"), np.load(tmp_path / "fresh" / "results.npz")
  assert sorted(a.files) == sorted(b.files) and a.files
  for k in a.files:
    assert np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind in "fc"), k
  checks = lambda d: [(c["name"], c["ok"], c["value"]) for c in json.load(open(d / "summary.json"))["checks"]]  # noqa: E731
  assert checks(tmp_path / "forked") == checks(tmp_path / "fresh")


@pytest.mark.slow   # (CI runs it with the slow tests: the test command stays under 5 minutes)
def test_turned_off_every_experiment_is_a_fresh_process(tmp_path):
  got = _drive([("bad", ["paths_2d", f"--out={tmp_path / 'bad'}", "--runs=-3"])], fork=False)
  assert got["preload"] == "--nofork"
  assert not got["bad"]["forked"] and got["bad"]["code"] != 0 and "Traceback" not in got["bad"]["stderr"]


# (A killed reproduce ends its forked experiments too: tests/test_reproduce_jobs.py)
