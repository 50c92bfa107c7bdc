"""A finished run as a table: every data set's per-run numbers in one pandas DataFrame.

    from svmattn import results
    df = results.load("out/e2")                         # python -m experiments.local_convergence --out=out/e2
    df.groupby("param").final_corr_fro.mean()           # mean final corr(W, W^mm) of W and of (K,Q)
    df.groupby("param").convergence_type.value_counts()
    curves = results.load_curves("out/e2", metrics=["corr_fro"])
    curves.groupby(["param", "step"]).corr_fro.median()   # or seaborn.lineplot(curves, x="step", y="corr_fro", hue="param")

``load(out)`` reads OUT/runs/study.json and every OUT/runs/cell_CCCC.npz (the per-run arrays the
host analysis returned, one file per cell, leading axis = the cell's analyzed data sets) and
returns one row per (cell, data set, stage). Its columns, in this order:

- ``cell``: the cell's number (C of cell_CCCC.npz), a column (the frame has a plain RangeIndex);
- every key of the cell labels (the settings that vary between cells: E4's ``n`` and ``d``, E6's
  ``lam``, a sweep's swept settings plus the experiment's own grid keys); a label key that clashes
  with a column below is written ``label_KEY``;
- ``run``: the data set's index (the cell's ``runs``/``run`` array; else 0, 1, ...);
- ``param``, only in experiments that train several stages: the stage's name as the array names
  carry it: "W", "KQ" (E1, E2, E7, E12-E15), the optimizer (E10: "normalized_gd", with "_KQ" for
  the (K,Q) parameterization), "seq2seq_W" / "causal_W" (E8), "W" / "W_fixed" (E11, the fixed head);
- one column per per-run metric, the stage's name taken out of the array name (E2's
  ``corr_W_fro`` -> ``corr_fro``, ``svm_fro_W_status`` -> ``svm_fro_status``, E14's
  ``W_head0_max_prob`` -> ``head0_max_prob``): a 1-D per-run array as it is (labels such as
  convergence types, SVM statuses and health are stored as strings already, so nothing is
  decoded), and a per-snapshot array (runs, S) as its last value, named ``final_<metric>``
  (``final_corr_fro``, ``final_max_prob``; E7's per-radius arrays give the value at the largest
  radius). An array that belongs to no stage (E1's ``svm_fro_status``, E13's ``svm_opt_status``)
  is repeated on every stage's row. Matrices and per-sequence vectors (``W_final_W``,
  ``selected_W``, ``optimal_tokens``, ...) are left out.

Rows are what the analysis kept: a study that stops a cell early (E3, E9) or draws until enough
data sets pass its filter has one row per *analyzed draw*: E5's rows are all its draws, its
``outcome`` column says which were kept ("kept") as the paper's runs.

``load_curves(out, metrics=None)`` is the long format of the per-snapshot arrays: one row per
(cell, data set, stage, snapshot) with the columns ``cell``, the label keys, ``run``, ``param``
(as above), ``step`` (the training step of the snapshot; E7: the radius index 0..num_r-1, with the
radius itself in an extra column ``R``), then one column per per-snapshot metric (``corr_fro``,
``max_prob``, ``loss``, ...; ``metrics`` keeps only those). One column per metric is what
``df.groupby([...]).METRIC.median()`` and ``seaborn.lineplot(x="step", y=METRIC, hue="param")``
want; ``df.melt(id_vars=[...])`` gives a metric/value pair where that is handier.

The snapshot steps of a cell are the run's results.npz ``steps`` (a sweep: its combination's
OUT/cells/*/results.npz), else computed from the settings (``steps``, ``snapshot_every``,
``chunk_steps`` of the summary's flags, overridden by the cell's label), else results.npz ``R``
(E7). A run made with --nokeep_runs has no cell files: a single-cell study whose results.npz holds
the cell's per-run arrays as they are (E1, E2, E7, E8, E10-E12, E14, E15) is read from there;
any other raises ``ResultsError``.

Errors (``ResultsError``, a ValueError) are one line: a directory without a run, an unfinished
run, a run that kept no per-run records, an unreadable, corrupt or replaced file (each cell file is
checked against the sha256 that runs/study.json holds), per-run arrays of unequal lengths.

A run is finished when OUT/summary.json exists and OUT/work/ does not (a run removes its work
directory once its results are written). ``load(out, allow_unfinished=True)`` reads what an
unfinished run holds and says what is missing in ``df.attrs["unfinished"]`` (a sentence) and
``df.attrs["missing"]`` (the missing files); on a finished run both are empty.
"""
from __future__ import annotations

