r"""The GPU checks of the speed issue, in one command (nothing else depends on them):

    python -m benchmarks.gpu --out=DIR                     # every part, about 6 minutes on one H200
    python -m benchmarks.gpu --out=DIR --parts=gd,determinism --cpu_e2=CPU_E2_DIR

Parts (--parts):
  gd           the GD kernel at E2's sizes (n=6, T=8, d=10), W and (K,Q), B = 1e4 and 1e5, as
               ``train.train`` runs it, for several block sizes and the per-data-set (vmapped)
               program: ns per data-set-step beside the floor. The floor is the larger of the
               step's flops (XLA's count) at the device's float64 matrix rate and its bytes at its
               copy bandwidth, both measured in the same run; "min" counts the data set and its
               state crossing device memory once per call, "stream" once per step (what a program
               that launches kernels step by step must move once the batch exceeds the L2 cache).
  determinism  --det_processes fresh processes per XLA flag setting (--det_labels): the engine's
               own (no XLA_FLAGS: svmattn sets --xla_gpu_autotune_level=0), XLA's autotuning
               (level 4), --xla_gpu_deterministic_ops and --xla_gpu_exclude_nondeterministic_ops:
               whether each setting gives the same bits in every process, and its cost.
  e2           E2 (local_convergence) end to end, each of --e2_runs with its own flags and
               compilation cache (a cache named twice: the second run is warm): wall times, each
               results.npz against the first run's array by array, and with --cpu_e2 the per-run
               final corr differences, selections and checks against a CPU run of the same version.
  e4           E4 (overparam) end to end at --e4_runs data sets per cell, one block per pipeline
               batch (--block_size = --batch_size), while --deadline_s allows.
  padding      E4 at --pad_runs data sets per cell twice, d unpadded (buckets.PAD_D = False) and padded to
               buckets (the GPU's default, train.buckets), each with an empty compilation cache: wall,
               compile and program counts, and per run the corr differences, the same convergence
               types, health labels and selections, and every check's verdict.
  resume       E4 at --resume_runs data sets per cell, its process group killed with SIGKILL after
               --kill_after_s, then run again with --resume in a fresh process (its own compilation
               cache, not the e4 part's): the wall time of both together, and its results.npz against
               the e4 part's uninterrupted run at the same count, array by array, bit for bit.

Every part runs in child processes: XLA reads its flags once per process, and a process that has
started JAX holds most of the GPU's memory. Writes DIR/gpu.json and prints a table per part. The
README's "On a GPU" subsection gives what it measured on an H200.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time

from absl import app
from absl import flags

from benchmarks import flag_checks as checks_lib
from svmattn.config import allowed

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "Directory for gpu.json and the runs' outputs.")
flags.DEFINE_list("parts", ["gd", "determinism", "e2", "e4"], "Parts: gd, determinism, e2, e4, resume, padding.")
flags.DEFINE_string("cpu_e2", None, "A CPU run of E2 at its defaults (its --out) to compare the GPU's with.")
flags.DEFINE_float("deadline_s", 330.0, "Skip what would start after this many seconds.")
flags.DEFINE_integer("gd_steps", 200, "Steps per timed GD call.")
flags.DEFINE_integer("repeats", 2, "Timed calls per row after the first (the best is kept).")
flags.DEFINE_list("rows", [], "(child) rows param:B:block:kernel to time.")
flags.DEFINE_string("child", None, "(child) the part this process runs: gd.")
flags.DEFINE_integer("svm_workers", 12, "SVM worker processes of the E4 runs.")
flags.DEFINE_list("e4_runs", ["500", "10000"], "Data sets per cell of the E4 runs, in order.")
flags.DEFINE_integer("resume_runs", 10000, "Data sets per cell of the resume part's E4 run.")
flags.DEFINE_integer("pad_runs", 500, "Data sets per cell of the padding part's two E4 runs.")
flags.DEFINE_float("kill_after_s", 60.0, "The resume part kills its first E4 process after this many seconds.")

GD_ROWS = ["W:10000:64:block", "W:10000:10000:block", "W:100000:2048:block", "W:100000:100000:block",
           "W:100000:100000:vmapped", "KQ:10000:64:block", "KQ:10000:10000:block", "KQ:100000:2048:block",
           "KQ:100000:100000:block", "KQ:100000:100000:vmapped"]
DET_ROWS = ["W:10000:64:block", "W:100000:100000:block", "KQ:100000:100000:block"]
flags.DEFINE_list("gd_rows", GD_ROWS, "Rows param:B:block:kernel of the gd part (kernel: block or vmapped).")
flags.DEFINE_list("det_rows", DET_ROWS, "Rows of the determinism part (each also among --gd_rows).")
# "engine": no XLA_FLAGS, so svmattn's own default (--xla_gpu_autotune_level=0, see svmattn/__init__.py);
# "autotune_level_4": XLA's default autotuning, which svmattn turns off
DET_FLAGS = {"engine": "", "autotune_level_4": "--xla_gpu_autotune_level=4",
             "deterministic_ops": "--xla_gpu_deterministic_ops=true",
             "exclude_nondeterministic_ops": "--xla_gpu_exclude_nondeterministic_ops=true"}
flags.DEFINE_list("det_labels", list(DET_FLAGS), f"XLA flag settings of the determinism part: {', '.join(DET_FLAGS)}.")
flags.DEFINE_integer("det_processes", 2, "Fresh processes per flag setting in the determinism part.")
flags.DEFINE_list("e2_runs", ["engine:cache_a", "engine:cache_a", "engine:cache_b", "autotune_level_4:cache_c",
                              "autotune_level_4:cache_d", "deterministic_ops:cache_e"],
                  "E2 runs of the e2 part, in order, each FLAG_SETTING:CACHE (a cache named twice: the second run "
                  "is warm).")
flags.DEFINE_float("peak_flops", 0.0, "(child) the device's float64 matrix rate, measured by the parent's peaks child.")
flags.DEFINE_float("peak_bandwidth", 0.0, "(child) the device's copy bandwidth, likewise.")
# The peaks are measured with XLA's autotuning on: svmattn's default --xla_gpu_autotune_level=0 ran a
# float64 4096^3 product at 7.8 TFLOP/s on an H200, against 52.7 with level 4 (cuBLAS's own choice of
# kernel), while the GD step's small products ran within 3-7% either way. The floor is the device's.
PEAK_XLA_FLAGS = "--xla_gpu_autotune_level=4"
E2 = dict(n=6, T=8, d=10)
T0 = time.time()


def _rows_problem(rows):
  for row in rows:
    parts = row.split(":")
    if (len(parts) != 4 or parts[0] not in ("W", "KQ") or not all(p.isdigit() and int(p) >= 1 for p in parts[1:3])
        or parts[3] not in ("block", "vmapped")):
      return f"{row!r} is not PARAM:B:BLOCK:KERNEL (PARAM W or KQ, B and BLOCK integers >= 1, KERNEL block or vmapped)"
  return None


def _e2_runs_problem(runs):
  for run in runs:
    label, _, cache = run.partition(":")
    if label not in DET_FLAGS or not cache.replace("_", "").replace("-", "").isalnum():
      return f"{run!r} is not SETTING:CACHE (SETTING among {', '.join(DET_FLAGS)}; CACHE a plain folder name)"
  return None


def _cpu_e2_problem(path):
  if path is not None and not os.path.isfile(os.path.join(path, "results.npz")):
    return f"{path} holds no results.npz (give the --out of a CPU run of E2)"
  return None


# every value checked when the flags are parsed: one line, nothing run
checks_lib.check("out", allowed.out_dir)
checks_lib.check("gd_rows", _rows_problem)
checks_lib.check("det_rows", _rows_problem)
checks_lib.check("e2_runs", _e2_runs_problem)
checks_lib.check("cpu_e2", _cpu_e2_problem)
checks_lib.check("e4_runs", allowed.int_list(minimum=1))
for _name in ("gd_steps", "repeats", "det_processes"):
  checks_lib.at_least(_name, 1, "an integer >= 1")
checks_lib.at_least("svm_workers", 0, "an integer >= 0")
checks_lib.at_least("deadline_s", 1, "a number of seconds >= 1")
checks_lib.at_least("resume_runs", 1, "an integer >= 1")
checks_lib.at_least("pad_runs", 1, "an integer >= 1")
checks_lib.at_least("kill_after_s", 1, "a number of seconds >= 1")
for _name, _allowed in (("parts", ("gd", "determinism", "e2", "e4", "resume", "padding")), ("det_labels", tuple(DET_FLAGS))):
  flags.register_validator(_name, lambda v, ok=_allowed: bool(v) and all(x in ok for x in v),
                           message=f"must list among {', '.join(_allowed)}")
checks_lib.distinct_lists("parts", "det_labels")


def log(*a):
  print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


# ---------------------------------------------------------------- child: the GD rows
def peaks():
  """float64 matrix rate (4096^3 product) and copy bandwidth (1 GiB read + written) of device 0."""
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.key(0), (4096, 4096), jnp.float64)
  mm = jax.jit(lambda x: x @ x)
  big = jax.random.normal(jax.random.key(1), (128 * 1024 * 1024,), jnp.float64)
  cp = jax.jit(lambda x: x * 1.0000001)

  def best(fn, x, k=5):
    jax.block_until_ready(fn(x))
    ts = []
    for _ in range(k):
      t = time.perf_counter()
      jax.block_until_ready(fn(x))
      ts.append(time.perf_counter() - t)
    return min(ts)
  return 2 * 4096 ** 3 / best(mm, a), 2 * big.nbytes / best(cp, big)


def step_cost(param):
  """(flops, the data set's bytes, its state's bytes) of one data-set-step: XLA's cost analysis of
  the step the engine runs on a block of 64 (the block kernel)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from svmattn.data import datasets as data_lib
  from svmattn.train import block_kernel
  from svmattn.train import loop as train_lib
  cfg = train_lib.TrainConfig(param=param)
  trainer = train_lib.make_trainer(cfg)
  runs = np.arange(64)
  host = data_lib.generate_host(data_lib.DataSpec(**E2), 0, runs)
  dt = data_lib.Dataset(*(jnp.asarray(a) for a in host))
  state = jax.jit(jax.vmap(trainer.init_one))(train_lib.init_keys(0, runs), dt)
  flops, _ = block_kernel.step_cost(cfg, state.params, dt)
  item = 8
  data_bytes = sum(int(np.prod(a.shape[1:])) for a in host) * item
  state_bytes = sum(int(np.prod(x.shape[1:])) for x in jax.tree_util.tree_leaves(state)) * item
  return flops, data_bytes, state_bytes


