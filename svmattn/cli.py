"""The ``svmattn`` command: one subcommand per experiment binary.

    svmattn reproduce --out=results            # = python -m experiments.reproduce --out=results
    svmattn local_convergence --out=DIR        # any binary of experiments/ by its module name
    svmattn list                               # the subcommands
    python -m svmattn ...                      # the same without the installed script

An installed svmattn (``pip install .``) carries the binaries as ``svmattn.experiments``; in a
clone of the repository they are the top-level ``experiments`` package (``python -m
experiments.NAME`` keeps working there).
"""
from __future__ import annotations

import importlib.util
import os
import pkgutil
import runpy
import sys

ALIASES = {"E1": "paths_2d", "E2": "local_convergence", "E3": "svm_rank", "E4": "overparam", "E5": "multi_token",
           "E6": "lambda_head", "E7": "reg_path", "E8": "seq_causal", "E9": "feasibility",
           "E10": "optimizer_geometry", "E11": "joint_training", "E12": "next_token", "E13": "real_data",
           "E14": "multi_head", "E15": "two_layer"}
NOT_COMMANDS = {"common", "cli", "__init__", "__main__"}


def package() -> str:
  """The package holding the binaries: svmattn.experiments when installed, else experiments."""
  for name in ("svmattn.experiments", "experiments"):
    try:
      if importlib.util.find_spec(name) is not None:
        return name
    except ModuleNotFoundError:
      continue
  sys.exit("error: svmattn's experiment binaries are not installed (pip install . from a clone of the repository)")


def commands(pkg: str) -> list[str]:
  spec = importlib.util.find_spec(pkg)
  paths = list(spec.submodule_search_locations or [])
  return sorted(m.name for m in pkgutil.iter_modules(paths) if m.name not in NOT_COMMANDS)


def usage(pkg: str) -> str:
  names = commands(pkg)
  ids = {v: k for k, v in ALIASES.items()}
  lines = ["usage: svmattn COMMAND [--flag=value ...]   (svmattn COMMAND --help: its flags)", "", "commands:"]
  lines += [f"  {n:<20} {ids.get(n, '')}" for n in names]
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
  argv = list(sys.argv if argv is None else argv)
  pkg = package()
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help", "list"):
    print(usage(pkg))
    return
  if argv[1] == "run":
    from svmattn.config import config_file
    config_file.main(argv[2:])
    return
  name = ALIASES.get(argv[1], argv[1]).replace("-", "_")
  if name not in commands(pkg):
    sys.exit(f"error: unknown command {argv[1]!r}\n\n{usage(pkg)}")
  sys.argv = [f"svmattn {name}"] + argv[2:]
  os.environ.setdefault("SVMATTN_COMMAND", "1")
  runpy.run_module(f"{pkg}.{name}", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
  main()
