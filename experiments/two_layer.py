r"""E15: two-layer attention (docs/science.md section 13): per layer, the tokens selected and the SVM approached.

Layer 1 is self-attention over the tokens with a residual, x1_k = x_k + sum_t softmax_t(x_t^T W1 x_k) x_t; layer 2 is
cross-attention of the query over layer 1's outputs, f = v^T X1^T softmax(X1 W2 z)
(svmattn.models.flax_models.TwoLayer, trained as a flax module by normalized GD on E2's data
sets). No theorem predicts the limit: per layer the binary reports the selection, the sparsity,
and corr with the Att-SVM at that selection (layer 1: the sequence-to-sequence SVM of self-
attention; layer 2: the single-query SVM on layer 1's final outputs). Writes to --out:
results.npz, summary.json (the per-layer tables) and layers.png (svmattn.studies.two_layer,
svmattn.figures.two_layer).

    python -m experiments.two_layer --out=results/e15
"""
from svmattn.config import flags_front

flags_front.define("two_layer")

if __name__ == "__main__":
  flags_front.main("two_layer")
