r"""Reproduce every experiment of the registry and assemble the report.

    svmattn reproduce --out=results            # the paper's run counts (= python -m experiments.reproduce)
    svmattn reproduce --out=results --quick    # each experiment's quick settings, < 10 min on 2 cores
    svmattn reproduce --out=results --only=E2,E5

The experiments are ``svmattn.registry.experiments()``, each with its variants (directory
NAME_VARIANT, key ID-VARIANT); --quick runs each with its ``quick`` settings. Each runs as its own
process (``python -m svmattn NAME --out=OUT/NAME ...``), so one failing experiment is recorded in
the report instead of stopping the others. On Linux that process is a fork of this one, which has
imported JAX, SciPy, matplotlib and the engine once before any JAX backend started
(``svmattn.report.forked``; the same results bit for bit, 2-4 s of imports saved per experiment;
--nofork starts fresh interpreters instead). --jobs of them run at once (by default 2 on the CPU: on 2
cores the E1-E9 run takes a quarter less time than one after another, with the same results bit for
bit; 1 where a GPU or TPU is visible): the paper's first, each group the longest first (each
experiment's ``cost_s``). Each dies with this process, even
when it is killed (``workers.die_with_parent``). Writes OUT/report.md and OUT/report.html
(``svmattn.report``: a summary of which claims hold, then per experiment its figures, its checks
against the paper, wall time and command; software versions) and OUT/reproduce.json (``svmattn
report OUT`` re-renders the report from it).
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

import svmattn
from svmattn import interrupts
from svmattn import registry
from svmattn.analysis import checks as checks_lib
from svmattn import report as report_lib
from svmattn.config import allowed
from svmattn.report import forked
from svmattn.io import atomic_files as results_io
from svmattn.execution import run_experiment
from svmattn.execution import workers

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "results", "Output directory: one subdirectory per experiment plus the report.")
flags.DEFINE_bool("quick", False, "Each experiment's quick settings (minutes instead of the paper's counts).")
flags.DEFINE_list("only", [], "Run only these experiments (ids like E2, keys like E2-authors or names like "
                  "local_convergence).")
flags.DEFINE_integer("seed", 0, "Seed passed to every experiment.")
flags.DEFINE_bool("overwrite", False, "Rerun experiments whose finished runs are in --out (with other settings, "
                  "for example --quick after a full run, they are refused otherwise); each old run is replaced only "
                  "once its new one is complete.")
flags.DEFINE_bool("keep_runs", True, "Keep every experiment's per-run records (OUT/*/runs/, what replay compares "
                  "with); --nokeep_runs writes only the results, figures and report.")
flags.DEFINE_bool("fork", True, "On Linux, start each experiment as a fork of this process, which has imported "
                  "the engine once (the same results as a fresh process); --nofork: a fresh interpreter each.")
flags.DEFINE_bool("full_records", False, "Keep per-run matrices whole in OUT/*/runs/ (by default a digest of each "
                  "run's, which replay compares bit for bit).")
flags.DEFINE_integer("jobs", 0, "Experiments run at once, each its own process (the longest first). "
                     "0 (default): 2 where they run on the CPU, 1 where a GPU or TPU is visible (one process holds "
                     "a TPU, and each preallocates most of a GPU's memory). Each one's wall time then includes the "
                     "time it shared the machine; --jobs=1 runs them one after another.", lower_bound=0)
flags.DEFINE_list("figure_format", ["png"], "Figure formats passed to every experiment (png, pdf, svg); png is "
                  "always written too, for the report.")


POLL_S = 0.05    # how often the running experiments are looked at
# Device files of accelerators JAX would use: NVIDIA and AMD GPUs, TPUs (accel on TPU VMs, vfio on v5e and later)
ACCELERATOR_FILES = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/accel[0-9]*", "/dev/vfio/[0-9]*")


def default_jobs(environ=None, exists=None) -> int:
  """--jobs=0: 2 when the experiments will run on the CPU (JAX_PLATFORMS=cpu, or no accelerator's device
  file), else 1. Decided without starting JAX here: a TPU is held by the first process that starts it."""
  environ = os.environ if environ is None else environ
  exists = (lambda pattern: bool(glob.glob(pattern))) if exists is None else exists
  platforms = {p.strip().lower() for p in environ.get("JAX_PLATFORMS", "").split(",") if p.strip()}
  if platforms and platforms <= {"cpu"}:
    return 2
  return 1 if any(exists(p) for p in ACCELERATOR_FILES) else 2


def _validator(name, check):
  def ok(value):
    problem = check(value)
    if problem:
      raise flags.ValidationError(problem)
    return True
  flags.register_validator(name, ok)


_validator("seed", allowed.seed)
_validator("out", allowed.out_dir)
_validator("figure_format", allowed.figure_formats)
for _name in ("only", "figure_format"):      # a repeated entry would run the same thing twice
  _validator(_name, lambda v: (f"repeats {', '.join(sorted({x for x in v if v.count(x) > 1}))}: list each value once"
                               if len(set(v or ())) < len(v or ()) else None))


@dataclasses.dataclass(frozen=True)
class Run:
  """One process of a reproduce run: an experiment, or one of its variants."""
  experiment: registry.Experiment
  variant: registry.Variant | None = None

  @property
  def id(self) -> str:
    return self.experiment.id

  @property
  def key(self) -> str:
    return self.id + (f"-{self.variant.name}" if self.variant else "")

  @property
  def dir(self) -> str:
    return self.experiment.name + (f"_{self.variant.name}" if self.variant else "")

  @property
  def title(self) -> str:
    return self.variant.title if self.variant else self.experiment.title

  @property
  def cost_s(self) -> float:
    """Its expected wall (``registry.Experiment.cost_s``), by which run_all orders the starts."""
    if self.variant is not None and self.variant.cost_s is not None:
      return self.variant.cost_s
    return self.experiment.cost_s

  def settings(self, quick: bool) -> dict:
    """The settings this run passes: the quick ones (with --quick), then the variant's."""
    return {**(self.experiment.quick if quick else {}), **(self.variant.settings if self.variant else {})}