import json
import os
import re
import zipfile

import numpy as np
import pandas as pd

from svmattn.report import across_runs
from svmattn import registry
from svmattn.io import atomic_files as results_io
from svmattn.io import record_names
from svmattn.train import loop as train_lib

__all__ = ["ResultsError", "load", "load_curves", "load_many", "plot", "export"]


class ResultsError(ValueError):
  """A results directory that cannot be read as a table (one-line message)."""


_PER_ITEM = record_names.PER_ITEM
# results.npz keys of a combined (multi-cell) reduction: one array per grid value (E5 _d4, E6 _l0, E13 _n2).
_GRID_SUFFIX = re.compile(r"_(d|l|n)\d+$")
_RUN_KEYS = ("runs", "run")


# ----------------------------------------------------------------------------
# Reading files
# ----------------------------------------------------------------------------


def _read_json(path: str) -> dict:
  try:
    with open(path) as f:
      value = json.load(f)
  except OSError as e:
    raise ResultsError(f"{path}: cannot read ({e.strerror or e})") from None
  except ValueError as e:
    raise ResultsError(f"{path}: corrupt JSON ({e})") from None
  if not isinstance(value, dict):
    raise ResultsError(f"{path}: corrupt (expected a JSON object, got {type(value).__name__})")
  return value


