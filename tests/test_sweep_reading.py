"""A sweep as people read it, end to end: per-cell numbers that are per cell, the default figure,
`svmattn plot`, `svmattn table` (CSV, Parquet, --curves), TensorBoard scalars, and no key number
printed for what was not asked (an E2 sweep of W alone: no nuclear SVM, no (K,Q))."""
import importlib.util
import json
import os
import struct
import subprocess

import numpy as np
import pandas as pd
import pytest

from svmattn import results
from test_config_run import CONFIG, SMALL, svmattn

pytestmark = pytest.mark.slow     # (one sweep of 4 cells: 20-40 s)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
  out = tmp_path_factory.mktemp("reading") / "sweep"
  proc = svmattn("run", f"--config={CONFIG}", *SMALL, "--config.sweep.lr=0.1,1", "--config.sweep.d=4,5",
                 "--config.params=W", "--config.norms=fro", "--config.log=tensorboard", f"--out={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  return out, proc


def _summary(path):
  with open(path) as f:
    return json.load(f)


def test_per_cell_numbers_are_the_cells_own(sweep):
  out, proc = sweep
  top = _summary(out / "summary.json")
  assert top["work"]["sets_loaded"] == 12 and top["timings_s"]["total"] > 0
  cells = [_summary(out / row["dir"] / "summary.json") for row in top["cells"]]
  for row, cell in zip(top["cells"], cells):
    assert cell["work"] == {"cells": 1, "sets_loaded": 3, "dataset_steps": 3 * 40, "sets_analyzed": 3}
    t = cell["timings_s"]
    assert "total" not in t and "pipeline_wall" not in t and t["cell_total"] > 0
    assert t["cell_total"] == pytest.approx(t["data"] + t["train"] + t["svm"] + t["write"])
    assert row["seconds"] == t["cell_total"]
  assert sum(c["timings_s"]["train"] for c in cells) <= top["timings_s"]["train"] * (1 + 1e-9)
  assert "None" not in proc.stdout and "nuclear" not in proc.stdout, proc.stdout
  assert f"figure {out / 'sweep.png'}" in proc.stdout and (out / "sweep.png").stat().st_size > 5000


def test_plot_draws_the_median_over_data_sets(sweep, tmp_path):
  out, _ = sweep
  fig = tmp_path / "lr.png"
  proc = svmattn("plot", str(out), "--x=lr", "--y=final_corr_fro", "--hue=d", f"--out={fig}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert fig.stat().st_size > 5000 and f"wrote {fig}" in proc.stdout
  df = results.load(out)
  medians = df.groupby(["d", "lr"]).final_corr_fro.median()
  for (d, lr), value in medians.items():
    assert any(line.split()[:3] == [str(d), f"{lr:.4g}", f"{value:.4g}"] for line in proc.stdout.splitlines()), \
        (d, lr, proc.stdout)
  curves = svmattn("plot", str(out), "--x=step", "--y=corr_fro", "--hue=lr", "--col=d", f"--out={tmp_path / 's.png'}")
  assert curves.returncode == 0 and (tmp_path / "s.png").exists(), curves.stderr[-2000:]
  bad = svmattn("plot", str(out), "--x=nope")
  assert bad.returncode == 1 and bad.stderr.startswith("error: --x=nope: no such column or setting") and \
      "Traceback" not in bad.stderr


def test_table_writes_csv_and_parquet(sweep, tmp_path):
  out, _ = sweep
  df = results.load(out)
  proc = svmattn("table", str(out), f"--out={tmp_path / 't.csv'}")
  assert proc.returncode == 0 and f"{len(df)} rows" in proc.stdout, proc.stderr[-2000:]
  csv = pd.read_csv(tmp_path / "t.csv")
  assert list(csv.columns) == ["source", *df.columns] and len(csv) == len(df)
  np.testing.assert_array_equal(csv.final_corr_fro.to_numpy(), df.final_corr_fro.to_numpy())   # (repr round-trips)
  proc = svmattn("table", str(out), str(out), "--curves", "--metrics=corr_fro", f"--out={tmp_path / 'c.parquet'}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  long = pd.read_parquet(tmp_path / "c.parquet")
  curves = results.load_curves(out, metrics=["corr_fro"])
  assert len(long) == 2 * len(curves) and set(long.columns) == {"source", *curves.columns}
  for args, expect in ((["--format=xls", "--out=x.xls"], "--format=xls: must be one of csv, parquet"),
                       ([], "--out=FILE is required"), (["--out=x.txt"], "format 'txt' is not one of")):
    bad = svmattn("table", str(out), *args)
    assert bad.returncode == 1 and expect in bad.stderr.splitlines()[0] and "Traceback" not in bad.stderr, bad.stderr


def _events(path):
  """(tag, step, value) of a TensorBoard event file (TFRecord frames of tensorboardX's Event protos)."""
  from tensorboardX.proto import event_pb2
  found = []
  data = open(path, "rb").read()
  at = 0
  while at < len(data):
    (length,) = struct.unpack("<Q", data[at:at + 8])
    event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
    at += 12 + length + 4
    for v in event.summary.value:
      found.append((v.tag, event.step, v.simple_value))
  return found


def test_tensorboard_holds_each_batchs_median_curves(sweep):
  """One TensorBoard run per cell, and per batch where a cell has several (here batches of 2 of
  the 3 data sets): each tag's scalar at each snapshot step is the median over the batch's data sets."""
  out, _ = sweep
  root = out / "tensorboard"
  cells = sorted(p.name for p in root.iterdir() if p.is_dir())
  assert cells == ["d=4_lr=0.1", "d=4_lr=1.0", "d=5_lr=0.1", "d=5_lr=1.0"], cells
  curves = results.load_curves(out, metrics=["corr_fro"])
  for name in cells:
    batches = sorted(p.name for p in (root / name).iterdir())
    assert batches == ["batch_0000", "batch_0001"]
    d, lr = int(name.split("_")[0][2:]), float(name.split("=")[-1])
    for k, runs in enumerate(([0, 1], [2])):
      files = list((root / name / batches[k]).iterdir())
      assert len(files) == 1
      events = _events(files[0])
      mine = curves[(curves.d == d) & (curves.lr == lr) & curves.run.isin(runs)]
      want = mine.groupby("step").corr_fro.median()
      got = {step: value for tag, step, value in events if tag == "corr_W_fro"}
      assert sorted(got) == list(want.index)
      for step, value in want.items():       # (TensorBoard keeps float32)
        assert got[step] == np.float32(value)
      assert {"corr_W_fro", "loss_W", "max_prob_W"} <= {tag for tag, _, _ in events}
  assert len(json.load(open(root / "logged.json"))) == 8


def test_several_runs_carry_the_settings_that_differ(sweep, tmp_path):
  """Two runs of other steps in one table: a column `steps` (the differing setting) beside `source`,
  and a figure with one line per steps value."""
  import shutil
  out, _ = sweep
  other = tmp_path / "other"
  shutil.copytree(out, other)
  summary = _summary(other / "summary.json")
  summary["flags"]["steps"] = 80                   # (as a run of 80 steps would record it)
  (other / "summary.json").write_text(json.dumps(summary))
  both = results.load_many([out, other])
  assert set(both.steps) == {40, 80} and set(both.source) == {str(out), str(other)}
  assert (both.groupby("source").steps.nunique() == 1).all()
  path, table = results.plot([out, other], x="lr", y="final_corr_fro", hue="steps", path=str(tmp_path / "s.png"))
  assert sorted(table.steps.unique()) == [40, 80] and os.path.getsize(path) > 5000


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed (not a dependency)")
def test_wandb_writes_an_offline_run_and_leaves_no_process(tmp_path):
  from test_sweep import e2
  out = tmp_path / "e2"
  proc = e2(out, "--log=wandb", flags=("--runs=3", "--steps=40", "--noprogress"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  runs = list((out / "wandb" / "wandb").glob("offline-run-*/run-*.wandb"))
  assert len(runs) == 1 and runs[0].stat().st_size > 1000
  alive = subprocess.run(["pgrep", "-f", f"wandb.*{out}"], capture_output=True, text=True)
  assert alive.stdout.strip() == ""


def test_wandb_missing_is_one_line(tmp_path):
  if importlib.util.find_spec("wandb") is not None:
    pytest.skip("wandb is installed here: the refusal cannot be seen")
  from test_sweep import e2
  proc = e2(tmp_path / "e2", "--log=wandb", flags=("--runs=3", "--steps=40", "--noprogress"))
  assert proc.returncode != 0 and "wandb is not installed" in proc.stderr and "Traceback" not in proc.stderr
  assert not (tmp_path / "e2").exists()
