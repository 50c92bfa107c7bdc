"""Run an experiment from its settings: build the study, run it on the pipeline, write the results.

    run_experiment.run(registry.get("E2"), values)                 # values: validated settings (flags or config)
    run_experiment.run(experiment, values, sweep={"lr": [0.01, 0.1], "d": [4, 8]})

Writes to values["out"]: results.npz, the experiment's figures, summary.json (the settings, the
summary, the wall time of each stage, the software), runs/ (every run's per-run arrays, what
replay and ``svmattn.results.load`` read). A sweep writes one directory per combination under
OUT/cells/ and a summary of the grid in OUT/summary.json. A run's identity is its settings minus
the operational ones (``config.fields.Field.operational``) plus the --data file's digest: what
--resume and replay check.

Every failure a user can cause ends the process with one line "error: ..." (exit status 1).
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import platform
import shutil
import signal
import sys
import time

import numpy as np

import svmattn
from svmattn import registry
from svmattn import xla_cache
from svmattn.analysis import checks as checks_lib
from svmattn.config import fields as F
from svmattn.data import datasets as data_lib
from svmattn.io import checkpoint as ckpt_lib
from svmattn.io import plots
from svmattn.io import atomic_files as results_io
from svmattn.execution import hosts as hosts_lib
from svmattn.execution import metric_log
from svmattn.execution import overwrite
from svmattn.execution import pipeline
from svmattn.execution import study_runner
from svmattn.execution import sweep as sweep_lib
from svmattn.report import compare as compare_lib
from svmattn.train import buckets
from svmattn.train import native_kernel


def fail(message: str):
  """End the process with "error: MESSAGE" on stderr and exit status 1 (no traceback)."""
  sys.exit(f"error: {message}")


class Timer:
  """Wall time of named stages: ``with timer("train"): ...``; ``timer.seconds``."""

  def __init__(self):
    self.seconds = {}
    self.start = time.perf_counter()

  @contextlib.contextmanager
  def __call__(self, name):
    t0 = time.perf_counter()
    try:
      yield
    finally:
      self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

  def total(self):
    return time.perf_counter() - self.start


def environment() -> dict:
  import importlib.metadata
  import jax
  import optax
  # the installed cvxpy's version without importing it (an import costs ~1 s)
  return {"python": platform.python_version(), "jax": jax.__version__, "optax": optax.__version__,
          "cvxpy": importlib.metadata.version("cvxpy"), "numpy": np.__version__, "platform": platform.platform(),
          "devices": [str(d) for d in jax.devices()], "cpu_count": os.cpu_count(), **_gd_kernel()}


def _gd_kernel() -> dict:
  return {**native_kernel.report(),
          "pad_d_buckets": buckets.enabled()}


def quiet_logs() -> None:
  """absl logging at WARNING unless --verbosity was given: orbax and jax log a lot at INFO."""
  from absl import flags
  from absl import logging
  del flags    # (absl marks --verbosity as set once app.run has started: look at the command line instead)
  given = any(a.split("=")[0] in ("--verbosity", "-v", "--v", "-verbosity") for a in sys.argv[1:])
  if not given:
    logging.set_verbosity(logging.WARNING)
    import logging as python_logging
    python_logging.getLogger("jax").setLevel(python_logging.WARNING)


def enable_compilation_cache(path: str) -> None:
  xla_cache.enable(path)


def operational(experiment) -> set[str]:
  return {f.name for f in experiment.settings.fields if f.operational}


def identity(experiment, values: dict) -> dict:
  """The settings that define a run's results (and the --data / --init file's digest)."""
  ident = {k: v for k, v in values.items() if k not in operational(experiment)}
  if values.get("data"):
    ident["data_sha256"] = results_io.file_sha256(values["data"])
  if str(values.get("init") or "").endswith(".npz"):
    ident["init_sha256"] = results_io.file_sha256(values["init"])
  return ident


def hosts(values: dict) -> tuple[int, int]:
  """(process_id, num_processes); one process where the experiment has no multi-host settings."""
  return (values["process_id"], values["num_processes"]) if "num_processes" in values else (0, 1)


def start_hosts(values: dict) -> None:
  """Join the other processes (before anything starts a JAX backend)."""
  if hosts(values)[1] > 1:
    try:
      hosts_lib.initialize(values["coordinator_address"], values["num_processes"], values["process_id"],
                           values["hosts_timeout"])
    except hosts_lib.HostsError as e:
      fail(str(e))


def dtype(values: dict):
  return np.float32 if values.get("precision") == "float32" else np.float64


def build(experiment, values: dict, ident: dict | None = None):
  """The study of ``values``; a bad --data file or setting is a ConfigError naming it."""
  module = experiment.study_module()
  ident = identity(experiment, values) if ident is None else ident
  try:
    if values.get("data") and "precision" in values:
      data_lib.check_file_magnitudes(values["data"], dtype(values))   # values that would overflow in --precision
      if not hasattr(module, "load_data_file"):                      # (E5's ReLU head checks its own V (B,d,d))
        data_lib.check_vector_head(values["data"])
    study = module.build(F.Values(values), ident)
  except data_lib.DataError as e:
    raise F.ConfigError(f"--data: {e}" if values.get("data") else str(e)) from None
  except ValueError as e:
    raise F.ConfigError(str(e)) from None
  if experiment.prepare is not None:
    experiment.prepare(F.Values(values), study)
  return study


def build_any(experiment, values: dict, sweep: dict | None = None, ident: dict | None = None):
  """The study of ``values``, or of every combination of ``sweep`` as the cells of one study
  (``study.sweep``); its identity ``ident`` (default: from the values and the sweep)."""
  if not sweep:
    return build(experiment, values, ident)
  combos = sweep_lib.grid(sweep)
  per = [{**values, **c} for c in combos]
  if ident is None:
    ident = {**identity(experiment, values), "sweep": {k: list(v) for k, v in sweep.items()}}
  parts = [(c, build(experiment, v, identity(experiment, v))) for c, v in zip(combos, per)]
  try:
    return sweep_lib.combine(experiment.name, parts, ident)
  except sweep_lib.SweepError as e:
    raise F.ConfigError(str(e)) from None


def prepare_process(values: dict) -> None:
  """Logging, the compilation cache and the figure formats of ``values``."""
  quiet_logs()
  xla_cache.count_compiles()
  if values["compilation_cache"]:
    enable_compilation_cache(values["compilation_cache_dir"])
  if values["figure_format"]:
    plots.set_formats(values["figure_format"])
  import_in_background()


def _imports():
  plots.pyplot()
  import scipy.optimize  # noqa: F401  (the SVM solvers' NNLS)




def import_in_background(*modules: str) -> None:
  """Import what the later stages need (default: pyplot, scipy.optimize, about 1.5 s; else the named
  ``modules``) on a thread, beside data generation, compiling and training. A stage that needs them
  waits for the import; so does the process's exit, so it never ends inside an import."""
  import atexit
  import importlib
  import threading
  target = (lambda: [importlib.import_module(m) for m in modules]) if modules else _imports
  thread = threading.Thread(target=target, name="svmattn-imports", daemon=True)
  thread.start()
  atexit.register(thread.join)


