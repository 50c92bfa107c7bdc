r"""Replay one data set of an E2 run alone, step by step, and check it against the batch.

    python -m experiments.replay --out=DIR --run=I            # from step 0
    python -m experiments.replay --out=DIR --run=I --step=K   # from the newest checkpoint at or before K

DIR is the --out of `python -m experiments.local_convergence`, finished (its summary.json)
or partial (its work/run.json). Data set I is rebuilt from the run's seed and index (or
taken from its --data file) and trained alone with every step recorded. Trained in a block
of the run's --block_size (copies of itself), its arithmetic is the batch's, so the replay
matches the batch result bit for bit; the binary checks that against results.npz (or the
partial run's trajectory and checkpoint files) and says so. Writes DIR/replay_I.npz:
steps (S,), and per parameterization P: W_P (S,d,d) (W or K Q^T at every step), max_prob_P,
loss_P (S,), attention_P (n,T), plus the comparison in DIR/replay_I.json.
"""
from __future__ import annotations

import json
import os
import sys

from absl import app
from absl import flags
import numpy as np

from experiments import common
from svmattn.io import checkpoint as ckpt_lib
from svmattn.data import datasets as data_lib
from svmattn.io import results
from svmattn.train import loop as train_lib

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "Results directory of an E2 run (finished or partial).")
flags.DEFINE_integer("run", None, "Index of the data set to replay.")
flags.DEFINE_integer("step", None, "Start from the newest checkpoint at or before this step (partial runs).")
flags.mark_flags_as_required(["out", "run"])


def run_flags(out):
  summary = os.path.join(out, "summary.json")
  partial = os.path.join(out, "work", "run.json")
  for path, pick in ((summary, lambda j: j["flags"]), (partial, lambda j: j["identity"])):
    if os.path.exists(path):
      try:
        with open(path) as f:
          return pick(json.load(f)), path
      except (OSError, ValueError, KeyError) as e:
        sys.exit(f"error: {path}: unreadable run description ({e})")
  sys.exit(f"error: {out} holds no E2 run (neither summary.json nor work/run.json)")


def batch_reference(out, fl, run, name):
  """The batch's own record of this run: (steps, W snapshots, final attention) or None."""
  path = os.path.join(out, "results.npz")
  if os.path.exists(path):
    with np.load(path, allow_pickle=False) as f:
      if f"W_final_{name}" in f.files:
        return {"W_final": f[f"W_final_{name}"][run], "attention": f[f"attention_{name}"][run],
                "max_prob": f[f"max_prob_{name}"][run], "steps": f["steps"], "where": path}
  bs = fl.get("batch_size", 1000)
  k, j = divmod(run, bs)
  path = os.path.join(out, "work", f"batch_{k:05d}_{name}.npz")
  if os.path.exists(path):
    with np.load(path, allow_pickle=False) as f:
      return {"W": f["W"][j], "W_final": f["W"][j, -1], "attention": f["attention"][j], "steps": f["steps"],
              "max_prob": f["max_prob"][j], "where": path}
  return None


def start_from_checkpoint(out, fl, run, name, config, step):
  """(step, State of this run alone) from the newest checkpoint of its batch at or before ``step``."""
  bs = fl.get("batch_size", 1000)
  k, j = divmod(run, bs)
  ckdir = os.path.join(out, "work", f"ckpt_{k:05d}_{name}")
  if not os.path.isdir(ckdir):
    return None
  ident = {k2: v for k2, v in fl.items()}
  ckpt = ckpt_lib.Checkpoints(ckdir, {"batch": k, "config": name, **ckpt_lib._normalize({"identity": ident})})
  plan = train_lib.schedule(config.steps, config.snapshot_every, config.chunk_steps)
  ends = np.cumsum([0] + [every * n for every, n in plan])      # training step at the end of chunk c
  usable = [c for c in ckpt.steps() if ends[c] <= step]
  if not usable:
    return None
  c = max(usable)
  tree = ckpt.restore(c)
  trainer = train_lib.make_trainer(config)
  import jax
  template = jax.eval_shape(lambda: trainer.init_one(jax.random.PRNGKey(0), _dummy(fl, config)))
  treedef = jax.tree_util.tree_structure(template)
  leaves = [np.asarray(tree["state"][str(i)])[j:j + 1] for i in range(treedef.num_leaves)]
  return int(ends[c]), jax.tree_util.tree_unflatten(treedef, leaves)


