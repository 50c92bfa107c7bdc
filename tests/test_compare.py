"""svmattn compare DIR1 DIR2 ...: key numbers, checks, numerics version and wall time side by side."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT
from svmattn.report import compare
from test_sweep import ENV


def write_run(path, w, kq, checks=(True, True), numerics="1", total=12.5, **extra):
  os.makedirs(path, exist_ok=True)
  summary = {"experiment": "E2 local convergence", "name": "local_convergence", "id": "E2",
             "final_corr": {"W_vs_fro": {"mean": w}, "KQ_vs_nuc": {"mean": kq}},
             "checks": [{"name": f"c{i}", "value": 1.0, "expected": "1", "ok": ok} for i, ok in enumerate(checks)],
             "timings_s": {"train": 1.0, "total": total}, **extra}
  if numerics is not None:
    summary["numerics_version"] = numerics
  with open(os.path.join(path, "summary.json"), "w") as f:
    json.dump(summary, f)
  return str(path)


def rows(text):
  return {line.split("  ")[0]: line for line in text.splitlines()}


def test_two_runs_side_by_side(tmp_path, capsys):
  a = write_run(tmp_path / "exact", 0.9987, 0.9975)
  b = write_run(tmp_path / "old", 0.9971, 0.9960, checks=(True, False), numerics=None, total=3.25)
  assert compare.main([a, b]) == 0
  out = capsys.readouterr().out
  lines = out.splitlines()
  assert a in lines[0] and b in lines[0] and lines[0].index(a) < lines[0].index(b)   # one column per directory
  r = rows(out)
  assert r["experiment"].split()[1:] == ["E2", "E2"]
  assert r["mean corr(W, Frobenius SVM)"].split()[-2:] == ["0.9987", "0.9971"]
  assert r["mean corr(KQ^T, nuclear SVM)"].split()[-2:] == ["0.9975", "0.996"]
  assert r["checks as expected"].split()[-2:] == ["2/2", "1/2"]
  assert r["numerics version"].split()[-2:] == ["1", "-"]                         # absent in an old run
  assert r["wall time (s)"].split()[-2:] == ["12.5", "3.2"]


def test_a_sweep_has_a_column_per_cell(tmp_path, capsys):
  sweep = tmp_path / "sweep"
  cells = []
  for k, (lr, w) in enumerate(((0.01, 0.95), (0.1, 0.99))):
    d = f"cells/{k:03d}_lr={lr}"
    write_run(sweep / d, w, w - 0.01, total=2.0 + k)
    cells.append({"settings": {"lr": lr}, "dir": d, "checks": {"ok": 2 - k, "total": 2, "failing": []},
                  "key_numbers": {"mean corr(W, Frobenius SVM)": w, "mean corr(KQ^T, nuclear SVM)": w - 0.01}})
  with open(sweep / "summary.json", "w") as f:
    json.dump({"experiment": "E2 local_convergence: sweep", "name": "local_convergence", "id": "E2",
               "sweep": {"lr": [0.01, 0.1]}, "cells": cells, "numerics_version": "1", "checks": [],
               "timings_s": {"total": 9.0}}, f)
  single = write_run(tmp_path / "single", 0.9, 0.8)
  assert compare.main([str(sweep), single]) == 0
  out = capsys.readouterr().out
  head = out.splitlines()[0]
  assert "[lr=0.01]" in head and "[lr=0.1]" in head and head.index("[lr=0.01]") < head.index("[lr=0.1]") \
      < head.index(single)
  r = rows(out)
  assert r["mean corr(W, Frobenius SVM)"].split()[-3:] == ["0.95", "0.99", "0.9"]
  assert r["checks as expected"].split()[-3:] == ["2/2", "1/2", "2/2"]
  assert r["wall time (s)"].split()[-3:] == ["2.0", "3.0", "12.5"]      # each cell's own summary


def test_bad_directories_are_one_line_each(tmp_path, capsys):
  good = write_run(tmp_path / "good", 0.99, 0.99)
  empty = tmp_path / "empty"
  empty.mkdir()
  broken = tmp_path / "broken"
  broken.mkdir()
  (broken / "summary.json").write_text("{not json")
  missing = str(tmp_path / "missing")
  assert compare.main([good, str(empty), str(broken), missing]) == 1
  captured = capsys.readouterr()
  assert captured.out == ""
  assert captured.err.splitlines() == [f"error: {empty}: no summary.json", f"error: {broken}: unreadable summary.json",
                                       f"error: {missing}: no such directory"]
  assert compare.main([]) == 1 and "usage" in capsys.readouterr().out


def test_damaged_and_unfinished_runs_are_one_line_each(tmp_path, capsys):
  """Damaged summaries and a run still working (its summary.json may be an earlier run's) are one line
  each, exit 1, and no table."""
  cases = {
      "cells": ({"sweep": {"lr": [1]}, "cells": [1, 2]}, "a sweep's cells must be a list of mappings"),
      "settings": ({"sweep": {"lr": [1]}, "cells": [{"settings": [1], "dir": "x"}]},
                   "a sweep cell's settings are not a mapping"),
      "checks": ({"checks": [1, 2]}, "its checks are not a list of mappings"),
  }
  for name, (extra, expect) in cases.items():
    d = write_run(tmp_path / name, 0.9, 0.9)
    with open(os.path.join(d, "summary.json")) as f:
      summary = {**json.load(f), **extra}
    with open(os.path.join(d, "summary.json"), "w") as f:
      json.dump(summary, f)
    assert compare.main([d]) == 1
    err = capsys.readouterr()
    assert err.out == "" and err.err.strip() == f"error: {d}: corrupt summary.json ({expect})"
  working = write_run(tmp_path / "working", 0.9, 0.9)
  os.makedirs(os.path.join(working, "work"))
  assert compare.main([working]) == 1
  assert "an unfinished run (its work/ directory is still there" in capsys.readouterr().err
  timings = write_run(tmp_path / "timings", 0.9, 0.9, timings_s=[1])
  assert compare.main([timings]) == 0
  assert rows(capsys.readouterr().out)["wall time (s)"].split()[-1] == "-"


@pytest.mark.parametrize("args", [["list"], ["compare", "RUN"]])
def test_a_closed_pipe_ends_quietly(args, tmp_path):
  """`svmattn list | true` and `svmattn compare DIR | true`: the reader is gone before the command
  writes; it ends with status 0 and no traceback."""
  run = write_run(tmp_path / "run", 0.9, 0.9)
  r, w = os.pipe()
  os.close(r)                                      # the reader has gone before anything is written
  proc = subprocess.run([sys.executable, "-m", "svmattn", *[run if a == "RUN" else a for a in args]],
                        cwd=REPO_ROOT, env=ENV, stdout=w, stderr=subprocess.PIPE, text=True, timeout=300)
  os.close(w)
  assert proc.returncode == 0 and "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
