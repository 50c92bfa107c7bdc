r"""E11: joint training of head and attention (docs/science.md section 11).

The head v trains together with the attention weights (W, (K,Q), or the prompt p of prompt
attention softmax(X p)), each parameter's step normalized by its own gradient norm. Predictions
(Tarzanagh, Li, Zhang, Oymak 2023, arXiv 2306.13596): v -> v^mm, the l2 max-margin classifier
of the selected tokens, and the attention weights -> the relaxed Att-SVM, whose constraints are
>= 1 for v^mm's support vectors and >= 0 for the other sequences. Beside it: the full Att-SVM at
the selection, and the same attention trained with the head held fixed.

  --setting=e2   E2's generator and sizes (n=6, T=8, d=10), 100 data sets, W and (K,Q), 2000 steps
                 (or --data=FILE.npz of E2's format, its v the initial head)
  --setting=toy  the public code's joint setting: n=3, T=2, d=2, prompt attention, p(0) = (0,-1),
                 v(0) = (-1,0), 1000 steps; data sets "tight" and "non-tight"

Writes to --out:
  results.npz   W_final_<param> (B,d,d) ((B,d) for p), v_final_<param> (B,d), selected_<param> (B,n),
                v_mm_<param> (B,d), support_<param> (B,n), W_relaxed_<param>, W_full_<param>, corr_v_<param>,
                corr_relaxed_<param>, corr_full_<param> (B,S), the *_fixed runs' corr_full, statuses, steps (S,)
  summary.json  per parameterization: mean/min final corrs, support vectors, which SVM W is nearer
  joint.png     corr(v, v^mm), corr(W, relaxed), corr(W, full) against iteration, and the fixed-head run
  toy.png       (--setting=toy) the trajectories of p and v with the SVM directions

    python -m experiments.joint_training --out=results/e11
    python -m experiments.joint_training --out=results/e11_toy --setting=toy
"""
from __future__ import annotations

from absl import app
from absl import flags
import numpy as np

from . import common
from svmattn.io import plots
from svmattn.studies import joint_training as e11

FLAGS = flags.FLAGS
common.define_common_flags(runs=100)
common.define_pipeline_flags(batch_size=1000)
common.define_numerics_flag()
flags.DEFINE_enum("setting", "e2", list(e11.SETTINGS), "e2: E2's sizes and generator (or --data); toy: the "
                  "public code's n=3, T=2, d=2 prompt-attention setting.")
flags.DEFINE_integer("n", 6, "Sequences per data set (e2).", lower_bound=1)
flags.DEFINE_integer("T", 8, "Tokens per sequence (e2).", lower_bound=2)
flags.DEFINE_integer("d", 10, "Embedding dimension (e2).", lower_bound=1)
flags.DEFINE_list("params", None, "Attention parameterizations: W, KQ, p (prompt attention). Default: W,KQ "
                  "for e2, p for toy.")
flags.DEFINE_integer("steps", None, "Steps (default 2000 for e2, 1000 for toy).", lower_bound=0)
flags.DEFINE_float("lr", 0.1, "Step size of the per-parameter normalized GD.")
flags.DEFINE_bool("fixed_head", True, "Also train each parameterization with the head held fixed (comparison).")
flags.DEFINE_enum("init", "uniform", ["uniform", "normal", "zero"], "Initialization of the attention weights "
                  "(toy: p(0) = (0,-1) always).")
flags.DEFINE_integer("snapshot_every", 10, "Record the parameters every this many steps.", lower_bound=1)
flags.DEFINE_integer("chunk_steps", 1000, "Steps per jitted chunk; a checkpoint is saved after each.", lower_bound=1)
flags.DEFINE_integer("block_size", 64, "Data sets per vectorized block.", lower_bound=1)
common.positive_float("lr")
flags.register_validator("params", lambda v: v is None or (bool(v) and len(set(v)) == len(v)
                                                         and all(p in ("W", "KQ", "p") for p in v)),
                         message="must list distinct parameterizations among W, KQ, p")


def main(argv):
  del argv
  if FLAGS.setting == "toy" and FLAGS.data:
    common.fail("--data goes with --setting=e2 (--setting=toy runs the public code's own data sets)")
  if FLAGS.setting == "toy" and FLAGS.params not in (None, ["p"]):
    common.fail("--setting=toy trains prompt attention: --params=p (or leave --params out)")
  common.run_one_cell(e11, draw, report)


