"""An experiment's binary: its fields as absl flags, over the same settings as its config.

    # experiments/local_convergence.py
    from svmattn.config import flags_front
    flags_front.define("local_convergence")
    if __name__ == "__main__":
      flags_front.main("local_convergence")

Every field becomes the flag of its name with its default and help; its check and the rules run
when the flags are parsed, so a bad value ends the binary with absl's one line
("FATAL Flags parsing error: flag --lr=nan: must be a finite number > 0") before anything starts.
"""
from __future__ import annotations

import sys

from absl import app
from absl import flags

import svmattn
from svmattn import registry
from svmattn.config import fields as F
from svmattn.execution import run_experiment

FLAGS = flags.FLAGS


def _define_field(f: F.Field) -> None:
  kw = dict(name=f.name, default=f.default, help=f.help)
  if f.kind == "int":
    flags.DEFINE_integer(**kw)
  elif f.kind == "float":
    flags.DEFINE_float(**kw)
  elif f.kind == "bool":
    flags.DEFINE_bool(**kw)
  elif f.kind == "enum":
    flags.DEFINE_enum(enum_values=[str(c) for c in f.choices], **kw)
  elif f.kind == "list":
    flags.DEFINE_list(**{**kw, "default": None if f.default is None else [str(v) for v in f.default]})
  else:
    flags.DEFINE_string(**kw)

  def ok(value, f=f):
    problem = f.problem(value)
    if problem:
      raise flags.ValidationError(problem)
    return True
  flags.register_validator(f.name, ok)


def _define_rule(rule: F.Rule, settings: F.Settings) -> None:
  def ok(values, rule=rule):
    coerced = {n: settings.field(n).coerce(v) for n, v in values.items()}
    problem = rule.check(coerced)
    if problem:
      raise flags.ValidationError(problem)
    return True
  flags.register_multi_flags_validator(list(rule.names), ok)


def define(name: str) -> registry.Experiment:
  """Define the flags of experiment ``name`` (once per process); returns the experiment."""
  experiment = registry.get(name)
  settings = experiment.settings
  for f in settings.fields:
    if f.name not in FLAGS:
      _define_field(f)
    # key flags of the program being run, so that --help lists them (absl lists the main module's
    # key flags; they are defined here, not in the front end that absl takes for the main module)
    FLAGS.register_key_flag_for_module(sys.argv[0], FLAGS[f.name])
  for rule in settings.rules:
    _define_rule(rule, settings)
  if "out" in settings.names:
    flags.mark_flag_as_required("out")
  app.call_after_init(run_experiment.install_stop_handlers)
  return experiment


def values(experiment: registry.Experiment) -> dict:
  """The parsed flags as the experiment's validated settings."""
  return experiment.settings.validate({n: FLAGS[n].value for n in experiment.settings.names})


def quick_flags(experiment: registry.Experiment) -> list[str]:
  """The experiment's small settings (its registry entry's ``quick``, what ``reproduce --quick`` runs)
  as flags: ``svmattn E4 --quick --out=DIR`` runs E4 at that size in seconds to a minute or two."""
  out = []
  for name, value in experiment.quick.items():
    if isinstance(value, (list, tuple)):
      value = ",".join(str(v) for v in value)
    out.append(f"--{name}={value}")
  return out


def expand_quick(experiment: registry.Experiment, argv: list[str]) -> list[str]:
  """``argv`` with ``--quick`` replaced by ``quick_flags`` placed before the other flags, so that a
  flag given on the command line still wins (absl keeps the last value of a flag)."""
  if "--quick" not in argv[1:]:
    return list(argv)
  rest = [a for a in argv[1:] if a != "--quick"]
  return [argv[0], *quick_flags(experiment), *rest]


def main(name: str) -> None:
  """Parse the flags of experiment ``name`` (defined by ``define``) and run it; ``--quick`` stands
  for the experiment's small settings (``quick_flags``)."""
  svmattn.configure()
  experiment = registry.get(name)
  sys.argv = expand_quick(experiment, sys.argv)

  def run(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments {argv[1:]}: settings are --name=value flags")
    try:
      got = values(experiment)
    except F.ConfigError as e:
      run_experiment.fail(str(e))
    run_experiment.run(experiment, got)

  app.run(run)

