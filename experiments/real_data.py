r"""E13: real data, offline (docs/science.md section 14): images as patch-token sequences.

Does attention trained on real images head for an attention SVM, and where does the Gen-SVM
(a finite part plus a max-margin direction) take over? Data sets are random subsets of n images
of a class pair (many per n); n runs from a few sequences to hundreds, across the point where
Att-SVM(alpha) has more constraints, n(T-1), than unknowns, d^2.

Data (no network): scikit-learn's bundled digits (1797 images 8x8, the default) or Fashion-MNIST
from Debian's dataset-fashion-mnist package (`apt-get install dataset-fashion-mnist`, see BUILD.md).

Writes to --out:
  results.npz   per n (suffix _n<n>): W_final_<P> (B,d,d), attention_<P> (B,n,T), selected_<P>,
                svm_<P>_status, corr_<P> (B,S) with Att-SVM, corr_svmeq_W (B,), gensvm_status,
                max_prob_<P>, above_tau_<P>, train_acc_<P>, test_acc_<P>, image (B,n) the images used
  summary.json  per n: feasibility, corr with Att-SVM and with W^SVMeq, sparsity, accuracies; the
                transition against the counting bound n(T-1) = d^2
  vs_n.png      those quantities against n
  attention.png the attention of trained models drawn over their images (a grid of examples)
With --export=PREFIX also PREFIX_n<n>.npz: the data sets of each n in the --data format of the
other binaries (X, Y, Z, v).

    python -m experiments.real_data --out=results/e13
    python -m experiments.real_data --out=results/e13_38 --classes=3,8
    python -m experiments.real_data --out=results/e13_fashion --dataset=fashion_mnist --classes=0,6 --patch=7
"""
from __future__ import annotations

from absl import app
from absl import flags
import numpy as np

from . import common
from svmattn.io import plots
from svmattn.io import results
from svmattn.studies import real_data as e13

FLAGS = flags.FLAGS
flags.DEFINE_integer("runs", 20, "Data sets (random subsets of n images) per n.", lower_bound=1)
flags.DEFINE_integer("seed", 0, "Seed: the train/held-out split and every subset.")
flags.DEFINE_string("out", None, "Results directory (created; files in it are replaced atomically).")
flags.DEFINE_bool("progress", True, "Show progress bars / log lines on stderr.")
flags.DEFINE_bool("compilation_cache", True, "Keep compiled XLA programs on disk.")
flags.DEFINE_string("compilation_cache_dir", common.DEFAULT_CACHE_DIR, "Directory of the persistent compilation cache.")
flags.mark_flag_as_required("out")
flags.register_multi_flags_validator(["compilation_cache", "compilation_cache_dir"], common._enable_cache)
common.define_pipeline_flags(batch_size=1000)
common.define_numerics_flag()
common.figure_format_flag()
flags.DEFINE_enum("dataset", "digits", ["digits", "fashion_mnist"], "Image data: digits (scikit-learn, bundled) or "
                  "fashion_mnist (Debian's dataset-fashion-mnist).")
flags.DEFINE_string("data_dir", None, "fashion_mnist: the directory of its IDX files (default: Debian's "
                    "/usr/share/datasets/fashion-mnist).")
flags.DEFINE_string("classes", "0,1", "A class pair a,b (+1 for a, -1 for b) or a,rest (one class against the rest).")
flags.DEFINE_integer("patch", None, "Patch size p: tokens of p*p pixels (default 2 for digits, 7 for fashion_mnist).",
                     lower_bound=1)
flags.DEFINE_enum("pos", "onehot", ["none", "onehot", "sincos"], "Positional encoding: none, onehot (a scaled one-hot "
                  "of the position appended), sincos (2-D sinusoids added).")
flags.DEFINE_float("pos_scale", 1.0, "Scale of the positional encoding before unit normalization.")
flags.DEFINE_enum("query", "mean", ["mean", "cls"], "mean: cross-attention with the mean token as query; cls: "
                  "self-attention from a fixed [CLS] token.")
flags.DEFINE_enum("head", "fit", list(e13.HEADS), "fit: logistic regression on the mean-pooled tokens, fixed; "
                  "fixed: their class-mean difference; joint: trained with the attention from fit.")
flags.DEFINE_list("n_values", None, "Sequences (images) per data set (default 2,4,8,16,32,64,128,240 for digits, "
                  "4,16,64,256,1024 for fashion_mnist).")
