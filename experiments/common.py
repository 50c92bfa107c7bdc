"""Pieces shared by the experiment binaries: flags, data, output directories."""
from __future__ import annotations

import contextlib
import math
import os
import platform
import sys
import time

from absl import app  # defines absl's own flags before we record them
from absl import flags
from absl import logging  # noqa: F401
import numpy as np

import svmattn  # noqa: F401  (float64 on)
from svmattn.data import datasets as data_lib

FLAGS = flags.FLAGS
_ABSL_FLAGS = frozenset(FLAGS)  # absl's own flags, left out of summaries


def _env_precision() -> str:
  """The environment variable SVMATTN_PRECISION (float64 or float32), else float64; one line if bad."""
  value = os.environ.get("SVMATTN_PRECISION") or "float64"
  if value not in ("float64", "float32"):
    sys.exit(f"error: the environment variable SVMATTN_PRECISION must be float64 or float32, got {value!r}")
  return value


def define_common_flags(runs: int = 100, seed: int = 0):
  flags.DEFINE_integer("runs", runs, "Number of random data sets (ignored with --data).", lower_bound=1)
  flags.DEFINE_integer("seed", seed, "Seed; data set r is drawn from fold_in(PRNGKey(seed), r).")
  seed_flag()
  flags.DEFINE_enum("precision", _env_precision(), ["float64", "float32"],
                    "Floating-point precision (default: the environment variable SVMATTN_PRECISION, else float64; "
                    "the Colab notebook sets float32 on a TPU).")
  flags.DEFINE_string("out", None, "Results directory (created; files in it are replaced atomically).")
  flags.DEFINE_string("data", None, "Run on the data sets of this .npz (X (B,n,T,d), Y (B,n), Z (B,n,d), "
                      "v (B,d)) instead of generated ones.")
  flags.DEFINE_float("saturation", 0.9, "Training health: a run whose final mean largest softmax probability "
                     "is below this is labelled 'unsaturated' (not yet at a token selection) and counted apart "
                     "from the convergence types (svmattn.analysis.health).", lower_bound=0.0, upper_bound=1.0)
  flags.register_validator("saturation", lambda v: math.isfinite(v), message="must be a number in [0, 1]")
  flags.DEFINE_bool("progress", True, "Show progress bars / log lines on stderr.")
  flags.DEFINE_bool("compilation_cache", True, "Keep compiled XLA programs on disk so that repeated runs "
                    "skip compilation (see --compilation_cache_dir).")
  flags.DEFINE_string("compilation_cache_dir", DEFAULT_CACHE_DIR, "Directory of the persistent compilation cache.")
  figure_format_flag()
  flags.mark_flag_as_required("out")
  out_flag()
  flags.register_validator("data", lambda v: v is None or os.path.isfile(v), message="no such file")
  # Runs when the flags are parsed, before main and before anything is compiled.
  flags.register_multi_flags_validator(["compilation_cache", "compilation_cache_dir"], _enable_cache)


def figure_format_flag() -> None:
  """--figure_format: every figure is written in each listed format (svmattn.io.plots.set_formats,
  applied when the flags are parsed, before main)."""
  flags.DEFINE_list("figure_format", ["png"], "Figure file formats, comma-separated: png, pdf, svg.")

  def ok(values):
    from svmattn.io import plots
    try:
      plots.set_formats(values)
    except ValueError:
      raise flags.ValidationError(f"must list formats among {', '.join(plots.FORMATS)}, got {','.join(values)}")
    return True
  flags.register_validator("figure_format", ok)


DEFAULT_CACHE_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "svmattn", "jax")


def quiet_logs() -> None:
  """absl logging at WARNING unless --verbosity was given: orbax and jax log a lot at INFO."""
  if FLAGS["verbosity"].using_default_value:
    logging.set_verbosity(logging.WARNING)
    import logging as python_logging
    python_logging.getLogger("jax").setLevel(python_logging.WARNING)   # e.g. "Unable to initialize backend 'tpu'"


def _enable_cache(values) -> bool:
  quiet_logs()
  if values["compilation_cache"]:
    enable_compilation_cache(values["compilation_cache_dir"])
  return True


def enable_compilation_cache(path: str = DEFAULT_CACHE_DIR) -> None:
  """Persistent XLA compilation cache in ``path``, one program shared by the CPU devices
  (``svmattn.xla_cache``)."""
  from svmattn import xla_cache
  xla_cache.enable(path)


