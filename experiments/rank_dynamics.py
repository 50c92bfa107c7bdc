r"""E18: rank dynamics of (K,Q) attention from a small initialization (docs/science.md section 23).

    python -m experiments.rank_dynamics --out=results/e18
"""
from svmattn.config import flags_front

flags_front.define("rank_dynamics")

if __name__ == "__main__":
  flags_front.main("rank_dynamics")
