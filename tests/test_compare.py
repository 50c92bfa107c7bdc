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
    write_run(sweep / d, w, w - 0.01, total=40.0, sweep_settings={"lr": lr},
              timings_s={"train": 1.0, "cell_total": 2.0 + k})      # a cell's own seconds, not the sweep's
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
  assert r["time (s): a run's wall, a cell's own work"].split()[-3:] == ["2.0", "3.0", "12.5"]  # each cell's own


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
  assert compare.main([]) == 1
  err = capsys.readouterr().err
  assert err.startswith("error: no run directory given") and "usage" in err


def test_damaged_and_unfinished_runs_are_one_line_each(tmp_path, capsys):
  """Damaged summaries and a run still working (its summary.json may be an earlier run's) are one line
  each, exit 1, and no table."""
  cases = {
      "cells": ({"sweep": {"lr": [1]}, "cells": [1, 2]}, "a sweep's cells must be a list of mappings"),
      "settings": ({"sweep": {"lr": [1]}, "cells": [{"settings": [1], "dir": "x"}]},
                   "a sweep cell's settings are not a mapping"),
      "checks": ({"checks": [1, 2]}, "its checks are not a list of mappings"),
      "flags": ({"flags": [1, 2]}, "its flags are a list, not a mapping"),
      "cell_dir": ({"sweep": {"lr": [1]}, "cells": [{"settings": {"lr": 1}}]}, "a sweep cell needs its settings and dir"),
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
  lost = write_run(tmp_path / "lost", 0.9, 0.9, sweep={"lr": [1]}, cells=[{"settings": {"lr": 1}, "dir": "cells/0"}])
  assert compare.main([lost]) == 1
  assert capsys.readouterr().err.strip() == f"error: {lost}: its cell cells/0 has no readable summary.json"
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


def test_the_settings_that_differ_come_first(tmp_path, capsys):
  """Two runs of other steps and data files: the differing settings are the first rows, by value
  (a file by its name); operational flags (--out, --progress) and equal settings are left out."""
  flags = {"out": "x", "progress": True, "lr": 0.1, "steps": 500, "data": "/data/a/sets.npz"}
  a = write_run(tmp_path / "a", 0.99, 0.98, flags=flags)
  b = write_run(tmp_path / "b", 0.97, 0.96, flags={**flags, "out": "y", "steps": 2000, "data": "/data/b/other.npz"})
  assert compare.main([a, b]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[2].split() == ["setting", "steps", "500", "2000"]
  assert lines[3].split() == ["setting", "data", "sets.npz", "other.npz"]
  assert not any(line.startswith(("setting lr", "setting out", "setting progress")) for line in lines)


def test_many_columns_are_one_row_each(tmp_path, capsys):
  """More than compare.WIDE columns: one row per run, key numbers numbered and named below, and
  the table no wider than its longest row needs; --layout=columns keeps the wide table."""
  dirs = [write_run(tmp_path / f"r{k}", 0.9 + k / 100, 0.8, flags={"lr": 0.1 * (k + 1), "steps": 500})
          for k in range(compare.WIDE + 2)]
  assert compare.main(dirs) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0] == f"E2: {len(dirs)} columns; settings that differ: lr"
  assert out[1].split()[:3] == ["run", "lr", "[1]"]
  assert len(out) == 2 + len(dirs) + 2 and out[-2:] == ["[1] mean corr(W, Frobenius SVM)",
                                                         "[2] mean corr(KQ^T, nuclear SVM)"]
  assert out[2].split()[:3] == [dirs[0], "0.1", "0.9"]
  assert max(len(line) for line in out) < 140
  assert compare.main([*dirs, "--layout=columns"]) == 0
  assert capsys.readouterr().out.splitlines()[0].split() == dirs
  assert compare.main([*dirs, "--layout=sideways"]) == 1
  assert "must be one of auto, columns, rows" in capsys.readouterr().err