def dtype():
  return np.float32 if FLAGS.precision == "float32" else np.float64


def load_or_generate(spec: data_lib.DataSpec, head=None):
  """(data, runs): the --data file or ``FLAGS.runs`` generated data sets, in --precision."""
  from svmattn.models import heads
  head = head or heads.LINEAR
  if FLAGS.data:
    try:
      data = data_lib.load_npz(FLAGS.data, dtype())
      if head is heads.LINEAR:
        data_lib.check_vector_head(FLAGS.data)
    except data_lib.DataError as e:
      sys.exit(f"error: --data: {e}")  # one clear line, exit status 1, nothing written
    runs = np.arange(data.X.shape[0])
  else:
    if FLAGS.runs < 1:
      sys.exit(f"error: --runs must be >= 1, got {FLAGS.runs}")
    runs = np.arange(FLAGS.runs)
    # drawn in float64 and rounded, so that float32 runs see the same data sets
    data = data_lib.generate(spec, FLAGS.seed, runs, head)
    data = data_lib.Dataset(*(np.asarray(a).astype(dtype()) for a in data))
  return data, runs


def flag_values() -> dict:
  """The values of the flags svmattn's binaries define (for summary.json)."""
  return {name: FLAGS[name].value for name in FLAGS
          if name not in _ABSL_FLAGS and not FLAGS.find_module_defining_flag(name, "").startswith("absl")
          and type(FLAGS[name]).__name__ != "_FlagAlias"}      # an alias (--batch) is its target's value


def environment() -> dict:
  import importlib.metadata
  import jax
  import optax
  # the installed cvxpy's version without importing it (an import costs ~1 s)
  return {"python": platform.python_version(), "jax": jax.__version__, "optax": optax.__version__,
          "cvxpy": importlib.metadata.version("cvxpy"), "numpy": np.__version__, "platform": platform.platform(),
          "devices": [str(d) for d in jax.devices()], "cpu_count": os.cpu_count()}


class Timer:
  """Wall time of named stages: ``with timer("train"): ...``; ``timer.seconds``."""

  def __init__(self):
    self.seconds = {}
    self.start = time.perf_counter()

  def __call__(self, name):
    timer = self

    class _Stage:
      def __enter__(self):
        self.t0 = time.perf_counter()

      def __exit__(self, *exc):
        timer.seconds[name] = timer.seconds.get(name, 0.0) + time.perf_counter() - self.t0

    return _Stage()

  def total(self):
    return time.perf_counter() - self.start


def file_sha256(path: str) -> str:
  import hashlib
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


# ----------------------------------------------------------------------------------------
# Flag checks: every value is checked when the flags are parsed, before any work starts; a bad
# one ends the binary with "FATAL Flags parsing error: flag --NAME=VALUE: what is allowed",
# exit status 1, no traceback and nothing written.
# ----------------------------------------------------------------------------------------


def at_least(name: str, minimum, what: str = "") -> None:
  """--NAME must be a number >= ``minimum`` (and finite); None passes (an unset optional flag)."""
  def ok(v):
    return v is None or (math.isfinite(v) and v >= minimum)
  flags.register_validator(name, ok, message=f"must be {what or f'>= {minimum}'}")


def positive_float(name: str) -> None:
  """--NAME must be a finite number > 0."""
  flags.register_validator(name, lambda v: v is None or (math.isfinite(v) and v > 0),
                           message="must be a finite number > 0")


def int_list(name: str, minimum: int = 1, allow_empty: bool = False) -> None:
  """--NAME must be a comma-separated list of distinct integers >= ``minimum``."""
  def ok(values):
    try:
      ints = [int(v) for v in values]
    except (TypeError, ValueError):
      return False
    return (allow_empty or bool(ints)) and all(i >= minimum for i in ints) and len(set(ints)) == len(ints)
  flags.register_validator(name, ok, message=f"must be a comma-separated list of distinct integers >= {minimum}")


