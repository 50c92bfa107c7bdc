"""A metric across a sweep's cells or several runs: ``svmattn plot`` and ``results.plot``.

    summary = across_runs.aggregate(df, x="lr", y="final_corr_fro", hue=["d"], col=["param"])
    across_runs.draw(summary, x="lr", y="final_corr_fro", hue=["d"], col=["param"], path="out/plot.png")

``df`` is a table of ``results.load`` (one row per cell, data set and parameterization) or of
``results.load_curves`` (one row per snapshot too: x = "step"). Each line is one value of the
``hue`` fields, each panel one value of the ``col`` fields; the line is the median over the data
sets of each x, the band their 25th..75th percentile (the spread over data sets), and the number
of data sets behind each point is in the aggregated table (``n``). Non-finite values (a diverged
run) are left out of the median and counted in ``n_nonfinite``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from svmattn.io import plots

Q = (0.25, 0.75)      # the band: this quantile range over data sets
MAX_LINES = 12        # more hue values than this: one figure would be unreadable (an error says so)
MAX_PANELS = 12


class PlotError(ValueError):
  """A plot that cannot be drawn as asked (one-line message)."""


def _label(row, fields) -> str:
  return ", ".join(f"{f}={plots_value(row[f])}" for f in fields) if fields else ""


def plots_value(v) -> str:
  return f"{v:.4g}" if isinstance(v, float) else str(v)


def check_fields(df: pd.DataFrame, x: str, y: str, hue: list[str], col: list[str]) -> None:
  """One PlotError naming the first field the table lacks, or a y that is not numeric."""
  for role, names in (("x", [x]), ("y", [y]), ("hue", hue), ("col", col)):
    for name in names:
      if name not in df.columns:
        raise PlotError(f"--{role}={name}: no such column; the table has {', '.join(map(str, df.columns))}")
  if not pd.api.types.is_numeric_dtype(df[y]) or pd.api.types.is_bool_dtype(df[y]):
    raise PlotError(f"--y={y}: not a numeric column (its values are like {df[y].iloc[0]!r}); pick a number such as "
                    + ", ".join(c for c in df.columns if pd.api.types.is_float_dtype(df[c]))[:200])
  if x in hue + col or y in hue + col or x == y:
    raise PlotError("--x, --y, --hue and --col must name different columns")


def aggregate(df: pd.DataFrame, x: str, y: str, hue: list[str] | None = None,
              col: list[str] | None = None) -> pd.DataFrame:
  """One row per (col..., hue..., x): ``median``, ``lo`` and ``hi`` (the Q quantiles) of the finite
  y values, ``n`` (data sets) and ``n_nonfinite``."""
  hue, col = list(hue or []), list(col or [])
  check_fields(df, x, y, hue, col)
  keys = col + hue + [x]
  values = df[y].astype(np.float64)
  finite = np.isfinite(values)
  frame = df[keys].assign(_y=values.where(finite), _bad=~finite)
  groups = frame.groupby(keys, sort=True, dropna=False)
  out = groups["_y"].agg(median="median", lo=lambda s: s.quantile(Q[0]), hi=lambda s: s.quantile(Q[1]))
  out["n"] = groups["_y"].size()
  out["n_nonfinite"] = groups["_bad"].sum().astype(int)
  return out.reset_index()


def draw(summary: pd.DataFrame, x: str, y: str, hue: list[str] | None = None, col: list[str] | None = None,
         path: str = "plot.png", title: str | None = None) -> str:
  """The figure of an ``aggregate`` table, saved at ``path`` (every --figure_format); returns path."""
  hue, col = list(hue or []), list(col or [])
  panels = [None] if not col else list(summary[col].drop_duplicates().itertuples(index=False, name=None))
  lines = [None] if not hue else list(summary[hue].drop_duplicates().itertuples(index=False, name=None))
  if len(lines) > MAX_LINES:
    raise PlotError(f"--hue={','.join(hue)}: {len(lines)} lines, more than {MAX_LINES} in one panel; "
                    "move a field to --col or pick fewer")
  if len(panels) > MAX_PANELS:
    raise PlotError(f"--col={','.join(col)}: {len(panels)} panels, more than {MAX_PANELS}; move a field to --hue")
  numeric_x = pd.api.types.is_numeric_dtype(summary[x]) and not pd.api.types.is_bool_dtype(summary[x])
  categories = list(dict.fromkeys(summary[x].tolist())) if not numeric_x else None
  plt = plots.pyplot()
  ncols = min(len(panels), 4)
  nrows = -(-len(panels) // ncols)
  fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows), squeeze=False, sharey=True)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for k, panel in enumerate(panels):
    ax = axes[k // ncols][k % ncols]
    part = summary if panel is None else summary[(summary[col] == pd.Series(panel, index=col)).all(axis=1)]
    for j, line in enumerate(lines):
      rows = part if line is None else part[(part[hue] == pd.Series(line, index=hue)).all(axis=1)]
      if rows.empty:
        continue
      rows = rows.sort_values(x) if numeric_x else rows
      xs = rows[x].to_numpy(np.float64) if numeric_x else np.array([categories.index(v) for v in rows[x]])
      label = _label(dict(zip(hue, line)), hue) if line is not None else y
      color = colors[j % len(colors)]
      ax.plot(xs, rows["median"], marker="o", ms=3.5, lw=1.6, color=color, label=label)
      ax.fill_between(xs, rows["lo"], rows["hi"], color=color, alpha=0.18, lw=0)
    if numeric_x and _log_spaced(summary[x]):
      ax.set_xscale("log")
    if not numeric_x:
      ax.set_xticks(range(len(categories)), [plots_value(c) for c in categories], rotation=30, ha="right")
    ax.set_xlabel(x)
    if k % ncols == 0:
      ax.set_ylabel(y)
    if panel is not None:
      ax.set_title(_label(dict(zip(col, panel)), col), fontsize=10)
    ax.grid(alpha=0.3)
  for k in range(len(panels), nrows * ncols):
    axes[k // ncols][k % ncols].axis("off")
  handles, labels = axes[0][0].get_legend_handles_labels()
  if hue and handles:
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(labels), 4),
               frameon=False, title=f"line: median over data sets, band: {100 * Q[0]:.0f}th..{100 * Q[1]:.0f}th "
                                    "percentile")
  elif handles:
    axes[0][0].legend(loc="best", title=f"median, band {100 * Q[0]:.0f}..{100 * Q[1]:.0f}th pct")
  if title:
    fig.suptitle(title, fontsize=11)
  fig.tight_layout()
  plots.save(fig, path)
  return path


def _log_spaced(values) -> bool:
  v = np.unique(np.asarray(values, np.float64))
  return len(v) >= 3 and v.min() > 0 and v.max() / v.min() >= 50


def default_metric(df: pd.DataFrame) -> str | None:
  """The metric a sweep's figure shows when none is named: final corr with the Frobenius SVM, else
  the first final corr, else the first final value, else the first float column."""
  floats = [c for c in df.columns if pd.api.types.is_float_dtype(df[c])]
  for pick in (lambda c: c == "final_corr_fro", lambda c: c.startswith("final_corr"),
               lambda c: c.startswith("final_"), lambda c: True):
    found = [c for c in floats if pick(c) and df[c].notna().any()]
    if found:
      return found[0]
  return None


def sweep_fields(df: pd.DataFrame, swept: list[str]) -> tuple[str, list[str], list[str]]:
  """(x, hue, col) of a sweep's default figure: x the first swept setting with a numeric value,
  each parameterization or optimizer a panel, the other swept settings the lines."""
  numeric = [s for s in swept if s in df.columns and pd.api.types.is_numeric_dtype(df[s])]
  x = (numeric or swept)[0]
  col = ["param"] if "param" in df.columns and df["param"].nunique() > 1 else []
  hue = [s for s in swept if s != x]
  return x, hue, col
