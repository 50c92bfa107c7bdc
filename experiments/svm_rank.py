r"""E3: numerical rank of the Frobenius and the nuclear Att-SVM solutions (docs/science.md section 8).

alpha = opt (the tokens of largest score gamma_it = Y_i v^T x_it, linear head). For each shape (n, T)
and each d, data sets are drawn in order (run 0, 1, 2, ...) until --runs of them have a feasible
Att-SVM(opt); a cell stops after --max_draws_factor * --runs draws and is reported as incomplete. On
the kept data sets it solves Att-SVM(opt) in the Frobenius norm (NNLS, exact) and in the nuclear norm
(--nuc_solver) and takes numerical ranks with relative tolerance --rtol. Prediction: the nuclear
solution has lower rank than the Frobenius one, whose rank is min(n, d). Everything is host-side
float64 (--precision does not apply). Writes to --out: results.npz, summary.json, rank.png and runs/
(svmattn.studies.svm_rank, svmattn.figures.svm_rank).

    python -m experiments.svm_rank --out=results/e3
    python -m experiments.svm_rank --out=/tmp/e3 --runs=10 --ds=1,2,5,10 --shapes=5:5,10:5
    python -m experiments.svm_rank --out=results/e3 --resume      # after an interruption

Each (n, T, d) cell is part of every data set's identity; the data sets are drawn and checked in
batches of --batch_size (alias --batch), and a cell stops after the first batch that completes it:
--resume skips finished batches and cells.
"""
from absl import flags

from svmattn.config import flags_front

flags_front.define("svm_rank")
flags.DEFINE_alias("batch", "batch_size")

if __name__ == "__main__":
  flags_front.main("svm_rank")
