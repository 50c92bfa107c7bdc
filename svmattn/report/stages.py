"""Stages of a reproduce run (startup, compile, data, train, SVMs and analysis, write, other), and
their floors (``benchmarks.benchmark --suites=stages``)."""
from __future__ import annotations

from svmattn.report import records as records_lib

STAGES = ("startup", "compile", "data", "train", "svm_analysis", "write", "other")


def stage_words(record) -> str:
  """" (startup 1.5 s, compile 2.2 s, ...)": the record's nonzero stages, or "" without them."""
  st = record.get("stages_s") or {}
  shown = [f"{s.replace('svm_analysis', 'SVMs and analysis')} {st[s]:.1f} s" for s in STAGES if st.get(s, 0.0) >= 0.05]
  return f" ({', '.join(shown)})" if shown else ""


def stages(t: dict, wall: float) -> dict:
  """An experiment's wall time cut into STAGES (seconds) from its summary's ``timings_s``:
  startup (process start, imports, flags: wall minus the binary's own total), compile (XLA),
  data (generating or loading data sets), train (device steps, compile excluded; E7's
  regularization paths), svm_analysis (host solvers and analysis: svm, feasibility, analysis),
  write (results, figures, summary) and other (the rest of the binary: reductions). The host
  analysis may run beside training in worker processes, so stages can add up to more than
  the wall time (the summary's ``overlap``)."""
  compile_s = float(t.get("compile", 0.0))
  out = {"startup": max(wall - float(t.get("total", wall)), 0.0), "compile": compile_s,
         "data": float(t.get("data", 0.0)),
         "train": max(float(t.get("train", 0.0)) - compile_s, 0.0) + float(t.get("paths", 0.0)),
         "svm_analysis": sum(float(t.get(k, 0.0)) for k in ("svm", "feasibility", "analysis")),
         "write": float(t.get("write", 0.0))}
  inside = float(t.get("pipeline_wall", 0.0)) + out["write"]
  out["other"] = max(float(t.get("total", 0.0)) - inside, 0.0)
  return out


def stage_table(records: list) -> str:
  """A text table: one row per experiment, one column per stage and the XLA programs it compiled
  (persistent-cache loads are not compiles), then the totals of the paper's experiments (E1-E9)
  and of the ones beyond it."""
  head = f"{'experiment':<14}{'wall':>8}" + "".join(f"{s:>13}" for s in STAGES) + f"{'programs':>10}"
  lines = [head]

  def programs(r):
    return (r.get("work") or {}).get("xla_programs_compiled")

  def row(name, wall, st, n):
    return (f"{name:<14}{wall:>8.1f}" + "".join(f"{st.get(s, 0.0):>13.1f}" for s in STAGES)
            + f"{'-' if n is None else n:>10}")
  for part, beyond in ((f"paper {records_lib.paper_span()}", False), ("beyond", True)):
    chosen = [r for r in records if records_lib.beyond(r) == beyond]
    if not chosen:
      continue
    for r in chosen:
      lines.append(row(r["id"], r["wall_s"], r.get("stages_s", {}), programs(r)))
    total = {s: sum(r.get("stages_s", {}).get(s, 0.0) for r in chosen) for s in STAGES}
    counts = [programs(r) for r in chosen]
    lines.append(row(part, sum(r["wall_s"] for r in chosen), total,
                     None if None in counts else sum(counts)))
  return "\n".join(lines)


def stage_floors(record: dict, rates: dict) -> list[dict]:
  """One row per stage of a reproduce.json record that has a floor: train (its data-set-steps at
  the kernel's rate), data (its bytes at the memory bandwidth) and svm_analysis (one NNLS solve
  per analyzed data set: a lower bound, every data set needs at least one SVM). Compile has no
  floor below itself on a cold run; startup's is the import time (the e2 suite)."""
  work, st = record.get("work") or {}, record.get("stages_s") or {}
  rows = []

  def add(stage, floor, cause):
    seconds = float(st.get(stage, 0.0))
    if floor > 0 and seconds > 0:
      rows.append({"experiment": record["id"], "stage": stage, "seconds": seconds, "floor_s": floor,
                   "over_floor": seconds / floor, "cause": cause})
  steps = work.get("dataset_steps", 0)
  if steps:
    rate = steps / max(st.get("train", 0.0), 1e-9)
    add("train", steps / rates["kernel_dataset_steps_per_s"],
        f"{steps:.3g} data-set-steps at {rate:.3g}/s; the kernel runs {rates['kernel_dataset_steps_per_s']:.3g}/s "
        f"at E2's sizes with the linear head")
  if work.get("data_bytes"):
    cells = max(work.get("cells", 1), 1)
    add("data", work["data_bytes"] / rates["bandwidth_bytes_per_s"],
        f"{cells} shapes, {st.get('data', 0.0) / cells:.2f} s each; a new shape's generator takes "
        f"{rates['generator_first_call_s']:.2f} s on its first call (compiling) and "
        f"{rates['generator_run_s']:.3f} s after")
  if work.get("sets_analyzed"):
    sets = work["sets_analyzed"]
    add("svm_analysis", sets / rates["nnls_solves_per_s"],
        f"{sets} data sets, {1e3 * st.get('svm_analysis', 0.0) / sets:.1f} ms each; one Frobenius NNLS solve takes "
        f"{1e3 / rates['nnls_solves_per_s']:.2f} ms")
  return rows
