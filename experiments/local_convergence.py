r"""E2: local convergence of normalized GD to the attention SVM (docs/science.md section 8).

Trains W and (K,Q) attention on every data set with normalized GD, solves the Frobenius and the
nuclear Att-SVM for the tokens each run selected, and writes to --out: results.npz, summary.json,
softmax.png and correlation.png (svmattn.studies.local_convergence, svmattn.figures.local_convergence).

    python -m experiments.local_convergence --out=results/e2
    python -m experiments.local_convergence --out=results/e2_mine --data=my_data.npz
    python -m experiments.local_convergence --out=results/e2 --resume      # after an interruption
"""
from svmattn.config import flags_front

flags_front.define("local_convergence")

if __name__ == "__main__":
  flags_front.main("local_convergence")