def draw(arrays, summary, out):
  names = [n for n, row in summary["stages"].items() if row["head"] == "trained"]
  steps = arrays["steps"]
  fig, axes = plots.figure(ncols=len(names), width=5.0)
  for ax, name in zip(axes, names):
    plots.band(ax, steps, arrays[f"corr_v_{name}"], "C0", "corr(v, v^mm)")
    plots.band(ax, steps, arrays[f"corr_relaxed_{name}"], "C1", "corr(W, relaxed Att-SVM)")
    plots.band(ax, steps, arrays[f"corr_full_{name}"], "C2", "corr(W, full Att-SVM)")
    if f"corr_full_{name}_fixed" in arrays:
      plots.band(ax, steps, arrays[f"corr_full_{name}_fixed"], "C7", "fixed head: corr(W, Att-SVM)", "--")
    label = {"W": "W", "KQ": "K Q^T", "p": "p"}[name]
    ax.set(xlabel="iteration", ylabel="correlation", title=f"joint training, {label} ({summary['setting']})")
    ax.set_ylim(min(0.5, ax.get_ylim()[0]), 1.02)
    ax.legend(loc="lower right")
  plots.save(fig, f"{out}/joint.png")
  if summary["setting"] == "toy":
    draw_toy(arrays, out)


def draw_toy(arrays, out):
  """Per toy data set: the angle of p(t) and v(t) against iteration, with the SVMs' angles."""
  from svmattn.studies import joint_training as study
  angle = lambda u: np.degrees(np.arctan2(u[..., 1], u[..., 0]))  # noqa: E731
  fig, axes = plots.figure(ncols=2, width=4.8, height=3.8)
  steps = arrays["steps"]
  for i, ax in enumerate(axes):
    run = np.flatnonzero(arrays["runs"] == i)[0]
    ax.plot(steps, angle(arrays["p_path_p"][run]), color="C0", label="p(t)")
    ax.plot(steps, angle(arrays["v_path_p"][run]), color="C2", label="v(t)")
    for ref, color, style, label in ((arrays["W_full_p"][run], "C3", ":", "full p^mm"),
                                     (arrays["W_relaxed_p"][run], "C1", "--", "relaxed p^mm"),
                                     (arrays["v_mm_p"][run], "C2", "--", "v^mm")):
      ax.axhline(angle(ref), color=color, ls=style, lw=1, label=label)
    ax.set(xscale="symlog", xlim=(0, steps[-1]), xlabel="iteration", ylabel="direction (degrees)",
           title=f"toy, {study.TOY_NAMES[i]} (n=3, T=2, d=2)")
    ax.legend()
  plots.save(fig, f"{out}/toy.png")


def report(summary):
  lines = [f"E11 joint training ({summary['setting']}): {summary['data_sets']} data sets; mean (min) final corr"]
  for name, row in summary["stages"].items():
    f = lambda d: "-" if d["mean"] is None else f"{d['mean']:.4f} ({d['min']:.4f})"  # noqa: E731
    if row["head"] == "trained":
      lines.append(f"  {name:<9} v~v^mm {f(row['corr_v_final'])}  W~relaxed {f(row['corr_relaxed_final'])}  "
                   f"W~full {f(row['corr_full_final'])}  non-support sequences in {row['sets_with_non_support_sequences']} "
                   f"sets: nearer relaxed {row['nearer_relaxed']}, nearer full {row['nearer_full']}")
      lines.append(f"  {'':<9} mean max softmax {row['max_prob_final']:.3f}; v~max-margin classifier of the pooled "
                   f"tokens X^T s {f(row['corr_v_pooled_final'])}")
    else:
      lines.append(f"  {name:<9} (head fixed) W~Att-SVM {f(row['corr_full_final'])}")
  for k, v in summary.get("toy", {}).items():
    lines.append(f"  toy {k}: " + "  ".join(f"{s}: " + ", ".join(f"{c} {x:.5f}" for c, x in d.items())
                                            for s, d in v.items()))
  common.print_report(lines, summary)


common.block_fits_batch()
common.distinct_lists()   # a repeated list entry would compute the same thing twice

if __name__ == "__main__":
  app.run(main)
