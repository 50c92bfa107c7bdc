r"""E2: local convergence of normalized GD to the attention SVM (SCIENCE.md section 8).

Trains W and (K,Q) attention on every data set with normalized GD, solves the
Frobenius and the nuclear Att-SVM for the tokens each run selected, and writes
to --out:
  results.npz    final W / KQ^T, selections, SVM solutions, per-snapshot
                 correlations and softmax curves (see README, "Output files")
  summary.json   flags, final correlations (mean, std), convergence types, timings
  softmax.png    (1/n) sum_i max_t s_it vs iteration, mean +- std, W blue, (K,Q) red
  correlation.png  corr with the SVM solutions vs iteration

    python -m experiments.local_convergence --out=results/e2
    python -m experiments.local_convergence --out=results/e2_mine --data=my_data.npz
"""
from __future__ import annotations

import sys

from absl import app
from absl import flags
import jax
import numpy as np

from experiments import common
from svmattn.analysis import compare as analysis
from svmattn.io import checkpoint
from svmattn.data import datasets as data_lib
from svmattn.models import heads
from svmattn.analysis import metrics
from svmattn.io import plots
from svmattn.io import results
from svmattn.svm import att_svm as svm_lib
from svmattn.study import pipeline as sweep
from svmattn.train import loop as train_lib

FLAGS = flags.FLAGS
common.define_common_flags(runs=100)
flags.DEFINE_integer("n", 6, "Sequences per data set.")
flags.DEFINE_integer("T", 8, "Tokens per sequence.")
flags.DEFINE_integer("d", 10, "Embedding dimension.")
flags.DEFINE_integer("m", None, "(K,Q) width m (default d).")
flags.DEFINE_integer("steps", 2000, "Optimizer steps.")
flags.DEFINE_float("lr", 0.1, "Learning rate (step size eta).")
flags.DEFINE_list("params", ["W", "KQ"], "Parameterizations to train: W, KQ.")
flags.DEFINE_enum("loss", "logistic", ["logistic", "exponential", "correlation"], "Loss.")
flags.DEFINE_string("optimizer", "normalized_gd", "normalized_gd, gd, or an optax optimizer name.")
flags.DEFINE_enum("attention", "cross", ["cross", "self"], "Cross-attention or self-attention.")
flags.DEFINE_integer("query_pos", 0, "Query position for self-attention.")
flags.DEFINE_integer("snapshot_every", 10, "Record W, softmax and loss every this many steps.")
flags.DEFINE_integer("chunk_steps", 1000, "Steps per jitted chunk; a checkpoint is saved after each.")

flags.DEFINE_integer("batch_size", 1000, "Data sets per pipeline batch: a batch trains on device while the "
                     "previous one's SVMs are solved on the host; memory is bounded by the batch.")
flags.DEFINE_bool("resume", False, "Continue the unfinished run in --out from its checkpoints.")
flags.DEFINE_integer("svm_workers", 1, "Worker processes solving SVMs while the device trains (0: inline).")
flags.DEFINE_integer("keep_checkpoints", 3, "Checkpoints kept per batch and parameterization.")
flags.DEFINE_integer("block_size", 64, "Data sets per vectorized block (results are bit-identical for a "
                     "fixed block size, whatever the batch size or device count).")

flags.DEFINE_string("loss_scale", "default", "Loss scaling: 'auto' (rescale each step's gradient so that "
                    "float32 does not underflow; see BUILD.md), a number, or 'default' (auto in float32, 1 in "
                    "float64).")
flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0 (jax.distributed).")
flags.DEFINE_integer("num_processes", 1, "Multi-host: number of processes; each trains and solves a contiguous "
                     "share of the data sets, process 0 writes the results.")
flags.DEFINE_integer("process_id", 0, "Multi-host: this process's index.")

NORM_NAMES = {"fro": "Frobenius", "nuc": "nuclear"}
# Flags that do not change the results: left out of the run's identity (so --resume may change them).
OPERATIONAL = {"out", "resume", "progress", "svm_workers", "keep_checkpoints", "compilation_cache",
               "compilation_cache_dir", "coordinator_address", "num_processes", "process_id"}