def _read_npz(path: str) -> dict[str, np.ndarray]:
  try:
    with np.load(path, allow_pickle=False) as f:
      arrays = {k: f[k] for k in f.files}
  except OSError as e:
    raise ResultsError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
  except (ValueError, zipfile.BadZipFile, EOFError, KeyError) as e:
    raise ResultsError(f"{path}: corrupt .npz ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
  foreign = [k for k, a in arrays.items() if not isinstance(a, np.ndarray)]
  if foreign:
    raise ResultsError(f"{path}: corrupt .npz (its member {foreign[0]!r} is not an array)")
  return arrays


class _Run:
  """What a results directory holds: summary, study description, cell arrays (read lazily)."""

  def __init__(self, out, allow_unfinished: bool = False):
    if not isinstance(out, (str, os.PathLike)):
      raise ResultsError(f"expected a results directory (a path), got {type(out).__name__} {out!r}")
    out = os.fspath(out)
    if not os.path.isdir(out):
      raise ResultsError(f"{out}: no such directory")
    self.out = out
    self.allow_unfinished = allow_unfinished
    summary_path = os.path.join(out, "summary.json")
    study_path = os.path.join(out, "runs", "study.json")
    working = os.path.isdir(os.path.join(out, "work"))
    if not os.path.exists(summary_path) and not os.path.exists(study_path):
      hint = " (an unfinished run: finish it with --resume)" if working else ""
      raise ResultsError(f"{out} holds no finished run (neither summary.json nor runs/study.json){hint}")
    self.missing = [] if os.path.exists(summary_path) else ["summary.json"]
    why = (["no summary.json"] if self.missing else []) + (["its work/ directory is still there"] if working else [])
    self.unfinished = f"an unfinished run ({' and '.join(why)})" if why else ""
    if self.unfinished and not allow_unfinished:
      raise ResultsError(f"{out}: {self.unfinished}; finish it with --resume, or read what it holds with "
                         "load(..., allow_unfinished=True)")
    self.summary = _read_json(summary_path) if os.path.exists(summary_path) else {}
    self.study = _read_json(study_path) if os.path.exists(study_path) else None
    flags = self.summary.get("flags") or self.summary.get("config") or {}
    if not isinstance(flags, dict):
      raise ResultsError(f"{summary_path}: corrupt (its flags are a {type(flags).__name__}, not a mapping)")
    self.flags = dict(flags)
    rows = self.summary.get("cells") if self.summary.get("sweep") else None
    if rows is not None and not (isinstance(rows, list) and all(isinstance(r, dict) for r in rows)):
      raise ResultsError(f"{summary_path}: corrupt (a sweep's cells must be a list of mappings)")
    if self.study is not None:
      if not isinstance(self.study.get("cells"), list):
        raise ResultsError(f"{study_path}: corrupt (no list of cells)")
      for c in self.study["cells"]:
        if not isinstance(c, dict) or not isinstance(c.get("label", {}), dict):
          raise ResultsError(f"{study_path}: corrupt cell entry {c!r}")
      self.cells = [dict(c.get("label") or {}) for c in self.study["cells"]]
      self.cell_runs = [c.get("runs") for c in self.study["cells"]]
      self.cell_sha256 = [c.get("sha256") for c in self.study["cells"]]
    else:
      self.cells, self.cell_runs, self.cell_sha256 = None, None, None
    self._results = None

  @property
  def name(self) -> str:
    return (self.study or {}).get("study") or self.summary.get("name") or self.summary.get("experiment", "?")

  def results(self) -> dict | None:
    if self._results is None:
      path = os.path.join(self.out, "results.npz")
      self._results = _read_npz(path) if os.path.exists(path) else {}
    return self._results or None

  def cell_paths(self) -> list[str]:
    runs_dir = os.path.join(self.out, "runs")
    if self.cells is None:
      return []
    return [os.path.join(runs_dir, f"cell_{c:04d}.npz") for c in range(len(self.cells))]

  def cell_arrays(self):
    """[(cell index, label, arrays)]: from runs/cell_*.npz, or results.npz (see the module doc)."""
    paths = self.cell_paths()
    present = [os.path.exists(p) for p in paths]
    if paths and any(present) and not all(present):
      missing = paths[present.index(False)]
      if not self.allow_unfinished:
        raise ResultsError(f"{self.out}: incomplete per-run record ({os.path.relpath(missing, self.out)} is missing)")
      self.missing += [os.path.relpath(p, self.out) for p, there in zip(paths, present) if not there]
    if any(present):
      return [(c, self.cells[c], self._cell(c, p)) for c, p in enumerate(paths) if present[c]]
    if paths and self.cell_sha256 and any(self.cell_sha256) and self.study.get("runs_kept", True) is not False \
        and not self.allow_unfinished:
      raise ResultsError(f"{self.out}: its per-run record is missing ({os.path.relpath(paths[0], self.out)}, "
                         "which runs/study.json records); results.npz holds reductions only")
    return [(0, self.cells[0] if self.cells else {}, self._fallback())]

  def _cell(self, c: int, path: str) -> dict:
    """A cell file's arrays, checked against its sha256 in study.json and for equal lengths."""
    arrays = _read_npz(path)
    want = self.cell_sha256[c] if self.cell_sha256 else None
    if want is not None and results_io.file_sha256(path) != want:
      raise ResultsError(f"{path}: damaged or replaced (its sha256 is not the one runs/study.json recorded)")
    lengths = {k: np.shape(a)[0] for k, a in arrays.items() if np.ndim(a) >= 1 and k != CELL_STEPS}
    if len(set(lengths.values())) > 1:
      common = max(set(lengths.values()), key=list(lengths.values()).count)
      odd = next(k for k, n in lengths.items() if n != common)
      raise ResultsError(f"{path}: array {odd!r} has {lengths[odd]} rows, the cell's other arrays {common} "
                         "(a cut or foreign array)")
    return arrays

  def _fallback(self) -> dict:
    why = ("it was made with --nokeep_runs" if self.study is not None and self.study.get("runs_kept") is False
           else "it has no runs/ directory")
    if self.cells is not None and len(self.cells) != 1 or self.summary.get("sweep"):
      raise ResultsError(f"{self.out}: the run kept no per-run records ({why}) and its results.npz holds "
                         f"reductions of {len(self.cells or [])} cells; rerun it without --nokeep_runs")
    arrays = self.results() or {}
    run_key = next((k for k in _RUN_KEYS if k in arrays and np.ndim(arrays[k]) == 1), None)
    expected = self.cell_runs[0] if self.cell_runs else None
    if (run_key is None or (expected is not None and len(arrays[run_key]) != expected)
        or any(_GRID_SUFFIX.search(k) for k in arrays)):
      raise ResultsError(f"{self.out}: the run kept no per-run records ({why}) and its results.npz is a "
                         f"reduction, not per-run arrays; rerun it without --nokeep_runs")
    return arrays

  def snapshot_axis(self, label: dict) -> tuple[str, np.ndarray] | None:
    """("step", the snapshot steps) or ("R", the radii) of a cell with ``label``; None if unknown."""
    arrays = None
    sweep_rows = self.summary.get("cells") if self.summary.get("sweep") else None
    if isinstance(sweep_rows, list):        # a sweep: the combination's own results.npz
      for row in sweep_rows:
        settings = row.get("settings") or {}
        if row.get("dir") and all(label.get(k) == v for k, v in settings.items()):
          path = os.path.join(self.out, row["dir"], "results.npz")
          arrays = _read_npz(path) if os.path.exists(path) else None
          break
    else:
      arrays = self.results()
    if arrays and "steps" in arrays and np.ndim(arrays["steps"]) == 1:
      return "step", np.asarray(arrays["steps"])
    identity = (self.study or {}).get("identity")
    settings = {**(identity if isinstance(identity, dict) else {}), **self.flags, **label}
    if all(isinstance(settings.get(k), int) and not isinstance(settings.get(k), bool)
           for k in ("steps", "snapshot_every", "chunk_steps")):
      try:
        plan = train_lib.schedule(settings["steps"], settings["snapshot_every"], settings["chunk_steps"])
        return "step", np.asarray(train_lib.snapshot_steps(plan))
      except (ValueError, TypeError):
        pass
    if arrays and "R" in arrays and np.ndim(arrays["R"]) == 1:
      return "R", np.asarray(arrays["R"])
    return None


# ----------------------------------------------------------------------------
# Array names -> (stage, metric)
# ----------------------------------------------------------------------------


def _stages(arrays_of_cells: list[dict], flags: dict) -> list[str]:
  """The stages (parameterizations / optimizers / modes) the arrays are named by.

  Every training stage has its health label ``health_<stage>`` (``analysis.health``); a study
  with a single stage writes plain ``health``. Records from before the health labels: the
  flags' "params" / "optimizers", where their names occur in the arrays."""
  found = []
  for arrays in arrays_of_cells:
    for k in arrays:
      if k.startswith("health_") and np.ndim(arrays[k]) == 1:
        s = k[len("health_"):]
        if s and s not in found:
          found.append(s)
  if found:
    return found
  names = set().union(*(set(a) for a in arrays_of_cells)) if arrays_of_cells else set()
  for key in ("optimizers", "params"):
    values = flags.get(key)
    if isinstance(values, (list, tuple)) and len(values) > 1:
      hits = [str(v) for v in values if any(_find(n.split("_"), str(v).split("_")) for n in names)]
      if len(hits) > 1:
        return hits
  return []


def _find(tokens: list[str], sub: list[str]) -> list[int]:
  return [i for i in range(len(tokens) - len(sub) + 1) if tokens[i:i + len(sub)] == sub]


def _split_name(name: str, stages: list[str]) -> tuple[str | None, str]:
  """(stage, the name without it) of an array name; (None, name) for an array of no stage.

  The longest stage name that occurs as whole "_"-separated tokens wins (E10's
  "normalized_gd_KQ" over "normalized_gd", E11's "W_fixed" over "W"); where it occurs twice
  (E2's "W_final_W"), the trailing occurrence is the stage unless the name starts with it
  (E14's "W_head0_W_final")."""
  tokens = name.split("_")
  for stage in sorted(stages, key=lambda s: (-len(s.split("_")), -len(s))):
    sub = stage.split("_")
    at = _find(tokens, sub)
    if not at or len(sub) == len(tokens):
      continue
    i = at[0] if at[0] == 0 else at[-1]
    rest = tokens[:i] + tokens[i + len(sub):]
    # a stage token glued to other stage names (E10's "normalized_gd_KQ" when looking for "normalized_gd")
    if i + len(sub) < len(tokens) and "_".join(sub + [tokens[i + len(sub)]]) in stages:
      continue
    return stage, "_".join(rest)
  return None, name


CELL_STEPS = record_names.CELL_STEPS


def _columns(arrays: dict, stages: list[str], S: int | None):
  """({(stage or None, metric): 1-D values}, {(stage or None, metric): (runs, S) values}, runs)."""
  lengths = [np.shape(a)[0] for a in arrays.values() if np.ndim(a) >= 1]
  run_key = next((k for k in _RUN_KEYS if k in arrays and np.ndim(arrays[k]) == 1), None)
  B = len(arrays[run_key]) if run_key else (max(set(lengths), key=lengths.count) if lengths else 0)
  runs = np.asarray(arrays[run_key]) if run_key else np.arange(B)
  scalars, series = {}, {}
  for k, a in arrays.items():
    if k in (run_key, CELL_STEPS) or np.ndim(a) == 0 or np.shape(a)[0] != B or k.endswith(results_io.DIGEST_SUFFIX):
      continue                            # (a per-run matrix's digests are replay's, not a metric)
    stage, metric = _split_name(k, stages)
    if a.ndim == 1:
      scalars[(stage, metric)] = a
    elif a.ndim == 2 and S is not None and a.shape[1] == S and not _PER_ITEM.search(metric):
      series[(stage, metric)] = a
  return scalars, series, runs


def _values(a: np.ndarray):
  if a.dtype.kind in "US":
    return np.asarray(a.tolist(), dtype=object)
  return a


def _frame(run: _Run, curves: bool, metrics=None) -> pd.DataFrame:
  cells = run.cell_arrays()
  stages = _stages([a for _, _, a in cells], run.flags)
  label_keys = list(dict.fromkeys(k for _, label, _ in cells for k in label))
  reserved = {"cell", "run", "param", "step", "R"}
  label_cols = {k: (f"label_{k}" if k in reserved else k) for k in label_keys}
  parts, available = [], []
  for c, label, arrays in cells:
    own = arrays.get(CELL_STEPS)
    axis = ("step", np.asarray(own[0])) if own is not None and np.ndim(own) == 2 and len(own) else run.snapshot_axis(label)
    S = len(axis[1]) if axis else None
    scalars, series, runs = _columns(arrays, stages, S)
    available += [m for _, m in series if m not in available]
    used = [s for s in stages if any(st == s for st, _ in list(scalars) + list(series))]
    per_stage = used or [None]
    B = len(runs)
    for stage in per_stage:
      head = {"cell": np.full(B, c, np.int64)}
      for k in label_keys:
        v = label.get(k)
        head[label_cols[k]] = [tuple(v) if isinstance(v, list) else v] * B
      head["run"] = runs
      if used:
        head["param"] = [stage] * B
      chosen = {}
      if not curves:
        for (st, m), a in scalars.items():
          if st in (stage, None):
            chosen[(st, m)] = _values(a)
        for (st, m), a in series.items():
          if st in (stage, None) and a.shape[1]:
            chosen[(st, "final_" + m)] = _values(a[:, -1])
        cols = _named(chosen, stage, label_cols.values())
        parts.append(pd.DataFrame({**head, **cols}))
      else:
        sel = {(st, m): a for (st, m), a in series.items()
               if st in (stage, None) and (metrics is None or m in metrics)}
        if S is None or not sel:
          continue
        cols = _named(sel, stage, label_cols.values())
        if metrics is not None:            # in the order asked for
          cols = {m: cols[m] for m in metrics if m in cols}
        long = pd.DataFrame(head).iloc[np.repeat(np.arange(B), S)].reset_index(drop=True)
        name, values = axis
        if name == "R":
          long["step"] = np.tile(np.arange(S), B)
          long["R"] = np.tile(values, B)
        else:
          long["step"] = np.tile(values, B)
        for k, a in cols.items():
          long[k] = _values(np.asarray(a).reshape(-1))
        parts.append(long)
  if curves and metrics is not None:
    missing = [m for m in metrics if m not in available]
    if missing:
      raise ResultsError(f"{run.out}: no per-snapshot metric {', '.join(map(repr, missing))} "
                         f"(there are: {', '.join(available) or 'none'})")
  if not parts:
    if curves:
      raise ResultsError(f"{run.out}: the run ({run.name}) has no per-snapshot arrays")
    raise ResultsError(f"{run.out}: no per-run arrays found")
  df = pd.concat(parts, ignore_index=True, sort=False)
  df.attrs["label_columns"] = list(label_cols.values())
  df.attrs.update({"study": run.name, "experiment": run.summary.get("experiment"), "flags": run.flags,
                   "stages": stages, "out": run.out, "unfinished": run.unfinished, "missing": list(run.missing)})
  return df


def _named(chosen: dict, stage, label_cols) -> dict:
  """Metric columns: the stage's own array wins over an array of no stage of the same name."""
  out = {}
  taken = {"cell", "run", "param", "step", "R", *label_cols}
  for (st, m), a in sorted(chosen.items(), key=lambda kv: kv[0][0] is None):
    name = m if m not in taken else f"metric_{m}"
    if name in out:
      if st is None:
        name = f"{m}_shared"
      else:
        continue
    out[name] = a
  return out


# ----------------------------------------------------------------------------
# The API
# ----------------------------------------------------------------------------


def load(out: str, allow_unfinished: bool = False) -> pd.DataFrame:
  """The run (or sweep) in directory ``out`` as a pandas DataFrame, one row per (cell, data set, stage).

  Columns: ``cell`` and the cell's swept settings, ``run`` (the data set's index), ``param`` (the
  parameterization or optimizer, where several are trained), then every per-run metric: a per-run
  array ``x_<P>_y`` as the column ``x_y``, a per-snapshot array as its final value ``final_<name>``
  (for E2: ``final_corr_fro``, ``final_corr_nuc``, ``convergence_type``, ``svm_fro_status``, ...).
  Raises ``ResultsError`` with a one-line reason for a directory that holds no run results, or an
  unfinished run unless ``allow_unfinished`` (then ``df.attrs["unfinished"]`` and ``["missing"]``
  say what is missing)."""
  run = _Run(out, allow_unfinished)
  if run.study is None and not run.results():
    raise ResultsError(f"{run.out} holds no run results (no runs/study.json and no results.npz)")
  return _frame(run, curves=False)


def load_curves(out: str, metrics=None, allow_unfinished: bool = False) -> pd.DataFrame:
  """The per-snapshot arrays of the run in ``out``, long: one row per (cell, data set, stage,
  snapshot) with ``step`` and one column per metric (only ``metrics`` if given); see the module doc
  (and ``load`` for ``allow_unfinished``)."""
  run = _Run(out, allow_unfinished)
  if run.study is None and not run.results():
    raise ResultsError(f"{run.out} holds no run results (no runs/study.json and no results.npz)")
  if isinstance(metrics, str):
    metrics = [metrics]
  if metrics is not None and (not isinstance(metrics, (list, tuple)) or not all(isinstance(m, str) for m in metrics)):
    raise ResultsError(f"load_curves: metrics must be a metric name or a list of them, got {metrics!r}")
  return _frame(run, curves=True, metrics=None if metrics is None else list(metrics))


class MissingField(ResultsError):
  """A field named for a table that neither its columns nor its run's settings hold."""

  def __init__(self, name: str, message: str):
    super().__init__(message)
    self.name = name


def _scalar(v) -> bool:
  return isinstance(v, (bool, int, float, str)) or v is None


def load_many(dirs, curves: bool = False, metrics=None, settings=(), allow_unfinished: bool = False) -> pd.DataFrame:
  """Several runs or sweeps in one table (``load`` of each, or ``load_curves`` with ``curves``): a
  first column ``source`` (each directory as given), then each one's columns. ``settings``: flags of
  a run's summary.json (``lr``, ``steps``, ...) added as columns where its table lacks them, so that
  single runs of different settings can be plotted against one another. A setting that is a file
  (``data``) shows its name. ``allow_unfinished`` as in ``load``."""
  dirs = [dirs] if isinstance(dirs, (str, os.PathLike)) else list(dirs)
  if not dirs:
    raise ResultsError("no results directory given")
  runs = [_Run(d, allow_unfinished) for d in dirs]
  settings = list(settings) + [n for n in _differing([r for r in runs]) if n not in settings]
  frames = []
  for d, run in zip(dirs, runs):
    df = load_curves(d, metrics, allow_unfinished) if curves else load(d, allow_unfinished)
    flags = run.flags
    for name in settings:
      if name in df.columns:
        continue
      if name not in flags:
        raise MissingField(name, f"{d} has no column or setting {name!r} (columns: {', '.join(map(str, df.columns))}; "
                                 f"settings: {', '.join(sorted(flags))})")
      value = flags[name]
      if isinstance(value, (list, tuple)):
        value = ",".join(map(str, value))
      elif isinstance(value, str) and os.sep in value:
        value = os.path.basename(value)
      if not _scalar(value):
        raise ResultsError(f"{d}: setting {name!r} is not a single value ({value!r})")
      df[name] = value
    df.insert(0, "source", os.fspath(d))
    frames.append(df)
  out = pd.concat(frames, ignore_index=True, sort=False) if len(frames) > 1 else frames[0]
  return out


def _differing(runs: list) -> list[str]:
  """The settings (non-operational flags with a single value) whose values differ between runs."""
  if len(runs) < 2:
    return []
  names = []
  for run in runs:
    experiment = registry.of_summary(run.summary)
    skip = {f.name for f in experiment.settings.fields if f.operational} if experiment is not None else {"out"}
    names += [k for k, v in run.flags.items() if k not in skip and k != "sweep" and (_scalar(v) or
                                                                                      isinstance(v, (list, tuple)))]
  names = list(dict.fromkeys(names))
  return [n for n in names if all(n in r.flags for r in runs) and
          len({json.dumps(r.flags[n], sort_keys=True, default=str) for r in runs}) > 1]


def _as_list(v) -> list[str]:
  if v is None:
    return []
  return [v] if isinstance(v, str) else list(v)


def plot(dirs, x: str | None = None, y: str | None = None, hue=None, col=None, path: str | None = None,
         title: str | None = None, allow_unfinished: bool = False) -> tuple[str, pd.DataFrame]:
  """A metric ``y`` against ``x`` across a sweep's cells or several runs, one line per value of the
  ``hue`` fields and one panel per value of the ``col`` fields: the median over data sets with
  their 25th..75th percentile as a band (``svmattn.report.across_runs``). ``x="step"`` plots
  the curves (``load_curves``). Defaults: for one sweep, its default figure (x the first swept
  setting, the parameterizations or optimizers as panels, the other swept settings as lines, y
  final corr with the Frobenius SVM where it has one); several directories, one line each
  (``hue="source"``). The figure goes to ``path`` (default: DIR/plot_Y_vs_X.png of the first
  directory). Returns (path, the aggregated table: median, lo, hi, n, n_nonfinite per point).
  ``allow_unfinished`` as in ``load`` (a sweep draws its figure before its work directory goes)."""
  dirs = [dirs] if isinstance(dirs, (str, os.PathLike)) else list(dirs)
  hue, col = _as_list(hue), _as_list(col)
  curves = x == "step"
  named = [f for f in [x, *hue, *col] if f]
  try:
    df = load_many(dirs, curves=curves, metrics=None if y is None or not curves else [y],
                   settings=[f for f in named if f not in ("source", "step", "param", "run", "cell")],
                   allow_unfinished=allow_unfinished)
  except MissingField as e:
    role = "x" if e.name == x else "hue" if e.name in hue else "col"
    raise ResultsError(f"--{role}={e.name}: no such column or setting: {e}") from None
  swept = list((_Run(dirs[0], allow_unfinished).summary.get("sweep") or {}).keys()) if len(dirs) == 1 else []
  if x is None:
    if not swept:
      raise ResultsError("plot: name --x (a setting, a column or step); only a sweep has a default x")
    x, dhue, dcol = across_runs.sweep_fields(df, swept)
    hue = hue or dhue
    col = col or dcol
  if len(dirs) > 1 and not hue and "source" not in col:
    hue = ["source"]
  if "param" in df.columns and df["param"].nunique() > 1 and "param" not in hue + col and x != "param":
    col = col + ["param"]
  y = y or across_runs.default_metric(df)
  if y is None:
    raise ResultsError("plot: the table has no numeric metric; name one with --y")
  try:
    summary = across_runs.aggregate(df, x, y, hue, col)
    path = path or os.path.join(os.fspath(dirs[0]), f"plot_{y}_vs_{x}.png")
    across_runs.draw(summary, x, y, hue, col, path, title)
  except across_runs.PlotError as e:
    raise ResultsError(str(e)) from None
  return path, summary


EXPORT_FORMATS = ("csv", "parquet")


def export(dirs, path: str, fmt: str | None = None, curves: bool = False, metrics=None) -> pd.DataFrame:
  """Write the table of ``load_many(dirs)`` (``curves``: the long table of ``load_curves``) to
  ``path`` as CSV or Parquet (``fmt``, else from the extension), atomically; returns it."""
  fmt = fmt or os.path.splitext(path)[1].lstrip(".").lower()
  if fmt not in EXPORT_FORMATS:
    raise ResultsError(f"{path}: format {fmt!r} is not one of {', '.join(EXPORT_FORMATS)} (--format)")
  df = load_many(dirs, curves=curves, metrics=metrics)
  with results_io.atomic_path(path, "." + fmt) as tmp:
    if fmt == "csv":
      df.to_csv(tmp, index=False)
    else:
      df.to_parquet(tmp, index=False)
  return df