def float_list(name: str, minimum: float = 0.0, strict: bool = True) -> None:
  """--NAME must be a non-empty comma-separated list of finite numbers > (or >=) ``minimum``."""
  def ok(values):
    try:
      xs = [float(v) for v in values]
    except (TypeError, ValueError):
      return False
    return (bool(xs) and all(math.isfinite(x) and (x > minimum if strict else x >= minimum) for x in xs)
            and len(set(xs)) == len(xs))
  flags.register_validator(name, ok, message=f"must be a comma-separated list of distinct finite numbers "
                           f"{'>' if strict else '>='} {minimum}")


SEED_LIMIT = 2 ** 32   # data set r of seed s: fold_in(PRNGKey(s), r), the seed passed as uint32 (data.generate)


def seed_flag(name: str = "seed") -> None:
  """--NAME must be a seed the key derivation takes: 0 <= seed < 2^32."""
  flags.register_validator(name, lambda v: v is None or 0 <= v < SEED_LIMIT,
                           message=f"must be an integer in [0, {SEED_LIMIT}) (2^32)")


def out_problem(path) -> str | None:
  """Why ``path`` cannot be a results directory (None if it can): an existing file, an empty
  name, or a place where nothing can be written (probed with a directory created and removed
  at once, so that root and read-only file systems are judged right)."""
  if path is None:
    return None
  if not str(path).strip():
    return "must name a directory"
  where = os.path.abspath(os.path.expanduser(path))
  if os.path.exists(where) and not os.path.isdir(where):
    return f"{where} is an existing file, not a directory"
  parent = where
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    return f"{parent} is a file, so {where} cannot be a directory"
  import tempfile
  try:
    os.rmdir(tempfile.mkdtemp(prefix=".svmattn-probe-", dir=parent))
  except OSError as e:
    return f"cannot write in {parent} ({e.strerror or e})"
  return None


def out_flag(name: str = "out") -> None:
  """--NAME must be a usable results directory (``out_problem``), checked when the flags are parsed."""
  def ok(value):
    problem = out_problem(value)
    if problem:
      raise flags.ValidationError(problem)
    return True
  flags.register_validator(name, ok)


def distinct_lists(*names: str) -> None:
  """Every list flag defined so far (or ``names``) must not repeat an entry: a repeated value
  would compute the same thing twice."""
  names = names or [n for n in FLAGS if n not in _ABSL_FLAGS and type(FLAGS[n].parser).__name__ == "ListParser"
                    and not FLAGS.find_module_defining_flag(n, "").startswith("absl")]
  for name in names:
    def ok(values, name=name):
      repeated = sorted({v for v in values or () if list(values).count(v) > 1})
      if repeated:
        raise flags.ValidationError(f"repeats {', '.join(repeated)}: list each value once")
      return True
    flags.register_validator(name, ok)


def block_fits_batch(block: str = "block_size", batch: str = "batch_size", default: int = 64) -> None:
  """--block_size at most max(--batch_size, ``default``): a larger block only pads the batch with
  copies (memory and time grow with the block, not the data)."""
  def ok(v):
    if v[block] is None or v[batch] is None or v[block] <= max(v[batch], default):
      return True
    raise flags.ValidationError(f"--{block}={v[block]} exceeds --{batch}={v[batch]}: a block larger than the "
                                f"batch only pads it with copies; use --{block} <= {max(v[batch], default)}")
  flags.register_multi_flags_validator([block, batch], ok)


def known_optimizer(name: str = "optimizer") -> None:
  """--NAME must name an optimizer (normalized_gd, gd or an optax optimizer)."""
  def ok(value):
    from svmattn.optim import optimizers
    try:
      optimizers.get_optimizer(value, 0.1)
    except (ValueError, KeyError, TypeError, AttributeError):
      return False
    return True
  flags.register_validator(name, ok, message="must be normalized_gd, gd or the name of an optax optimizer "
                           "(e.g. adam, sgd)")


def known_params(name: str = "params") -> None:
  """--NAME must list known parameterizations (W, KQ)."""
  def ok(values):
    known = own_norms()
    return bool(values) and all(v in known for v in values)
  flags.register_validator(name, ok, message=f"must list parameterizations among {sorted(own_norms())}")


# ----------------------------------------------------------------------------------------
# The study pipeline's flags, and running a study
# ----------------------------------------------------------------------------------------

# Flags that do not change the results: left out of a run's identity (so --resume may change them).
OPERATIONAL = {"out", "resume", "progress", "figure_format", "svm_workers", "keep_checkpoints", "keep_runs",
               "compilation_cache",
               "compilation_cache_dir", "coordinator_address", "num_processes", "process_id", "hosts_timeout"}