def identity():
  ident = {k: v for k, v in common.flag_values().items() if k not in OPERATIONAL}
  if FLAGS.data:
    ident["data_sha256"] = common.file_sha256(FLAGS.data)
  return ident


@jax.jit
def _token_scores(v, X, Y):
  return jax.vmap(lambda v, X, Y: heads.token_scores(heads.LINEAR, v, X, Y))(v, X, Y)


def token_scores(batch):
  return np.asarray(_token_scores(batch.v, batch.X, batch.Y), np.float64)


def main(argv):
  del argv
  timer = common.Timer()
  common.check_params(FLAGS.params)
  if FLAGS.batch_size < 1 or FLAGS.svm_workers < 0:
    raise app.UsageError("--batch_size must be >= 1 and --svm_workers >= 0")
  if FLAGS.num_processes > 1:  # before anything starts a JAX backend
    if not FLAGS.coordinator_address or not 0 <= FLAGS.process_id < FLAGS.num_processes:
      raise app.UsageError("multi-host needs --coordinator_address=host:port and 0 <= --process_id < "
                           "--num_processes")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives; no effect on GPU/TPU
    jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  spec, configs = common.e2_setup(common.flag_values())
  for _, config in configs:
    config.validate()
  user_data = None
  if FLAGS.data:
    user_data, _ = common.load_or_generate(spec)
    total = user_data.X.shape[0]
  else:
    if FLAGS.runs < 1:
      raise app.UsageError(f"--runs must be >= 1, got {FLAGS.runs}")
    total = FLAGS.runs
  if FLAGS.num_processes > 1 and total < FLAGS.num_processes:
    raise app.UsageError(f"{total} data sets cannot be shared by {FLAGS.num_processes} processes")
  plan = sweep.Plan(configs, total, FLAGS.batch_size, FLAGS.seed, identity(),
                    FLAGS.process_id, FLAGS.num_processes)

  def load_batch(k):
    runs = plan.batch_runs(k)
    if user_data is not None:
      batch = data_lib.take(user_data, runs)
    else:
      batch = data_lib.generate(spec, FLAGS.seed, runs)
      batch = data_lib.Dataset(*(np.asarray(a).astype(common.dtype()) for a in batch))
    return batch, runs, {"gamma": token_scores(batch)}

  try:
    arrays, stages = sweep.run(plan, FLAGS.out, load_batch, analysis.e2_batch, FLAGS.resume, FLAGS.svm_workers,
                               FLAGS.progress, FLAGS.keep_checkpoints)
  except (sweep.SweepError, checkpoint.CheckpointError) as e:
    sys.exit(f"error: {e}")
  arrays = sweep.gather(arrays, plan)
  if plan.process_count > 1:
    from jax.experimental import multihost_utils
    stages = {k: float(np.max(multihost_utils.process_allgather(np.array([v])))) for k, v in stages.items()}
    if plan.process_index != 0:
      multihost_utils.sync_global_devices("results written")
      sweep.finish(FLAGS.out, plan)
      multihost_utils.sync_global_devices("work removed")
      return
  first = configs[0][1]
  arrays["steps"] = train_lib.snapshot_steps(train_lib.schedule(first.steps, first.snapshot_every,
                                                                first.chunk_steps))
  B = total
  n, T, d = arrays["token_scores"].shape[1], arrays["token_scores"].shape[2], arrays[f"W_final_{FLAGS.params[0]}"].shape[-1]
  summary = {"experiment": "E2 local convergence", "flags": common.flag_values(),
             "data_sets": B, "shape": {"n": n, "T": T, "d": d}, "final_corr": {}, "convergence_types": {},
             "svm_status": {}, "diverged_runs": {}}
  for p in FLAGS.params:
    summary["diverged_runs"][p] = int(np.sum(~arrays[f"finite_{p}"]))
    for norm in svm_lib.NORMS:
      summary["final_corr"][f"{p}_vs_{norm}"] = analysis.summarize_corr(arrays[f"corr_{p}_{norm}"][:, -1])
      status = arrays[f"svm_{norm}_{p}_status"]
      summary["svm_status"][f"{norm}_{p}"] = {s: int(np.sum(status == s)) for s in svm_lib.STATUSES}
    summary["convergence_types"][p] = metrics.type_fractions(arrays[f"convergence_type_{p}"])
  summary["checks"] = checks(summary["final_corr"])

  with timer("write"):
    results.write_npz(f"{FLAGS.out}/results.npz", arrays)
    draw(arrays, FLAGS.params, FLAGS.out)
  summary["timings_s"] = {"compile": stages["compile_s"], "train": stages["train_s"], "svm": stages["svm_s"],
                          "pipeline_wall": stages["wall_s"], "overlap": stages["overlap"], **timer.seconds,
                          "total": timer.total()}
  summary["environment"] = common.environment()
  results.write_json(f"{FLAGS.out}/summary.json", summary)
  if plan.process_count > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("results written")
  sweep.finish(FLAGS.out, plan)
  if plan.process_count > 1:
    multihost_utils.sync_global_devices("work removed")
    sweep.finish_shared(FLAGS.out)
  report(summary)


