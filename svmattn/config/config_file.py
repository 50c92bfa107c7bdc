"""``svmattn run``: run any experiment, or a sweep of it, from a config file (ml_collections, configs as code).

    svmattn run --config=grid.py [--config.FIELD=VALUE ...] [--config.sweep.FIELD=V1,V2,...] --out=DIR [--resume] [--overwrite]

The file's ``get_config()`` returns an ml_collections ConfigDict naming the experiment
(``config.experiment = "local_convergence"`` or ``"E2"``) and any of its fields (the names of the
experiment's flags); ``svmattn.config.defaults("E2")`` gives one holding every default:

    from svmattn.config import defaults

    def get_config():
      config = defaults("E2")
      config.runs = 50
      config.sweep = {"lr": [0.01, 0.1, 1.0], "d": [4, 8, 16]}
      return config

``config.sweep`` maps fields to lists of values; every combination is a cell of one study
(``study.sweep``). Fields the file leaves out keep the experiment's defaults. Every value is
checked by the experiment's own fields (``config.fields``), inside a sweep as outside it, before
anything runs; a grid of more than ``MAX_CELLS`` combinations is refused before that.

On the command line a value is parsed by its field's type. A list field takes its items separated
by commas (``--config.params=W,KQ``, brackets optional); in a sweep of a list field the values are
separated by semicolons (``--config.sweep.lams='0,15;1,5'`` sweeps [0, 15] and [1, 5]).
"""
from __future__ import annotations

import os
import runpy
import sys

import svmattn
from svmattn import registry
from svmattn import results
from svmattn.config import fields as F
from svmattn.execution import run_experiment
from svmattn.execution import sweep as sweep_lib

USAGE = ("usage: svmattn run --config=FILE.py [--config.FIELD=VALUE ...] [--config.sweep.FIELD=V1,V2,...] "
         "--out=DIR [--resume] [--overwrite]\n  (a list field: --config.FIELD=A,B; a sweep of it: --config.sweep.FIELD='A,B;C,D')")
MAX_CELLS = 10_000        # the most combinations a sweep may have (checked before any is validated)


def fail(message: str):
  sys.exit(f"error: {message}")


def _split_argv(argv: list[str]):
  """(config file, [--config.sweep.* args], the other args) of the command line."""
  path, sweeps, rest = None, [], []
  it = iter(argv)
  for arg in it:
    if arg == "--config":
      path = next(it, None)
    elif arg.startswith("--config="):
      path = arg.split("=", 1)[1]
    elif arg.startswith("--config.sweep."):
      sweeps.append(arg[len("--config.sweep."):])
    else:
      rest.append(arg)
  return path, sweeps, rest


def load(path: str):
  """The ConfigDict of a config file's get_config(); a bad file is one error line."""
  if not path:
    fail(f"--config=FILE.py is required\n{USAGE}")
  if not os.path.isfile(path):
    fail(f"--config={path}: no such file")
  try:
    namespace = runpy.run_path(path)
  except SystemExit as e:      # the file itself ends the process: say so in one line
    fail(f"--config={path}: the file called sys.exit({e.code!r}) while it was read")
  except BaseException as e:   # a user's file: report what is wrong with it in one line
    where = ""
    tb = e.__traceback__
    while tb is not None:
      if os.path.abspath(tb.tb_frame.f_code.co_filename) == os.path.abspath(path):
        where = f" (line {tb.tb_lineno})"
      tb = tb.tb_next
    if isinstance(e, SyntaxError):
      where = f" (line {e.lineno})"
    fail(f"--config={path}: {type(e).__name__}: {e}{where}")
  get_config = namespace.get("get_config")
  if not callable(get_config):
    fail(f"--config={path}: the file defines no get_config() returning the config")
  try:
    config = get_config()
  except SystemExit as e:
    fail(f"--config={path}: get_config() called sys.exit({e.code!r})")
  except (Exception, KeyboardInterrupt) as e:
    fail(f"--config={path}: get_config() raised {type(e).__name__}: {e}")
  if not hasattr(config, "get") or not config.get("experiment"):
    fail(f"--config={path}: the config must name its experiment (config.experiment = \"E2\" or "
         "\"local_convergence\")")
  return config


