"""E2 on an lr x d grid, 50 data sets per cell: svmattn run --config=experiments/configs/e2_lr_d_grid.py --out=DIR"""
from svmattn.config import defaults


def get_config():
  config = defaults("E2")
  config.runs = 50
  config.sweep = {"lr": [0.01, 0.1, 1.0], "d": [4, 8, 16]}
  return config
