r"""E11: joint training of head and attention (docs/science.md section 11).

The head v trains together with the attention weights (W, (K,Q), or the prompt p of prompt
attention softmax(X p)), each parameter's step normalized by its own gradient norm. Predictions
(Tarzanagh, Li, Zhang, Oymak 2023, arXiv 2306.13596): v -> v^mm, the l2 max-margin classifier
of the selected tokens, and the attention weights -> the relaxed Att-SVM, whose constraints are
>= 1 for v^mm's support vectors and >= 0 for the other sequences. Beside it: the full Att-SVM at
the selection, and the same attention trained with the head held fixed.

  --setting=e2   E2's generator and sizes (n=6, T=8, d=10), 100 data sets, W and (K,Q), 2000 steps
                 (or --data=FILE.npz of E2's format, its v the initial head)
  --setting=toy  the public code's joint setting: n=3, T=2, d=2, prompt attention, p(0) = (0,-1),
                 v(0) = (-1,0), 1000 steps; data sets "tight" and "non-tight"

Writes to --out: results.npz, summary.json, joint.png and (--setting=toy) toy.png
(svmattn.studies.joint_training, svmattn.figures.joint_training).

    python -m experiments.joint_training --out=results/e11
    python -m experiments.joint_training --out=results/e11_toy --setting=toy
"""
from svmattn.config import flags_front

flags_front.define("joint_training")

if __name__ == "__main__":
  flags_front.main("joint_training")
