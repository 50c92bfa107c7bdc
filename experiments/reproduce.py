"""Reproduce every experiment and write the report: ``python -m experiments.reproduce --out=results
[--quick] [--only=E2,E5]`` (= ``svmattn reproduce``; the binary is ``svmattn.report.reproduce``)."""
from svmattn.report import reproduce

if __name__ == "__main__":
  reproduce.run()
