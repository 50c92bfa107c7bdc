"""svmattn.results: every experiment's output (E1..E15, tiny runs) as a table and as curves, the
--nokeep_runs fallback and the one-line errors.

Each binary runs once per session in a subprocess (two at a time), only for the tests selected."""
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import REPO_ROOT
from svmattn import results
from svmattn.analysis import metrics
from test_sweep import ENV

COMMON = ("--noprogress", "--svm_workers=0")
TRAIN = ("--steps=50", "--chunk_steps=50", "--snapshot_every=10")


class Exp:
  def __init__(self, flags, stages, probes, slow=False, early_stop=False, labels=()):
    # probes: (array name with {p} for the stage, column, "1d" | "final")
    self.flags, self.stages, self.probes = flags, stages, probes
    self.slow, self.early_stop, self.labels = slow, early_stop, tuple(labels)


EXPS = {
    "paths_2d": Exp(("--runs=2", "--steps=30", "--snapshot_every=10"), ["W", "KQ"],
                    [("corr_{p}_fro", "corr_fro", "1d"), ("loss_{p}", "final_loss", "final"),
                     ("health_{p}", "health", "1d"), ("svm_fro_status", "svm_fro_status", "1d")]),
    "local_convergence": Exp(("--runs=3", "--n=3", "--T=4", "--d=5", *TRAIN), ["W", "KQ"],
                             [("corr_{p}_fro", "final_corr_fro", "final"), ("corr_{p}_nuc", "final_corr_nuc", "final"),
                              ("max_prob_{p}", "final_max_prob", "final"), ("loss_{p}", "final_loss", "final"),
                              ("convergence_type_{p}", "convergence_type", "1d"),
                              ("svm_fro_{p}_status", "svm_fro_status", "1d"), ("finite_{p}", "finite", "1d"),
                              ("health_{p}", "health", "1d")]),
    "svm_rank": Exp(("--runs=2", "--shapes=3:3", "--ds=1,2", "--max_draws_factor=4"), [],
                    [("feasible", "feasible", "1d"), ("rank_fro", "rank_fro", "1d"), ("rank_nuc", "rank_nuc", "1d"),
                     ("status_nuc", "status_nuc", "1d")], early_stop=True, labels=("n", "T", "d")),
    "overparam": Exp(("--runs=3", "--n_values=2", "--T=3", "--d_min=2", "--d_max=3", "--steps=50", "--chunk_steps=50"),
                     [], [("types", "types", "1d"), ("corr", "corr", "1d"), ("svm_status", "svm_status", "1d"),
                          ("health", "health", "1d"), ("feasible_opt", "feasible_opt", "1d")], labels=("n", "d")),
    "multi_token": Exp(("--ds=4", "--runs=2", "--steps=300", "--snapshot_every=50", "--chunk_steps=100", "--lr=0.5",
                        "--batch_size=64"), [],
                       [("outcome", "outcome", "1d"), ("corr_svmeq", "final_corr_svmeq", "final"),
                        ("corr_mm", "final_corr_mm", "final"), ("health", "health", "1d")],
                       slow=True, early_stop=True, labels=("d",)),
    "lambda_head": Exp(("--runs=2", "--lams=0,0.4", "--n=2", "--T=3", "--d=5", "--steps=50", "--snapshot_every=10"), [],
                       [("gap", "gap", "1d"), ("status", "status", "1d"), ("final_svmeq", "final_svmeq", "1d"),
                        ("health", "health", "1d")], slow=True, labels=("lam",)),
    "reg_path": Exp(("--runs=2", "--n=2", "--T=3", "--d=3", "--num_r=3", "--r_min=0.5", "--r_max=40", "--iters=30",
                     "--first_iters=60"), ["W", "KQ"],
                    [("corr_{p}_fro", "final_corr_fro", "final"), ("loss_{p}", "final_loss", "final"),
                     ("svm_nuc_status", "svm_nuc_status", "1d")], slow=True),
    "seq_causal": Exp(("--runs=2", "--n=2", "--T=3", "--d=6", *TRAIN), ["seq2seq_W", "causal_W"],
                      [("corr_{p}", "final_corr", "final"), ("convergence_type_{p}", "convergence_type", "1d"),
                       ("svm_{p}_status", "svm_status", "1d")], slow=True),
    "feasibility": Exp(("--runs=4", "--shapes=3:3", "--d_min=1", "--d_max=3"), [],
                       [("feasible_opt", "feasible_opt", "1d"), ("status_random", "status_random", "1d")],
                       labels=("n", "T", "d")),
    "optimizer_geometry": Exp(("--runs=2", "--n=3", "--T=4", "--d=5", *TRAIN, "--optimizers=normalized_gd,sd_linf",
                               "--norms=fro,linf", "--params=W,KQ"),
                              ["normalized_gd", "normalized_gd_KQ", "sd_linf", "sd_linf_KQ"],
                              [("corr_{p}_fro", "final_corr_fro", "final"), ("corr_{p}_linf", "final_corr_linf", "final"),
                               ("dist_{p}_fro", "dist_fro", "1d"), ("svm_linf_{p}_status", "svm_linf_status", "1d")]),
    "joint_training": Exp(("--runs=2", "--n=3", "--T=4", "--d=5", *TRAIN), ["W", "W_fixed", "KQ", "KQ_fixed"],
                          [("corr_full_{p}", "final_corr_full", "final"), ("max_prob_{p}", "final_max_prob", "final"),
                           ("health_{p}", "health", "1d")], slow=True, labels=("setting",)),
    "next_token": Exp(("--runs=2", *TRAIN), ["W"],
                      [("corr_{p}", "final_corr", "final"), ("svm_{p}_status", "svm_status", "1d"),
                       ("cyclic_sccs", "cyclic_sccs", "1d")], slow=True, labels=("setting",)),
    "real_data": Exp(("--runs=2", "--n_values=2,4", "--steps=40", "--chunk_steps=40", "--snapshot_every=20"), ["W"],
                     [("corr_{p}", "final_corr", "final"), ("test_acc_{p}", "test_acc", "1d"),
                      ("svm_opt_status", "svm_opt_status", "1d")], slow=True, labels=("n",)),
    "multi_head": Exp(("--runs=2", "--n=3", "--T=4", "--d=5", *TRAIN), ["W", "KQ"],
                      [("{p}_head0_corr", "final_head0_corr", "final"), ("{p}_head1_max_prob", "head1_max_prob", "1d"),
                       ("{p}_all_same", "all_same", "1d")], slow=True),
    "two_layer": Exp(("--runs=2", "--n=3", "--T=4", "--d=5", *TRAIN), ["W", "KQ"],
                     [("{p}_layer2_corr", "final_layer2_corr", "final"), ("{p}_layer1_self", "layer1_self", "1d")],
                     slow=True),
}


