r"""E4: over-parameterization: global / local / not-local convergence of GD versus d (docs/science.md section 8).

For each n in --n_values and each d from --d_min to --d_max, trains the W attention with normalized GD
(--steps steps, step --lr, uniform initialization) on --runs data sets (the paper's unit-Gaussian
generator, T tokens, linear head, cross-attention), solves the Frobenius Att-SVM at the selected tokens
and classifies each run: global, local or not-local (``metrics.convergence_type``). Prediction: the
global share grows with d, and not-local vanishes once d >= max(T-1, n). Writes to --out: runs/,
results.npz, summary.json and overparam.png (svmattn.studies.overparam, svmattn.figures.overparam).

    python -m experiments.overparam --out=results/e4
    python -m experiments.overparam --out=/tmp/e4 --runs=50 --n_values=5 --d_max=8 --steps=500
    python -m experiments.overparam --out=results/e4 --runs=10000 --batch_size=2000 --resume

Each (n, d) cell is part of every data set's identity: --resume skips finished cells and
batches, and several processes (--num_processes) share every cell.
"""
from svmattn.config import flags_front

flags_front.define("overparam")

if __name__ == "__main__":
  flags_front.main("overparam")
