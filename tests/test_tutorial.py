"""notebooks/tutorial.ipynb: a valid, output-free notebook, and (slow) executed end to end as a
reader would run it (its QUICK sweep: 4 data sets, 100 steps), checking what each step shows."""
import os

import nbformat
import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO_ROOT, "notebooks", "tutorial.ipynb")
CELLS = ["setup", "sweep", "load", "plot", "compare", "replay", "export"]


def _code_cells(nb):
  return {c.metadata["tags"][0]: c for c in nb.cells if c.cell_type == "code"}


def test_tutorial_is_valid_clean_and_compiles():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  cells = _code_cells(nb)
  assert list(cells) == CELLS
  for tag, cell in cells.items():
    assert not cell.outputs and cell.execution_count is None, f"cell {tag} holds outputs: clear them"
    compile(cell.source, tag, "exec")


@pytest.mark.slow    # a 2-cell E10 sweep, plots, a replay and the exports: about 40 s on 2 cores
def test_tutorial_runs_end_to_end(tmp_path, monkeypatch):
  from ipykernel import kernelspec
  from nbclient import NotebookClient
  kernelspec.install(prefix=str(tmp_path / "jupyter"))
  monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter" / "share" / "jupyter"))
  monkeypatch.setenv("SVMATTN_TUTORIAL_OUT", str(tmp_path / "out"))
  monkeypatch.setenv("SVMATTN_TUTORIAL_QUICK", "1")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  nb = nbformat.read(NOTEBOOK, as_version=4)
  NotebookClient(nb, kernel_name="python3", timeout=600, resources={"metadata": {"path": REPO_ROOT}}).execute()
  text = {}
  for tag, cell in _code_cells(nb).items():
    text[tag] = "".join(o.get("text", "") if o.output_type == "stream" else o.get("data", {}).get("text/plain", "")
                        for o in cell.outputs)
  images = {tag: sum("image/png" in o.get("data", {}) for o in cell.outputs) for tag, cell in _code_cells(nb).items()}
  out = tmp_path / "out"
  assert "sweep of 2 combinations" in text["sweep"] and (out / "sweep" / "sweep.png").exists()
  assert "16 rows" in text["load"] and "final_corr_linf" in text["load"]
  assert images["plot"] == 2 and (out / "linf_vs_lr.png").exists() and (out / "curves.png").exists()
  assert "share of data sets where Adam is nearer the l-inf SVM" in text["compare"] and "checks as expected" in text["compare"]
  assert "identical to the batch" in text["replay"] and "differ from the sweep's record: []" in text["replay"]
  assert (out / "sweep.csv").exists() and (out / "curves.parquet").exists() and "corr_linf" in text["export"]