def _param(name):
  return pytest.param(name, marks=pytest.mark.slow) if EXPS[name].slow else name


def _run(name, out):
  proc = subprocess.run([sys.executable, "-m", f"experiments.{name}", f"--out={out}", *COMMON, *EXPS[name].flags],
                        cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=600)
  return proc


class _Outputs:
  """The binaries' runs, two at a time: started for every selected test at once, awaited by each."""

  def __init__(self, root):
    self.root, self.futures = root, {}
    self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)

  def start(self, name):
    if name not in self.futures:
      out = self.root / name
      self.futures[name] = self.pool.submit(lambda: (out, _run(name, out)))

  def get(self, name):
    self.start(name)
    out, proc = self.futures[name].result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


GRID = "overparam"   # the grid of test_without_kept_runs_a_grid_is_a_clear_error


@pytest.fixture(scope="module")
def outputs(request, tmp_path_factory):
  runs = _Outputs(tmp_path_factory.mktemp("results_table"))
  for item in request.session.items:
    if item.module is not request.module:
      continue
    if hasattr(item, "callspec") and "name" in item.callspec.params:
      runs.start(item.callspec.params["name"])
    elif "e2" in item.fixturenames:
      runs.start("local_convergence")
    elif "grid" in item.name:
      runs.start(GRID)
  yield runs
  runs.pool.shutdown(wait=True)