flags.DEFINE_float("test_fraction", 0.3, "Share of the class pair's images held out (accuracy).")
flags.DEFINE_integer("test_size", 1000, "At most this many held-out images are scored.", lower_bound=1)
flags.DEFINE_list("params", ["W"], "Parameterizations: W (Frobenius Att-SVM, Gen-SVM), KQ (nuclear Att-SVM).")
flags.DEFINE_integer("steps", 2000, "Normalized-GD steps.", lower_bound=0)
flags.DEFINE_float("lr", 0.1, "Step size.")
flags.DEFINE_enum("init", "uniform", ["uniform", "normal", "zero"], "Initialization of W (K,Q).")
flags.DEFINE_float("tau_H", 1e-3, "A token is selected when its final probability is >= tau_H (Gen-SVM).")
flags.DEFINE_float("tau_L", 1e-6, "Gen-SVM's lower threshold.")
flags.DEFINE_integer("snapshot_every", 20, "Record W every this many steps.", lower_bound=1)
flags.DEFINE_integer("chunk_steps", 1000, "Steps per jitted chunk; a checkpoint is saved after each.", lower_bound=1)
flags.DEFINE_integer("block_size", 16, "Data sets per vectorized block.", lower_bound=1)
flags.DEFINE_string("export", None, "Also write each n's data sets to PREFIX_n<n>.npz (the --data format).")
common.positive_float("lr")
common.known_params()
flags.register_validator("pos_scale", lambda v: v > 0, message="must be positive")
flags.register_validator("test_fraction", lambda v: 0 < v < 1, message="must be in (0, 1)")
flags.register_multi_flags_validator(["tau_L", "tau_H"], lambda v: 0 < v["tau_L"] < v["tau_H"] < 1,
                                     message="need 0 < tau_L < tau_H < 1")


def _classes_ok(text):
  from svmattn.data import images
  try:
    images.parse_classes(text)
  except ValueError:
    return False
  return True


def _n_values_ok(values):
  if values is None:
    return True
  try:
    ns = [int(v) for v in values]
  except ValueError:
    return False
  return bool(ns) and min(ns) >= 1 and len(set(ns)) == len(ns)


flags.register_validator("classes", _classes_ok, message="must be a,b (two class labels, e.g. 0,1) or a,rest")
flags.register_validator("n_values", _n_values_ok, message="must list distinct positive integers, e.g. 4,16,64")

DEFAULTS = {"digits": {"patch": 2, "n_values": [2, 4, 8, 16, 32, 64, 128, 240]},
            "fashion_mnist": {"patch": 7, "n_values": [4, 16, 64, 256, 1024]}}


def flag_values() -> dict:
  fl = common.flag_values()
  for k, v in DEFAULTS[fl["dataset"]].items():
    if fl.get(k) is None:
      fl[k] = v
  fl["n_values"] = [int(n) for n in fl["n_values"]]
  return fl


def main(argv):
  del argv
  timer = common.Timer()
  fl = flag_values()
  try:
    study = e13.build(fl, {k: v for k, v in fl.items() if k not in common.OPERATIONAL and k != "export"})
  except ValueError as e:       # data.datasets.DataError included: a missing data set, a bad --classes
    common.fail(str(e))
  if FLAGS.export:
    export(study, fl)

  def write(output):
    arrays, summary = e13.reduce(fl, output.cells)
    with timer("write"):
      results.write_npz(f"{FLAGS.out}/results.npz", arrays)
      draw(arrays, summary, fl, FLAGS.out)
    summary = common.write_summary(summary, fl, output, timer)
    report(summary)

  common.run_study(study, write)


def export(study, fl):
  from svmattn.data import datasets as data_lib
  for cell in study.cells:
    batch = study.load(cell, np.arange(cell.runs))
    path = f"{FLAGS.export}_n{cell.label['n']}.npz"
    data_lib.save_npz(path, data_lib.Dataset(batch["X"], batch["Y"], batch["Z"], batch["v"]))
    print(f"exported {cell.runs} data sets with n={cell.label['n']} to {path}")


def _series(summary, p, *keys):
  out = []
  for n in summary["per_n"]:
    v = summary["per_n"][n][p]
    for k in keys:
      v = None if v is None else v.get(k)
    out.append(np.nan if v is None else v)
  return np.asarray(out, np.float64)


def draw(arrays, summary, fl, out):
  ns = np.asarray([int(n) for n in summary["per_n"]])
  bound = summary["transition"][fl["params"][0]]["n_at_counting_bound"]
  fig, axes = plots.figure(ncols=4, width=3.8, height=3.4)
  for k, p in enumerate(fl["params"]):
    c = f"C{k}"
    axes[0].plot(ns, _series(summary, p, "feasible_fraction"), "o-", color=c, label=f"at GD's selection ({p})")
    if k == 0:
      axes[0].plot(ns, _series(summary, p, "opt_feasible_fraction"), "s--", color="C3", label="at the optimal tokens")
      axes[0].plot(ns, _series(summary, p, "random_feasible_fraction"), "^:", color="C4", label="at random tokens")
    axes[1].plot(ns, _series(summary, p, "corr_svm_final", "mean"), "o-", color=c, label=f"{p} vs Att-SVM")
    if p == "W":
      axes[1].plot(ns, _series(summary, p, "corr_svmeq_final", "mean"), "s--", color="C3", label="W vs W^SVMeq")
    axes[2].plot(ns, _series(summary, p, "max_prob", "mean"), "o-", color=c, label=f"{p}: mean max prob")
    axes[2].plot(ns, _series(summary, p, "sequences_on_several_tokens", "mean"), "s--", color=c,
                 label=f"{p}: share on >1 token")
    axes[3].plot(ns, _series(summary, p, "train_acc", "mean"), "o-", color=c, label=f"{p} train")
    axes[3].plot(ns, _series(summary, p, "test_acc", "mean"), "s--", color=c, label=f"{p} held-out")
  titles = ("Att-SVM(alpha) feasible", "mean final corr (where solved)", "attention sparsity", "accuracy")
  for ax, title in zip(axes, titles):
    ax.axvline(bound, color="0.5", ls=":", lw=1)
    ax.set(xscale="log", xlabel="n (images per data set)", title=title)
    ax.set_xticks(ns, [str(n) for n in ns])                 # the n values, not 2x10^0 minor labels
    ax.xaxis.set_minor_formatter(plots.plt.NullFormatter())
    ax.legend()
  axes[0].text(bound, 0.5, " n(T-1) = d^2", fontsize=8, color="0.4", transform=axes[0].get_xaxis_transform())
  plots.save(fig, f"{out}/vs_n.png")
  draw_attention(arrays, summary, fl, out)