def define_numerics_flag() -> None:
  """--numerics: exact (default) or authors (the paper's code; see README, Numerics)."""
  flags.DEFINE_enum("numerics", "exact", ["exact", "authors"],
                    "exact: normalized GD as written (g / ||g||) with a pooled token free of cancellation; "
                    "authors: as the paper's code, g / (||g|| + float64 epsilon) and the pooled token X^T s "
                    "(training freezes once ||g|| falls to about the epsilon).")


def define_pipeline_flags(batch_size: int = 1000, hosts: bool = True) -> None:
  """--batch_size, --resume, --svm_workers, --keep_checkpoints and (``hosts``) the multi-host flags."""
  flags.DEFINE_integer("batch_size", batch_size, "Data sets per pipeline batch: a batch trains on device while "
                       "the previous one's SVMs are solved on the host; memory is bounded by the batch.",
                       lower_bound=1)
  flags.DEFINE_bool("resume", False, "Continue the unfinished run in --out from its checkpoints (bit for bit "
                    "the results of an uninterrupted run).")
  flags.DEFINE_integer("svm_workers", 1, "Worker processes solving SVMs while the device trains (0: inline).",
                       lower_bound=0)
  flags.DEFINE_integer("keep_checkpoints", 3, "Checkpoints kept per batch and configuration.", lower_bound=1)
  flags.DEFINE_bool("keep_runs", True, "Keep every run's per-run arrays in OUT/runs/ (what replay compares a "
                    "replayed data set with). --nokeep_runs writes only the results and runs/study.json.")
  if hosts:
    flags.DEFINE_string("coordinator_address", None, "Several hosts: host:port of process 0 (jax.distributed).")
    flags.DEFINE_integer("num_processes", 1, "Several hosts: number of processes; each runs a contiguous share "
                         "of every cell's data sets, process 0 writes the results.", lower_bound=1)
    flags.DEFINE_integer("process_id", 0, "Several hosts: this process's index.", lower_bound=0)
    flags.DEFINE_integer("hosts_timeout", 300, "Several hosts: seconds to wait for every process to join before "
                         "giving up with an error.", lower_bound=1)
    flags.register_multi_flags_validator(
        ["coordinator_address", "num_processes", "process_id"],
        lambda v: v["process_id"] < v["num_processes"] and (v["num_processes"] == 1 or bool(v["coordinator_address"])),
        message="several processes need --coordinator_address=host:port and 0 <= --process_id < --num_processes")


def identity() -> dict:
  """The flags that define a run's results (and the --data file's digest)."""
  ident = {k: v for k, v in flag_values().items() if k not in OPERATIONAL}
  if "data" in FLAGS and FLAGS.data:
    ident["data_sha256"] = file_sha256(FLAGS.data)
  return ident


def hosts_flags() -> tuple[int, int]:
  """(process_id, num_processes); 1 process for binaries without the multi-host flags."""
  return (FLAGS.process_id, FLAGS.num_processes) if "num_processes" in FLAGS else (0, 1)


def start_hosts() -> None:
  """Join the other processes (before anything starts a JAX backend)."""
  if hosts_flags()[1] > 1:
    from svmattn.study import hosts
    try:
      hosts.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id, FLAGS.hosts_timeout)
    except hosts.HostsError as e:
      fail(str(e))


def start_study(module):
  """(flag values, study): join the other hosts, then ``module.build`` the study of this
  binary's flags; a bad --data file ends the binary with one error line."""
  from svmattn.data import datasets as data_lib
  start_hosts()
  fl = flag_values()
  try:
    if "data" in FLAGS and FLAGS.data and "precision" in FLAGS:
      data_lib.check_file_magnitudes(FLAGS.data, dtype())   # values that would overflow in --precision
      if not hasattr(module, "load_data_file"):             # (E5's ReLU head checks its own V (B,d,d))
        data_lib.check_vector_head(FLAGS.data)
    return fl, module.build(fl, identity())
  except data_lib.DataError as e:
    fail(f"--data: {e}")