def full_config(config):
  """(experiment, a ConfigDict of every field: the experiment's defaults, then the file's values)."""
  try:
    experiment = registry.get(config["experiment"])
  except registry.UnknownExperiment as e:
    fail(f"config.experiment: {e}")
  given = {k: v for k, v in config.items() if k not in ("experiment", "sweep")}
  unknown = sorted(set(given) - set(experiment.settings.names))
  if unknown:
    fail(f"config.{unknown[0]}: no such setting of {experiment.id} {experiment.name}"
         + F._suggest(unknown[0], experiment.settings.names))
  full = experiment.config()
  for k, v in given.items():
    field = experiment.settings.field(k)
    v = list(v) if field.kind == "list" and isinstance(v, list) else v
    try:
      full[k] = field.coerce(v) if v is not None else None
    except (TypeError, ValueError) as e:
      fail(f"config.{k}={v}: {field.problem(v) or e}")
  sweep = config.get("sweep") or {}
  if not hasattr(sweep, "items") or isinstance(sweep, str):
    fail(f"config.sweep must map settings to lists of values (e.g. {{\"lr\": [0.01, 0.1]}}), "
         f"got {type(sweep).__name__} {sweep!r}")
  full.sweep = {k: list(v) if isinstance(v, (list, tuple)) else [v] for k, v in dict(sweep.items()).items()}
  return experiment, full


def _parse_scalar(kind, text: str):
  text = text.strip()
  if kind in ("int", int):
    return int(text)
  if kind in ("float", float):
    return float(text)
  if kind in ("bool", bool):
    if text.lower() in ("true", "1", "yes"):
      return True
    if text.lower() in ("false", "0", "no"):
      return False
    raise ValueError(f"{text!r} is not true or false")
  return text


def _parse_value(field: F.Field, text: str):
  """One value of ``field`` from the command line (a list field: items separated by commas)."""
  if field.kind != "list":
    return _parse_scalar(field.kind, text)
  inner = text.strip()
  if inner[:1] in "[(" and inner[-1:] in "])":
    inner = inner[1:-1]
  return tuple(_parse_scalar(field.item, t) for t in inner.split(",") if t.strip())


def _values_text(field: F.Field, text: str) -> list[str]:
  """The texts of a command-line sweep's values: comma-separated, semicolons for a list field."""
  return [t for t in text.split(";" if field.kind == "list" else ",") if t.strip()]


def list_overrides(experiment, args: list[str]) -> list[str]:
  """``args`` with each --config.LISTFIELD=A,B as the tuple literal ml_collections parses."""
  out = []
  for arg in args:
    name, eq, text = arg[len("--config."):].partition("=") if arg.startswith("--config.") else ("", "", "")
    if eq and name in experiment.settings.names and experiment.settings.field(name).kind == "list":
      try:
        arg = f"--config.{name}={_parse_value(experiment.settings.field(name), text)!r}"
      except ValueError as e:
        fail(f"--config.{name}={text}: {e}")
    out.append(arg)
  return out


def _same_type(field: F.Field, value) -> str | None:
  """Where a sweep's value is not of its field's type (the ConfigDict refuses it outside a sweep)."""
  if field.kind == "int" and isinstance(value, float):
    return "must be an integer"
  return None


