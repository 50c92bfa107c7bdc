"""absl flag checks of the tools, from ``svmattn.config.allowed``: every value is checked when the
flags are parsed, before any work starts; a bad one ends the tool with absl's one line
("FATAL Flags parsing error: flag --NAME=VALUE: what is allowed"), exit status 1, nothing written."""
from __future__ import annotations

import math
import sys

from absl import flags
import numpy as np

from svmattn.config import allowed
from svmattn.config import common

FLAGS = flags.FLAGS


def check(name: str, problem) -> None:
  """--NAME must pass ``problem(value) -> None or "must be ..."`` (an ``allowed`` check)."""
  def ok(value):
    why = problem(value)
    if why:
      raise flags.ValidationError(why)
    return True
  flags.register_validator(name, ok)


def at_least(name: str, minimum, what: str = "") -> None:
  """--NAME must be a finite number >= ``minimum``; None passes (an unset optional flag)."""
  flags.register_validator(name, lambda v: v is None or (math.isfinite(v) and v >= minimum),
                           message=f"must be {what or f'>= {minimum}'}")


def positive_float(name: str) -> None:
  check(name, lambda v: None if v is None else allowed.positive(v))


def distinct_lists(*names: str) -> None:
  """The list flags ``names`` must not repeat an entry (it would compute the same thing twice)."""
  for name in names:
    def ok(values):
      repeated = sorted({v for v in values or () if list(values).count(v) > 1})
      if repeated:
        raise flags.ValidationError(f"repeats {', '.join(repeated)}: list each value once")
      return True
    flags.register_validator(name, ok)


def figure_format_flag() -> None:
  """--figure_format: every figure in each listed format (applied when the flags are parsed)."""
  flags.DEFINE_list("figure_format", ["png"], "Figure file formats, comma-separated: png, pdf, svg.")

  def ok(values):
    why = allowed.figure_formats(values)
    if why:
      raise flags.ValidationError(why)
    from svmattn.io import plots
    plots.set_formats(values)
    return True
  flags.register_validator("figure_format", ok)


def define_data_flags(runs: int = 100) -> None:
  """--runs --seed --out --data --progress --compilation_cache(_dir) --figure_format, checked as an
  experiment's (``svmattn.config.common``)."""
  flags.DEFINE_integer("runs", runs, "Number of random data sets (ignored with --data).", lower_bound=1)
  flags.DEFINE_integer("seed", 0, "Seed; data set r is drawn from fold_in(PRNGKey(seed), r).")
  check("seed", allowed.seed)
  flags.DEFINE_string("out", None, "Results directory (created; files in it are replaced atomically).")
  flags.mark_flag_as_required("out")
  check("out", allowed.out_dir)
  flags.DEFINE_string("data", None, "Run on the data sets of this .npz (X (B,n,T,d), Y (B,n), Z (B,n,d), "
                      "v (B,d)) instead of generated ones.")
  check("data", allowed.existing_file)
  flags.DEFINE_bool("progress", True, "Show progress bars / log lines on stderr.")
  flags.DEFINE_bool("compilation_cache", True, "Keep compiled XLA programs on disk so that repeated runs "
                    "skip compilation (see --compilation_cache_dir).")
  flags.DEFINE_string("compilation_cache_dir", common.DEFAULT_CACHE_DIR,
                      "Directory of the persistent compilation cache.")
  figure_format_flag()

  def cache(values):
    from svmattn.execution import run_experiment
    run_experiment.quiet_logs()
    if values["compilation_cache"]:
      run_experiment.enable_compilation_cache(values["compilation_cache_dir"])
    return True
  flags.register_multi_flags_validator(["compilation_cache", "compilation_cache_dir"], cache)


_ABSL = frozenset(FLAGS)      # absl's own flags, left out of summaries


def flag_values() -> dict:
  """The values of the tool's own flags (for summary.json)."""
  return {name: FLAGS[name].value for name in FLAGS
          if name not in _ABSL and not FLAGS.find_module_defining_flag(name, "").startswith("absl")
          and type(FLAGS[name]).__name__ != "_FlagAlias"}


def load_or_generate(spec, dtype=np.float64):
  """(data, runs): the --data file's data sets (a vector head v) or ``FLAGS.runs`` generated ones,
  drawn in float64 and rounded to ``dtype``."""
  from svmattn.data import datasets as data_lib
  from svmattn.models import heads
  if FLAGS.data:
    try:
      data = data_lib.load_npz(FLAGS.data, dtype)
      data_lib.check_vector_head(FLAGS.data)
    except data_lib.DataError as e:
      sys.exit(f"error: --data: {e}")  # one clear line, exit status 1, nothing written
    return data, np.arange(data.X.shape[0])
  runs = np.arange(FLAGS.runs)
  data = data_lib.generate(spec, FLAGS.seed, runs, heads.LINEAR)
  return data_lib.Dataset(*(np.asarray(a).astype(dtype) for a in data)), runs