def run_study(study, write):
  """Run ``study`` with the pipeline flags; ``write(output)`` writes the results on process 0.
  A results directory that cannot be used as asked ends the binary with one clear line."""
  from svmattn.io import checkpoint
  from svmattn.study import pipeline
  from svmattn.study import runner
  index, count = hosts_flags()
  for cell in study.cells:
    if cell.runs < count:
      fail(f"{cell.runs} data sets cannot be shared by {count} processes")
  options = runner.Options(FLAGS.resume, FLAGS.svm_workers, FLAGS.progress, FLAGS.keep_checkpoints, index, count,
                           keep_runs=FLAGS.keep_runs)
  try:
    with stop_on_signals():
      return runner.execute(study, FLAGS.out, write, options)
  except (pipeline.StudyError, checkpoint.CheckpointError) as e:
    fail(str(e))
  except Stopped as e:
    fail(f"stopped by {e}; to continue, run the same command with --resume")


def _install_stop_handlers() -> None:
  """Under app.run, after the flags are parsed: SIGTERM interrupts like Ctrl-C (so that what the
  binary started is stopped on the way out, e.g. reproduce's experiment processes), and an
  interrupt outside a run (``run_study`` has its own) ends with one line, exit status 1, instead
  of a traceback. Only KeyboardInterrupt is handled here; any other exception is reported as usual."""
  import signal

  def term(signum, frame):
    raise KeyboardInterrupt("SIGTERM")

  if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
    signal.signal(signal.SIGTERM, term)
  previous = sys.excepthook

  def hook(kind, value, tb):
    if issubclass(kind, KeyboardInterrupt):
      sys.stderr.write(f"error: stopped by {str(value) or 'SIGINT (Ctrl-C)'}\n")
      return
    previous(kind, value, tb)
  sys.excepthook = hook


app.call_after_init(_install_stop_handlers)


class Stopped(BaseException):
  """SIGINT (Ctrl-C) or SIGTERM during a run: the run stops where it is; --resume continues it."""


@contextlib.contextmanager
def stop_on_signals():
  """SIGINT and SIGTERM end the process with one line saying how to resume while the block runs
  (the work directory keeps every finished step; the SVM workers die with the process)."""
  import signal

  def stop(signum, frame):
    # End at once, as a kill would (the pipeline is built to resume from any kill: every file is
    # written atomically; the workers die with this process): unwinding the stack from a signal
    # handler can deadlock on a lock the interrupted code holds (a future, the prefetch thread).
    sys.stderr.write(f"\nerror: stopped by {signal.Signals(signum).name}; to continue, run the same command "
                     "with --resume\n")
    sys.stderr.flush()
    try:    # multiprocessing's helper would outlive this process and warn about the workers' semaphores
      from multiprocessing import resource_tracker
      pid = getattr(resource_tracker._resource_tracker, "_pid", None)
      if pid:
        os.kill(pid, signal.SIGKILL)
    except (ImportError, OSError):
      pass
    os._exit(1)

  previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
  try:
    yield
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def run_one_cell(module, draw, report) -> None:
  """The main of a binary whose study has one cell: build it from the flags, run it on the
  pipeline, then ``module.reduce`` -> results.npz, ``draw(arrays, summary, out)`` (figures),
  summary.json and ``report(summary)`` (the terminal)."""
  timer = Timer()
  fl, study = start_study(module)

  def write(output):
    from svmattn.io import results
    arrays, summary = module.reduce(fl, output.cells[0])
    with timer("write"):
      results.write_npz(f"{FLAGS.out}/results.npz", arrays)
      draw(arrays, summary, FLAGS.out)
    report(write_summary(summary, fl, output, timer))

  run_study(study, write)


def define_training_flags(params=("W", "KQ"), steps: int = 2000, n: int = 6, T: int = 8, d: int = 10) -> None:
  """E2's sizes and normalized-GD flags: --n --T --d --params --steps --lr --optimizer
  --snapshot_every --chunk_steps --block_size, with their validators."""
  flags.DEFINE_integer("n", n, "Sequences per data set.", lower_bound=1)
  flags.DEFINE_integer("T", T, "Tokens per sequence.", lower_bound=2)
  flags.DEFINE_integer("d", d, "Embedding dimension.", lower_bound=1)
  flags.DEFINE_list("params", list(params), "Parameterizations: W, KQ.")
  flags.DEFINE_integer("steps", steps, "Normalized-GD steps.", lower_bound=0)
  flags.DEFINE_float("lr", 0.1, "Step size.")
  flags.DEFINE_string("optimizer", "normalized_gd", "Optimizer (each parameter normalized by its own norm).")
  flags.DEFINE_integer("snapshot_every", 10, "Record the matrices every this many steps.", lower_bound=1)
  flags.DEFINE_integer("chunk_steps", 1000, "Steps per jitted chunk; a checkpoint is saved after each.", lower_bound=1)
  flags.DEFINE_integer("block_size", 64, "Data sets per vectorized block.", lower_bound=1)
  positive_float("lr")
  known_params()
  known_optimizer()
  if "batch_size" in FLAGS:
    block_fits_batch()


