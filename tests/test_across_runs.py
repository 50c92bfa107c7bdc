"""Reading sweeps: the figure across cells (aggregate), the metric log's scalars, cell names of
file-valued axes, and key numbers that were not computed (library level, no run)."""
import numpy as np
import pandas as pd
import pytest

from svmattn import registry
from svmattn.execution import metric_log
from svmattn.execution import run_experiment
from svmattn.report import across_runs


def _frame():
  rng = np.random.default_rng(0)
  rows = []
  for lr in (0.01, 0.1, 1.0):
    for d in (4, 8):
      for run in range(9):
        rows.append({"lr": lr, "d": d, "run": run, "param": "W", "final_corr_fro": rng.uniform(0.9, 1.0),
                     "health": "ok"})
  df = pd.DataFrame(rows)
  df.loc[0, "final_corr_fro"] = np.nan          # a diverged run: left out of the median, counted
  return df


def test_aggregate_is_the_median_and_quartiles_over_data_sets():
  df = _frame()
  got = across_runs.aggregate(df, "lr", "final_corr_fro", hue=["d"])
  assert len(got) == 6 and list(got.columns[:2]) == ["d", "lr"]
  for _, row in got.iterrows():
    values = df[(df.lr == row.lr) & (df.d == row.d)].final_corr_fro.dropna().to_numpy()
    assert row["median"] == np.median(values)
    assert row["lo"] == np.quantile(values, 0.25) and row["hi"] == np.quantile(values, 0.75)
    assert row["n"] == 9 and row["n_nonfinite"] == (1 if (row.lr, row.d) == (0.01, 4) else 0)


def test_plot_errors_name_the_field(tmp_path):
  df = _frame()
  with pytest.raises(across_runs.PlotError, match="--x=nope: no such column"):
    across_runs.aggregate(df, "nope", "final_corr_fro")
  with pytest.raises(across_runs.PlotError, match="--y=health: not a numeric column"):
    across_runs.aggregate(df, "lr", "health")
  with pytest.raises(across_runs.PlotError, match="different columns"):
    across_runs.aggregate(df, "lr", "final_corr_fro", hue=["lr"])
  many = across_runs.aggregate(df.assign(run=df.run.astype(str)), "lr", "final_corr_fro", hue=["run"], col=["d"])
  assert len(many) == 54
  path = across_runs.draw(across_runs.aggregate(df, "lr", "final_corr_fro", hue=["d"]), "lr", "final_corr_fro",
                          ["d"], [], str(tmp_path / "p.png"))
  assert (tmp_path / "p.png").stat().st_size > 1000 and path.endswith("p.png")


def test_the_sweep_default_figure_fields():
  df = _frame().assign(param=["W", "KQ"] * 27)
  assert across_runs.sweep_fields(df, ["lr", "d"]) == ("lr", ["d"], ["param"])
  assert across_runs.default_metric(df) == "final_corr_fro"


def test_metric_log_scalars_are_medians_per_snapshot():
  steps = np.array([0, 10, 20])
  curves = np.array([[0.1, 0.5, 0.9], [0.3, np.nan, 0.7], [0.2, 0.4, np.inf]])
  arrays = {"corr_W_fro": curves, "dist_fro": np.array([1.0, 3.0, 2.0]), "runs": np.arange(3),
            "selected_W": np.zeros((3, 3)), "health": np.array(["ok"] * 3)}
  got = metric_log.scalars(arrays, steps)
  assert got == [("corr_W_fro", 0, 0.2), ("corr_W_fro", 10, 0.45), ("corr_W_fro", 20, 0.8),
                 ("final/dist_fro", 20, 2.0)]
  assert metric_log.snapshot_steps({"steps": 20, "snapshot_every": 10, "chunk_steps": 20}).tolist() == [0, 10, 20]
  assert metric_log.snapshot_steps({"R": [1, 2]}) is None


def test_file_valued_cells_have_short_distinct_names():
  a = run_experiment.cell_dir(0, {"data": "/home/me/data/a/sets.npz", "lr": 0.1})
  b = run_experiment.cell_dir(1, {"data": "/home/me/data/b/sets.npz", "lr": 0.1})
  assert a.startswith("000_data=sets-") and b.startswith("001_data=sets-") and a[4:] != b[4:]
  assert len(a) < 30 and "/" not in a and "home" not in a
  assert run_experiment.cell_dir(2, {"lr": 0.1, "optimizers": ["adam", "muon"]}) == "002_lr=0.1_optimizers=adam-muon"


def test_key_numbers_not_computed_are_left_out():
  e2 = registry.get("E2")
  summary = {"final_corr": {"W_vs_fro": {"mean": 0.99}}}
  assert registry.key_numbers(summary, e2) == [("mean corr(W, Frobenius SVM)", 0.99)]
  e10 = registry.get("E10")
  nearest = {"normalized_gd": {"by_corr": "fro", "predicted": "fro"}, "adam": {"by_corr": "l3", "predicted": "linf"},
             "muon": {"by_corr": "spectral", "predicted": "spectral"}}
  labels = [label for label, _ in registry.key_numbers({"nearest": nearest}, e10)]
  assert [lab for lab in labels if "nearest norm" in lab] == ["normalized_gd: nearest norm (predicted fro)",
                                                                "adam: nearest norm (predicted linf)",
                                                                "muon: nearest norm (predicted spectral)"]
