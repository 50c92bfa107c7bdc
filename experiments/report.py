"""Re-render a reproduce run's report: ``python -m experiments.report OUT`` (= ``svmattn report OUT``).

The report lives in ``svmattn.report``."""
import sys

from svmattn.report import main

if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
