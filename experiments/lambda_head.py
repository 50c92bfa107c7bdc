r"""E6: the lambda head selects more tokens as lambda grows (docs/science.md sections 6, 8).

Head h(r) = v^T r - lambda ||r||^2 (v unit Gaussian); the tokens of each sequence
are orthonormal (X_i X_i^T = I, T <= d), queries unit Gaussian, labels Y = +1.
W is trained by normalized GD (lr 0.1, 2001 steps) on the same --runs data sets
for every lambda of --lams. With orthonormal tokens h(X_i^T s) = a_i^T s - lambda ||s||^2
(a_i = X_i v), so the attention that maximizes h over the simplex is
s*_i = Proj_simplex(a_i / (2 lambda)) (argmax_t a_it at lambda = 0): its support is
the predicted selected set, of size 1 at lambda = 0 and growing with lambda.

For each lambda and run: the selected sets O_i = {t: s_it >= tau_H} of the final
softmax, the outcome of the Gen-SVM thresholds rule, and for the evaluated runs
W^SVMeq, W^mm, W^1token with 1 - corr(W_GD, .) (final W) and the distance of the
final softmax to s* on the selected entries.

Evaluated runs. At lambda > 0 the selected tokens of a sequence settle at a finite
optimum; normalized GD (a fixed step 0.1) keeps zig-zagging around it, so only a
small share of each step drives the masked tokens, whose probabilities then decay
like 1/t instead of exponentially (at 2001 steps typically 1e-6 to 1e-3; 10x more
steps, 10x smaller). The paper's rule would discard almost every run as
"intermediate". By default (--keep_intermediate) those runs are evaluated with
O_i = {s_it >= tau_H}, and the rule's counts are reported beside them;
--nokeep_intermediate applies the rule. Runs with nothing masked ("finite": W has
a finite limit, typically every token selected at large lambda) are never evaluated.

Writes to --out: results.npz, summary.json (with "checks"), tokens.png (|O_i|
vs lambda, measured and predicted), correlation.png (final 1 - corr vs lambda),
and runs/ (every run's per-run arrays, one file per lambda). The code lives in
svmattn.studies.lambda_head (the study, its settings and its registry entry) and
svmattn.figures.lambda_head.

    python -m experiments.lambda_head --out=results/e6
    python -m experiments.lambda_head --out=results/e6_quick --runs=16 --lams=0,0.2,0.5,1
    python -m experiments.lambda_head --out=results/e6 --resume      # after an interruption

Each lambda is a cell of the study pipeline (svmattn.studies.lambda_head): batches of
--batch_size data sets train while the previous batch's SVMs are solved, --resume
continues an interrupted run bit for bit, and several processes (--num_processes)
share every lambda's data sets.
"""
from svmattn.config import flags_front

flags_front.define("lambda_head")

if __name__ == "__main__":
  flags_front.main("lambda_head")