def run(experiment, values: dict, sweep: dict | None = None, sweep_figure=None):
  """Run ``experiment`` with validated ``values`` (and a sweep {field: [values]}); returns the
  pipeline's output. Errors a user can cause end the process with one line. ``sweep_figure(dest)``
  draws a sweep's default figure once its summaries are written (``svmattn run`` passes
  ``config_file.sweep_figure``); it returns the figure's path or None."""
  timer = Timer()
  prepare_process(values)
  start_hosts(values)
  try:
    study = build_any(experiment, values, sweep)
  except F.ConfigError as e:
    fail(str(e))
  combos = sweep_lib.grid(sweep) if sweep else []
  per = [{**values, **c} for c in combos]
  out = values["out"]
  dest = destination(study, values)     # out, or beside it where --overwrite replaces a finished run

  def write(output):
    if not sweep:
      arrays, summary, extras = reduce(experiment, values, output.cells)
      with timer("write"):
        results_io.write_npz(os.path.join(dest, "results.npz"), arrays)
        draw(experiment, arrays, summary, dest, values, extras)
      summary = write_summary(experiment, summary, values, output, timer, dest)
      report(experiment, summary, values)
      return
    rows = []
    for k, (c, v) in enumerate(zip(combos, per)):
      name = os.path.join("cells", cell_dir(k, c))
      where = os.path.join(dest, name)
      own = sweep_lib.cells_of(study, c)
      arrays, summary, extras = reduce(experiment, v, [output.cells[i] for i in own])
      cell_timer = Timer()
      with timer("write"), cell_timer("write"), \
          plots.caption("sweep cell " + ", ".join(f"{n}={_short(x)}" for n, x in c.items())):
        results_io.write_npz(os.path.join(where, "results.npz"), arrays)
        draw(experiment, arrays, summary, where, {**v, "out": os.path.join(out, name)}, extras)
      summary = write_summary(experiment, summary, {**v, "out": os.path.join(out, name)}, output, cell_timer, where,
                              settings=c, cells=own)
      rows.append({"settings": c, "dir": name, "checks": _checks(summary),
                   "key_numbers": _keys(experiment, summary), "seconds": summary["timings_s"].get("cell_total")})
    write_sweep_summary(experiment, values, sweep, rows, output, timer, dest)
    figure = None
    if sweep_figure is not None:
      with timer("write"):
        figure = sweep_figure(dest)
    report_sweep(experiment, rows, output, timer)
    if sweep_figure is not None:
      print(f"  figure {os.path.join(out, os.path.basename(figure))}" if figure else
            "  no sweep figure (no numeric per-run metric); svmattn plot draws any")

  output = run_study(study, values, write, dest)
  if dest != out and hosts(values)[0] == 0:
    overwrite.swap(out, dest)
    print(f"{out}: the finished run there was replaced by this one")
  return output


