r"""E9: feasibility of Att-SVM(alpha) versus d around max(T-1, n) (docs/science.md sections 3, 8).

For each shape (n, T) and each d, draws --runs data sets (the paper's unit-Gaussian generator, linear
head) and asks whether Att-SVM(alpha) is feasible (``svmattn.svm.feasibility.check``) for alpha = opt
(the tokens of largest score gamma_it = Y_i v^T x_it) and for a uniformly random alpha (drawn from the
run's initialization key). Prediction: 100% feasible for every d >= max(T-1, n), below that possibly
infeasible. Everything is host-side float64 (--precision does not apply). Writes to --out: results.npz,
summary.json, feasibility.png and runs/ (svmattn.studies.feasibility, svmattn.figures.feasibility).

    python -m experiments.feasibility --out=results/e9
    python -m experiments.feasibility --out=/tmp/e9 --runs=200 --shapes=5:5,10:5 --d_max=11
    python -m experiments.feasibility --out=results/e9 --resume      # after an interruption

Each (n, T, d) cell is part of every data set's identity: --resume skips finished cells and
batches of --batch_size (alias --batch) data sets, and several processes (--num_processes) share
every cell.
"""
from absl import flags

from svmattn.config import flags_front

flags_front.define("feasibility")
flags.DEFINE_alias("batch", "batch_size")

if __name__ == "__main__":
  flags_front.main("feasibility")
