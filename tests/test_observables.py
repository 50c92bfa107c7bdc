"""--observe (issue 67): named per-snapshot quantities, built in or registered, computed on the host
from a run's snapshots (svmattn.analysis.observables); observing never changes training."""
import numpy as np
import pytest

import svmattn
from svmattn.analysis import observables
from svmattn.execution import pipeline
from svmattn.studies import local_convergence as e2

svmattn.configure()


def _data(seed=0, n=4, T=3, d=3):
  rng = np.random.default_rng(seed)
  return {"X": rng.normal(size=(n, T, d)), "Z": rng.normal(size=(n, d)), "Y": np.ones(n), "v": rng.normal(size=d),
          "selected": np.zeros(n, np.int64)}


def test_built_in_observables_on_known_matrices():
  W = np.stack([np.diag([3.0, 4.0, 0.0]), np.zeros((3, 3)), np.outer([1.0, 0, 0], [0, 2.0, 0])])   # (S=3, d, d)
  data = _data()
  got = {k: observables.REGISTRY[k](W, data) for k in observables.BUILT_IN if k != "plateau_exit_rank"}
  np.testing.assert_allclose(got["singular_values"][0], [4, 3, 0])
  np.testing.assert_allclose(got["stable_rank"][[0, 2]], [25 / 16, 1.0])
  assert np.isnan(got["stable_rank"][1]) and np.isnan(got["margin"][1])
  assert list(got["rank"]) == [2, 0, 1]
  np.testing.assert_allclose(got["norm"], [5, 0, 2])
  np.testing.assert_allclose(got["attention_entropy"][1], np.log(3))      # W = 0: uniform attention
  # margin of W / ||W||: the smallest (x_{i alpha} - x_it)^T W z_i over t != alpha_i, divided by ||W||_F
  X, Z, Wn = data["X"], data["Z"], W[0] / 5
  want = min((X[i, 0] - X[i, t]) @ Wn @ Z[i] for i in range(4) for t in (1, 2))
  np.testing.assert_allclose(got["margin"][0], want, rtol=1e-12)


def test_a_registered_observable_and_the_errors():
  observables.register("trace_test", lambda W, data: np.trace(W, axis1=-2, axis2=-1))
  try:
    W = np.stack([np.eye(3), 2 * np.eye(3)])[None]                        # (B=1, S=2, 3, 3)
    d = {k: v[None] for k, v in _data().items()}
    got = observables.compute(("trace_test", "norm"), W, d, d["selected"])
    np.testing.assert_allclose(got["trace_test"], [[3, 6]])
    with pytest.raises(observables.ObservableError, match="unknown observable"):
      observables.compute(("nope",), W, d, d["selected"])
    observables.register("scalar_test", lambda W, data: 1.0)
    with pytest.raises(observables.ObservableError, match="one value .* per snapshot"):
      observables.compute(("scalar_test",), W, d, d["selected"])
    with pytest.raises(observables.ObservableError, match="is built in"):
      observables.register("norm", lambda W, data: W)
  finally:
    observables.REGISTRY.pop("trace_test", None)
    observables.REGISTRY.pop("scalar_test", None)


def test_observing_leaves_every_other_array_bit_for_bit(tmp_path):
  base = {"runs": 3, "steps": 60, "n": 5, "T": 4, "d": 4, "out": "unused", "progress": False, "norms": ["fro"],
          "snapshot_every": 20}
  plain = pipeline.run(e2.build(e2.SETTINGS.validate(base)), str(tmp_path / "a"), workers=0,
                       show_progress=False).cells[0]
  seen = pipeline.run(e2.build(e2.SETTINGS.validate({**base, "observe": ["stable_rank", "margin"]})),
                      str(tmp_path / "b"), workers=0, show_progress=False).cells[0]
  for k, a in plain.items():
    assert np.array_equal(a, seen[k], equal_nan=a.dtype.kind == "f"), k
  assert seen["stable_rank_KQ"].shape == (3, 4) and seen["margin_W"].shape == (3, 4)
  assert e2.SETTINGS.problems({**e2.SETTINGS.values({}), "observe": ["nope"]})


def test_plateau_exits_follow_the_stated_rule():
  steps = np.arange(0, 200, 10)
  loss = np.concatenate([np.full(8, 0.7), np.linspace(0.7, 0.3, 4)[1:], np.full(6, 0.3), [0.2, 0.1, 0.05]])
  exits = observables.plateau_exits(loss, steps)
  assert list(np.flatnonzero(exits)) == [8, 17]          # after 7 flat intervals; after 5 flat ones (>= 5)
  assert not observables.plateau_exits(np.linspace(1, 0.1, 20), steps).any()    # always falling: no plateau
  W = np.stack([np.eye(3)] * 20)
  got = observables.REGISTRY["plateau_exit_rank"](W, {"loss": loss, "steps": steps})
  assert np.all(np.isnan(got[~exits])) and list(got[exits]) == [3.0, 3.0]