def destination(study, values: dict) -> str:
  """Where the run writes: --out, or with --overwrite over a finished run, its staging directory
  beside --out (``overwrite``). A staged run left by an --overwrite that did not complete is
  named, never replaced by a run without --overwrite."""
  out = values["out"]
  overwrite.recover(out)
  stage = overwrite.staging(out)
  holds_finished = study_runner.finished_differences(out, study) is not None
  if values.get("overwrite") and holds_finished and overwrite.finished(stage):
    # killed after the staged run finished, before the swap: this very run is swapped in; one of
    # other settings (never swapped in, so never a result anyone read) is discarded
    if study_runner.finished_differences(stage, study) == []:
      overwrite.swap(out, stage)
      print(f"{out}: already complete (the finished --overwrite run beside it replaced the old one)")
      sys.exit(0)
    shutil.rmtree(stage)
  if not values.get("overwrite"):
    if holds_finished and os.path.isdir(stage):
      fail(f"{out}: an unfinished --overwrite run is staged beside it ({stage}): rerun with --overwrite "
           f"--resume to continue it, or delete {stage}")
    return out
  return stage if holds_finished else out


def cell_name(label: dict) -> str:
  """A study cell's name in the metric logs: its settings (E4: n=6_d=10; a sweep: the swept settings too)."""
  return "_".join(f"{n}={_short(v)}" for n, v in label.items()) or "run"


def cell_dir(k: int, combination: dict) -> str:
  return f"{k:03d}_" + "_".join(f"{n}={_short(v)}" for n, v in combination.items())


def _short(v) -> str:
  """A value as a cell's directory name shows it: a list joined by '-'; a file (a value with a path
  separator) as its name without the extension plus 6 hex digits of a hash of the whole path, so
  two files of one name in different folders stay apart (data/a/x.npz -> x-3f2a1c)."""
  if isinstance(v, (list, tuple)):
    return "-".join(map(str, v))
  text = str(v)
  if "/" in text or os.sep in text:
    stem = os.path.splitext(os.path.basename(text.rstrip("/" + os.sep)))[0] or "file"
    return f"{stem}-{hashlib.sha256(text.encode()).hexdigest()[:6]}"
  return text


def _checks(summary):
  return checks_lib.tally(summary.get("checks"))


def _keys(experiment, summary):
  return {label: value for label, value in registry.key_numbers(summary, experiment)}


def reduce(experiment, values, cells):
  """(arrays, summary, extras) of one run (or one sweep combination) from its cells' per-run arrays."""
  module = experiment.study_module()
  got = module.reduce(F.Values(values), cells[0] if experiment.one_cell else list(cells))
  arrays, summary = got[0], got[1]
  return arrays, summary, (got[2] if len(got) > 2 else None)


def draw(experiment, arrays, summary, out, values, extras) -> None:
  if experiment.figures is not None:
    experiment.figures(arrays, summary, out, F.Values(values), extras)


def report(experiment, summary, values) -> None:
  lines = experiment.report(summary, F.Values(values)) if experiment.report is not None else [summary["experiment"]]
  print_report(lines, summary)


# the pipeline's timings under their summary names (data_wait: the seconds the main loop waited for data,
# where data counts the loads beside training too)
STAGE_TIMINGS = {"data_s": "data", "data_wait_s": "data_wait", "compile_s": "compile", "train_s": "train",
                 "svm_s": "svm", "wall_s": "pipeline_wall", "overlap": "overlap"}