STAGE_TIMINGS = {"data_s": "data", "compile_s": "compile", "train_s": "train", "svm_s": "svm", "wall_s": "pipeline_wall",
                 "overlap": "overlap"}


def write_summary(summary: dict, fl: dict, output, timer: "Timer", names: dict | None = None) -> dict:
  """OUT/summary.json: the study's summary with the flags, the wall time of each stage (the
  pipeline's ``output.timings`` named by ``names``, then the binary's own, then the total) and
  the software environment. Returns it."""
  t = output.timings
  names = STAGE_TIMINGS if names is None else names
  summary = dict(summary)
  head = {"experiment": summary.pop("experiment"), "flags": fl}
  summary = {**head, **summary,
             "timings_s": {**{name: t[key] for key, name in names.items()}, **timer.seconds, "total": timer.total()},
             "work": dict(getattr(output, "work", {}) or {}),
             "environment": environment()}
  from svmattn.io import results
  results.write_json(os.path.join(FLAGS.out, "summary.json"), summary)
  return summary


def fail(message: str):
  """End the binary with "error: MESSAGE" on stderr and exit status 1 (no traceback)."""
  sys.exit(f"error: {message}")


def is_writer() -> bool:
  return hosts_flags()[0] == 0


def parse_shapes(values, flag: str = "--shapes") -> list[tuple[int, int]]:
  """Entries "n:T" of a list flag as (n, T) pairs, with a clear error for bad ones."""
  shapes = []
  for v in values:
    try:
      n, T = (int(x) for x in v.split(":"))
    except ValueError:
      raise app.UsageError(f"{flag}: expected entries n:T such as 5:5, got {v!r}") from None
    if n < 1 or T < 2:
      raise app.UsageError(f"{flag}: need n >= 1 and T >= 2, got n={n} T={T}")
    shapes.append((n, T))
  return shapes


def checks_line(summary: dict) -> str:
  """One line for the terminal: how many of summary["checks"] hold, and which do not."""
  bad = [c["name"] for c in summary["checks"] if not c["ok"]]
  return (f"  checks: {len(summary['checks']) - len(bad)}/{len(summary['checks'])} ok"
          + (f"; failing: {bad}" if bad else ""))


def print_report(lines: list[str], summary: dict, each_check: bool = True) -> None:
  """Print a binary's terminal report: its own ``lines``, then the checks (one line each, or
  one summary line) and the wall time of each stage."""
  lines = list(lines)
  if each_check:
    for c in summary["checks"]:
      v = c["value"]
      value = f"{v:.6g}" if isinstance(v, float) else str(v)
      lines.append(f"  [{'ok' if c['ok'] else 'FAIL'}] {c['name']}: {value} (expected {c['expected']})")
  else:
    lines.append(checks_line(summary))
  lines.append("  wall " + "  ".join(f"{k} {v:.2f}s" for k, v in summary["timings_s"].items()
                                     if isinstance(v, (int, float))))
  print("\n".join(lines))
  sys.stdout.flush()


def own_norms() -> dict[str, str]:
  """{parameterization: the SVM norm it is biased toward} (model.Parameterization.svm_norm)."""
  from svmattn.models import attention as model_lib
  # (prompt attention's "p" goes with its own model: experiments.joint_training only)
  return {name: p.svm_norm for name, p in model_lib.PARAMETERIZATIONS.items() if name != "p"}


def check_params(params) -> None:
  """--params: every entry a known parameterization, else a usage error naming it."""
  from absl import app
  known = own_norms()
  for p in params:
    if p not in known:
      raise app.UsageError(f"--params: unknown parameterization {p!r}; use {' and/or '.join(sorted(known))}")
