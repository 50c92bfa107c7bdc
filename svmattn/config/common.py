"""The settings most experiments share: data sets, outputs, the pipeline, hosts, numerics, training.

    SETTINGS = common.base(runs=100) + common.pipeline(batch_size=1000) + common.numerics() + fields.Settings(...)

Each field's name is the binary's flag (``--runs``) and the config's field (``config.runs``).
"""
from __future__ import annotations

import os
import sys

from svmattn.config import allowed
from svmattn.config import fields as F

DEFAULT_CACHE_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "svmattn", "jax")


def env_precision() -> str:
  """The environment variable SVMATTN_PRECISION (float64 or float32), else float64; one line if bad."""
  value = os.environ.get("SVMATTN_PRECISION") or "float64"
  if value not in ("float64", "float32"):
    sys.exit(f"error: the environment variable SVMATTN_PRECISION must be float64 or float32, got {value!r}")
  return value


def base(runs: int = 100, seed: int = 0, data: bool = True, precision: bool = True, saturation: bool = True) -> F.Settings:
  """--runs --seed --precision --out --data --saturation --progress --compilation_cache(_dir) --figure_format."""
  fs = [F.Int("runs", runs, "Number of random data sets (ignored with --data).", lower=1),
        F.Int("seed", seed, "Seed; data set r is drawn from fold_in(PRNGKey(seed), r).", check=allowed.seed)]
  if precision:
    fs.append(F.Enum("precision", env_precision(), ["float64", "float32"],
                     "Floating-point precision (default: the environment variable SVMATTN_PRECISION, else float64; "
                     "the Colab notebook sets float32 on a TPU)."))
  fs += outputs().fields
  if data:
    fs.append(F.Str("data", None, "Run on the data sets of this .npz (X (B,n,T,d), Y (B,n), Z (B,n,d), v (B,d)) "
                    "instead of generated ones.", check=allowed.existing_file))
  if saturation:
    fs.append(F.Float("saturation", 0.9, "Training health: a run whose final mean largest softmax probability is "
                      "below this is labelled 'unsaturated' (not yet at a token selection) and counted apart from "
                      "the convergence types (svmattn.analysis.health).", lower=0.0, upper=1.0))
  return F.Settings(tuple(fs))


def outputs() -> F.Settings:
  """--out --progress --compilation_cache --compilation_cache_dir --figure_format (operational)."""
  return F.Settings((
      F.Str("out", None, "Results directory (created; files in it are replaced atomically).", check=allowed.out_dir,
            operational=True, sweepable=False),
      F.Bool("progress", True, "Show progress bars / log lines on stderr.", operational=True, sweepable=False),
      F.Bool("compilation_cache", True, "Keep compiled XLA programs on disk so that repeated runs skip "
             "compilation (see --compilation_cache_dir).", operational=True, sweepable=False),
      F.Str("compilation_cache_dir", DEFAULT_CACHE_DIR, "Directory of the persistent compilation cache.",
            operational=True, sweepable=False),
      F.List("figure_format", ("png",), "Figure file formats, comma-separated: png, pdf, svg.",
             check=allowed.figure_formats, operational=True, sweepable=False),
      F.Enum("log", "none", ("none", "tensorboard", "wandb"), "Per-snapshot scalars of each cell and "
             "parameterization, written after each batch's host analysis: tensorboard (OUT/tensorboard, "
             "tensorboard --logdir OUT/tensorboard) or wandb (offline, OUT/wandb; needs wandb installed).",
             check=allowed.metric_log, operational=True, sweepable=False),
  ))