def cell_work(output, cells: list[int], names: dict, timer: Timer) -> tuple[dict, dict]:
  """(timings_s, work) of a sweep's combination alone: what its own cells' units took (the
  pipeline's ``per_cell``: loads, training, compiles, analyses; resumed units count nothing),
  its own write, and "cell_total", their sum (seconds of work, not a wall time: in a sweep, a
  cell's loads and analyses run beside other cells' training)."""
  tally = {k: sum(output.per_cell[i][k] for i in cells) for k in (*pipeline.CELL_TIMINGS, *pipeline.CELL_COUNTS)} \
      if output.per_cell else {}
  timings = {names[k]: tally[k] for k in pipeline.CELL_TIMINGS if k in names and k in tally}
  timings.update(timer.seconds)
  timings["cell_total"] = sum(tally.get(k, 0.0) for k in pipeline.CELL_TIMINGS if k != "compile_s") + \
      sum(timer.seconds.values())
  return timings, {"cells": len(cells), **{k: tally[k] for k in pipeline.CELL_COUNTS if k in tally}}


def write_summary(experiment, summary: dict, values: dict, output, timer: Timer, out: str,
                  settings: dict | None = None, cells: list[int] | None = None) -> dict:
  """OUT/summary.json: the study's summary with the settings ("flags"), the wall time of each
  stage (the pipeline's ``output.timings`` under the experiment's names, then the binary's own,
  then the total), the numerics version and the software environment. Returns it. A sweep's
  combination (``settings``, its study ``cells``) gets its own timings and work (``cell_work``);
  the sweep's totals are in the sweep's summary alone."""
  t = output.timings
  names = experiment.timing_names or STAGE_TIMINGS
  summary = dict(summary)
  note = experiment.below_calibration(values)
  if summary.get("checks"):
    summary["checks"] = checks_lib.gate(summary["checks"], summary.get("health"))
  if note and summary.get("checks"):
    summary["checks"] = [{**c, "note": note} for c in summary["checks"]]
  head = {"experiment": summary.pop("experiment"), "name": experiment.name, "id": experiment.id, "flags": values}
  if settings is not None:
    head["sweep_settings"] = settings
  if cells is not None:
    timings, work = cell_work(output, cells, names, timer)
  else:
    timings = {**{name: t[key] for key, name in names.items() if key in t}, **timer.seconds, "total": timer.total()}
    work = {**dict(getattr(output, "work", {}) or {}), **_compile_stats()}
  summary = {**head, **summary, "numerics_version": svmattn.NUMERICS_VERSION, "timings_s": timings, "work": work,
             "environment": environment()}
  results_io.write_json(os.path.join(out, "summary.json"), summary)
  return summary


def _compile_stats() -> dict:
  return xla_cache.compile_stats()


def write_sweep_summary(experiment, values, sweep, rows, output, timer, dest: str) -> dict:
  summary = {"experiment": f"{experiment.id} {experiment.name}: sweep", "name": experiment.name, "id": experiment.id,
             "flags": values, "sweep": {k: list(v) for k, v in sweep.items()}, "cells": rows,
             "numerics_version": svmattn.NUMERICS_VERSION,
             "checks": [], "timings_s": {**{n: output.timings[k] for k, n in STAGE_TIMINGS.items()
                                            if k in output.timings}, **timer.seconds, "total": timer.total()},
             "work": {**dict(getattr(output, "work", {}) or {}), **_compile_stats()},
             "environment": environment()}
  results_io.write_json(os.path.join(dest, "summary.json"), summary)
  return summary


def report_sweep(experiment, rows, output, timer) -> None:
  """The sweep's table: one row per combination (its settings, key numbers, checks and own seconds),
  as ``svmattn compare`` prints it, then the sweep's wall time."""
  cols = [{"name": r["dir"].split("/", 1)[-1], "experiment": experiment.id, "keys": list(r["key_numbers"].items()),
           "checks": f"{r['checks']['ok']}/{r['checks']['total']}"
                     + (f" ({len(r['checks']['not_evaluated'])} not evaluated)" if r["checks"].get("not_evaluated")
                        else ""),
           "numerics": svmattn.NUMERICS_VERSION, "wall": r.get("seconds"), "settings": r["settings"]} for r in rows]
  lines = [f"{experiment.id} {experiment.name}: sweep of {len(rows)} combinations",
           compare_lib.table(cols, "rows").split("\n", 1)[1], f"  wall {timer.total():.2f}s"]
  print("\n".join(lines))
  sys.stdout.flush()


def _fmt(v):
  return f"{v:.4g}" if isinstance(v, float) else str(v)


def checks_line(summary: dict) -> str:
  """One line: how many of summary["checks"] hold, which do not, and which were not evaluated."""
  t = checks_lib.tally(summary["checks"])
  return (f"  checks: {t['ok']}/{t['total']} ok" + (f"; failing: {t['failing']}" if t["failing"] else "")
          + (f"; not evaluated: {t['not_evaluated']}" if t["not_evaluated"] else ""))


