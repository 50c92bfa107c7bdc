r"""E10: optimizer geometry: what attention converges to under each optimizer (docs/science.md section 10).

For every optimizer of --optimizers (steepest descent in a norm: sd_l1, sd_linf, sd_l<p>,
sd_spectral, sd_nuc; l_p mirror descent md_l<p>; normalized_gd; adam, muon, ...), trains W (and
(K,Q) with --params=W,KQ) on every data set (E2's sizes by default), takes the tokens it selected
and solves the Att-SVM in every norm of --norms at that selection. Predictions: steepest descent
in a norm -> that norm's max-margin solution (for linear classifiers), l_p mirror descent -> the
l_p Att-SVM (proved for attention), Adam -> l_inf, Muon -> spectral (linear classifiers); for
attention the rest is open, and the checks say where a prediction holds. Writes to --out:
  results.npz   W_final_<opt> (B,d,d), selected_<opt> (B,n), corr_<opt>_<norm> (B,S),
                dist_<opt>_<norm> (B,) the final || W/||W|| - W^mm/||W^mm|| || in the norm,
                bregman_<opt>_<norm> (B,) for l_p norms, svm_<norm>_<opt>_status, steps (S,)
                (<opt>_KQ for the (K,Q) runs)
  summary.json  the optimizer x norm tables (mean final corr, distance, Bregman), the nearest
                norm of each optimizer, checks, timings
  geometry.png  the mean final corr table as a heatmap, each optimizer's predicted norm boxed
  curves.png    corr with the predicted norm's SVM against iteration

    python -m experiments.optimizer_geometry --out=results/e10
    python -m experiments.optimizer_geometry --out=/tmp/e10 --optimizers=md_l1.75,md_l3 --norms=l1.75,fro,l3 --init=normal
"""
from __future__ import annotations

from absl import app
from absl import flags
import numpy as np

from . import common
from svmattn.io import plots
from svmattn.studies import optimizer_geometry as e10

FLAGS = flags.FLAGS
common.define_common_flags(runs=100)
common.define_pipeline_flags(batch_size=1000)
common.define_numerics_flag()
flags.DEFINE_integer("n", 6, "Sequences per data set.", lower_bound=1)
flags.DEFINE_integer("T", 8, "Tokens per sequence.", lower_bound=2)
flags.DEFINE_integer("d", 10, "Embedding dimension.", lower_bound=1)
flags.DEFINE_list("optimizers", ["normalized_gd", "sd_l1", "sd_linf", "sd_spectral", "md_l1.75", "md_l3", "adam",
                                 "muon"], "Optimizers (names of svmattn.optim.optimizers.get_optimizer).")
flags.DEFINE_list("norms", ["fro", "l1", "linf", "spectral", "nuc", "l1.75", "l3"],
                  "Att-SVM norms: fro, nuc, spectral, l1, linf, l<p> (p > 1).")
flags.DEFINE_list("params", ["W"], "Parameterizations to train: W, KQ.")
flags.DEFINE_integer("steps", 2000, "Optimizer steps.", lower_bound=0)
flags.DEFINE_float("lr", 0.1, "Learning rate (step size eta).")
flags.DEFINE_enum("init", "uniform", ["uniform", "normal", "zero"], "Initialization (the l_p mirror-descent "
                  "paper starts from N(0,1) entries: normal).")
flags.DEFINE_integer("snapshot_every", 10, "Record W every this many steps.", lower_bound=1)
flags.DEFINE_integer("chunk_steps", 1000, "Steps per jitted chunk; a checkpoint is saved after each.", lower_bound=1)
flags.DEFINE_integer("block_size", 64, "Data sets per vectorized block.", lower_bound=1)
common.positive_float("lr")
common.known_params()


def _known_optimizers(values):
  from svmattn.optim import optimizers
  try:
    for v in values:
      optimizers.get_optimizer(v, 0.1)
  except (ValueError, KeyError, TypeError, AttributeError):
    return False
  return bool(values) and len(set(values)) == len(values)


MAX_P = 100   # l<p> norms: |W|^p of larger p overflows (l1e400 is p = inf)


def _known_norms(values):
  from svmattn.analysis import metrics
  try:
    for v in values:
      metrics.norm_value(np.eye(2), v)
      if v.startswith("l") and v not in ("l1", "linf") and not 1 < float(v[1:]) <= MAX_P:
        return False
  except ValueError:
    return False
  return bool(values) and len(set(values)) == len(values)


flags.register_validator("optimizers", _known_optimizers, message="must list distinct optimizer names such as "
                         "normalized_gd, sd_l1, sd_linf, sd_l3, sd_spectral, sd_nuc, md_l1.75, adam, muon")
flags.register_validator("norms", _known_norms, message="must list distinct norms among fro, nuc, spectral, l1, "
                         f"linf and l<p> with 1 < p <= {MAX_P}")


def main(argv):
  del argv
  common.run_one_cell(e10, draw, report)


def draw(arrays, summary, out):
  names = list(summary["tables"]["corr"])
  norms = summary["norms"]
  table = np.array([[np.nan if summary["tables"]["corr"][o][n] is None else summary["tables"]["corr"][o][n]
                     for n in norms] for o in names])
  fig, (ax,) = plots.figure(width=1.0 + 0.9 * len(norms), height=1.0 + 0.45 * len(names))
  im = ax.imshow(table, cmap="viridis", aspect="auto")
  ax.set_xticks(range(len(norms)), norms)
  ax.set_yticks(range(len(names)), names)
  for i, o in enumerate(names):
    for j, n in enumerate(norms):
      if np.isfinite(table[i, j]):
        ax.text(j, i, f"{table[i, j]:.3f}", ha="center", va="center", fontsize=8,
                color="w" if table[i, j] < np.nanmean(table) else "k")
    pred = summary["nearest"][o]["predicted"]
    if pred in norms:
      j = norms.index(pred)
      ax.add_patch(plots.plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", lw=2))
  ax.set(xlabel="Att-SVM norm", title="mean final corr(W, Att-SVM); red: predicted norm")
  fig.colorbar(im, ax=ax)
  plots.save(fig, f"{out}/geometry.png")

  fig, (ax,) = plots.figure(width=6.5)
  steps = arrays["steps"]
  for k, o in enumerate(names):
    pred = summary["nearest"][o]["predicted"] or "fro"
    if pred in norms:
      plots.band(ax, steps, arrays[f"corr_{o}_{pred}"], f"C{k % 10}", f"{o} vs {pred}")
  ax.set(xlabel="iteration", ylabel="corr with the predicted norm's Att-SVM", ylim=(0, 1.02))
  ax.legend(loc="lower right")
  plots.save(fig, f"{out}/curves.png")


def report(summary):
  norms = summary["norms"]
  lines = [f"E10 optimizer geometry: {summary['data_sets']} data sets; mean final corr(W, Att-SVM in each norm) "
           "at each optimizer's selection; * nearest, [] predicted",
           "  " + " " * 16 + "".join(f"{n:>11}" for n in norms)]
  for o, row in summary["tables"]["corr"].items():
    near, pred = summary["nearest"][o]["by_corr"], summary["nearest"][o]["predicted"]
    cells = []
    for n in norms:
      v = row[n]
      text = "-" if v is None else f"{v:.4f}"
      text = (text + "*") if n == near else text
      text = f"[{text}]" if n == pred else text
      cells.append(f"{text:>11}")
    lines.append(f"  {o:<16}" + "".join(cells))
  common.print_report(lines, summary)


common.distinct_lists()   # a repeated list entry would compute the same thing twice

if __name__ == "__main__":
  app.run(main)