def pipeline(batch_size: int = 1000, hosts: bool = True) -> F.Settings:
  """--batch_size --resume --svm_workers --keep_checkpoints --checkpoint_every_s --keep_runs --full_records
  and (``hosts``) the multi-host flags."""
  op = dict(operational=True, sweepable=False)
  fs = [F.Int("batch_size", batch_size, "Data sets per pipeline batch: a batch trains on device while the "
              "previous one's SVMs are solved on the host; memory is bounded by the batch.", lower=1,
              sweepable=False),
        F.Bool("resume", False, "Continue the unfinished run in --out from its checkpoints (bit for bit the "
               "results of an uninterrupted run).", **op),
        F.Bool("overwrite", False, "Replace the finished run in --out (whole: its results, figures, replays and "
               "sweep cells): the new run is written beside it and replaces it only once complete, so a kill or a "
               "full disk leaves the old run intact (continue with --overwrite --resume).", **op),
        F.Int("svm_workers", None, "Worker processes solving SVMs (0: inline). Default: 1 beside a study that "
              "trains, one per core (at most 8) for a study that trains nothing (none where that is one "
              "core, as for each of the two experiments `svmattn reproduce` runs at once on 2 cores: the "
              "study then solves them itself), none where a batch's analysis takes milliseconds (E6, E7). "
              "On a GPU host more workers than 1 can use the free cores beside training.",
              lower=0, **op),
        F.Int("keep_checkpoints", 3, "Checkpoints kept per batch and configuration.", lower=1, **op),
        F.Float("checkpoint_every_s", 10.0, "Save a training checkpoint after a chunk only when at least this "
                "many seconds have passed since the last save of its batch (0: after every chunk). A kill loses "
                "at most about this much training per batch; which chunks were saved never changes a result.",
                lower=0.0, **op),
        F.Bool("keep_runs", True, "Keep every run's per-run arrays in OUT/runs/ (what replay compares a replayed "
               "data set with). --nokeep_runs writes only the results and runs/study.json.", **op),
        F.Bool("full_records", False, "Keep per-run matrices (data, parameters, attention maps) whole in "
               "OUT/runs/; by default each run's is kept as a digest, which replay compares bit for bit.", **op)]
  rules = ()
  if hosts:
    fs += [F.Str("coordinator_address", None, "Several hosts: host:port of process 0 (jax.distributed).", **op),
           F.Int("num_processes", 1, "Several hosts: number of processes; each runs a contiguous share of every "
                 "cell's data sets, process 0 writes the results.", lower=1, **op),
           F.Int("process_id", 0, "Several hosts: this process's index.", lower=0, **op),
           F.Int("hosts_timeout", 300, "Several hosts: seconds to wait for every process to join before giving up "
                 "with an error.", lower=1, **op)]
    rules = (F.Rule(("coordinator_address", "num_processes", "process_id"), _hosts_rule),)
  return F.Settings(tuple(fs), rules)


def _hosts_rule(v):
  if v["process_id"] < v["num_processes"] and (v["num_processes"] == 1 or bool(v["coordinator_address"])):
    return None
  return ("several processes need --coordinator_address=host:port and 0 <= --process_id < --num_processes")


def numerics() -> F.Settings:
  """--numerics: exact (default) or authors (the paper's code; docs/science.md section 9)."""
  return F.Settings((F.Enum(
      "numerics", "exact", ["exact", "authors"],
      "exact: normalized GD as written (g / ||g||) with a pooled token free of cancellation; authors: as the "
      "paper's code, g / (||g|| + float64 epsilon) and the pooled token X^T s (training freezes once ||g|| falls "
      "to about the epsilon)."),))


def block_fits_batch(block: str = "block_size", batch: str = "batch_size", default: int = 64) -> F.Rule:
  """--block_size at most max(--batch_size, ``default``): a larger block only pads the batch with copies."""
  def check(v):
    if v.get(block) is None or v.get(batch) is None or v[block] <= max(v[batch], default):
      return None
    return (f"--{block}={v[block]} exceeds --{batch}={v[batch]}: a block larger than the batch only pads it with "
            f"copies; use --{block} <= {max(v[batch], default)}")
  return F.Rule((block, batch), check)