def _dummy(fl, config):
  import jax.numpy as jnp
  n, T, d = fl["n"], fl["T"], fl["d"]
  dt = jnp.float32 if fl.get("precision") == "float32" else jnp.float64
  return data_lib.Dataset(jnp.zeros((n, T, d), dt), jnp.ones((n,), dt), jnp.zeros((n, d), dt), jnp.zeros((d,), dt))


def main(argv):
  del argv
  common.quiet_logs()
  common.enable_compilation_cache()
  out, run = FLAGS.out, FLAGS.run
  fl, source = run_flags(out)
  fl = dict(fl)
  fl.setdefault("block_size", 64)
  spec, configs = common.e2_setup(fl)
  dtype = np.float32 if fl.get("precision") == "float32" else np.float64
  if fl.get("data"):
    try:
      all_data = data_lib.load_npz(fl["data"], dtype)
    except data_lib.DataError as e:
      sys.exit(f"error: the run's --data: {e}")
    total = all_data.X.shape[0]
  else:
    total = fl["runs"]
  if not 0 <= run < total:
    sys.exit(f"error: --run={run}: the run in {out} has data sets 0..{total - 1}")
  if fl.get("data"):
    one = data_lib.take(all_data, np.array([run]))
  else:
    one = data_lib.generate(spec, fl["seed"], [run])
    one = data_lib.Dataset(*(np.asarray(a).astype(dtype) for a in one))
  keys = train_lib.init_keys(fl["seed"], [run])

  arrays, report = {}, {"run": run, "source": source, "parameterizations": {}}
  for name, config in configs:
    start = None
    if FLAGS.step is not None:
      try:
        start = start_from_checkpoint(out, fl, run, name, config, FLAGS.step)
      except ckpt_lib.CheckpointError as e:
        sys.exit(f"error: {e}")
      if start is None:
        print(f"{name}: no checkpoint at or before step {FLAGS.step}; replaying from step 0")
    per_step = train_lib.TrainConfig(**{**config.__dict__, "snapshot_every": 1})
    traj = train_lib.train(per_step, one, keys, start=start)
    arrays["steps"] = traj.steps
    arrays[f"W_{name}"], arrays[f"max_prob_{name}"] = traj.W[0], traj.max_prob[0]
    arrays[f"loss_{name}"], arrays[f"attention_{name}"] = traj.loss[0], traj.attention[0]
    entry = {"from_step": int(traj.steps[0])}
    ref = batch_reference(out, fl, run, name)
    if ref is None:
      entry["compared"] = "nothing to compare with yet (the run's batch has not finished this parameterization)"
    else:
      where = np.searchsorted(traj.steps, ref["steps"])
      inside = (where < len(traj.steps)) & (traj.steps[np.minimum(where, len(traj.steps) - 1)] == ref["steps"])
      entry["compared_with"] = ref["where"]
      entry["final_W_identical"] = bool(np.array_equal(traj.W[0, -1], ref["W_final"]))
      entry["final_attention_identical"] = bool(np.array_equal(traj.attention[0], ref["attention"]))
      entry["max_prob_identical"] = bool(np.array_equal(traj.max_prob[0][where[inside]], ref["max_prob"][inside]))
      entry["max_abs_diff_final_W"] = float(np.max(np.abs(traj.W[0, -1] - ref["W_final"])))
    report["parameterizations"][name] = entry
    status = ("identical to the batch" if entry.get("final_W_identical") and entry.get("max_prob_identical")
              else entry.get("compared", "DIFFERS from the batch"))
    print(f"run {run} {name}: {len(traj.steps)} steps from step {entry['from_step']} -> {status}")
  results.write_npz(os.path.join(out, f"replay_{run}.npz"), arrays)
  results.write_json(os.path.join(out, f"replay_{run}.json"), report)
  mismatch = [n for n, e in report["parameterizations"].items()
              if "final_W_identical" in e and not (e["final_W_identical"] and e["max_prob_identical"])]
  return 1 if mismatch else 0


if __name__ == "__main__":
  app.run(main)
