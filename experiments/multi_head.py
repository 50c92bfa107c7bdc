r"""E14: multi-head attention (docs/science.md section 13): which tokens each head selects and what it approaches.

f = sum_h v_h^T X^T softmax(X W_h z) with H heads (W_h, or K_h Q_h^T), trained by normalized GD as
a flax module (svmattn.models.flax_models.MultiHead) on E2's data sets; each data set has H fixed
unit heads v_h (or, --shared_head, its own v for all). No theorem predicts the limit: the binary
reports per head the selection, the softmax's sparsity, corr with the Att-SVM at that selection
(Frobenius for W, nuclear for (K,Q)), for the sum of the heads' matrices the SVM of the tokens the
sum selects, and whether heads select the same tokens or split them. Writes to --out:
results.npz, summary.json (the per-head and summed tables) and heads.png
(svmattn.studies.multi_head, svmattn.figures.multi_head).

    python -m experiments.multi_head --out=results/e14
    python -m experiments.multi_head --out=/tmp/e14 --heads=4 --params=W
"""
from svmattn.config import flags_front

flags_front.define("multi_head")

if __name__ == "__main__":
  flags_front.main("multi_head")
