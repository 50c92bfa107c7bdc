"""E16 over a grid of step sizes, 20 data sets per cell: svmattn run --config=experiments/configs/e16_step_sizes.py --out=DIR

Normalized GD, its heavy-ball momentum and sign GD on the linear control and on attention W, at full
batch and at 2 sequences (points) per step, for lr 0.03, 0.1 and 0.3: does the step size move the
rates, or the batch size at which the full-batch bias is lost?
"""
from svmattn.config import defaults


def get_config():
  config = defaults("E16")
  config.models = ["linear", "W"]
  config.minibatches = [0, 2]
  config.optimizers = ["normalized_gd", "normalized_gd+mom0.9", "sign_gd"]
  config.sweep = {"lr": [0.03, 0.1, 0.3]}
  return config
