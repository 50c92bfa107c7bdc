"""Figure helpers (matplotlib, Agg backend): mean +- std and quantile bands, and figure files.

Every figure is written in each format of ``set_formats`` (the binaries' --figure_format: png by
default, pdf, svg), beside the path given to ``save`` (its extension replaced). Legends are at least
8 pt at the figure's size (rcParams legend.fontsize; set a larger size where needed, never smaller).
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings

import numpy as np

from svmattn.io import atomic_files as results_io

COLORS = {"W": "tab:blue", "KQ": "tab:red"}
FORMATS = ("png", "pdf", "svg")      # the formats ``set_formats`` accepts
LEGEND_FONTSIZE = 8                  # points, at the figure's size (figures are saved at their size)
DPI = 120

_PYPLOT: list = []
_PYPLOT_LOCK = threading.Lock()
_STATE = {"handed_out": False, "warmed": False}


def pyplot(_hand_out: bool = True):
  """matplotlib.pyplot with the Agg backend and this module's rcParams, imported on first use."""
  with _PYPLOT_LOCK:
    if not _PYPLOT:
      import matplotlib
      matplotlib.use("Agg")
      import matplotlib.pyplot as pyplot
      pyplot.rcParams["legend.fontsize"] = pyplot.rcParams["legend.title_fontsize"] = LEGEND_FONTSIZE
      _PYPLOT.append(pyplot)
    _STATE["handed_out"] |= _hand_out
  return _PYPLOT[0]


def warm_up() -> None:
  """Draw one small throwaway figure (a log axis, mathtext tick labels, a title and a legend, at
  ``DPI``, cropped as ``save`` crops): matplotlib's one-time work in a process (finding the
  fonts, building the mathtext parser, laying out its first texts; 0.1-0.3 s) is then done before
  the first real figure. reproduce does it once before it forks its experiments
  (``report.forked.preload``), so no experiment pays for it. (A binary's import thread does not:
  beside training it competes for the interpreter, and E2 from a cold start took 3.5 s instead
  of 2.9.) It holds the lock ``pyplot`` takes, so a figure started meanwhile waits for it, and it
  does nothing once pyplot has been handed out (a figure may be in progress on another thread).
  Figures are the same bytes with or without it (tests/test_figures.py)."""
  pyplot(_hand_out=False)
  with _PYPLOT_LOCK:
    if _STATE["handed_out"] or _STATE["warmed"]:
      return
    import io
    plt_ = _PYPLOT[0]
    fig = plt_.figure(figsize=(2.0, 1.5))
    ax = fig.add_subplot()
    ax.plot([1.0, 10.0, 100.0], [1e-3, 1e-2, 1.0], label="$W$")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_title("warm-up")
    ax.legend()
    fig.savefig(io.BytesIO(), dpi=DPI, bbox_inches="tight", format="png")
    plt_.close(fig)
    _STATE["warmed"] = True


class _LazyPyplot:
  """``plt``: matplotlib.pyplot, imported when first used. The import costs 0.6-0.9 s, which a
  binary spends on a thread while it generates data and compiles (``execution.run_experiment.prepare_process``)."""

  def __getattr__(self, name):
    return getattr(pyplot(), name)


plt = _LazyPyplot()


_formats = ["png"]
_caption = []         # a line ``save`` writes under every figure while ``caption`` is active


@contextlib.contextmanager
def caption(text: str):
  """Within the block, every saved figure carries ``text`` at its foot (e.g. a sweep cell's settings,
  so that a figure names the settings it was drawn for)."""
  _caption.append(text)
  try:
    yield
  finally:
    _caption.pop()


def set_formats(formats) -> None:
  """The formats ``save`` writes every figure in, e.g. ["png", "pdf"] (at least one, each in
  ``FORMATS``; repeats are dropped)."""
  formats = [f.strip().lower() for f in formats]
  bad = [f for f in formats if f not in FORMATS]
  if bad or not formats:
    raise ValueError(f"figure formats must be among {', '.join(FORMATS)} (at least one), got {formats}")
  _formats[:] = list(dict.fromkeys(formats))


def formats() -> list[str]:
  """The formats ``save`` writes (see ``set_formats``)."""
  return list(_formats)


def band(ax, x, curves, color, label, linestyle="-"):
  """Mean +- std over the leading axis of curves (R, S), NaN-aware (an all-NaN column, e.g.
  no SVM solved, leaves a gap)."""
  curves = np.asarray(curves, np.float64)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    mean, std = np.nanmean(curves, 0), np.nanstd(curves, 0)
  ax.plot(x, mean, color=color, linestyle=linestyle, label=label, lw=2)
  ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.2, lw=0)


BAND_MEAN_STD = "line: mean, band: mean $\\pm$ std"


def quantile_band(ax, x, curves, color, label, linestyle="-", q=(0.1, 0.9)):
  """Median and the q[0]..q[1] quantile range over the leading axis of curves (R, S), NaN-aware:
  a band that stays positive, for log axes (mean +- std does not)."""
  curves = np.asarray(curves, np.float64)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    lo, mid, hi = np.nanquantile(curves, [q[0], 0.5, q[1]], axis=0)
  ax.plot(x, mid, color=color, linestyle=linestyle, label=label, lw=2)
  ax.fill_between(x, lo, hi, color=color, alpha=0.2, lw=0)


def quantile_band_caption(q=(0.1, 0.9)) -> str:
  """What ``quantile_band`` draws, for a legend title or caption."""
  return f"line: median, band: {100 * q[0]:.0f}th..{100 * q[1]:.0f}th percentile"


def figure(ncols=1, width=5.0, height=3.8):
  fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
  return fig, list(axes[0])


def save(fig, path):
  """Writes fig as path in every format of ``set_formats`` (path's extension replaced by each
  format's: x.png -> x.png, x.pdf), atomically, and closes it. Vector formats carry no date, so
  equal figures give equal files."""
  root = os.path.splitext(os.fspath(path))[0]
  if _caption:    # below everything drawn (axis labels, a legend under the axes), never over it
    box = fig.get_tightbbox(fig.canvas.get_renderer())       # (inches)
    fig.text(0.5, (box.y0 - 0.06) / fig.get_size_inches()[1], _caption[-1], ha="center", va="top", fontsize=9,
             color="0.3")
  for fmt in _formats:
    metadata = {"pdf": {"CreationDate": None}, "svg": {"Date": None}}.get(fmt)
    with results_io.atomic_path(f"{root}.{fmt}", "." + fmt) as tmp:
      fig.savefig(tmp, dpi=DPI, bbox_inches="tight", format=fmt, metadata=metadata)
  plt.close(fig)