def runs() -> list[Run]:
  """Every experiment of the registry, each followed by its variants."""
  return [Run(e, v) for e in registry.experiments() for v in (None, *e.variants)]


def flag(name: str, value) -> str:
  """--name=value of a setting (a list comma-joined; a bool as --name / --noname)."""
  if isinstance(value, bool):
    return f"--{name}" if value else f"--no{name}"
  if isinstance(value, (list, tuple)):
    value = ",".join(map(str, value))
  return f"--{name}={value}"


def selected(only) -> list[Run]:
  every = runs()
  if not only:
    return every
  wanted = {w.strip() for w in only}
  known = {r.id for r in every} | {r.key for r in every} | {r.experiment.name for r in every}
  unknown = wanted - known
  if unknown:
    raise app.UsageError(f"--only: unknown experiment(s) {sorted(unknown)}; known: "
                         f"{', '.join(dict.fromkeys(r.id + '=' + r.experiment.name for r in every))}")
  return [r for r in every if r.id in wanted or r.key in wanted or r.experiment.name in wanted]


def command(run: Run, out: str) -> list[str]:
  formats = ",".join(dict.fromkeys(["png", *FLAGS.figure_format]))      # the report embeds the PNGs
  extra = [flag(k, v) for k, v in run.settings(FLAGS.quick).items()]
  return [sys.executable, "-m", "svmattn", run.experiment.name, f"--out={os.path.join(out, run.dir)}",
          f"--seed={FLAGS.seed}", "--noprogress", f"--figure_format={formats}",
          *(() if FLAGS.keep_runs else ("--nokeep_runs",)), *(("--full_records",) if FLAGS.full_records else ()),
          *(("--overwrite",) if FLAGS.overwrite else ()), "--resume", *extra]


