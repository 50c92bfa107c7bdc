r"""E5: multi-token selection with a ReLU head, and the general SVM equivalence (docs/science.md sections 6, 8).

Head h(r) = 1^T ReLU(V^T r), V Gaussian with ||V||_F = 1; n=3 sequences of T=4
unit tokens, unit queries, labels +-1; W trained by normalized GD (lr 0.1,
2001 steps, snapshot every 100) from the uniform initialization. For every d,
data sets are drawn in run order until --runs of them are KEPT (at most --max_draws):
  skipped    no negative label (the authors' rule: with only Y = +1 the convex
             head selects one token per sequence)
  discarded  by the Gen-SVM thresholds rule on the final softmax (some s_it in
             (1e-6, 1e-3], or no s_it <= 1e-6), or an SVM that is infeasible/failed
The kept runs are the first --runs passing runs in run order (independent of --batch_size).

For each kept run: W^fin, W^mm, W^SVMeq = W^fin + C W^mm (C fitted to the FINAL
W_GD) and W^1token = Att-SVM(argmax s) from the FINAL softmax, and
1 - corr(W(k), object) at every snapshot k against these final-step objects, as
in the authors' notebook (multi_token_converge.ipynb). The authors plot the mean
over runs; we plot the median and the quartile band, and report both.

Multi-token selection (some |O_i| > 1) happens in Y = -1 sequences (they minimize
the convex head h >= 0). A sequence is "dead" when every ReLU unit is off at its
final pooled token (h = 0 there, a minimum for Y = -1): its gradient vanishes, its
logits freeze, and the margins W^mm asks of its masked tokens stop growing, so
W^SVMeq mispredicts W_GD by a constant. The summary reports 1 - corr apart for
runs with a dead sequence, with every sequence live, and with/without multi-token
selection; scatter.png marks the dead runs.

Writes to --out: results.npz, summary.json (with "checks"), correlation.png (1 - corr vs
iteration per d), scatter.png (max masked s vs final 1 - corr), and runs/ (every analyzed
draw's per-run arrays, one file per d). The code lives in svmattn.studies.multi_token (the
study, its settings and its registry entry) and svmattn.figures.multi_token.

    python -m experiments.multi_token --out=results/e5
    python -m experiments.multi_token --out=results/e5_quick --runs=40 --ds=4,6
    python -m experiments.multi_token --out=results/e5 --resume      # after an interruption

Each d is a cell of the study pipeline (svmattn.studies.multi_token): batches of
--batch_size draws train while the previous batch's SVMs are solved, and --resume
continues an interrupted run bit for bit.
"""
from absl import flags

from svmattn.config import flags_front

flags_front.define("multi_token")
flags.DEFINE_alias("batch", "batch_size")   # the old name of --batch_size

if __name__ == "__main__":
  flags_front.main("multi_token")