def print_report(lines: list[str], summary: dict, each_check: bool = True) -> None:
  """Print the terminal report: the experiment's ``lines``, then the checks and the wall times."""
  lines = list(lines)
  if each_check:
    for c in summary.get("checks", []):
      v = c["value"]
      value = f"{v:.6g}" if isinstance(v, float) else str(v)
      note = f"; {c['note']}" if c.get("note") else ""
      if c.get("ok") is None:
        lines.append(f"  [not evaluated] {c['name']}: {c.get('reason', 'not evaluated')}")
        continue
      lines.append(f"  [{'ok' if c['ok'] else 'FAIL'}] {c['name']}: {value} (expected {c['expected']}{note})")
  else:
    lines.append(checks_line(summary))
  lines.append("  wall " + "  ".join(f"{k} {v:.2f}s" for k, v in summary["timings_s"].items()
                                     if isinstance(v, (int, float))))
  print("\n".join(lines))
  sys.stdout.flush()


# ----------------------------------------------------------------------------------------
# The pipeline, signals
# ----------------------------------------------------------------------------------------


def run_study(study, values: dict, write, dest: str | None = None):
  """Run ``study`` with the pipeline settings of ``values`` into ``dest`` (default: --out);
  ``write(output)`` writes the results on process 0. A results directory that cannot be used as
  asked ends with one clear line."""
  dest = values["out"] if dest is None else dest
  index, count = hosts(values)
  for cell in study.cells:
    if cell.runs < count:
      fail(f"{cell.runs} data sets cannot be shared by {count} processes")
  v = F.Values(values)
  options = study_runner.Options(resume=v.resume, workers=v.svm_workers, progress=v.progress,
                           keep_checkpoints=v.keep_checkpoints, checkpoint_every_s=v.checkpoint_every_s,
                           process_index=index, process_count=count, keep_runs=v.keep_runs,
                           full_records=v.full_records, log=values.get("log") or "none",
                           cell_names=tuple(cell_name(c.label) for c in study.cells))
  try:
    with stop_on_signals():
      return study_runner.run(study, dest, write, options)
  except study_runner.AlreadyComplete as e:
    print(e)
    sys.exit(0)
  except (pipeline.StudyError, ckpt_lib.CheckpointError, metric_log.LogError) as e:
    fail(str(e))
  except OSError as e:
    if e.errno not in DISK_ERRORS:
      raise
    fail(f"{values['out']}: {e.strerror or e}" + (f" ({e.filename})" if e.filename else "")
         + ": nothing finished was lost; free space or fix the path, then rerun the same command with --resume")


DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG, errno.EFBIG}
"""What a full disk, a quota, a read-only or forbidden place or an over-long name raises: one line."""


def install_stop_handlers() -> None:
  """After the flags are parsed: SIGTERM interrupts like Ctrl-C (so that what the process started is
  stopped on the way out), and an interrupt outside a run (``run_study`` has its own) ends with one
  line, exit status 1, instead of a traceback."""
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


def helper_processes(marker: str, parent: int | None = None) -> list[int]:
  """The pids of the children of ``parent`` (default: this process) whose command line holds
  ``marker`` (read from /proc, the operating system's public view; [] where there is none, as on
  macOS and Windows)."""
  found, me = [], os.getpid() if parent is None else parent
  try:
    entries = [e for e in os.listdir("/proc") if e.isdigit()]
  except OSError:
    return []
  for entry in entries:
    try:
      with open(f"/proc/{entry}/stat", "rb") as f:
        ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
      if ppid != me:
        continue
      with open(f"/proc/{entry}/cmdline", "rb") as f:
        if marker.encode() in f.read():
          found.append(int(entry))
    except (OSError, ValueError, IndexError):
      continue
  return found


@contextlib.contextmanager
def stop_on_signals():
  """SIGINT and SIGTERM end the process with one line saying how to resume while the block runs
  (the work directory keeps every finished step; the SVM workers die with the process)."""
  def stop(signum, frame):
    # End at once, as a kill would (the pipeline resumes from any kill: every file is written
    # atomically; the workers die with this process): unwinding the stack from a signal handler can
    # deadlock on a lock the interrupted code holds (a future, the prefetch thread).
    sys.stderr.write(f"\nerror: stopped by {signal.Signals(signum).name}; to continue, run the same command "
                     "with --resume\n")
    sys.stderr.flush()
    for pid in helper_processes("multiprocessing.resource_tracker"):
      try:    # multiprocessing's helper would outlive this process and warn about the workers' semaphores
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    os._exit(1)

  previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
  try:
    yield
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