def gd_row(spec, steps, repeats):
  import numpy as np
  from svmattn.data import datasets as data_lib
  from svmattn.train import block_kernel
  from svmattn.train import loop as train_lib
  param, B, block, kernel = spec.split(":")
  B, block = int(B), int(block)
  block_kernel.ENABLED = kernel != "vmapped"
  train_lib._JIT_CACHE.clear()
  try:
    cfg = train_lib.TrainConfig(param=param, steps=steps, snapshot_every=steps, chunk_steps=steps, block_size=block)
    runs = np.arange(B)
    data = data_lib.generate_host(data_lib.DataSpec(**E2), 0, runs)
    keys = train_lib.init_keys(0, runs)
    t = time.perf_counter()
    first = train_lib.train(cfg, data, keys)
    first_wall = time.perf_counter() - t
    digest = lambda tr: hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in  # noqa: E731
                                                (tr.W, tr.max_prob, tr.loss, tr.attention))).hexdigest()[:16]
    h0, runs_s, same = digest(first), [], True
    for _ in range(repeats):
      tr = train_lib.train(cfg, data, keys)
      runs_s.append(tr.run_seconds)
      same &= digest(tr) == h0
  finally:
    block_kernel.ENABLED = True
    train_lib._JIT_CACHE.clear()
  return {"row": spec, "param": param, "batch": B, "block": block, "kernel": kernel, "steps": steps,
          "compile_s": first.compile_seconds, "first_call_s": first_wall, "run_s": min(runs_s),
          "ns_per_dataset_step": 1e9 * min(runs_s) / (B * steps), "hash": h0, "repeat_same_bits": bool(same),
          "padded_batch": -(-B // block) * block}


def child_gd():
  import svmattn
  svmattn.configure()                # float64 on, as in every binary
  import jax
  dev = jax.devices()[0]
  out = {"device": getattr(dev, "device_kind", str(dev)), "platform": dev.platform, "jax": jax.__version__,
         "xla_flags": os.environ.get("XLA_FLAGS", "")}
  flops, bw = FLAGS.peak_flops, FLAGS.peak_bandwidth
  out.update(matmul_flops=flops, bandwidth=bw)
  costs = {}
  rows = []
  for spec in FLAGS.rows:
    param = spec.split(":")[0]
    if param not in costs:
      costs[param] = step_cost(param)
    f, data_b, state_b = costs[param]
    r = gd_row(spec, FLAGS.gd_steps, FLAGS.repeats)
    stream = data_b + 2 * state_b
    r.update(flops_per_dataset_step=f, stream_bytes=stream, min_bytes=stream / FLAGS.gd_steps,
             compute_floor_ns=1e9 * f / flops, min_floor_ns=1e9 * max(f / flops, stream / FLAGS.gd_steps / bw),
             stream_floor_ns=1e9 * max(f / flops, stream / bw))
    r["x_min_floor"] = r["ns_per_dataset_step"] / r["min_floor_ns"]
    r["x_stream_floor"] = r["ns_per_dataset_step"] / r["stream_floor_ns"]
    rows.append(r)
    print("ROW " + json.dumps(r), flush=True)
  out["rows"] = rows
  print("RESULT " + json.dumps(out), flush=True)


# ---------------------------------------------------------------- parent
def run_child(rows, xla_flags, label, timeout, peak=(float("nan"), float("nan"))):
  env = dict(os.environ, XLA_FLAGS=xla_flags, PYTHONUNBUFFERED="1")
  cmd = [sys.executable, "-m", "benchmarks.gpu", "--child=gd", "--rows=" + ",".join(rows),
         f"--gd_steps={FLAGS.gd_steps}", f"--repeats={FLAGS.repeats}", f"--peak_flops={peak[0]}",
         f"--peak_bandwidth={peak[1]}"]
  log(f"gd child [{label}] XLA_FLAGS='{xla_flags}'")
  t = time.time()
  try:
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired as e:
    return {"label": label, "error": f"timed out after {timeout:.0f} s", "stdout": (e.stdout or "")[-3000:]
            if isinstance(e.stdout, str) else ""}
  res = next((json.loads(l[7:]) for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
  if res is None:
    return {"label": label, "error": f"exit {p.returncode}", "stderr": p.stderr[-3000:]}
  res.update(label=label, wall_s=time.time() - t)
  return res


def print_gd(res):
  log(f"{res.get('device')} ({res.get('platform')}, jax {res.get('jax')}): float64 matmul "
      f"{res['matmul_flops'] / 1e12:.1f} TFLOP/s, copy {res['bandwidth'] / 1e12:.2f} TB/s, XLA_FLAGS='{res['xla_flags']}'")
  print(f"{'param':<6}{'batch':>8}{'block':>8}{'kernel':>9}{'flops':>7}{'ns/step':>9}{'floor min':>10}"
        f"{'x min':>8}{'floor strm':>11}{'x strm':>8}{'compile':>9}  hash")
  for r in res["rows"]:
    print(f"{r['param']:<6}{r['batch']:>8}{r['block']:>8}{r['kernel']:>9}{r['flops_per_dataset_step']:>7.0f}"
          f"{r['ns_per_dataset_step']:>9.2f}{r['min_floor_ns']:>10.3f}{r['x_min_floor']:>8.1f}"
          f"{r['stream_floor_ns']:>11.3f}{r['x_stream_floor']:>8.1f}{r['compile_s']:>9.2f}  {r['hash']}"
          f"{'' if r['repeat_same_bits'] else ' REPEAT DIFFERS'}", flush=True)


def left():
  return FLAGS.deadline_s - (time.time() - T0)


def measure_peaks():
  """(float64 matrix rate, copy bandwidth) of device 0, in a child with XLA's autotuning on."""
  code = "import svmattn; svmattn.configure(); from benchmarks import gpu; print('PEAKS', *gpu.peaks())"
  p = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, XLA_FLAGS=PEAK_XLA_FLAGS),
                     capture_output=True, text=True, timeout=max(30, left()))
  line = next((l.split()[1:] for l in p.stdout.splitlines() if l.startswith("PEAKS ")), None)
  if line is None:
    log("peaks failed:", p.stderr[-2000:])
    return float("nan"), float("nan")
  return float(line[0]), float(line[1])


def part_gd(report):
  res = run_child(FLAGS.gd_rows, "", "engine", max(60, left()), peak=measure_peaks())
  report["gd"] = res
  if "rows" in res:
    print_gd(res)
  else:
    log("gd failed:", json.dumps(res)[:3000])


def part_determinism(report):
  """--det_processes fresh processes per flag setting: each row's bits against the first process of
  the same setting (is the setting deterministic across processes?) and against the first process
  of the engine's own setting (does the setting change the numbers?), and its time against the latter."""
  out, first = [], {}
  for label in FLAGS.det_labels:
    for k in range(FLAGS.det_processes):
      if left() < 30:
        log(f"determinism [{label}] process {k}: skipped (deadline)")
        continue
      res = run_child(FLAGS.det_rows, DET_FLAGS[label], label, max(30, left()))
      res["process"] = k
      out.append(res)
      if "rows" not in res:
        log(f"determinism [{label}] failed:", json.dumps(res)[:2000])
        continue
      for r in res["rows"]:
        own, none = first.setdefault((label, r["row"]), r), first.get(("engine", r["row"]))
        r["same_bits_as_first_process_same_flags"] = r["hash"] == own["hash"]
        r["same_bits_as_engine"] = None if none is None else r["hash"] == none["hash"]
        r["time_vs_engine"] = None if none is None else r["run_s"] / none["run_s"]
        log(f"  [{label} #{k}] {r['row']:<20} {r['ns_per_dataset_step']:8.2f} ns  x{r['time_vs_engine'] or float('nan'):.2f}"
            f" of the engine's  same bits as: its first process {r['same_bits_as_first_process_same_flags']}, the engine's "
            f"{r['same_bits_as_engine']}, its repeat {r['repeat_same_bits']}")
  report["determinism"] = out


# `python -m svmattn ARGS` with the padding of d turned off (svmattn.train.buckets.PAD_D)
_UNPADDED = "import sys; from svmattn.train import buckets; buckets.PAD_D = False; from svmattn import cli; cli.main(sys.argv)"


def run_binary(args, env_extra, timeout):
  """Run ``python -m svmattn ARGS``; env_extra {"pad_d": False}: with d unpadded."""
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  if env_extra.get("pad_d") is False:
    cmd = [sys.executable, "-c", _UNPADDED, "svmattn"] + args
  else:
    cmd = [sys.executable, "-m", "svmattn"] + args
  log("$", " ".join(f"{k}={v}" for k, v in env_extra.items()), " ".join(map(shlex.quote, cmd[1:])))
  t = time.time()
  try:
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    rc, tail = p.returncode, (p.stdout + p.stderr)[-1500:]
  except subprocess.TimeoutExpired:
    rc, tail = "timeout", ""
  wall = time.time() - t
  log(f"  exit {rc}, {wall:.1f} s")
  if rc != 0:
    print(tail, flush=True)
  return {"args": args, "env": env_extra, "rc": rc, "wall_s": wall}


def npz_diff(a, b):
  import numpy as np
  za, zb = np.load(os.path.join(a, "results.npz")), np.load(os.path.join(b, "results.npz"))
  keys = sorted(set(za.files) & set(zb.files))
  differ = [k for k in keys if za[k].shape != zb[k].shape or za[k].tobytes() != zb[k].tobytes()]
  return {"arrays": len(keys), "differ": differ}


def vs_cpu(gpu, cpu):
  """Per-run final corr differences, the share of runs with the same selection, every check's verdict."""
  import numpy as np
  zg, zc = np.load(os.path.join(gpu, "results.npz")), np.load(os.path.join(cpu, "results.npz"))
  out = {}
  for k in zg.files:
    if k.startswith("corr_") and k in zc.files:
      d = np.abs(zg[k][:, -1] - zc[k][:, -1])
      out[k] = {"max": float(np.nanmax(d)), "median": float(np.nanmedian(d))}
    if k.startswith("selected_") and k in zc.files:
      out[k] = {"same_share": float(np.mean(np.all(zg[k] == zc[k], axis=tuple(range(1, zg[k].ndim)))))}
  sg, sc = (json.load(open(os.path.join(x, "summary.json"))) for x in (gpu, cpu))
  out["checks"] = [{"name": g["name"], "gpu_ok": g["ok"], "cpu_ok": c["ok"], "gpu": g.get("value"), "cpu": c.get("value")}
                   for g, c in zip(sg["checks"], sc["checks"])]
  return out


def timings(d):
  try:
    s = json.load(open(os.path.join(d, "summary.json")))
    work = s.get("work") or {}
    return {"timings_s": s.get("timings_s"), "checks_ok": sum(bool(c["ok"]) for c in s["checks"]),
            "checks": len(s["checks"]), "programs_compiled": work.get("xla_programs_compiled"),
            "programs_loaded": work.get("xla_programs_loaded"), "numerics_version": s.get("numerics_version")}
  except (OSError, ValueError, KeyError) as e:
    return {"error": str(e)}


def part_e2(report):
  """The --e2_runs in order; each run's results.npz against the first run's and the first of its own
  flag setting (array by array, bit for bit); the first against --cpu_e2."""
  out, dirs = {}, []
  for i, spec in enumerate(FLAGS.e2_runs):
    label, cache = spec.split(":")
    if left() < 20:
      log(f"e2 {spec}: skipped (deadline)")
      continue
    d = os.path.join(FLAGS.out, f"e2_{i}_{label}")
    xf = DET_FLAGS[label]
    r = run_binary(["local_convergence", f"--out={d}", f"--compilation_cache_dir={os.path.join(FLAGS.out, cache)}"],
                   {"XLA_FLAGS": xf} if xf else {}, max(20, left()))
    r.update(timings(d), label=label, cache=cache,
             warm=any(c == cache for _, c, _ in dirs))
    if r["rc"] == 0:
      for name, (l0, c0, d0) in (("vs_first", dirs[0] if dirs else (None, None, None)),
                                 ("vs_first_same_flags", next((x for x in dirs if x[0] == label), (None, None, None)))):
        if d0 is not None:
          r[name] = npz_diff(d0, d)
      dirs.append((label, cache, d))
    out[f"{i}_{label}"] = r
    log(f"e2 #{i} {label} ({'warm' if r['warm'] else 'cold'}, {cache}): exit {r['rc']}, wall {r['wall_s']:.1f} s, "
        f"checks {r.get('checks_ok')}/{r.get('checks')}, compile {(r.get('timings_s') or {}).get('compile')}, "
        f"train {(r.get('timings_s') or {}).get('train')}; arrays differing from the first run: "
        f"{len(r['vs_first']['differ']) if 'vs_first' in r else None}, from the first with its flags: "
        f"{len(r['vs_first_same_flags']['differ']) if 'vs_first_same_flags' in r else None}")
  if FLAGS.cpu_e2 and dirs:
    out["vs_cpu"] = vs_cpu(dirs[0][2], FLAGS.cpu_e2)
    log("e2 GPU vs CPU:", json.dumps(out["vs_cpu"]))
  report["e2"] = out


def e4_args(runs, out, cache):
  batch = min(int(runs), 10_000)
  return ["overparam", f"--out={out}", f"--runs={runs}", f"--batch_size={batch}", f"--block_size={batch}",
          f"--svm_workers={FLAGS.svm_workers}", "--nokeep_runs", f"--compilation_cache_dir={cache}"]


def part_e4(report):
  out = []
  for runs in FLAGS.e4_runs:
    if left() < 30:
      log(f"e4 runs={runs}: skipped (deadline)")
      continue
    d = os.path.join(FLAGS.out, f"e4_{runs}")
    r = run_binary(e4_args(runs, d, os.path.join(FLAGS.out, "cache_e4")), {}, max(30, left()))
    r.update(timings(d), runs_per_cell=int(runs))
    out.append(r)
    log(f"e4 runs={runs}: wall {r['wall_s']:.1f} s, checks {r.get('checks_ok')}/{r.get('checks')}, "
        f"stages {r.get('timings_s')}")
  report["e4"] = out


def part_resume(report):
  """E4 killed with SIGKILL (its whole process group, SVM workers included) after --kill_after_s,
  then resumed in a fresh process; its results against the e4 part's uninterrupted run."""
  d = os.path.join(FLAGS.out, f"e4_{FLAGS.resume_runs}_resumed")
  args = e4_args(FLAGS.resume_runs, d, os.path.join(FLAGS.out, "cache_resume"))
  cmd = [sys.executable, "-m", "svmattn"] + args
  log("$", " ".join(map(shlex.quote, cmd[1:])), f"(killed after {FLAGS.kill_after_s:.0f} s)")
  t = time.time()
  proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, start_new_session=True)
  try:
    rc = proc.wait(timeout=FLAGS.kill_after_s)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    rc = proc.wait()
  killed_s = time.time() - t
  log(f"  first process ended at {killed_s:.1f} s (exit {rc})")
  r = run_binary(args + ["--resume"], {}, max(30, left()))
  res = {"runs_per_cell": FLAGS.resume_runs, "kill_after_s": FLAGS.kill_after_s, "killed_at_s": killed_s,
         "first_rc": rc, "resume": r, "total_wall_s": killed_s + r["wall_s"], **timings(d)}
  ref = os.path.join(FLAGS.out, f"e4_{FLAGS.resume_runs}")
  if r["rc"] == 0 and os.path.isfile(os.path.join(ref, "results.npz")):
    res["vs_uninterrupted"] = npz_diff(ref, d)
  log(f"resume: killed at {killed_s:.1f} s, resumed run {r['wall_s']:.1f} s, together {res['total_wall_s']:.1f} s, "
      f"checks {res.get('checks_ok')}/{res.get('checks')}; arrays differing from the uninterrupted run: "
      f"{res['vs_uninterrupted']['differ'] if 'vs_uninterrupted' in res else 'not compared'}")
  report["resume"] = res


def e4_vs(a, b):
  """E4 run b against run a: per-run corr differences, the share of runs with the same convergence
  type, health label and selection, and every check's verdict."""
  import numpy as np
  za, zb = np.load(os.path.join(a, "results.npz")), np.load(os.path.join(b, "results.npz"))
  out = {}
  x, y = za["corr"], zb["corr"]
  both = np.isfinite(x) & np.isfinite(y)
  d = np.abs(x[both] - y[both])
  out["corr"] = {"max": float(d.max()) if d.size else None, "median": float(np.median(d)) if d.size else None,
                 "nan_pattern_same": bool(np.array_equal(np.isnan(x), np.isnan(y)))}
  out["same_type"] = float(np.mean(za["types"] == zb["types"]))
  out["same_health"] = float(np.mean(za["health"] == zb["health"]))
  for k in za.files:
    if k.startswith("selected_") and k in zb.files:
      out[f"same_{k}"] = float(np.mean(np.all(za[k] == zb[k], axis=-1)))
  sa, sb = (json.load(open(os.path.join(x, "summary.json"))) for x in (a, b))
  out["health"] = [sa.get("health"), sb.get("health")]
  out["checks"] = [{"name": p["name"], "ok": [p["ok"], q["ok"]], "value": [p.get("value"), q.get("value")]}
                   for p, q in zip(sa["checks"], sb["checks"])]
  return out


def part_padding(report):
  out = {}
  for label, env in (("unpadded", {"pad_d": False}), ("padded", {})):
    if left() < 30:
      log(f"padding {label}: skipped (deadline)")
      continue
    d = os.path.join(FLAGS.out, f"e4_{FLAGS.pad_runs}_{label}")
    r = run_binary(e4_args(FLAGS.pad_runs, d, os.path.join(FLAGS.out, f"cache_{label}")), env, max(30, left()))
    r.update(timings(d))
    out[label] = r
    log(f"padding {label}: wall {r['wall_s']:.1f} s, programs compiled {r.get('programs_compiled')} "
        f"(loaded {r.get('programs_loaded')}), checks {r.get('checks_ok')}/{r.get('checks')}, stages {r.get('timings_s')}")
  if all(out.get(k, {}).get("rc") == 0 for k in ("unpadded", "padded")):
    out["padded_vs_unpadded"] = e4_vs(*(os.path.join(FLAGS.out, f"e4_{FLAGS.pad_runs}_{k}") for k in ("unpadded", "padded")))
    log("padding: padded against unpadded:", json.dumps(out["padded_vs_unpadded"]))
  report["padding"] = out


def main(argv):
  del argv
  if FLAGS.child == "gd":
    child_gd()
    return
  if not FLAGS.out:
    raise app.UsageError("--out is required")
  os.makedirs(FLAGS.out, exist_ok=True)
  report = {"started": time.strftime("%Y-%m-%d %H:%M:%S")}
  try:
    report["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
                                           "--format=csv,noheader"], capture_output=True, text=True,
                                          timeout=30).stdout.strip()
  except (OSError, subprocess.SubprocessError) as e:
    report["nvidia_smi"] = f"unavailable: {e}"
  log("nvidia-smi:", report["nvidia_smi"])
  parts = {"gd": part_gd, "determinism": part_determinism, "e2": part_e2, "e4": part_e4, "resume": part_resume,
           "padding": part_padding}
  for name in FLAGS.parts:
    if left() < 10:
      log(f"{name}: skipped (deadline)")
      continue
    parts[name](report)
    with open(os.path.join(FLAGS.out, "gpu.json"), "w") as f:
      json.dump(report, f, indent=1, default=str)
  log("done")


if __name__ == "__main__":
  import svmattn
  svmattn.configure()
  app.run(main)
