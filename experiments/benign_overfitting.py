r"""E17: benign overfitting of token selection under label noise (docs/science.md section 21).

Trains the prompt p of f(X) = sum_t softmax(X p)_t nu^T x_t by gradient descent on data sets with a
share of flipped labels, over a grid of signal norms and n, and scores it on clean test sequences;
writes results.npz, summary.json, vs_signal.png, attention.png and curves.png to --out
(svmattn.studies.benign_overfitting, svmattn.figures.benign_overfitting).

    python -m experiments.benign_overfitting --out=results/e17
    python -m experiments.benign_overfitting --out=results/e17_quick --d=200 --test_n=200 --signal_norms=1,3,10,30
"""
from svmattn.config import flags_front

flags_front.define("benign_overfitting")

if __name__ == "__main__":
  flags_front.main("benign_overfitting")
