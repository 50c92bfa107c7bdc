"""What the names of per-run arrays say about their shape (shared by ``results`` and the metric logs)."""
from __future__ import annotations

import re

# A cell's own snapshot steps (runs, S), every row the same: for studies whose cells record their
# snapshots at different steps (E16: the linear control's and attention's cells).
CELL_STEPS = "snapshot_steps"

# The stage-free names of per-run arrays that are per sequence / per token, never per snapshot,
# even when their length happens to equal the number of snapshots.
PER_ITEM = re.compile(r"(^|_)(selected|optimal|optimal_tokens|labels|image|alpha|match|dead|support|Y|v|V|E|"
                      r"tokens|singular_values|token_scores|attention|v_final|v_mm)(_|$)")
