r"""E7: regularization paths RP-W and RP-KQ (docs/science.md sections 4 and 8).

For every data set, on a geometric grid of radii R:
  RP-W:  W_R = argmin_{||W||_F <= R} L(W)
  RP-KQ: (K_R, Q_R) = argmin_{||K||_F^2 + ||Q||_F^2 <= 2R} L(K, Q)
(``svmattn.train.regpath``: accelerated projected gradient, warm-started along R, plus
a second start along the SVM of the optimal tokens at every R, the lower loss
kept), and their correlation with the attention SVM of the optimal tokens
alpha = opt (gamma = Y v^T x): W_R with W^mm (Frobenius), K_R Q_R^T with W^mm_*
(nuclear). Prediction: both correlations rise to 1 as R grows. Writes to --out:
runs/ (every data set's per-run arrays), results.npz (R grid, optimal tokens, SVM solutions,
W_R / K_R Q_R^T per R, loss, constraint values, KKT cosines, correlations, where the SVM start
won and by how much), summary.json and correlation.png. The code lives in
svmattn.studies.reg_path (the study, its settings and its registry entry) and
svmattn.figures.reg_path.

    python -m experiments.reg_path --out=results/e7
    python -m experiments.reg_path --out=/tmp/e7 --runs=20 --num_r=16   # quick
    python -m experiments.reg_path --out=results/e7 --resume            # after an interruption

The data sets are solved in batches of --batch_size (one vectorized path solve per batch and
parameterization; finished batches are kept on --resume, a path interrupted half-way is
solved again).
"""
from absl import flags

from svmattn.config import flags_front

flags_front.define("reg_path")
flags.DEFINE_alias("batch", "batch_size")   # the old name of --batch_size

if __name__ == "__main__":
  flags_front.main("reg_path")
