"""svmattn: experiments on the implicit bias of attention (arXiv 2308.16898).

Importing the package turns on JAX float64 (``jax_enable_x64``); every function
keeps the dtype of its inputs, so float32 runs pass float32 arrays.

Layout (device side first, host side last; they meet at NumPy arrays):
  data      data sets: the paper's generator, .npz load/save and validation
  heads     prediction heads h(r) and token scores
  losses    logistic / exponential / correlation losses
  model     W and (K,Q) parameterizations, attention, the loss of one data set
  optim     normalized GD and optimizers by name (optax)
  train     the training loop: lax.scan over steps, vmap over data sets
  svm       Att-SVM solvers (host: NumPy, SciPy NNLS, cvxpy)
  metrics   correlations, optimal/selected tokens, convergence types, ranks
  results   atomic writing of results files
  progress  progress bars and log lines
"""
import jax

jax.config.update("jax_enable_x64", True)

__version__ = "0.1.0"