def _environ(jobs: int = 1) -> dict:
  """The experiments' environment: this checkout importable (python -m svmattn in a clone), and
  each experiment's share of the cores with ``jobs`` of them at once (``svmattn.core_share``: the
  default SVM workers of a study that trains nothing)."""
  env = dict(os.environ)
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
  env[workers.PARENT_ENV] = str(os.getpid())
  env[svmattn.CORE_SHARE_ENV] = str(max(1, svmattn.core_share() // max(jobs, 1)))
  return env


class Started:
  """An experiment's process, running: its output goes to anonymous files (no pipe to fill)."""

  def __init__(self, run: Run, out: str, jobs: int = 1):
    self.run, self.out, self.cmd = run, out, command(run, out)
    print(f"[{run.key}] {run.title}: {' '.join(self.cmd[1:])}", flush=True)
    self.stdout, self.stderr = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    self.t0 = time.perf_counter()
    self.proc = forked.start(self.cmd, self.stdout, self.stderr, _environ(jobs))

  def finished(self) -> dict | None:
    """Its record once the process has ended, else None."""
    if self.proc.poll() is None:
      return None
    wall = time.perf_counter() - self.t0
    texts = []
    for f in (self.stdout, self.stderr):
      f.seek(0)
      texts.append(f.read())
      f.close()
    return record_of(self.run, self.out, self.cmd, wall, self.proc.returncode, *texts)

  def stop(self) -> None:
    if self.proc.poll() is None:
      self.proc.terminate()
      try:
        self.proc.wait(10)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()


def run_all(chosen: list[Run], out: str, jobs: int) -> list[dict]:
  """Run ``chosen`` with at most ``jobs`` processes at once: the paper's experiments before those
  beyond it, each group the longest first (``Run.cost_s``; ties in registry order), so that the
  runs that end last are short and no slot idles long beside one long run. The records come back in
  registry order. An interrupt stops every running experiment (and each one dies with this process
  even when it is killed: ``workers.die_with_parent``)."""
  waiting = sorted(chosen, key=lambda r: (r.experiment.beyond, -r.cost_s))
  running, done = [], {}
  try:
    while waiting or running:
      while waiting and len(running) < jobs:
        running.append(Started(waiting.pop(0), out, jobs))
      for started in list(running):
        record = started.finished()
        if record is not None:
          running.remove(started)
          done[started.run.key] = record
      time.sleep(POLL_S)
  finally:
    for started in running:
      started.stop()
  return [done[r.key] for r in chosen]


def record_of(run: Run, out: str, cmd: list, wall: float, returncode: int, stdout: str, stderr: str) -> dict:
  """An experiment's record for reproduce.json and the report, from its process and its summary.json."""
  target = os.path.join(out, run.dir)
  record = {"id": run.key, "module": run.experiment.name, "title": run.title, "command": " ".join(cmd[1:]),
            "wall_s": wall, "returncode": returncode, "dir": run.dir,
            "variant": run.variant.name if run.variant else "", "beyond": run.experiment.beyond}
  os.makedirs(target, exist_ok=True)
  with results_io.atomic_path(os.path.join(target, "log.txt")) as tmp:
    with open(tmp, "w") as f:
      f.write(stdout + "\n--- stderr ---\n" + stderr)
  if returncode != 0:
    record["error"] = stderr.strip()[-2000:]
    print(f"[{run.key}] FAILED after {wall:.1f}s (see {target}/log.txt)", flush=True)
    return record
  try:
    with open(os.path.join(target, "summary.json")) as f:
      summary = json.load(f)
  except (OSError, ValueError) as e:
    record["returncode"], record["error"] = -1, f"no readable summary.json: {e}"
    return record
  record["checks"] = summary.get("checks", [])
  record["summary"] = {k: summary[k] for k in ("final_corr", "per_d", "numerics") if k in summary}
  try:
    record["key_numbers"] = [[label, value] for label, value in registry.key_numbers(summary, run.experiment)]
  except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
    print(f"[{run.key}] key numbers not read: {e!r}", flush=True)
  record["numerics_version"] = summary.get("numerics_version")
  record["timings_s"] = summary.get("timings_s", {})
  record["stages_s"] = report_lib.stages(record["timings_s"], wall)
  record["work"] = summary.get("work", {})
  record["figures"] = sorted(os.path.relpath(p, out) for p in glob.glob(os.path.join(target, "*.png")))
  record["stdout"] = stdout.strip()[-3000:]
  t = checks_lib.tally(record["checks"])
  skipped = f" ({len(t['not_evaluated'])} not evaluated)" if t["not_evaluated"] else ""
  print(f"[{run.key}] done in {wall:.1f}s: {t['ok']}/{t['total']} checks as expected{skipped}", flush=True)
  return record


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  run_experiment.quiet_logs()
  chosen = selected(FLAGS.only)
  out = FLAGS.out
  os.makedirs(out, exist_ok=True)
  t0 = time.perf_counter()
  jobs = min(FLAGS.jobs or default_jobs(), max(len(chosen), 1))     # never more than there are experiments
  not_forked = forked.preload(FLAGS.fork)   # the engine imported once here: each experiment a fork of it
  if not_forked:
    print(f"each experiment starts a fresh process ({not_forked})", flush=True)
  records = run_all(chosen, out, jobs)
  meta = {"quick": FLAGS.quick, "seed": FLAGS.seed, "jobs": jobs, "forked": not not_forked,
          "total_s": time.perf_counter() - t0,
          "paper_s": sum(r["wall_s"] for r in records if not r.get("beyond")),
          "beyond_s": sum(r["wall_s"] for r in records if r.get("beyond")),
          "environment": run_experiment.environment(), "command": report_lib.command_line()}
  results_io.write_json(os.path.join(out, "reproduce.json"), {"meta": meta, "experiments": records})
  report_lib.write(out, records, meta)
  failed = [r["id"] for r in records if r["returncode"] != 0]
  unexpected = [f"{r['id']}:{c['name']}" for r in records for c in r.get("checks", []) if c.get("ok") is False]
  together = (f"; {jobs} experiments ran at once, so the rows add up to more than the {meta['total_s']:.0f} s "
              "it took" if jobs > 1 and len(records) > 1 else "")
  print(f"\nseconds per stage (reproduce.json: stages_s of each experiment{together})\n"
        + report_lib.stage_table(records))
  print(f"\nreport: {out}/report.md and {out}/report.html ({meta['total_s']:.0f} s)")
  if failed:
    print(f"failed experiments: {', '.join(failed)}")
  if unexpected:
    print(f"checks not as expected: {', '.join(unexpected)}")
  return 1 if failed else 0


def run(argv=None) -> None:
  """The command: parse the flags of ``argv`` (default sys.argv) and run ``main``."""
  svmattn.configure()
  app.call_after_init(run_experiment.install_stop_handlers)
  interrupts.install("the same command continues: finished experiments are kept, the others resume")
  app.run(main, argv=argv)


if __name__ == "__main__":
  run()