def sweep_of(experiment, sweep: dict, args: list[str]) -> dict:
  """{field: [values]} of config.sweep and the --config.sweep.FIELD=V1,V2 arguments (these win), checked."""
  sweep = dict(sweep)
  for arg in args:
    name, _, text = arg.partition("=")
    if name not in experiment.settings.names:
      fail(f"--config.sweep.{name}: no such setting of {experiment.id} {experiment.name}"
           + F._suggest(name, experiment.settings.names))
    field = experiment.settings.field(name)
    try:
      sweep[name] = [_parse_value(field, t) for t in _values_text(field, text)]
    except ValueError as e:
      fail(f"--config.sweep.{name}={text}: {e}")
  cells = 1
  for name, values in sweep.items():
    cells *= max(1, len(values)) if isinstance(values, (list, tuple)) else 1
  if cells > MAX_CELLS:
    fail(f"config.sweep: {' x '.join(str(len(v)) for v in sweep.values())} = {cells} combinations, "
         f"more than the {MAX_CELLS} a sweep may have; sweep fewer values or split it into several runs")
  for name, values in sweep.items():
    if name not in experiment.settings.names:
      fail(f"config.sweep.{name}: no such setting of {experiment.id} {experiment.name}"
           + F._suggest(name, experiment.settings.names))
    field = experiment.settings.field(name)
    if not field.sweepable:
      fail(f"config.sweep.{name}: {name} does not change the results (or names the run); it cannot be swept")
    if not isinstance(values, (list, tuple)) or not values:
      fail(f"config.sweep.{name}: needs a list of at least one value")
    for v in values:
      problem = _same_type(field, v) or field.problem(v)
      if problem:
        fail(f"config.sweep.{name}={F._show(v)}: {problem}")
    values = [field.coerce(v) for v in values]
    for i, v in enumerate(values):
      if v in values[:i]:
        fail(f"config.sweep.{name}: repeats the value {F._show(v)}; list each value once")
    sweep[name] = values
  return sweep


def main(argv: list[str]) -> None:
  """``svmattn run`` with ``argv`` (the arguments after "run")."""
  svmattn.configure()
  from absl import app
  from absl import flags
  from ml_collections import config_flags

  path, sweep_args, rest = _split_argv(list(argv))
  if any(a in ("-h", "--help", "--helpfull") for a in rest) and not path:
    print(USAGE)
    return
  experiment, full = full_config(load(path))
  # --config.a.b=... names must exist (ml_collections ends with a traceback otherwise)
  for arg in rest:
    if arg.startswith("--config."):
      name = arg[len("--config."):].split("=", 1)[0]
      if name not in experiment.settings.names:
        fail(f"--config.{name}: no such setting of {experiment.id} {experiment.name}"
             + F._suggest(name, experiment.settings.names))
  sweep = dict(full.sweep)
  del full["sweep"]
  sys.argv = ["svmattn run", *list_overrides(experiment, rest)]      # (config_flags reads its overrides from sys.argv)
  handle = config_flags.DEFINE_config_dict("config", full, "The experiment's settings (from --config=FILE.py).")
  flags.DEFINE_string("out", None, "Results directory (also config.out).")
  flags.DEFINE_bool("resume", None, "Continue the unfinished run in --out (also config.resume).")
  flags.DEFINE_bool("overwrite", None, "Replace the finished run in --out once this one is complete "
                    "(also config.overwrite).")
  app.call_after_init(run_experiment.install_stop_handlers)

  def run(rest_argv):
    if len(rest_argv) > 1:
      raise app.UsageError(f"unexpected arguments {rest_argv[1:]}\n{USAGE}")
    config = handle.value
    values = dict(config.items())
    if flags.FLAGS.out is not None:
      values["out"] = flags.FLAGS.out
    if flags.FLAGS.resume is not None and "resume" in values:
      values["resume"] = flags.FLAGS.resume
    if flags.FLAGS.overwrite is not None and "overwrite" in values:
      values["overwrite"] = flags.FLAGS.overwrite
    if not values.get("out"):
      fail(f"--out=DIR (or config.out) is required\n{USAGE}")
    try:
      checked = experiment.settings.validate(values)
      swept = sweep_of(experiment, sweep, sweep_args)
      for combination in _combinations(swept):
        experiment.settings.validate({**checked, **combination})
    except F.ConfigError as e:
      fail(str(e))
    run_experiment.run(experiment, checked, swept or None, sweep_figure=sweep_figure)

  app.run(run, argv=sys.argv)


def sweep_figure(dest: str) -> str | None:
  """DEST/sweep.png, a sweep's default figure (``results.plot``: its main per-run metric against the
  first swept setting, one line per other combination, the parameterizations as panels); None where
  the sweep has nothing to plot (no numeric per-run metric, no per-run record kept)."""
  try:
    return results.plot(dest, path=os.path.join(dest, "sweep.png"), allow_unfinished=True)[0]
  except results.ResultsError:
    return None


def _combinations(sweep: dict):
  return sweep_lib.grid(sweep) if sweep else []
