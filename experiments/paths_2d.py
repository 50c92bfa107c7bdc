r"""E1: the 2-D picture of global convergence (docs/science.md section 8, the paper's Figure 1).

n=2 sequences of T=3 tokens in d=2, labels Y=+1; tokens 0.3 N(0,1) shifted by (-1,0) for sequence 1
and (+1,0) for sequence 2 (``svmattn.studies.paths_2d.two_clusters``); queries z_i and head v unit
Gaussian. Normalized GD (lr 0.1, 2000 steps) from W(0)=0, and for (K,Q) from Q(0)=0, K(0)=0.1 N(0,1)
(init scheme "zero"). Writes to --out: runs/, results.npz, summary.json and paths.png (tokens, the
normalized paths W(k) z_i / ||W(k)||_F and the SVM rays; left W, right (K,Q))
(svmattn.studies.paths_2d, svmattn.figures.paths_2d).

    python -m experiments.paths_2d --out=results/e1
    python -m experiments.paths_2d --out=/tmp/e1 --steps=500      # quick
    python -m experiments.paths_2d --out=results/e1 --resume      # after an interruption
"""
from svmattn.config import flags_front

flags_front.define("paths_2d")

if __name__ == "__main__":
  flags_front.main("paths_2d")