def checks(final_corr):
  """The paper's expectations (SCIENCE.md E2: 0.996, 0.997; cross pairs about 0.86 / 0.85)."""
  mean = {k: v["mean"] for k, v in final_corr.items()}
  out = []
  for key, paper in (("W_vs_fro", 0.996), ("KQ_vs_nuc", 0.997)):
    if mean.get(key) is not None:
      out.append({"name": f"mean final corr {key}", "value": mean[key],
                  "expected": f">= 0.99 (authors: {paper})", "ok": mean[key] >= 0.99})
  for cross, own, paper in (("W_vs_nuc", "W_vs_fro", 0.86), ("KQ_vs_fro", "KQ_vs_nuc", 0.85)):
    if mean.get(cross) is not None and mean.get(own) is not None:
      out.append({"name": f"mean final corr {cross} (cross pair)", "value": mean[cross],
                  "expected": f"clearly below {own} (authors: about {paper})",
                  "ok": mean[cross] < mean[own] - 0.05})
  return out


def draw(arrays, params, out):
  steps = arrays["steps"]
  fig, (ax,) = plots.figure()
  for p in params:
    plots.band(ax, steps, arrays[f"max_prob_{p}"], plots.COLORS[p], {"W": "W", "KQ": "(K,Q)"}[p])
  ax.set(xlabel="iteration", ylabel=r"softmax probability $\frac{1}{n}\sum_i \max_t s_{it}$",
         title="Attention saturates")
  ax.legend()
  plots.save(fig, f"{out}/softmax.png")

  fig, (ax,) = plots.figure()
  own = common.own_norms()
  for p in params:
    for norm in svm_lib.NORMS:
      style = "-" if own[p] == norm else "--"
      label = f"{'W' if p == 'W' else '(K,Q)'} vs {NORM_NAMES[norm]} SVM"
      plots.band(ax, steps, arrays[f"corr_{p}_{norm}"], plots.COLORS[p], label, style)
  ax.set(xlabel="iteration", ylabel="correlation coefficient", ylim=(0, 1.02),
         title="GD direction vs max-margin SVM")
  ax.legend(loc="lower right")
  plots.save(fig, f"{out}/correlation.png")


def report(summary):
  lines = [f"E2 local convergence: {summary['data_sets']} data sets"]
  for key, v in summary["final_corr"].items():
    if v["mean"] is not None:
      lines.append(f"  corr {key:<10} {v['mean']:.4f} +- {v['std']:.4f} ({v['solved']} solved)")
  for p, fr in summary["convergence_types"].items():
    lines.append(f"  types {p:<3} " + "  ".join(f"{k} {100 * x:.0f}%" for k, x in fr.items()))
  t = summary["timings_s"]
  lines.append(f"  wall {t['total']:.2f}s: train {t['train']:.2f}s (compile {t['compile']:.2f}s), "
               f"svm {t['svm']:.2f}s, overlap {t['overlap']:.2f}")
  print("\n".join(lines))
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)
