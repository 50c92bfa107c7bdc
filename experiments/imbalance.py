r"""E19: class imbalance in next-token prediction (docs/science.md section 24).

    python -m experiments.imbalance --out=results/e19
"""
from svmattn.config import flags_front

flags_front.define("imbalance")

if __name__ == "__main__":
  flags_front.main("imbalance")