def _get(outputs, name):
  return outputs.get(name)


@pytest.fixture
def e2(outputs):
  return _get(outputs, "local_convergence")


def _study(out):
  with open(os.path.join(out, "runs", "study.json")) as f:
    return json.load(f)


def _cell(out, c):
  with np.load(os.path.join(out, "runs", f"cell_{c:04d}.npz")) as f:
    return dict(f)


def _runs_of(a):
  if "runs" in a or "run" in a:
    return a["runs"] if "runs" in a else a["run"]
  return np.arange(len(next(v for v in a.values() if v.ndim >= 1)))


def _equal(got, want):
  got, want = np.asarray(list(got)), np.asarray(want)
  if want.dtype.kind == "f":
    np.testing.assert_allclose(got.astype(float), want, rtol=0, atol=0, equal_nan=True)
  else:
    np.testing.assert_array_equal(got.astype(want.dtype), want)


@pytest.mark.slow
@pytest.mark.parametrize("name", [_param(n) for n in EXPS])
def test_load_every_experiment(outputs, name):
  exp = EXPS[name]
  out = _get(outputs, name)
  df = results.load(str(out))
  study = _study(out)
  cells = study["cells"]
  n_stages = max(1, len(exp.stages))
  lengths = []
  for c, cell in enumerate(cells):
    a = _cell(out, c)
    lengths.append(len(_runs_of(a)))
    if not exp.early_stop:
      assert lengths[-1] == cell["runs"]
  assert len(df) == sum(lengths) * n_stages
  # columns: cell, the label keys, run, param (several stages), then the metrics
  label_keys = list(dict.fromkeys(k for cell in cells for k in cell["label"]))
  assert label_keys == list(exp.labels)
  head = ["cell", *label_keys, "run"] + (["param"] if exp.stages else [])
  assert list(df.columns[:len(head)]) == head
  if exp.stages:
    assert sorted(df["param"].unique()) == sorted(exp.stages)
  else:
    assert "param" not in df.columns
  for c, cell in enumerate(cells):
    rows = df[df["cell"] == c]
    for k, v in cell["label"].items():
      assert (rows[k] == v).all()
    a = _cell(out, c)
    for p in exp.stages or [None]:
      r = rows if p is None else rows[rows["param"] == p]
      _equal(r["run"], _runs_of(a))
      for template, column, kind in exp.probes:
        assert column in df.columns, (column, list(df.columns))
        raw = a[template.format(p=p)]
        _equal(r[column], raw[:, -1] if kind == "final" else raw)
  # curves: the last snapshot of every (cell, run, param) equals the final_ column
  finals = [(t, col) for t, col, kind in exp.probes if kind == "final"]
  if not finals:
    with pytest.raises(results.ResultsError, match="no per-snapshot arrays"):
      results.load_curves(str(out))
    return
  names = [col[len("final_"):] for _, col in finals]
  curves = results.load_curves(str(out), metrics=names)
  keys = ["cell", "run"] + (["param"] if exp.stages else [])
  assert list(curves.columns) == ["cell", *label_keys, "run", *(["param"] if exp.stages else []), "step",
                                  *(["R"] if name == "reg_path" else []), *names]
  last = curves.sort_values("step").groupby(keys, sort=False).tail(1).merge(df, on=keys + label_keys)
  assert len(last) == len(df)
  for m in names:
    _equal(last[m], last["final_" + m].to_numpy())


