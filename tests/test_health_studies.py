"""Training health (``analysis.health``) in every training study's outputs: ``check_summary`` is
called by each study's test module on the run it already makes (E1, E5, E6, E10-E15); the tests
here cover the pieces that need no training run."""
import numpy as np

from svmattn.analysis import health
from svmattn.studies import lambda_head as e6
from svmattn.studies import multi_token as e5
from svmattn.studies import next_token as e12
from svmattn.studies import real_data


def check_summary(summary: dict, arrays, runs: dict, threshold: float = health.SATURATION) -> None:
  """summary["health"] holds, for every name of ``runs`` ({name: number of runs}), counts over
  the four labels summing to its runs, equal to those of results.npz's health_<name>, with a
  stalled_step_<name> beside it; summary["saturation_threshold"] is ``threshold`` (0: no run is
  "unsaturated")."""
  assert summary["saturation_threshold"] == threshold
  assert sorted(summary["health"]) == sorted(runs)
  for name, n in runs.items():
    counts = summary["health"][name]
    assert list(counts) == list(health.LABELS)
    assert sum(counts.values()) == n, (name, counts)
    assert counts == health.counts(arrays[f"health_{name}"])
    assert arrays[f"stalled_step_{name}"].shape == (n,)
    assert np.all((arrays[f"stalled_step_{name}"] >= 0) == (arrays[f"health_{name}"] == "stalled"))
    if threshold == 0:
      assert counts["unsaturated"] == 0


def test_multi_token_studies_do_not_label_unsaturated_runs():
  # E5, E6, E13 study multi-token selection, E12 the graph SVM (attention spread inside a cyclic
  # component): a spread softmax is no unhealthy run
  assert e5.SATURATION == e6.SATURATION == e12.SATURATION == real_data.SATURATION == 0.0
  t = {"finite": np.array([True, True, False]), "stalled_step": np.array([-1, 40, -1]),
       "max_prob": np.array([[1.0, 0.3], [1.0, 0.3], [1.0, np.nan]])}
  assert health.of_trajectory(t, e5.SATURATION).tolist() == ["ok", "stalled", "diverged"]


def test_multi_token_health_covers_the_trained_draws_only():
  """E5: a skipped draw (no negative label, not trained) has no health in results.npz: health_d<d>
  is aligned with trained_runs_d<d>."""
  B, n, T, d = 4, 2, 3, 2
  cell = {"runs": np.arange(B), "outcome": np.array(["skipped", "kept", "finite", "kept"], e5.OUTCOME_DTYPE),
          "health": np.array(["skipped", "ok", "stalled", "ok"], "<U11"), "stalled_step": np.array([-1, -1, 20, -1]),
          "X": np.zeros((B, n, T, d))}
  for k in e5.KEPT_KEYS:
    cell.setdefault(k, np.zeros((B,)))
  _, counts, trained = e5.reduce_cell(e5.SETTINGS.validate({"runs": 2}), cell, 3)
  assert counts["trained"] == 3
  assert trained["runs"].tolist() == [1, 2, 3]
  assert trained["health"].tolist() == ["ok", "stalled", "ok"]
  assert trained["stalled_step"].tolist() == [-1, 20, -1]
