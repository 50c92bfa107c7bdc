"""Figure output (svmattn.io.plots) and the binaries' --figure_format flag.

Checked:
  * plots.save writes a figure in every format of plots.set_formats (png, pdf, svg), replacing
    the extension of the path it is given; set_formats refuses an unknown format or none.
  * Legends are >= 8 pt: the default (rcParams) and no legend in the binaries' plotting code
    asks for a smaller size.
  * E1 (paths_2d, cheap settings) with --figure_format=png,pdf writes paths.png and paths.pdf;
    a bad --figure_format is refused at flag parsing: non-zero exit, a message naming the flag,
    no traceback, nothing trained.
  * plots.warm_up (reproduce runs it before forking its experiments) leaves figures as they were:
    a figure drawn after it is the same PNG bytes as in a process without it; and it draws nothing
    once pyplot has been handed out (a figure may then be in progress on another thread).
"""
import glob
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO_ROOT
from svmattn.io import plots

ENV = dict(os.environ, PYTHONPATH=REPO_ROOT, JAX_PLATFORMS="cpu")


@pytest.fixture
def formats():
  before = plots.formats()
  yield
  plots.set_formats(before)


def test_save_writes_every_format(tmp_path, formats):
  plots.set_formats(["png", "pdf", "svg"])
  fig, (ax,) = plots.figure()
  ax.plot([0, 1], [0, 1], label="a line")
  ax.legend()
  plots.save(fig, tmp_path / "f.png")
  assert sorted(os.listdir(tmp_path)) == ["f.pdf", "f.png", "f.svg"]
  assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
  assert (tmp_path / "f.pdf").read_bytes()[:5] == b"%PDF-"
  assert b"<svg" in (tmp_path / "f.svg").read_bytes()[:2000]


def test_set_formats_refuses_unknown_formats(formats):
  for bad in (["jpg"], [], ["png", "eps"]):
    with pytest.raises(ValueError, match="figure formats"):
      plots.set_formats(bad)
  plots.set_formats(["PDF", "png", "pdf"])
  assert plots.formats() == ["pdf", "png"]


def test_legends_are_at_least_8_pt():
  fig, (ax,) = plots.figure()
  ax.plot([0, 1], label="x")
  assert ax.legend().get_texts()[0].get_fontsize() >= 8
  plots.plt.close(fig)
  small = []
  drawing = glob.glob(os.path.join(REPO_ROOT, "svmattn", "figures", "*.py"))
  assert len(drawing) >= 10      # (the experiments' figures live there)
  for path in drawing + glob.glob(os.path.join(REPO_ROOT, "svmattn", "studies", "*.py")):
    with open(path) as f:
      for k, line in enumerate(f, 1):
        m = re.search(r"legend\(.*fontsize=(\d+(?:\.\d+)?)", line)
        if m and float(m.group(1)) < plots.LEGEND_FONTSIZE:
          small.append(f"{os.path.basename(path)}:{k}")
  assert not small, small


def _e1(out, *args):
  return subprocess.run([sys.executable, "-m", "experiments.paths_2d", f"--out={out}", "--runs=2", "--steps=30",
                         "--snapshot_every=10", "--svm_workers=0", "--noprogress", *args],
                        cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=600)


@pytest.mark.slow   # an end-to-end run of a binary (CI runs the slow tests too)
def test_figure_format_png_pdf_writes_both(tmp_path):
  proc = _e1(tmp_path, "--figure_format=png,pdf")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (tmp_path / "paths.png").read_bytes()[:4] == b"\x89PNG"
  assert (tmp_path / "paths.pdf").read_bytes()[:5] == b"%PDF-"
  assert not (tmp_path / "paths.svg").exists()


def test_a_bad_figure_format_is_refused_cleanly(tmp_path):
  proc = _e1(tmp_path / "out", "--figure_format=png,jpg")
  assert proc.returncode != 0
  assert "figure_format" in proc.stderr and "png, pdf, svg" in proc.stderr, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  assert not (tmp_path / "out").exists()


def test_a_caption_is_written_under_figures_saved_within_it(tmp_path):
  plots.set_formats(["svg"])
  try:
    with plots.caption("sweep cell lr=0.1"):
      fig, (ax,) = plots.figure()
      ax.plot([0, 1])
      plots.save(fig, str(tmp_path / "a.png"))
    fig, (ax,) = plots.figure()
    ax.plot([0, 1])
    plots.save(fig, str(tmp_path / "b.png"))
  finally:
    plots.set_formats(["png"])
  assert "sweep cell lr=0.1" in (tmp_path / "a.svg").read_text()
  assert "sweep cell" not in (tmp_path / "b.svg").read_text()


_DRAW = """
import sys
from svmattn.io import plots
if sys.argv[2] == "warm":
  plots.warm_up()
fig, (ax,) = plots.figure()
ax.plot([1, 10, 100, 1000], [1.0, 0.3, 1e-2, 1e-4], label="$1 - corr$")
ax.set_xscale("log"); ax.set_yscale("log"); ax.set_title("$W$ vs $W^{mm}$"); ax.legend()
plots.save(fig, sys.argv[1])
"""


def test_warm_up_leaves_figures_the_same_bytes(tmp_path):
  for mode in ("cold", "warm"):
    subprocess.run([sys.executable, "-c", _DRAW, str(tmp_path / f"{mode}.png"), mode], env=ENV, check=True,
                   timeout=120)
  cold, warm = ((tmp_path / f"{m}.png").read_bytes() for m in ("cold", "warm"))
  assert len(cold) > 1000 and cold == warm


def test_warm_up_draws_nothing_once_pyplot_was_handed_out(monkeypatch):
  plt = plots.pyplot()
  before = plt.get_fignums()
  monkeypatch.setattr(plots, "_STATE", {"handed_out": True, "warmed": False})
  plots.warm_up()
  assert plots._STATE["warmed"] is False
  monkeypatch.setattr(plots, "_STATE", {"handed_out": False, "warmed": False})
  plots.warm_up()                     # not handed out: it draws (and closes) its figure
  assert plots._STATE == {"handed_out": False, "warmed": True} and plt.get_fignums() == before
