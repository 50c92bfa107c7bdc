"""E18 (svmattn.studies.rank_dynamics): the grid of init scales x optimizers, the rank measures, and
that a cell at init scale 1 trains as E2 does (docs/science.md section 23)."""
import numpy as np

import svmattn
from svmattn.execution import pipeline
from svmattn.studies import local_convergence as e2
from svmattn.studies import rank_dynamics as e18

svmattn.configure()


def test_the_grid_and_its_rank_measures(tmp_path):
  fl = e18.SETTINGS.validate({"runs": 2, "steps": 300, "snapshot_every": 10, "init_scales": [1e-3, 1.0],
                              "optimizers": ["gd:0.5"], "out": "unused", "progress": False})
  cells = pipeline.run(e18.build(fl), str(tmp_path / "e18"), workers=0, show_progress=False).cells
  assert len(cells) == 2
  for a in cells:
    assert a["stable_rank_KQ"].shape == (2, 31) and a["visible_rank_KQ"].shape == (2, 31)
    np.testing.assert_array_equal(a["rank_increments_KQ"], np.sum(np.diff(a["visible_rank_KQ"], axis=1) > 0, axis=1))
    assert np.all(a["stable_rank_KQ"][np.isfinite(a["stable_rank_KQ"])] >= 1 - 1e-12)
  # init scale 1 with plain GD at 0.5 is E2's (K,Q) run with those settings, bit for bit
  same = e2.SETTINGS.validate({"runs": 2, "steps": 300, "snapshot_every": 10, "params": ["KQ"], "norms": ["nuc"],
                               "optimizer": "gd", "lr": 0.5, "chunk_steps": 1000, "out": "unused", "progress": False})
  ref = pipeline.run(e2.build(same), str(tmp_path / "e2"), workers=0, show_progress=False).cells[0]
  for k in ("W_final_KQ", "loss_KQ", "corr_KQ_nuc"):
    assert np.array_equal(cells[1][k], ref[k]), k
  arrays, summary = e18.reduce(fl, cells)
  assert [r["init_scale"] for r in summary["cells"]] == [1e-3, 1.0] and summary["checks"] == []
  assert "stable_rank_KQ_s0.001_gd_lr0.5" in arrays
