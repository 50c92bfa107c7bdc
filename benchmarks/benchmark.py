r"""Benchmarks: every figure is a ratio against a baseline measured in the same run.

    python -m benchmarks.benchmark --out=results/benchmark                 # everything
    python -m benchmarks.benchmark --out=DIR --suites=gd,svm --batch_sizes=1,100,10000

Suites (--suites):
  gd     normalized-GD data-set-steps per second at E2 sizes (n=6, T=8, d=10, W) for each batch
         size, against a naive baseline in the same run (a Python loop over data sets and steps
         calling a jitted single-data-set step, as a notebook would); compile time separately;
         cost growth with n, T and d (gd_scaling.png). Three columns: the engine as train.train
         runs it (blocks of --block_size, the batch padded to whole blocks on as many devices as
         it has blocks: a batch smaller than block_size costs a whole block), the engine on one
         device, and a single
         vmap over the whole batch on one device (no blocks: its working set leaves the caches
         as the batch grows).
  floor  the physical floor of the GD step: flops and bytes per data-set-step from XLA's cost
         analysis of the compiled step, this machine's float64 matmul rate (measured again before
         every timed repeat of each kernel: a row's floor comes from the best rate of its own
         minutes) and memory bandwidth measured in the same run, and achieved / floor; rows for
         each kernel of --floor_kernels (--floor_kernels=native: the kernel training runs on the
         CPU alone, about a minute).
  svm    Att-SVM solves per second, Frobenius (NNLS; and the on-device dual solver) and nuclear
         (SCS on the reduced problem), one at a time and as a batch on threads (svm.THREADS,
         one per core: the solvers release the GIL), against a naive baseline in the same run
         (constraints appended one by one in a Python loop, a fresh cvxpy problem per data set,
         the same solver); scaling with the number of constraints n(T-1) and variables d^2.
  norms  Att-SVM solves per second in every norm of --norms (E10's: l1, linf, l_p, spectral, ...;
         one DPP problem per shape and norm) against a naive baseline in the same run (constraints
         appended one by one, a fresh cvxpy problem per data set, the same solver).
  models the flax path against the built-in path at E2 sizes (B = --models_batch, W): data-set-steps
         per second of the built-in model (closed-form gradient), the built-in model with autodiff,
         the flax SingleHead (the same model through svmattn.models.flax_models' protocol),
         MultiHead (H=2) and TwoLayer, as ratios to the built-in model in the same run.
  e2     the E2 default experiment end to end in fresh processes, against the authors' code
         (286 s on a 2-core machine of this kind: a quoted reference, docs/science.md section 8).
  quick  `reproduce --quick` end to end.
  stages every stage of a `reproduce` run (--reproduce_json=OUT/reproduce.json) beside its floor,
         with rates measured in this run: train = its data-set-steps at the GD kernel's rate (E2
         sizes), data = its bytes at the memory bandwidth, svm_analysis = one Frobenius NNLS solve
         per analyzed data set; the cause of anything above 3x (per shape generator compiles,
         the achieved training rate, ms per analyzed data set). Run it on an idle machine.
Writes DIR/benchmark.json and figures; prints a table.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

import svmattn

svmattn.configure()    # a program: float64 and the CPU devices before anything below starts JAX's backend

from benchmarks import flag_checks as checks_lib  # noqa: E402
from svmattn.data import datasets as data_lib  # noqa: E402
from svmattn.io import plots  # noqa: E402
from svmattn import report as report_lib  # noqa: E402
from svmattn.config import allowed  # noqa: E402
from svmattn.io import atomic_files as results_io  # noqa: E402
from svmattn.svm import att_svm as svm_lib  # noqa: E402
from svmattn.svm import dual as svm_dual  # noqa: E402
from svmattn.execution import run_experiment  # noqa: E402
from svmattn.train import block_kernel  # noqa: E402
from svmattn.train import native_kernel  # noqa: E402
from svmattn.train import native_train  # noqa: E402
from svmattn.train import loop as train_lib  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "Directory for benchmark.json and figures.")
checks_lib.figure_format_flag()
flags.DEFINE_list("suites", ["gd", "floor", "svm", "norms", "models", "e2"],
                  "Suites to run: gd, floor, svm, norms, models, e2, quick, stages (needs --reproduce_json).")
flags.DEFINE_list("norms", ["fro", "nuc", "l1", "linf", "l1.75", "l3", "spectral"], "Norms of the norms suite.")
flags.DEFINE_list("batch_sizes", ["1", "10", "100", "1000", "10000", "100000"], "GD batch sizes.")
flags.DEFINE_integer("gd_steps", 200, "Steps per timed GD call.")
flags.DEFINE_integer("floor_batch", 100_000, "Data sets in the achieved-vs-floor measurement.")
FLOOR_KERNELS = ("vmapped", "block", "native")
flags.DEFINE_list("floor_kernels", list(FLOOR_KERNELS),
                  "The floor suite's kernels: vmapped (the per-data-set program), block (the XLA block "
                  "kernel), native (the native CPU kernel, which training runs where it is built).")
flags.DEFINE_integer("scaling_batch", 1000, "Data sets per point of the GD cost-vs-size curves.")
flags.DEFINE_integer("block_size", train_lib.TrainConfig.block_size, "Data sets per vectorized block (the engine's).")
flags.DEFINE_integer("naive_sets", 8, "Data sets in the naive GD baseline (times per data set are constant).")
flags.DEFINE_integer("svm_sets", 50, "Data sets per SVM measurement.")
flags.DEFINE_integer("repeats", 3, "Repetitions (the best is kept for kernels, the median for end to end).")
flags.DEFINE_integer("models_batch", 1000, "Data sets in the models suite.")
flags.DEFINE_list("e2_flags", [], "Extra flags for the E2 end-to-end run (e.g. --runs=20).")
flags.DEFINE_string("reproduce_json", None, "The stages suite: a reproduce.json (svmattn reproduce) "
                    "whose experiments' stages are put beside their floors.")

# every value checked when the flags are parsed: one line, nothing run
for _name in ("gd_steps", "floor_batch", "scaling_batch", "block_size", "naive_sets", "svm_sets", "repeats",
              "models_batch"):
  checks_lib.at_least(_name, 1, "an integer >= 1")
checks_lib.check("batch_sizes", allowed.int_list(minimum=1))
checks_lib.check("out", allowed.out_dir)
checks_lib.distinct_lists("suites", "norms", "floor_kernels")
flags.register_validator("floor_kernels", lambda v: bool(v) and all(x in FLOOR_KERNELS for x in v),
                         message="must list kernels among " + ", ".join(FLOOR_KERNELS))
flags.register_validator("suites", lambda v: bool(v) and all(x in ("gd", "floor", "svm", "norms", "models", "e2",
                                                                   "quick", "stages") for x in v),
                         message="must list suites among gd, floor, svm, norms, models, e2, quick, stages")
MAX_P = 100


def _norm_ok(v: str) -> bool:
  if v in ("fro", "nuc", "spectral", "l1", "linf"):
    return True
  try:
    return v.startswith("l") and 1 < float(v[1:]) <= MAX_P
  except ValueError:
    return False


flags.register_validator("norms", lambda v: bool(v) and all(_norm_ok(x) for x in v),
                         message=f"must list norms among fro, nuc, spectral, l1, linf and l<p> with 1 < p <= {MAX_P}")
flags.register_multi_flags_validator(
    ["suites", "reproduce_json"],
    lambda v: ("stages" not in v["suites"] or bool(v["reproduce_json"])) and
              (not v["reproduce_json"] or os.path.isfile(v["reproduce_json"])),
    message="the stages suite needs --reproduce_json naming an existing reproduce.json")

AUTHORS_E2_SECONDS = 286.0
# what `python -m svmattn local_convergence` imports before it runs (the e2 suite's import floor)
E2_BINARY = "svmattn.cli, svmattn.config.flags_front, svmattn.studies.local_convergence"
E2 = dict(n=6, T=8, d=10)


class Paired:
  """What the floor suite measures around every timed repeat of best_time (``_BETWEEN``): the
  machine's matmul rate just before it (untimed) and the repeat's seconds just after, so that a
  kernel and its floor are measured in the same minutes, repeat by repeat."""

  def __init__(self):
    self.rates, self.seconds = [], []

  def before(self):
    self.rates.append(matmul_rate(2))

  def after(self, seconds):
    self.seconds.append(seconds)


_BETWEEN: Paired | None = None


def best_time(fn, repeats, between=True):
  """The shortest of ``repeats`` timed calls of fn (each measured with ``_BETWEEN``, where set and
  ``between``)."""
  paired = _BETWEEN if between else None
  times = []
  for _ in range(repeats):
    if paired is not None:
      paired.before()
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
    if paired is not None:
      paired.after(times[-1])
  return min(times)


def config_kernel(config, B, n, T, d, steps):
  """(compile_s, run_s) of ``steps`` steps of ``config`` on B data sets, as train.train runs them."""
  import dataclasses
  config = dataclasses.replace(config, steps=steps, snapshot_every=steps, chunk_steps=steps,
                               block_size=FLAGS.block_size)
  trainer = train_lib.make_trainer(config)
  runs = np.arange(B)
  batch = data_lib.generate(data_lib.DataSpec(n, T, d), 0, runs)
  keys = train_lib.init_keys(0, runs)
  mesh = train_lib.batch_mesh(B, FLAGS.block_size)
  batch, keys = (train_lib.place(x, mesh) for x in train_lib.pad_to_blocks((batch, keys), config.block_size * mesh.size))
  state = train_lib._compiled(trainer, "init", mesh)(keys, batch)
  fn = train_lib._compiled(trainer, "advance", mesh, steps, 1)
  t0 = time.perf_counter()
  compiled = fn.compile_for(state, batch)
  compile_s = time.perf_counter() - t0
  return compile_s, best_time(lambda: compiled(state, batch), FLAGS.repeats)


def suite_models(report):
  from svmattn.models import flax_models
  B, steps = FLAGS.models_batch, FLAGS.gd_steps
  cases = {"builtin (closed-form gradient)": train_lib.TrainConfig(param="W"),
           # the same model, its gradient by autodiff: a loss scale skips the closed form (normalized GD
           # is invariant to it)
           "builtin (autodiff)": train_lib.TrainConfig(param="W", loss_scale=2.0),
           "flax SingleHead": train_lib.TrainConfig(module=flax_models.SingleHead()),
           "flax MultiHead H=2": train_lib.TrainConfig(module=flax_models.MultiHead(heads=2)),
           "flax TwoLayer": train_lib.TrainConfig(module=flax_models.TwoLayer())}
  rows = {}
  for name, cfg in cases.items():
    compile_s, run_s = config_kernel(cfg, B, E2["n"], E2["T"], E2["d"], steps)
    rows[name] = {"compile_s": compile_s, "run_s": run_s, "dataset_steps_per_s": B * steps / run_s}
  base = rows["builtin (closed-form gradient)"]["dataset_steps_per_s"]
  for name, row in rows.items():
    row["vs_builtin"] = row["dataset_steps_per_s"] / base
    print(f"models  {name:<32} {row['dataset_steps_per_s']:10.4g} data-set-steps/s = {row['vs_builtin']:5.2f}x "
          f"the built-in model (compile {row['compile_s']:.2f}s)", flush=True)
  report["models"] = {"batch": B, "steps": steps, "rows": rows,
                      "flax_single_head_slowdown": base / rows["flax SingleHead"]["dataset_steps_per_s"],
                      "autodiff_slowdown": base / rows["builtin (autodiff)"]["dataset_steps_per_s"]}


def gd_kernel(B, n, T, d, steps, param="W", mode="engine"):
  """(compile_s, run_s, trainer, state, batch) for B data sets x steps of normalized GD.

  mode "engine": what ``train.train`` runs (blocks of --block_size, the batch padded to whole
  blocks on every device, one program over all devices); "engine_1dev": the same on one
  device; "vmap": one vmap over the whole batch on one device (no blocks). Where training runs
  the native kernel's C entry point (``train.native_train``: nothing compiled), the engine modes
  time ``train.train`` itself, one chunk of ``steps`` steps: the start drawn on the host, the
  data laid out for the kernel, the kernel's call on each device's share, the two observations;
  compile_s is then that setup (no program is compiled)."""
  config = train_lib.TrainConfig(param=param, steps=steps, snapshot_every=steps, chunk_steps=steps,
                                 block_size=FLAGS.block_size)
  trainer = train_lib.make_trainer(config)
  runs = np.arange(B)
  batch = data_lib.generate_host(data_lib.DataSpec(n, T, d), 0, runs)
  keys = train_lib.init_keys(0, runs)
  if mode != "vmap" and native_train.supports(config, batch.X.dtype):
    mesh = None if mode == "engine" else train_lib.data_mesh(jax.local_devices()[:1])
    run = lambda: train_lib.train(config, batch, keys, mesh=mesh)  # noqa: E731
    traj = run()
    run_s = best_time(lambda: run().W, FLAGS.repeats)
    return traj.compile_seconds, run_s, trainer, train_lib.State(traj.params, None), batch
  batch = data_lib.Dataset(*(jnp.asarray(a) for a in batch))
  if mode == "vmap":
    state = jax.jit(jax.vmap(trainer.init_one))(keys, batch)
    fn = jax.jit(jax.vmap(lambda st, dt: trainer.advance_one(st, dt, steps, 1)))
  else:
    mesh = train_lib.batch_mesh(B, FLAGS.block_size,
                                None if mode == "engine" else train_lib.data_mesh(jax.local_devices()[:1]))
    batch, keys = (train_lib.place(x, mesh) for x in train_lib.pad_to_blocks((batch, keys), config.block_size * mesh.size))
    state = train_lib._compiled(trainer, "init", mesh)(keys, batch)
    fn = train_lib._compiled(trainer, "advance", mesh, steps, 1)
  t0 = time.perf_counter()
  compiled = fn.compile_for(state, batch) if mode != "vmap" else fn.lower(state, batch).compile()
  compile_s = time.perf_counter() - t0
  run_s = best_time(lambda: compiled(state, batch), FLAGS.repeats)
  return compile_s, run_s, trainer, state, batch


def naive_gd(n, T, d, steps, sets):
  """Python loop over data sets and steps, one jitted single-data-set step per call."""
  config = train_lib.TrainConfig(param="W", steps=steps)
  trainer = train_lib.make_trainer(config)
  runs = np.arange(sets)
  batch = data_lib.generate(data_lib.DataSpec(n, T, d), 0, runs)
  keys = train_lib.init_keys(0, runs)
  step = jax.jit(trainer.step_one)
  init = jax.jit(trainer.init_one)
  one = data_lib.take(batch, 0)
  jax.block_until_ready(step(init(keys[0], one), one))  # compile outside the timing

  def run():
    out = []
    for b in range(sets):
      dset = data_lib.take(batch, b)
      st = init(keys[b], dset)
      for _ in range(steps):
        st = step(st, dset)
      out.append(st.params)
    return out

  return best_time(run, max(3, FLAGS.repeats))   # the baseline's best: it is the denominator


def suite_gd(report):
  n, T, d = E2["n"], E2["T"], E2["d"]
  steps = FLAGS.gd_steps
  naive_steps = min(steps, 100)
  naive_s = naive_gd(n, T, d, naive_steps, FLAGS.naive_sets)
  naive_rate = FLAGS.naive_sets * naive_steps / naive_s
  rows = []
  devices = len(jax.local_devices())
  for B in [int(b) for b in FLAGS.batch_sizes]:
    used = train_lib.batch_mesh(B, FLAGS.block_size).size
    row = {"batch": B, "steps": steps, "devices_used": used,
           "padded_batch": -(-B // (FLAGS.block_size * used)) * FLAGS.block_size * used}
    for mode in ("engine", "engine_1dev", "vmap"):
      compile_s, run_s, *_ = gd_kernel(B, n, T, d, steps, mode=mode)
      rate = B * steps / run_s
      row[mode] = {"compile_s": compile_s, "run_s": run_s, "dataset_steps_per_s": rate, "vs_naive": rate / naive_rate}
    row.update(dataset_steps_per_s=row["engine"]["dataset_steps_per_s"], vs_naive=row["engine"]["vs_naive"])
    rows.append(row)
    print(f"gd  B={B:>7}  engine ({used} dev) {row['dataset_steps_per_s']:10.4g}/s = {row['vs_naive']:6.1f}x naive"
          f"  | engine 1 dev {row['engine_1dev']['dataset_steps_per_s']:10.4g}/s"
          f"  | vmap, no blocks, 1 dev {row['vmap']['dataset_steps_per_s']:10.4g}/s"
          f"  (compile {row['engine']['compile_s']:.2f}s)", flush=True)
  scaling = {}
  for name, values in (("n", [2, 6, 12, 24]), ("T", [4, 8, 16, 32]), ("d", [5, 10, 20, 40])):
    sizes = []
    for value in values:
      shape = dict(E2, **{name: value})
      B = FLAGS.scaling_batch
      _, run_s, *_ = gd_kernel(B, shape["n"], shape["T"], shape["d"], 50)
      sizes.append({"value": value, "us_per_dataset_step": 1e6 * run_s / (B * 50)})
    scaling[name] = sizes
  fig, axes = plots.figure(3, width=3.6)
  for ax, (name, sizes) in zip(axes, scaling.items()):
    ax.loglog([s["value"] for s in sizes], [s["us_per_dataset_step"] for s in sizes], "o-")
    ax.set(xlabel=name, ylabel="us per data-set-step", title=f"GD cost vs {name} (B={FLAGS.scaling_batch})")
  if FLAGS.out:
    plots.save(fig, os.path.join(FLAGS.out, "gd_scaling.png"))
  report["gd"] = {"naive": {"dataset_steps_per_s": naive_rate, "sets": FLAGS.naive_sets, "steps": naive_steps},
                  "devices": devices, "block_size": FLAGS.block_size,
                  "batched": rows, "best_vs_naive": max(r["vs_naive"] for r in rows),
                  "best_dataset_steps_per_s": max(r["dataset_steps_per_s"] for r in rows),
                  "scaling": scaling}


def matmul_rate(repeats=5):
  """float64 flops per second of a 1024 x 1024 matmul (XLA's, every core), measured now: best of repeats."""
  a = jnp.ones((1024, 1024), jnp.float64)
  mm = jax.jit(lambda x: x @ x)
  jax.block_until_ready(mm(a))
  return 2 * 1024 ** 3 / best_time(lambda: mm(a), repeats, between=False)   # (it is what _BETWEEN runs)


def machine_peaks():
  """float64 matmul flop rate and memory bandwidth of this machine, measured now."""
  flops = matmul_rate()
  big = jnp.ones((32 * 1024 * 1024,), jnp.float64)  # 256 MiB
  copy = jax.jit(lambda x: x * 1.0000001)
  jax.block_until_ready(copy(big))
  bandwidth = 2 * big.nbytes / best_time(lambda: copy(big), 5)
  return flops, bandwidth


def step_cost(trainer, state, batch):
  """(flops, bytes accessed) per data-set-step: XLA's cost analysis of one step of one block on
  one device, of the program the engine runs (the block kernel where it applies, otherwise the
  vmapped per-data-set step)."""
  block = jax.tree_util.tree_map(lambda x: np.asarray(x)[:FLAGS.block_size], (state, batch))
  if block_kernel.supports(trainer.config):
    st, dt = block
    return block_kernel.step_cost(trainer.config, st.params, data_lib.Dataset(*(jnp.asarray(a) for a in dt)))
  compiled = jax.jit(jax.vmap(trainer.step_one)).lower(*block).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return (float(cost.get("flops", float("nan"))) / FLAGS.block_size,
          float(cost.get("bytes accessed", float("nan"))) / FLAGS.block_size)


def floor_row(B, param, peak_flops, bandwidth, kernel="native"):
  """One row of the floor table. kernel "vmapped": the per-data-set program (version 2's kernel);
  "block": the XLA block kernel (version 3's); "native": the native CPU kernel (version 4's), whose
  flops are XLA's count of the block kernel's step, the same arithmetic.

  The machine's matmul rate is measured again before every timed repeat of the kernel, and the
  row's floor comes from the best of those (peak_flops, the suite's first measurement, where the
  kernel has no timed repeats): this host's speed wanders by 20-30% within minutes, and a floor
  measured in a fast minute against a kernel timed in a slow one (or the reverse) moved "x floor"
  by as much as the kernel's own changes. Best against best, in the same minutes."""
  global _BETWEEN
  block_kernel.ENABLED = kernel != "vmapped"
  native_kernel.ENABLED = kernel == "native"
  train_lib._JIT_CACHE.clear()
  paired = _BETWEEN = Paired()
  try:
    _, run_s, trainer, state, batch = gd_kernel(B, E2["n"], E2["T"], E2["d"], FLAGS.gd_steps, param=param)
    state, batch = (x.parts[0] if isinstance(x, train_lib.Split) else x for x in (state, batch))
    flops_per, xla_bytes_per = step_cost(trainer, state, batch)   # xla bytes: every unfused intermediate
    ran = ("vmapped" if not block_kernel.supports(trainer.config)
           else "native" if block_kernel.uses_native(trainer.config, batch.X.dtype) else "block")
  finally:
    _BETWEEN = None
    block_kernel.ENABLED = native_kernel.ENABLED = True
    train_lib._JIT_CACHE.clear()
  rates = paired.rates
  peak_flops = max(rates, default=peak_flops)
  # DRAM traffic the engine cannot avoid: each call reads every data set and its state once and
  # writes the state once (a block stays in cache for all --gd_steps steps of the call); the
  # "streaming" figure is what a step would move if nothing stayed in cache between steps.
  item = np.dtype(batch.X.dtype).itemsize
  data_bytes = sum(int(np.prod(a.shape[1:])) for a in batch) * item
  state_bytes = sum(int(np.prod(x.shape[1:])) for x in jax.tree_util.tree_leaves(state)) * item
  streaming_bytes_per = data_bytes + 2 * state_bytes
  min_bytes_per = streaming_bytes_per / FLAGS.gd_steps
  achieved = run_s / (B * FLAGS.gd_steps)
  compute_floor, memory_floor = flops_per / peak_flops, min_bytes_per / bandwidth
  floor = max(compute_floor, memory_floor)
  # repeat by repeat: each repeat's time against the floor at the rate measured just before it (the
  # best against the best, above, pairs the fastest minute of each; the median of these pairs is
  # the figure that the host's wandering speed moves least)
  paired_ratios = [(s / (B * FLAGS.gd_steps)) / max(flops_per / rate, memory_floor)
                   for rate, s in zip(rates, paired.seconds)]
  return {"batch": B, "param": param, "steps_per_call": FLAGS.gd_steps, "devices": len(jax.local_devices()),
          "kernel": ran,
          "flops_per_dataset_step": flops_per, "xla_bytes_accessed_per_dataset_step": xla_bytes_per,
          "min_bytes_per_dataset_step": min_bytes_per,
          "streaming_bytes_per_dataset_step": streaming_bytes_per,
          "machine_float64_matmul_flops": peak_flops, "matmul_rates_between_repeats": rates,
          "machine_bandwidth_bytes_per_s": bandwidth,
          "compute_floor_s": compute_floor, "memory_floor_s": memory_floor,
          "streaming_floor_s": streaming_bytes_per / bandwidth,
          "floor_s_per_dataset_step": floor, "achieved_s_per_dataset_step": achieved,
          "achieved_over_floor": achieved / floor,
          "repeat_seconds": paired.seconds, "paired_over_floor": paired_ratios,
          "paired_over_floor_median": float(np.median(paired_ratios)) if paired_ratios else float("nan"),
          "bound": "compute" if compute_floor >= memory_floor else "memory"}


def suite_floor(report):
  """The GD kernel against its floor at E2's sizes, W and (K,Q), at 10^4 data sets and at
  --floor_batch. The floor of a data-set-step is the larger of its flops (XLA's count for the
  program the engine runs) at the machine's float64 matmul rate and its unavoidable DRAM traffic
  at the machine's bandwidth, both measured now."""
  peak_flops, bandwidth = machine_peaks()
  batches = sorted({min(10_000, FLAGS.floor_batch), FLAGS.floor_batch})
  rows = [floor_row(B, param, peak_flops, bandwidth, kernel) for param in ("W", "KQ") for B in batches
          for kernel in FLAGS.floor_kernels]
  report["floor"] = next(r for r in rows if r["param"] == "W" and r["batch"] == FLAGS.floor_batch
                         and r["kernel"] == rows[-1]["kernel"])
  report["floor_table"] = rows
  f = report["floor"]
  print(f"floor: machine {peak_flops / 1e9:.1f} GFLOP/s float64 matmul at the start, {bandwidth / 1e9:.1f} GB/s; the data set and "
        f"state cross DRAM once per {FLAGS.gd_steps}-step call ({f['min_bytes_per_dataset_step']:.0f} bytes per "
        f"data-set-step for W; {f['streaming_bytes_per_dataset_step']:.0f} if nothing stayed in cache)", flush=True)
  print(f"{'param':<6}{'batch':>9}{'kernel':>14}{'flops':>8}{'GFLOP/s':>9}{'floor ns':>10}{'achieved ns':>13}{'x floor':>9}"
        f"{'paired':>8}  bound  (GFLOP/s: the best matmul rate measured between the row's repeats; x floor: the "
        "best repeat against that best rate; paired: the median over the repeats of each against the rate "
        "measured just before it)")
  for r in rows:
    print(f"{r['param']:<6}{r['batch']:>9}{r['kernel']:>14}"
          f"{r['flops_per_dataset_step']:>8.0f}{r['machine_float64_matmul_flops'] / 1e9:>9.1f}"
          f"{1e9 * r['floor_s_per_dataset_step']:>10.1f}"
          f"{1e9 * r['achieved_s_per_dataset_step']:>13.0f}{r['achieved_over_floor']:>9.2f}"
          f"{r['paired_over_floor_median']:>8.2f}  {r['bound']}", flush=True)


def naive_svm(X, Z, alpha, norm, solver="SCS"):
  """Constraints built one by one in Python, a fresh cvxpy problem per data set."""
  import cvxpy as cp
  n, T, d = X.shape
  W = cp.Variable((d, d))
  constraints = []
  for i in range(n):
    for t in range(T):
      if t != alpha[i]:
        constraints.append((X[i, alpha[i]] - X[i, t]) @ W @ Z[i] >= 1)
  objective = {"nuc": lambda: cp.normNuc(W), "fro": lambda: cp.sum_squares(W), "spectral": lambda: cp.sigma_max(W),
               "l1": lambda: cp.sum(cp.abs(W)), "linf": lambda: cp.max(cp.abs(W))}.get(norm)
  objective = objective() if objective else cp.pnorm(cp.vec(W, order="F"), float(norm[1:]))
  prob = cp.Problem(cp.Minimize(objective), constraints)
  kwargs = {"eps": 1e-9, "max_iters": 200_000} if solver == "SCS" else {}
  prob.solve(solver=solver, **kwargs)
  return W.value


def time_svm(fn, sets):
  """Solves per second over ``sets`` data sets, the best of max(3, --repeats) passes."""

  def one_pass():
    for b in range(sets):
      fn(b)

  return sets / best_time(one_pass, max(3, FLAGS.repeats))


def svm_data(sets, n, T, d):
  batch = data_lib.generate(data_lib.DataSpec(n, T, d), 0, np.arange(sets))
  X, Z = np.asarray(batch.X), np.asarray(batch.Z)
  alpha = np.random.RandomState(0).randint(0, T, (sets, n))
  return X, Z, alpha


def suite_svm(report):
  sets = FLAGS.svm_sets
  X, Z, alpha = svm_data(sets, **E2)
  rows = {}
  naive_sets = min(sets, max(5, sets // 5))      # the naive solver's data sets are among the sets drawn
  for norm in ("fro", "nuc"):
    svm_lib.att_svm(X[0], Z[0], alpha[0], norm)  # build the DPP problem outside the timing
    ours = time_svm(lambda b: svm_lib.att_svm(X[b], Z[b], alpha[b], norm), sets)
    naive_svm(X[0], Z[0], alpha[0], norm)        # import cvxpy outside the timing
    naive = time_svm(lambda b: naive_svm(X[b], Z[b], alpha[b], norm), naive_sets)
    batch = sets / best_time(lambda: svm_lib.att_svm_batch(X, Z, alpha, norm), max(3, FLAGS.repeats))
    rows[norm] = {"ours_solves_per_s": ours, "naive_solves_per_s": naive, "vs_naive": ours / naive,
                  "batch_solves_per_s": batch, "batch_threads": svm_lib.THREADS, "batch_vs_naive": batch / naive,
                  "solver": svm_lib.DEFAULT_SOLVER[norm]}
    print(f"svm {norm}: one at a time {ours:10.1f} solves/s ({svm_lib.DEFAULT_SOLVER[norm]}) = {ours / naive:.1f}x; "
          f"att_svm_batch on {svm_lib.THREADS} threads {batch:10.1f} solves/s = {batch / naive:.1f}x; "
          f"naive {naive:8.2f} solves/s", flush=True)
  Xb, Zb, ab = svm_data(2000, **E2)
  svm_dual.att_svm_fro_batch(Xb[:10], Zb[:10], ab[:10])
  dual_B = svm_dual.att_svm_fro_batch(Xb, Zb, ab)  # compile for this shape
  dual_rate = len(Xb) / best_time(lambda: svm_dual.att_svm_fro_batch(Xb, Zb, ab), max(3, FLAGS.repeats))
  rows["fro_device_dual"] = {"solves_per_s": dual_rate, "batch": len(Xb),
                             "fallbacks": int(dual_B["fallback"].sum()),
                             "max_kkt_residual": float(np.max(dual_B["kkt_residual"])),
                             "vs_naive": dual_rate / rows["fro"]["naive_solves_per_s"]}
  print(f"svm fro on-device dual (B={len(Xb)}): {dual_rate:10.1f} solves/s, "
        f"{int(dual_B['fallback'].sum())} fallbacks, max KKT residual {np.max(dual_B['kkt_residual']):.1e}",
        flush=True)
  rows["nuclear_solvers"] = nuclear_solvers()
  scaling = []
  for n, T, d in ((6, 4, 10), (6, 8, 10), (6, 16, 10), (6, 32, 10), (6, 8, 5), (6, 8, 20), (6, 8, 30)):
    Xs, Zs, als = svm_data(10, n, T, d)
    entry = {"n": n, "T": T, "d": d, "constraints": n * (T - 1), "variables": d * d}
    for norm in ("fro", "nuc"):
      svm_lib.att_svm(Xs[0], Zs[0], als[0], norm)
      entry[f"{norm}_ms"] = 1e3 / time_svm(lambda b: svm_lib.att_svm(Xs[b], Zs[b], als[b], norm), 10)
    scaling.append(entry)
  rows["scaling"] = scaling
  fig, axes = plots.figure(2, width=4.2)
  for ax, key, label in ((axes[0], "constraints", "constraints n(T-1) (d=10)"), (axes[1], "variables", "variables d^2 (T=8)")):
    pick = [e for e in scaling if (e["d"] == 10 if key == "constraints" else e["T"] == 8)]
    for norm, style in (("fro", "o-"), ("nuc", "s--")):
      ax.loglog([e[key] for e in pick], [e[f"{norm}_ms"] for e in pick], style, label=norm)
    ax.set(xlabel=label, ylabel="ms per solve")
    ax.legend()
  if FLAGS.out:
    plots.save(fig, os.path.join(FLAGS.out, "svm_scaling.png"))
  report["svm"] = rows


NUCLEAR_SHAPES = ((6, 8, 10), (5, 5, 5), (5, 10, 3), (10, 5, 10), (5, 15, 20), (15, 5, 15))  # E2's, then E3's


def nuclear_solvers():
  """Every nuclear-norm solver against SCS (through cvxpy, eps 1e-9: E3's default) in the same
  run, on E2's shape and E3's: ms per solve and, per solver, the largest relative difference
  from SCS in the objective and in W over the feasible data sets (the same checks: margins
  >= 1 - 1e-6, rescaled to a smallest margin of 1)."""
  from svmattn.studies import svm_rank
  from svmattn.svm import feasibility as feas_lib
  out = []
  for n, T, d in NUCLEAR_SHAPES:
    batch = data_lib.generate(data_lib.DataSpec(n, T, d), 0, np.arange(60))
    X, Z = np.asarray(batch.X), np.asarray(batch.Z)
    alpha = svm_rank.opt_tokens(batch)      # E3's alpha = opt
    keep = np.flatnonzero(feas_lib.check(X, Z, alpha).feasible)[:max(10, FLAGS.svm_sets // 5)]
    entry = {"n": n, "T": T, "d": d, "sets": len(keep)}
    ref = {}
    for solver in ("SCS", "scs_direct", "clarabel_dual", "nuc_auto", "nuc_ipm"):
      svm_lib.att_svm(X[keep[0]], Z[keep[0]], alpha[keep[0]], "nuc", solver)     # setup outside the timing
      res = {}

      def one_pass():
        for b in keep:
          res[b] = svm_lib.att_svm(X[b], Z[b], alpha[b], "nuc", solver)
      entry[f"{solver}_ms"] = 1e3 * best_time(one_pass, max(2, FLAGS.repeats)) / len(keep)
      entry[f"{solver}_optimal"] = int(sum(r.ok for r in res.values()))
      if solver == "SCS":
        ref = res
        continue
      both = [b for b in keep if res[b].ok and ref[b].ok]
      entry[f"{solver}_max_rel_objective_diff"] = max(
          (abs(res[b].objective - ref[b].objective) / ref[b].objective for b in both), default=float("nan"))
      entry[f"{solver}_max_rel_W_diff"] = max(
          (np.linalg.norm(res[b].W - ref[b].W) / np.linalg.norm(ref[b].W) for b in both), default=float("nan"))
      entry[f"{solver}_vs_SCS"] = entry["SCS_ms"] / entry[f"{solver}_ms"]
    # nuc_ipm as the studies call it: the data sets of a batch stacked (att_svm_batch), one thread
    stacked = lambda: svm_lib.att_svm_batch(X[keep], Z[keep], alpha[keep], "nuc", "nuc_ipm", threads=1)  # noqa: E731
    entry["nuc_ipm_stacked_ms"] = 1e3 * best_time(stacked, max(2, FLAGS.repeats)) / len(keep)
    entry["nuc_ipm_stacked_vs_SCS"] = entry["SCS_ms"] / entry["nuc_ipm_stacked_ms"]
    out.append(entry)
    print(f"svm nuc (n={n}, T={T}, d={d}, {len(keep)} sets): SCS {entry['SCS_ms']:.1f} ms; scs_direct "
          f"{entry['scs_direct_ms']:.1f} ms ({entry['scs_direct_vs_SCS']:.1f}x, objective within "
          f"{entry['scs_direct_max_rel_objective_diff']:.0e}); clarabel_dual {entry['clarabel_dual_ms']:.1f} ms "
          f"({entry['clarabel_dual_vs_SCS']:.1f}x, objective within {entry['clarabel_dual_max_rel_objective_diff']:.0e}, "
          f"W within {entry['clarabel_dual_max_rel_W_diff']:.0e}); nuc_auto {entry['nuc_auto_ms']:.1f} ms "
          f"({entry['nuc_auto_vs_SCS']:.1f}x); nuc_ipm {entry['nuc_ipm_ms']:.1f} ms ({entry['nuc_ipm_vs_SCS']:.1f}x, "
          f"objective within {entry['nuc_ipm_max_rel_objective_diff']:.0e}, W within "
          f"{entry['nuc_ipm_max_rel_W_diff']:.0e}), stacked {entry['nuc_ipm_stacked_ms']:.1f} ms "
          f"({entry['nuc_ipm_stacked_vs_SCS']:.1f}x)", flush=True)
  return out


def spectral_direct(X, Z, alpha, sets):
  """The spectral SVM by clarabel_reduced against cvxpy's CLARABEL and SCS: solves per second
  and the largest relative objective difference from each (same data sets)."""
  out, res = {}, {}
  for solver in ("CLARABEL", "SCS", "clarabel_reduced"):
    svm_lib.att_svm(X[0], Z[0], alpha[0], "spectral", solver)
    out[f"{solver}_solves_per_s"] = time_svm(lambda b: svm_lib.att_svm(X[b], Z[b], alpha[b], "spectral", solver), sets)
    res[solver] = [svm_lib.att_svm(X[b], Z[b], alpha[b], "spectral", solver) for b in range(sets)]
  for ref in ("CLARABEL", "SCS"):
    both = [b for b in range(sets) if res[ref][b].ok and res["clarabel_reduced"][b].ok]
    out[f"vs_{ref}"] = out["clarabel_reduced_solves_per_s"] / out[f"{ref}_solves_per_s"]
    out[f"max_rel_objective_diff_vs_{ref}"] = max(
        (abs(res["clarabel_reduced"][b].objective / res[ref][b].objective - 1) for b in both), default=float("nan"))
  return out


def suite_norms(report):
  sets = max(5, FLAGS.svm_sets // 4)
  X, Z, alpha = svm_data(sets, **E2)
  rows = {}
  for norm in FLAGS.norms:
    solver = svm_lib.default_solver(norm)
    svm_lib.att_svm(X[0], Z[0], alpha[0], norm)    # build the DPP problem outside the timing
    ours = time_svm(lambda b: svm_lib.att_svm(X[b], Z[b], alpha[b], norm), sets)
    naive_solver = solver if solver in ("CLARABEL", "SCS") else "SCS"
    naive_svm(X[0], Z[0], alpha[0], norm, naive_solver)
    naive = time_svm(lambda b: naive_svm(X[b], Z[b], alpha[b], norm, naive_solver), max(3, sets // 3))
    rows[norm] = {"ours_solves_per_s": ours, "naive_solves_per_s": naive, "vs_naive": ours / naive,
                  "solver": solver, "naive_solver": naive_solver}
    print(f"svm {norm:>9}: {ours:9.1f} solves/s ({solver}) against naive {naive:8.2f} ({naive_solver}) = "
          f"{ours / naive:.1f}x", flush=True)
    if norm == "spectral":          # the path without cvxpy on the reduced problem, against SCS in the same run
      rows[norm]["direct"] = direct = spectral_direct(X, Z, alpha, sets)
      print(f"svm  spectral: clarabel_reduced {direct['clarabel_reduced_solves_per_s']:.1f} solves/s = "
            f"{direct['vs_CLARABEL']:.1f}x cvxpy's Clarabel, {direct['vs_SCS']:.1f}x cvxpy's SCS; objective within "
            f"{direct['max_rel_objective_diff_vs_SCS']:.0e} of SCS", flush=True)
  report["norms"] = rows


def run_process(args):
  t0 = time.perf_counter()
  proc = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True)
  if proc.returncode != 0:
    raise RuntimeError(f"{' '.join(args)} failed:\n{proc.stderr[-3000:]}")
  return time.perf_counter() - t0


def import_seconds(module: str) -> float:
  """Wall time of a fresh process that imports ``module`` and starts JAX's CPU backend."""
  t0 = time.perf_counter()
  subprocess.run([sys.executable, "-c", f"import {module}, jax; jax.devices()"], check=True)
  return time.perf_counter() - t0


def suite_e2(report):
  rows = []
  for i in range(FLAGS.repeats):
    with tempfile.TemporaryDirectory() as tmp:
      # cold: the compilation cache on (the default) but empty, as on a fresh machine
      wall = run_process(["svmattn", "local_convergence", f"--out={tmp}/out", "--noprogress",
                          f"--compilation_cache_dir={tmp}/cache", *FLAGS.e2_flags])
      with open(os.path.join(tmp, "out", "summary.json")) as f:
        summary = json.load(f)
    t = summary["timings_s"]
    compile_s = t["compile"]
    rows.append({"process_wall_s": wall, "in_process_total_s": t["total"], "compile_s": compile_s,
                 "svm_s": t["svm"], "train_s_excl_compile": t["train"] - compile_s, "overlap": t["overlap"],
                 "corr_W_fro": summary["final_corr"]["W_vs_fro"]["mean"],
                 "corr_KQ_nuc": summary["final_corr"]["KQ_vs_nuc"]["mean"]})
    print(f"e2 run {i}: process {wall:.2f}s (in-process {t['total']:.2f}s, compile {compile_s:.2f}s, "
          f"svm {t['svm']:.2f}s)", flush=True)
  median = float(np.median([r["process_wall_s"] for r in rows]))
  # The floor of a cold run: starting Python and importing the binary (jax, flax, optax, orbax,
  # absl: nothing runs), plus XLA compiling E2's programs, which an empty cache cannot avoid.
  imports = float(np.median([import_seconds(E2_BINARY) for _ in range(FLAGS.repeats)]))
  compile_med = float(np.median([r["compile_s"] for r in rows]))
  report["e2"] = {"runs": rows, "e2_flags": FLAGS.e2_flags, "median_process_wall_s": median,
                  "authors_reference_s": AUTHORS_E2_SECONDS, "speedup_vs_authors": AUTHORS_E2_SECONDS / median,
                  "import_floor_s": imports, "median_compile_s": compile_med,
                  "cold_floor_s": imports + compile_med, "target_s": AUTHORS_E2_SECONDS / 100}
  print(f"e2 default end to end: median {median:.2f} s over {len(rows)} fresh processes, empty compilation "
        f"cache -> {AUTHORS_E2_SECONDS / median:.1f}x faster than the authors' {AUTHORS_E2_SECONDS:.0f} s; floor of a "
        f"cold run: {imports:.2f} s to start and import + {compile_med:.2f} s XLA compile = "
        f"{imports + compile_med:.2f} s (the 100x target is {AUTHORS_E2_SECONDS / 100:.2f} s)", flush=True)


def stage_rates():
  """The rates the floors of ``suite_stages`` use, measured now: the GD kernel (E2 sizes, W,
  B = 1000, as train.train runs it), the Frobenius NNLS solve (the fastest exact Att-SVM),
  memory bandwidth, and the compile and run time of the data generator for one new shape."""
  _, run_s, *_ = gd_kernel(1000, E2["n"], E2["T"], E2["d"], FLAGS.gd_steps)
  kernel = 1000 * FLAGS.gd_steps / run_s
  X, Z, alpha = svm_data(100, **E2)
  svm_lib.att_svm(X[0], Z[0], alpha[0], "fro")
  nnls = time_svm(lambda b: svm_lib.att_svm(X[b], Z[b], alpha[b], "fro"), 100)
  _, bandwidth = machine_peaks()
  spec = data_lib.DataSpec(7, 5, 13)            # a shape no other suite uses: its generator is new
  t0 = time.perf_counter()
  jax.block_until_ready(data_lib.generate(spec, 1, np.arange(1000)))
  first = time.perf_counter() - t0
  again = best_time(lambda: data_lib.generate(spec, 2, np.arange(1000)), max(2, FLAGS.repeats))
  return {"kernel_dataset_steps_per_s": kernel, "nnls_solves_per_s": nnls, "bandwidth_bytes_per_s": bandwidth,
          "generator_first_call_s": first, "generator_run_s": again}


def suite_stages(report):
  if not FLAGS.reproduce_json:
    raise app.UsageError("--suites=stages needs --reproduce_json=OUT/reproduce.json (svmattn reproduce)")
  try:
    with open(FLAGS.reproduce_json) as f:
      records = json.load(f)["experiments"]
  except (OSError, ValueError, KeyError) as e:
    raise app.UsageError(f"--reproduce_json: not a readable reproduce.json: {e}") from None
  rates = stage_rates()
  rows = [row for r in records for row in report_lib.stage_floors(r, rates)]
  print(f"stage floors: GD kernel {rates['kernel_dataset_steps_per_s']:.3g} data-set-steps/s, NNLS "
        f"{rates['nnls_solves_per_s']:.0f} solves/s, {rates['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s", flush=True)
  print(f"{'experiment':<12}{'stage':<14}{'seconds':>9}{'floor':>10}{'x floor':>10}  cause (where above 3x)")
  for row in rows:
    cause = row["cause"] if row["over_floor"] > 3 else ""
    print(f"{row['experiment']:<12}{row['stage']:<14}{row['seconds']:>9.1f}{row['floor_s']:>10.3g}"
          f"{row['over_floor']:>10.3g}  {cause}")
  report["stages"] = {"rates": rates, "rows": rows, "reproduce_json": FLAGS.reproduce_json}


def suite_quick(report):
  with tempfile.TemporaryDirectory() as tmp:
    wall = run_process(["svmattn", "reproduce", f"--out={tmp}", "--quick"])
  report["quick"] = {"reproduce_quick_wall_s": wall}
  print(f"reproduce --quick: {wall:.1f} s", flush=True)


SUITES = {"models": suite_models, "gd": suite_gd, "floor": suite_floor, "svm": suite_svm, "norms": suite_norms, "e2": suite_e2,
          "quick": suite_quick, "stages": suite_stages}


def main(argv):
  del argv
  unknown = set(FLAGS.suites) - set(SUITES)
  if unknown:
    raise app.UsageError(f"--suites: unknown {sorted(unknown)}; known: {sorted(SUITES)}")
  report = {"device": str(jax.devices()[0]), "environment": run_experiment.environment()}
  for name in FLAGS.suites:
    SUITES[name](report)
  if FLAGS.out:
    results_io.write_json(os.path.join(FLAGS.out, "benchmark.json"), report)
    print(f"wrote {FLAGS.out}/benchmark.json")


if __name__ == "__main__":
  app.run(main)
