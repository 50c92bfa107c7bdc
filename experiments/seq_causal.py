r"""E8: sequence-to-sequence and causal attention, GD versus their SVMs (docs/science.md sections 7-8).

Every position k of sequence i is a query z_ik = x_ik with its own label Y_ik.
For each mode (seq2seq: all tokens visible; causal: position k sees t <= k) the
binary trains W with normalized GD on every data set, reads off the tokens GD
selected, alpha_hat_ik = argmax_t s_ikt, solves the matching SVM

    min ||W||_F  s.t.  (x_{i,alpha_hat_ik} - x_it)^T W x_ik >= 1   (all t != alpha_hat_ik; causal: t <= k)

and reports corr(W_GD, W^mm) per iteration and at the end, SVM feasibility,
and how often GD selected the globally optimal tokens opt_ik = argmax_t Y_ik v^T x_it
(causal: over t <= k; causal position 0 sees one token and is left out).
With --params=W,KQ the (K,Q) runs are compared with the nuclear-norm SVM.

Default sizes n=4, T=5, d=20 = n T: the n T queries are then linearly
independent, so the SVM is feasible for every selection (seq2seq and causal).

Writes to --out:
  runs/           every data set's per-run arrays (one file for the study's one cell)
  results.npz     per mode m and parameterization p: W_final_{m}_{p}, selected_{m}_{p} (B,n,T),
                  svm_{m}_{p} (B,d,d) and _status, corr_{m}_{p} (B,S), max_prob_{m}_{p}, loss_{m}_{p},
                  optimal_{m} (B,n,T), global_{m}_{p} (B,) ; steps, runs, token_scores (B,n,T,T)
  summary.json    flags, final correlations, feasibility, global selections, types, checks, timings
  correlation.png corr(W_GD, W^mm_alpha_hat) vs iteration, mean +- std per mode
  softmax.png     mean over queries of max_t s_ikt vs iteration (causal position 0, always 1, included)
The code lives in svmattn.studies.seq_causal (the study, its settings and its registry entry)
and svmattn.figures.seq_causal.

    python -m experiments.seq_causal --out=results/e8
    python -m experiments.seq_causal --out=results/e8_quick --runs=20
    python -m experiments.seq_causal --out=results/e8 --resume      # after an interruption

Each mode and parameterization trains as one stage of every batch of --batch_size data sets;
--resume keeps finished batches and stages and continues the others from their checkpoints.
"""
from svmattn.config import flags_front

flags_front.define("seq_causal")

if __name__ == "__main__":
  flags_front.main("seq_causal")