def test_e2_against_results_npz(e2):
  df = results.load(str(e2))
  with np.load(e2 / "results.npz") as f:
    r = dict(f)
  assert len(df) == 3 * 2 and df.groupby("param").size().to_dict() == {"W": 3, "KQ": 3}
  for p in ("W", "KQ"):
    rows = df[df["param"] == p]
    np.testing.assert_array_equal(rows["final_corr_fro"].to_numpy(), r[f"corr_{p}_fro"][:, -1])
    np.testing.assert_array_equal(rows["convergence_type"].to_numpy().astype(str), r[f"convergence_type_{p}"])
    assert set(rows["convergence_type"]) <= set(metrics.CONVERGENCE_TYPES)
  for column in ("final_corr_nuc", "final_max_prob", "final_loss", "svm_fro_status", "svm_nuc_status", "finite",
                 "health", "stalled_step"):
    assert column in df.columns and not df[column].isna().any(), column
  assert not any(c.startswith(("W_final", "selected", "optimal", "attention", "token_scores")) for c in df.columns)
  # the docstring's example
  means = df.groupby("param").final_corr_fro.mean()
  assert means["W"] == pytest.approx(r["corr_W_fro"][:, -1].mean())
  curves = results.load_curves(str(e2))
  assert len(curves) == 6 * len(r["steps"])
  assert sorted(curves["step"].unique()) == list(r["steps"])
  w0 = curves[(curves["param"] == "W") & (curves["run"] == 0)]
  np.testing.assert_array_equal(w0["corr_fro"].to_numpy(), r["corr_W_fro"][0])
  np.testing.assert_array_equal(w0["step"].to_numpy(), r["steps"])
  tidy = curves.melt(id_vars=["cell", "run", "param", "step"], var_name="metric")
  assert set(tidy["metric"]) == {"corr_fro", "corr_nuc", "max_prob", "loss"}


def test_without_kept_runs_reads_results_npz_of_one_cell(e2, tmp_path):
  """--nokeep_runs leaves runs/study.json only: E2 (one cell, per-run results.npz) reads the same."""
  kept = results.load(str(e2))
  lean = tmp_path / "lean"
  shutil.copytree(e2, lean)
  for p in (lean / "runs").glob("cell_*.npz"):
    p.unlink()
  study = _study(lean)
  study["runs_kept"] = False
  (lean / "runs" / "study.json").write_text(json.dumps(study))
  pd.testing.assert_frame_equal(results.load(str(lean)), kept)
  pd.testing.assert_frame_equal(results.load_curves(str(lean)), results.load_curves(str(e2)))


def test_without_kept_runs_a_grid_is_a_clear_error(outputs, tmp_path):
  lean = tmp_path / "lean"
  shutil.copytree(_get(outputs, GRID), lean)
  for p in (lean / "runs").glob("cell_*.npz"):
    p.unlink()
  with pytest.raises(results.ResultsError, match=r"its per-run record is missing \(runs/cell_0000.npz"):
    results.load(str(lean))                  # deleted files the record names: never read around them
  study = _study(lean)
  study["runs_kept"] = False
  (lean / "runs" / "study.json").write_text(json.dumps(study))
  with pytest.raises(results.ResultsError, match="kept no per-run records.*--nokeep_runs"):
    results.load(str(lean))


def test_a_deleted_cell_file_of_one_cell_is_not_read_around(e2, tmp_path):
  """A one-cell run whose runs/cell_0000.npz was deleted: an error naming it, not results.npz read instead."""
  gone = tmp_path / "gone"
  shutil.copytree(e2, gone)
  (gone / "runs" / "cell_0000.npz").unlink()
  with pytest.raises(results.ResultsError, match="per-run record is missing"):
    results.load(str(gone))


