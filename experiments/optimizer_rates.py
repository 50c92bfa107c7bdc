r"""E16: stochastic and adaptive optimizers, step sizes and rates, checked first on a linear classifier
(docs/science.md section 19).

A grid over model (the linear-classifier control: binary and multiclass; attention W and (K,Q) on
E2's data sets) x mini-batch size; in every cell one stage per optimizer entry (NAME or NAME:LR).
Per run: the norm whose max-margin solution it ends nearest to, the normalized-margin gap and
1 - corr per snapshot, their log-log slopes over the end of the run, and the end of the
oscillating phase of large steps. Writes results.npz, summary.json and rates.png, nearest.png
and oscillation.png to --out (svmattn.studies.optimizer_rates, svmattn.figures.optimizer_rates).

    python -m experiments.optimizer_rates --out=results/e16
    python -m experiments.optimizer_rates --out=/tmp/e16 --models=W --minibatches=0,1,2 --optimizers=normalized_gd,normalized_gd+mom0.9
"""
from svmattn.config import flags_front

flags_front.define("optimizer_rates")

if __name__ == "__main__":
  flags_front.main("optimizer_rates")
