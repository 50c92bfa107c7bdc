"""E16's figures: the margin-gap curves with their fitted slopes, the nearest norm of every stage,
and the end of the oscillating phase against the step size."""
from __future__ import annotations

import numpy as np

from svmattn.io import plots


def _cell(arrays: dict, tag: str, key: str):
  return arrays.get(f"{tag}__{key}")


def _rate_panel(ax, arrays, tag, rows, fit_from):
  k = 0
  for name, r in rows.items():
    norm = r["target_norm"]
    gap = _cell(arrays, tag, f"gap_{name}_{norm}") if norm else None
    steps = _cell(arrays, tag, "snapshot_steps")
    if gap is None or steps is None or "_lr" in name:
      continue
    x = steps[0]
    health = _cell(arrays, tag, f"health_{name}")
    if health is not None:                  # as in the summary: stalled and diverged runs are left out
      gap = gap[~np.isin(health, ("stalled", "diverged"))]
    if not len(gap):
      continue
    with np.errstate(all="ignore"):
      med = np.nanmedian(np.where(gap > 0, gap, np.nan), axis=0)
    ok = np.isfinite(med) & (x > 0)
    if not ok.any():
      continue
    color = f"C{k % 10}"
    k += 1
    slope = (r.get("slope_gap") or {}).get("mean")
    label = f"{name} ({norm})" + (f", slope {slope:.2f}" if slope is not None else "")
    ax.loglog(x[ok], med[ok], color=color, label=label)
    lo = fit_from * x[-1]
    window = ok & (x >= lo)
    if slope is not None and window.any():
      x0 = x[window][0]
      xs = x[window]
      ax.loglog(xs, med[window][0] * (xs / x0) ** slope, color=color, linestyle="--", linewidth=1)
  ax.set(title=tag.replace("_mb", ", minibatch ").replace("minibatch 0", "full batch"), xlabel="step",
         ylabel="median normalized-margin gap")
  if k:
    ax.legend(fontsize=8, loc="lower left")


def draw(arrays, summary, out, flags, extras=None):
  """OUT/rates.png, OUT/nearest.png and OUT/oscillation.png."""
  cells = summary["cells"]
  tags = list(cells)
  fit_from = summary["fit_window"][0]
  cols = min(len(tags), 2) or 1
  nrows = -(-len(tags) // cols) or 1
  fig, axes = plots.plt.subplots(nrows, cols, figsize=(7.0 * cols, 5.2 * nrows), squeeze=False)
  axes = axes.reshape(-1)
  for ax, tag in zip(axes, tags):
    _rate_panel(ax, arrays, tag, cells[tag], fit_from)
  for ax in axes[len(tags):]:
    ax.set_visible(False)
  fig.tight_layout(rect=(0, 0, 1, 0.97))
  fig.suptitle(f"gap in each optimizer's target norm (median over the data sets not stalled); dashed: the mean fitted slope "
               f"on the last {1 - fit_from:.0%} of the run, drawn from the median's value where the window starts; entries "
               "with their own step size (NAME:LR) are in the summary's tables, not drawn here", fontsize=9)
  plots.save(fig, f"{out}/rates.png")

  names = list(next(iter(cells.values()))) if cells else []
  table = np.full((len(names), len(tags)), np.nan)
  text = [["" for _ in tags] for _ in names]
  for j, tag in enumerate(tags):
    for i, name in enumerate(names):
      r = cells[tag].get(name)
      if r is None:
        continue
      total = sum(r["nearest"].values())
      if not total:
        continue
      want = r["target_norm"] or max(r["nearest"], key=r["nearest"].get)
      hits = sum(v for k, v in r["nearest"].items() if want in k.split("="))
      table[i, j] = hits / total
      # the most common label, named where it excludes the target and outnumbers the target's runs
      top, count = max(r["nearest"].items(), key=lambda kv: kv[1])
      named = f"{top} " if want not in top.split("=") and count > hits else ""
      text[i][j] = f"{named}{hits}/{total}"
  fig, (ax,) = plots.figure(width=2.0 + 1.3 * len(tags), height=1.6 + 0.5 * len(names))
  im = ax.imshow(table, cmap="viridis", vmin=0, vmax=1, aspect="auto")
  ax.set_xticks(range(len(tags)), [t.replace("_mb", "\nmb") for t in tags], fontsize=8)
  ax.set_yticks(range(len(names)), names, fontsize=8)
  for i in range(len(names)):
    for j in range(len(tags)):
      if text[i][j]:
        ax.text(j, i, text[i][j], ha="center", va="center", fontsize=8,
                color="w" if table[i, j] < 0.5 else "k")
  ax.set_title("runs ending nearest the target norm's max-margin solution (or one equal to it), of the runs "
               "used;\na norm is named where more runs end nearest it instead (stalled runs left out)", fontsize=9)
  fig.colorbar(im, ax=ax, label="share")
  plots.save(fig, f"{out}/nearest.png")

  q5 = (summary.get("questions") or {}).get("5_large_steps") or {}
  fig, (ax,) = plots.figure(width=5.5)
  by_model = {}
  for key, v in q5.items():
    by_model.setdefault(key.split("/")[0], []).append(v)
  for k, (model, vs) in enumerate(by_model.items()):
    vs = sorted(vs, key=lambda v: v["lr"])
    lr = np.array([v["lr"] for v in vs])
    med = np.array([np.nan if v["osc_end_median"] is None else v["osc_end_median"] for v in vs], float)
    top = np.array([np.nan if v["osc_end_max"] is None else v["osc_end_max"] for v in vs], float)
    ax.plot(lr, med + 1, "o-", color=f"C{k}", label=f"{model}: median", clip_on=False)
    ax.plot(lr, top + 1, "v:", color=f"C{k}", label=f"{model}: max", clip_on=False)
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_ylim(bottom=0.8)
  from matplotlib import ticker
  ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda y, _: f"{y:g}"))
  ax.yaxis.set_minor_formatter(ticker.NullFormatter())
  ax.set(xlabel="GD step size eta", ylabel="1 + last step at which the loss rose",
         title="GD at constant steps, full batch: end of the oscillating phase\n(1: the loss never rose; linear: "
               "every step, attention: every snapshot)")
  if by_model:
    ax.legend(fontsize=8)
  else:
    ax.text(0.5, 0.5, "no GD entries (gd or gd:LR) in this run", ha="center", va="center", transform=ax.transAxes)
  plots.save(fig, f"{out}/oscillation.png")
