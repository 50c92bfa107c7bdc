r"""E12: next-token prediction with self-attention and its graph SVM (docs/science.md section 12).

A vocabulary of K tokens with unit-norm embeddings, sequences of T distinct tokens whose last
token queries all T positions; GD on the key-query weights converges in direction to the graph
SVM built from the strongly connected components of each query token's token graph, plus a
finite part W^fin inside the components (Li, Huang, Ildiz, Rawat, Oymak, AISTATS 2024).

  --setting=global  mass-on-label readout, loss -log mass, normalized GD, lr 0.01, 4000 steps
  --setting=local   vocabulary readout softmax(E X^T s), loss (1 - p_y)^2, lr 0.1, 2000 steps;
                    compared with the graph SVM of the tokens GD selected (and of the labels)

Data: the public code's generator (K=6, d=8, n=6, T=4), or --data=FILE.npz with E (B,K,d),
tokens (B,n,T) int and labels (B,n) int (each label a token of its sequence).
Writes to --out: results.npz, summary.json, corr.png, residual.png and graph.png
(svmattn.studies.next_token, svmattn.figures.next_token).

    python -m experiments.next_token --out=results/e12
    python -m experiments.next_token --out=results/e12_local --setting=local
"""
from svmattn.config import flags_front

flags_front.define("next_token")

if __name__ == "__main__":
  flags_front.main("next_token")