def test_errors_are_one_line(e2, tmp_path):
  def error(path, match, fn=results.load):
    with pytest.raises(results.ResultsError, match=match) as info:
      fn(str(path))
    assert "\n" not in str(info.value) and isinstance(info.value, ValueError)

  error(tmp_path / "missing", "no such directory")
  (tmp_path / "empty").mkdir()
  error(tmp_path / "empty", "holds no finished run")
  error(tmp_path / "empty", "holds no finished run", results.load_curves)
  bad = tmp_path / "bad"
  shutil.copytree(e2, bad)
  (bad / "runs" / "cell_0000.npz").write_bytes(b"not a zip file")
  error(bad, r"cell_0000.npz: corrupt \.npz")
  shutil.rmtree(bad)
  shutil.copytree(e2, bad)
  (bad / "summary.json").write_text("{truncated")
  error(bad, "summary.json: corrupt JSON")
  shutil.rmtree(bad)
  shutil.copytree(e2, bad)
  (bad / "runs" / "study.json").write_text("[1, 2]")
  error(bad, "study.json: corrupt")
  with pytest.raises(results.ResultsError, match="no per-snapshot metric 'bogus'"):
    results.load_curves(str(e2), metrics=["bogus"])
  for bad_metrics in (5, [1, 2], {"loss": 1}):
    with pytest.raises(results.ResultsError, match="metrics must be a metric name or a list of them"):
      results.load_curves(str(e2), metrics=bad_metrics)


def test_damaged_and_unfinished_runs_raise_never_guess(e2, tmp_path):
  """An unfinished run, a replaced or cut cell file, damaged summaries and a non-path raise one line;
  allow_unfinished=True reads what is there and says what is missing."""
  def error(path, match, **kw):
    with pytest.raises(results.ResultsError, match=match) as info:
      results.load(path, **kw)
    assert "\n" not in str(info.value)

  def copy(name):
    d = tmp_path / name
    shutil.copytree(e2, d)
    return d

  for bad in (None, 123, ["a"]):
    error(bad, "expected a results directory")
  unfinished = copy("unfinished")
  (unfinished / "summary.json").unlink()
  error(str(unfinished), r"an unfinished run \(no summary.json\); finish it with --resume")
  with pytest.raises(results.ResultsError, match="unfinished"):
    results.load_curves(str(unfinished))
  df = results.load(str(unfinished), allow_unfinished=True)
  assert df.attrs["unfinished"] == "an unfinished run (no summary.json)" and df.attrs["missing"] == ["summary.json"]
  assert "final_corr_fro" in df.columns           # the snapshot steps from the study's identity
  working = copy("working")
  (working / "work").mkdir()
  error(str(working), r"its work/ directory is still there")
  finished = results.load(str(e2))
  assert finished.attrs["unfinished"] == "" and finished.attrs["missing"] == []

  replaced = copy("replaced")
  cell = dict(np.load(replaced / "runs" / "cell_0000.npz"))
  cell["corr_W_fro"] = cell["corr_W_fro"] + 1.0
  np.savez_compressed(replaced / "runs" / "cell_0000.npz", **cell)
  error(str(replaced), r"cell_0000.npz: damaged or replaced")
  cut = copy("cut")
  study = _study(cut)
  for c in study["cells"]:
    c.pop("sha256")                                # (a record from before the digests: lengths still checked)
  (cut / "runs" / "study.json").write_text(json.dumps(study))
  cell = dict(np.load(cut / "runs" / "cell_0000.npz"))
  cell["corr_W_fro"] = cell["corr_W_fro"][:-1]
  np.savez_compressed(cut / "runs" / "cell_0000.npz", **cell)
  error(str(cut), r"array 'corr_W_fro' has \d+ rows, the cell's other arrays \d+ \(a cut or foreign array\)")

  flags = copy("flags")
  summary = json.loads((flags / "summary.json").read_text())
  (flags / "summary.json").write_text(json.dumps({**summary, "flags": [1, 2]}))
  error(str(flags), r"summary.json: corrupt \(its flags are a list, not a mapping\)")
  (flags / "summary.json").write_text(json.dumps({**summary, "sweep": {"lr": [1]}, "cells": [1, 2]}))
  error(str(flags), r"summary.json: corrupt \(a sweep's cells must be a list of mappings\)")
