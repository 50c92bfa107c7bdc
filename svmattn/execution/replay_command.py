r"""Replay one data set of any study alone, and check it against the run's own record.

    svmattn replay --out=DIR --run=I                 # cell 0 (studies without a grid)
    svmattn replay --out=DIR --cell=n=5,d=3 --run=I  # a cell by its label (or its index)
    svmattn replay --out=DIR --run=I --step=K        # training from the newest checkpoint <= K

DIR is the --out of any experiment binary, finished (DIR/runs/) or partial (DIR/work/). Data
set I of the cell is rebuilt from the run's seed (or its --data file), run through the cell's
device stages alone and analyzed alone; every per-run array must equal the batch's bit for
bit (a training stage trains it in a block of its block size, so its arithmetic is the
batch's), and the binary says which arrays do. Writes the comparison in DIR/replay_I.json.
Exit status 1 when an array differs from the batch.

With --save_trajectory, training stages are also recorded at every step and written to
DIR/replay_I.npz (steps (S,), and per training stage P: W_P (S,d,d) (W or K Q^T), max_prob_P,
loss_P (S,), attention_P (n,T)); the binary prints its size (every step's W: 8 S d^2 bytes per
stage, 160 MB at d = 100 and 2000 steps), which is why it is not kept by default.
"""
from __future__ import annotations

import os
import sys
import tempfile

from absl import app
from absl import flags

import svmattn
from svmattn.config import common
from svmattn.data import datasets as data_lib
from svmattn.io import checkpoint as ckpt_lib
from svmattn.io import atomic_files as results_io
from svmattn.execution import run_experiment
from svmattn.execution import pipeline
from svmattn.execution import replay
from svmattn.execution import stages

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "Results directory of a run of any experiment (finished or partial).")
flags.DEFINE_integer("run", None, "Index of the data set to replay (within its cell).", lower_bound=0)
flags.DEFINE_string("cell", "0", "The data set's cell: its index, or its label such as n=5,d=3.")
flags.DEFINE_integer("step", None, "With --save_trajectory: the recorded trajectory starts from the newest "
                     "checkpoint at or before this step (partial runs).", lower_bound=0)
flags.DEFINE_bool("save_trajectory", False, "Also record every training step (W or K Q^T, max prob, loss, "
                  "attention) in DIR/replay_I.npz; its size is printed (8 S d^2 bytes per stage).")
flags.mark_flags_as_required(["out", "run"])
# (defined when this module is imported: by `svmattn replay` or experiments/replay.py, the only importers)


def main(argv):
  del argv
  run_experiment.quiet_logs()
  run_experiment.enable_compilation_cache(common.DEFAULT_CACHE_DIR)
  out, run = FLAGS.out, FLAGS.run
  try:
    study, source = replay.rebuild(out)
    c = replay.find_cell(study, FLAGS.cell)
    replay.check_run(study, c, run)
  except replay.ReplayError as e:
    run_experiment.fail(str(e))
  except data_lib.DataError as e:
    run_experiment.fail(f"the run's --data: {e}")
  writable(out)
  try:
    data, _, result = replay.run_one(study, c, run)
  except ckpt_lib.CheckpointError as e:
    run_experiment.fail(str(e))
  label = ",".join(f"{k}={v}" for k, v in study.cells[c].label.items())
  report = {"study": study.name, "cell": c, "label": study.cells[c].label, "run": run, "source": source,
            "stages": {}}
  if FLAGS.step is not None and not FLAGS.save_trajectory:
    run_experiment.fail("--step chooses where the recorded trajectory starts: pass it with --save_trajectory")
  arrays = {}
  for stage in study.stages(study.cells[c]):
    if not isinstance(stage, stages.Train) or not FLAGS.save_trajectory:
      continue
    start = None
    if FLAGS.step is not None:
      try:
        start = replay.start_from_checkpoint(out, study, c, run, data, stage, FLAGS.step)
      except ckpt_lib.CheckpointError as e:
        run_experiment.fail(str(e))
      if start is None:
        print(f"{stage.name}: no checkpoint at or before step {FLAGS.step}; replaying from step 0")
    traj = replay.every_step(study, c, data, stage, start)
    arrays["steps"] = traj.steps
    arrays[f"W_{stage.name}"], arrays[f"max_prob_{stage.name}"] = traj.W[0], traj.max_prob[0]
    arrays[f"loss_{stage.name}"], arrays[f"attention_{stage.name}"] = traj.loss[0], traj.attention[0]
    report["stages"][stage.name] = {"from_step": int(traj.steps[0])}
    print(f"run {run} {stage.name}: {len(traj.steps)} steps from step {int(traj.steps[0])}")
  try:
    ref = replay.reference(out, study, c, run)
  except pipeline.StudyError as e:       # a damaged record of the run
    run_experiment.fail(f"cannot compare with the run's record: {e}")
  where = f"cell {c} ({label})" if label else "the run"
  if ref is None and not replay.runs_kept(out):
    report["compared"] = "nothing to compare with (the run was made with --nokeep_runs)"
    verdict = f"run {run} of {where}: replayed; {report['compared']}"
  elif ref is None:
    report["compared"] = "nothing to compare with yet (the run's batch has not been analyzed)"
    verdict = f"run {run} of {where}: replayed; {report['compared']}"
  else:
    same = replay.compare(result, ref[0])
    report["compared_with"] = ref[1]
    report["identical"] = same
    differ = sorted(k for k, ok in same.items() if not ok)
    report["differ"] = differ
    verdict = (f"run {run} of {where}: {len(same) - len(differ)}/{len(same)} per-run arrays identical to the batch"
               + (f"; DIFFER: {differ}" if differ else ""))
  path = os.path.join(out, f"replay_{run}.npz")
  report["trajectory"] = path if arrays else "not saved (pass --save_trajectory to record every step)"
  try:          # written before the verdict is said: a full disk is one line, and no verdict without its record
    if arrays:
      results_io.write_npz(path, arrays)
      print(f"trajectory: {path}, {os.path.getsize(path) / 1e6:.1f} MB ({len(arrays['steps'])} steps of "
            f"{len(report['stages'])} training stage(s))")
    results_io.write_json(os.path.join(out, f"replay_{run}.json"), report)
  except OSError as e:
    run_experiment.fail(f"{out}: cannot write the replay's record ({e.strerror or e}); nothing was replaced")
  print(verdict)
  sys.stdout.flush()
  return 1 if report.get("differ") else 0


def writable(out: str) -> None:
  """One line unless ``out`` is a directory this process can write in (checked before the replay)."""
  try:
    with tempfile.TemporaryFile(dir=out):
      pass
  except OSError as e:
    run_experiment.fail(f"--out={out}: cannot write the replay's record there ({e.strerror or e})")


def run() -> None:
  svmattn.configure()
  app.run(main)


if __name__ == "__main__":
  run()
