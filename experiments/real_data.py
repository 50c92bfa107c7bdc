r"""E13: real data, offline (docs/science.md section 14): images as patch-token sequences.

Does attention trained on real images head for an attention SVM, and where does the Gen-SVM
(a finite part plus a max-margin direction) take over? Data sets are random subsets of n images
of a class pair (many per n); n runs from a few sequences to hundreds, across the point where
Att-SVM(alpha) has more constraints, n(T-1), than unknowns, d^2.

Data (no network): scikit-learn's bundled digits (1797 images 8x8, the default) or Fashion-MNIST
from Debian's dataset-fashion-mnist package (`apt-get install dataset-fashion-mnist`, see BUILD.md).

Writes to --out: results.npz (per n, suffix _n<n>), summary.json, vs_n.png (feasibility,
correlations, sparsity, accuracies against n) and attention.png (the attention of trained models
over their images); with --export=PREFIX also PREFIX_n<n>.npz, the data sets of each n in the --data
format of the other binaries (svmattn.studies.real_data: settings, study, report, export;
svmattn.figures.real_data: the figures).

    python -m experiments.real_data --out=results/e13
    python -m experiments.real_data --out=results/e13_38 --classes=3,8
    python -m experiments.real_data --out=results/e13_fashion --dataset=fashion_mnist --classes=0,6 --patch=7
"""
from svmattn.config import flags_front

flags_front.define("real_data")

if __name__ == "__main__":
  flags_front.main("real_data")