def block_size_field() -> F.Int:
  """--block_size: data sets per vectorized block (``train.loop.TrainConfig.block_size``)."""
  return F.Int("block_size", 64, "Data sets per vectorized block (results are bit-identical for a fixed block size, "
               "whatever the batch size or device count).", lower=1)


def training(params=("W", "KQ"), steps: int = 2000, n: int = 6, T: int = 8, d: int = 10, chunk_steps: int = 1000,
             init: bool = True, minibatch: bool = False) -> F.Settings:
  """E2's sizes and normalized-GD fields: --n --T --d --params --steps --lr --optimizer --snapshot_every
  --chunk_steps --block_size (--init) (``minibatch``: --minibatch --sampling, for an experiment that
  passes them into its ``TrainConfig``; see ``minibatch_fields``)."""
  fs = (F.Int("n", n, "Sequences per data set.", lower=1),
        F.Int("T", T, "Tokens per sequence.", lower=2),
        F.Int("d", d, "Embedding dimension.", lower=1),
        F.List("params", params, "Parameterizations: W, KQ.", check=allowed.params),
        F.Int("steps", steps, "Optimizer steps.", lower=0),
        F.Float("lr", 0.1, "Step size.", check=allowed.positive),
        F.Str("optimizer", "normalized_gd", "normalized_gd, gd, or an optax optimizer name.", check=allowed.optimizer),
        F.Int("snapshot_every", 10, "Record the matrices every this many steps.", lower=1),
        F.Int("chunk_steps", chunk_steps, "Steps per jitted chunk; a checkpoint is saved after each.", lower=1),
        block_size_field()) + ((init_field(),) if init else ())
  out = F.Settings(fs, (block_fits_batch(),))
  return out + minibatch_fields() if minibatch else out


def minibatch_fields() -> F.Settings:
  """--minibatch --sampling (``train.loop.TrainConfig``), with the rule --minibatch <= --n."""
  fs = (F.Int("minibatch", 0, "Sequences per optimizer step (stochastic training); 0: all n of a data set "
              "(full-batch GD). The loss and snapshots recorded stay full-data values.", lower=0),
        F.Enum("sampling", "without", ["with", "without", "cyclic"],
               "With --minibatch > 0, how a step's sequences are drawn from the run's own key: with "
               "(uniform, with replacement), without (a fresh random permutation every epoch, consumed "
               "--minibatch at a time, wrapping into the next epoch when --minibatch does not divide n) or "
               "cyclic (the fixed order 0..n-1, wrapping)."))
  return F.Settings(fs, (F.Rule(("minibatch", "n", "data"), _minibatch_rule),))


def _minibatch_rule(v):
  if v.get("data") or v["minibatch"] <= v["n"]:     # (a --data file's own n is checked when it is loaded)
    return None
  return f"--minibatch={v['minibatch']} exceeds --n={v['n']}: a step draws at most the n sequences of a data set"


def init_scale_field() -> F.Float:
  """--init_scale: the random initialization times S (``train.loop.TrainConfig.init_scale``)."""
  return F.Float("init_scale", 1.0, "Multiply the random initialization by this (every parameterization: W, K and "
                 "Q, p); 1 is the initialization as drawn, bit for bit. Small values (1e-3) start near the saddle at "
                 "0 (rank dynamics from a small init); a --init file is used as given.", check=allowed.positive)


def init_field(default: str = "uniform") -> F.Field:
  """--init: an initialization scheme (uniform, normal, zero) or a .npz of starting parameters, one row
  per data set: W (B,d,d), or K and Q (B,d,m) (``train.init_file``)."""
  return F.Str("init", default, "Initialization: uniform (+-1/sqrt(d)), normal, zero, or FILE.npz holding the "
               "starting parameters of every data set: W (runs,d,d) and/or K, Q (runs,d,m); row r starts data set r.",
               check=allowed.init)