def draw_attention(arrays, summary, fl, out, columns: int = 6):
  """Rows: three values of n (smallest, middle, largest); columns: images of run 0 with the final
  attention over their patches (red: attention weight; box: the selected patch)."""
  from svmattn.data import images as images_lib
  images, _ = images_lib.load_images(fl["dataset"], root=fl.get("data_dir") or None)
  H, Wd = images.shape[1:]
  grid = images_lib.patch_grid(H, Wd, fl["patch"])
  ns = [int(n) for n in summary["per_n"]]
  rows = sorted({ns[0], ns[len(ns) // 2], ns[-1]})
  p = fl["params"][0]
  fig = plots.plt.figure(figsize=(1.6 * columns, 1.8 * len(rows)))
  for r, n in enumerate(rows):
    att = arrays[f"attention_{p}_n{n}"][0]                       # (n, T) of run 0
    img = arrays[f"image_n{n}"][0]
    ys = arrays[f"Y_n{n}"][0]
    offset = att.shape[-1] - len(grid)                           # 1 with a [CLS] token first
    for c in range(min(columns, len(img))):
      ax = fig.add_subplot(len(rows), columns, r * columns + c + 1)
      ax.imshow(images[img[c]], cmap="gray_r", vmin=0, vmax=1)
      heat = np.zeros((H, Wd))
      for t, (y0, x0) in enumerate(grid):
        heat[y0:y0 + fl["patch"], x0:x0 + fl["patch"]] = att[c, offset + t]
      ax.imshow(np.dstack([np.ones_like(heat), np.zeros_like(heat), np.zeros_like(heat), 0.6 * heat]))
      top = int(np.argmax(att[c])) - offset
      if top >= 0:
        y0, x0 = grid[top]
        ax.add_patch(plots.plt.Rectangle((x0 - 0.5, y0 - 0.5), fl["patch"], fl["patch"], fill=False,
                                         edgecolor="C0", lw=1.5))
      ax.set_xticks([])
      ax.set_yticks([])
      ax.set_title(f"n={n}, y={int(ys[c]):+d}", fontsize=7)
  fig.suptitle(f"{fl['dataset']} {fl['classes']}: final attention of run 0 (red), selected patch (box)", fontsize=8)
  plots.save(fig, f"{out}/attention.png")


def report(summary):
  lines = [f"E13 real data: {summary['dataset']} classes {summary['classes']}, patch {summary['patch']} "
           f"(T={summary['T']}, d={summary['d']}, pos {summary['pos']}, query {summary['query']}, head {summary['head']})",
           "     n  n(T-1)  d^2  P   feasible  (at opt) (random)  corr(Att-SVM)  corr(SVMeq)  max prob  >1 token  train  held-out"]
  f = lambda d, k="mean": "   -  " if d is None else f"{d[k]:.4f}"  # noqa: E731
  for n, row in summary["per_n"].items():
    for p, e in row.items():
      if not isinstance(e, dict):
        continue
      lines.append(f"  {int(n):>4}  {row['constraints']:>6}  {row['unknowns']:>4} {p:<3} {e['feasible_fraction']:>8.2f}  {e['opt_feasible_fraction']:>8.2f} {e['random_feasible_fraction']:>8.2f}"
                   f"  {f(e['corr_svm_final']):>13}  {f(e.get('corr_svmeq_final')):>11}  {f(e['max_prob']):>8}"
                   f"  {f(e['sequences_on_several_tokens']):>8}  {f(e['train_acc']):>5}  {f(e['test_acc']):>8}")
  for p, t in summary["transition"].items():
    lines.append(f"  {p}: Att-SVM at GD's selection mostly infeasible from n = {t['first_n_mostly_infeasible']}, at the "
                 f"optimal tokens from n = {t['first_n_opt_mostly_infeasible']}, at random tokens from n = "
                 f"{t['first_n_random_mostly_infeasible']}; counting bound n(T-1) = d^2 at "
                 f"n = {t['n_at_counting_bound']:.1f}")
  common.print_report(lines, summary)


common.seed_flag()
common.out_flag()
common.block_fits_batch(default=16)
common.distinct_lists()   # a repeated list entry would compute the same thing twice

if __name__ == "__main__":
  app.run(main)
