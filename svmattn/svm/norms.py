"""Att-SVMs in other norms (host side: NumPy, cvxpy; never traces JAX).

    minimize ||W||   subject to   A vec(W) >= 1      (rows of A: ``att_svm.margin_matrix``)

Norm names (``parse_norm``):
  "fro" = "l2"   Frobenius = entrywise l2 (solved by ``att_svm``'s NNLS path)
  "nuc"          nuclear norm (sum of singular values; ``att_svm``'s SCS path)
  "spectral"     largest singular value (matrix norm), an SDP: cvxpy's sigma_max,
                 i.e. min t s.t. [[t I, W], [W^T, t I]] PSD
  "l1", "linf"   entrywise l1 / l_inf of vec(W): linear programs
  "l<p>"         entrywise lp for any real p > 1 ("l1.75", "l3"): exact 3-d power cones,
                 ||w||_p <= t  <=>  sum_i r_i = t,  r_i^(1/p) t^(1-1/p) >= |w_i|
                 (no rational approximation of p, unlike cvxpy's pnorm)

The dual of min ||w|| s.t. A w >= 1 is max 1^T lam s.t. lam >= 0, ||A^T lam||_dual <= 1, so the
multipliers of the margin constraints (``SVMResult.dual``) sum to the objective and
``dual_norm_value(A^T lam) <= 1`` certifies optimality. Dual pairs: fro-fro, nuc-spectral,
l1-linf, lp-lq with 1/p + 1/q = 1.

One DPP problem per (number of constraints, d, norm), built once (``cvxpy_problem``) and
re-solved with new data. Default solver CLARABEL (interior point: accurate, deterministic,
no warm start); SCS (eps 1e-9, warm_start=False) is the independent check. The spectral SVM
also has "clarabel_reduced" (``svm.nuclear.solve_spectral``: Clarabel without cvxpy on the
problem restricted to the spans the constraints see).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
import threading
import warnings

import numpy as np

from svmattn.svm import nuclear as svm_nuclear

# Matrix norms and entrywise norms with a name of their own; "l<p>" adds any real p > 1.
NAMED = ("fro", "l2", "nuc", "spectral", "l1", "linf")
EXAMPLES = ("fro", "nuc", "spectral", "l1", "l1.75", "l2", "l3", "linf")
ALLOWED = ("'fro' (= 'l2'), 'nuc', 'spectral', 'l1', 'linf', or 'l<p>' for a real p > 1 "
           "(e.g. 'l1.75', 'l3')")
DEFAULT_SOLVER = "CLARABEL"
# warm_start=False for both: cvxpy would otherwise start SCS from the previous solution and
# update() the previous Clarabel solver object in place (which made Clarabel stall with
# InsufficientProgress on re-solves of the power-cone problem); cold starts make a solution
# depend on its own data set only.
SCS_SETTINGS = {"eps": 1e-9, "max_iters": 200_000, "warm_start": False}
CLARABEL_SETTINGS = {"tol_gap_abs": 1e-10, "tol_gap_rel": 1e-10, "tol_feas": 1e-10, "max_iter": 500,
                     "warm_start": False}

_LP = re.compile(r"^l(\d+(?:\.\d*)?|\.\d+)$")


@dataclasses.dataclass(frozen=True)
class Norm:
  """A parsed norm. name: canonical name; kind: fro | nuc | spectral | l1 | linf | lp; p: the
  entrywise exponent (2 for fro, inf for linf, None for nuc / spectral)."""
  name: str
  kind: str
  p: float | None

  @property
  def entrywise(self) -> bool:
    return self.kind in ("fro", "l1", "linf", "lp")


def _p_name(p: float) -> str:
  return f"l{p:.15g}"


def parse_norm(name) -> Norm:
  """Norm of a name; ValueError (naming the allowed forms) for anything else."""
  if isinstance(name, Norm):
    return name
  if not isinstance(name, str):
    raise ValueError(f"unknown SVM norm {name!r}; use {ALLOWED}")
  return _parse(name)


@functools.lru_cache(maxsize=256)
def _parse(name: str) -> Norm:
  s = name.strip().lower()
  if s in ("fro", "frobenius"):
    return Norm("fro", "fro", 2.0)
  if s in ("nuc", "nuclear"):
    return Norm("nuc", "nuc", None)
  if s in ("spectral", "spec", "op"):
    return Norm("spectral", "spectral", None)
  if s in ("linf", "l_inf", "max"):
    return Norm("linf", "linf", math.inf)
  m = _LP.match(s)
  if m is None:
    raise ValueError(f"unknown SVM norm {name!r}; use {ALLOWED}")
  p = float(m.group(1))
  if p == 1.0:
    return Norm("l1", "l1", 1.0)
  if not (p > 1.0 and math.isfinite(p)):
    raise ValueError(f"unknown SVM norm {name!r}: p must be > 1 (or exactly 1 for 'l1'); use {ALLOWED}")
  if p == 2.0:
    return Norm("l2", "fro", 2.0)
  return Norm(_p_name(p), "lp", p)


def norm_value(W: np.ndarray, norm) -> float:
  """||W|| in the named norm."""
  nm = parse_norm(norm)
  W = np.asarray(W, np.float64)
  if nm.kind == "nuc":
    return float(np.linalg.norm(W, "nuc"))
  if nm.kind == "spectral":
    return float(np.linalg.norm(W, 2))
  w = np.abs(W.reshape(-1))
  if nm.kind == "fro":
    return float(np.linalg.norm(w))
  if nm.kind == "l1":
    return float(w.sum())
  if nm.kind == "linf":
    return float(w.max(initial=0.0))
  scale = w.max(initial=0.0)  # lp without overflow
  return 0.0 if scale == 0 else float(scale * np.sum((w / scale) ** nm.p) ** (1 / nm.p))


def dual_norm_value(M: np.ndarray, norm) -> float:
  """||M||_* of the dual norm (spectral <-> nuc, l1 <-> linf, lp <-> lq)."""
  nm = parse_norm(norm)
  if nm.kind == "fro":
    return norm_value(M, "fro")
  if nm.kind == "nuc":
    return norm_value(M, "spectral")
  if nm.kind == "spectral":
    return norm_value(M, "nuc")
  if nm.kind == "l1":
    return norm_value(M, "linf")
  if nm.kind == "linf":
    return norm_value(M, "l1")
  q = nm.p / (nm.p - 1)
  return norm_value(M, Norm(_p_name(q), "lp", q))


def cvxpy_problem(N: int, d: int, norm: str):
  """One DPP problem per (N, d, norm) and thread (a cvxpy problem holds its parameter values
  and solver state, so threads of att_svm_many must not share one): the parameter is the
  constraint matrix A (N, d*d). Returns (problem, A parameter, W variable, margin constraint)."""
  return _cvxpy_problem(N, d, parse_norm(norm).name, threading.get_ident())


@functools.lru_cache(maxsize=256)
def _cvxpy_problem(N: int, d: int, norm: str, thread: int):
  import cvxpy as cp
  nm = parse_norm(norm)
  A = cp.Parameter((N, d * d), name="A")
  W = cp.Variable((d, d), name="W")
  w = cp.vec(W, order="C")
  cons = []
  if nm.kind == "fro":
    objective = cp.norm(w, 2)
  elif nm.kind == "nuc":
    objective = cp.normNuc(W)
  elif nm.kind == "spectral":
    objective = cp.sigma_max(W)
  elif nm.kind == "l1":
    objective = cp.norm1(w)
  elif nm.kind == "linf":
    objective = cp.norm_inf(w)
  else:
    t = cp.Variable(name="t")
    r = cp.Variable(d * d, name="r")
    cons = [cp.sum(r) == t, cp.PowCone3D(r, t * np.ones(d * d), w, 1.0 / nm.p)]
    objective = t
  margin = A @ w >= 1
  prob = cp.Problem(cp.Minimize(objective), [margin] + cons)
  assert prob.is_dpp()
  return prob, A, W, margin


def solve(A: np.ndarray, d: int, norm, solver: str | None = None):
  """min ||W|| s.t. A vec(W) >= 1 through cvxpy. Returns (status, w (d*d,) or None,
  dual (N,) or None, message); w is rescaled so that its smallest margin is 1."""
  import cvxpy as cp
  nm = parse_norm(norm)
  N = A.shape[0]
  if N == 0:
    return "optimal", np.zeros(d * d), np.zeros(0), "no constraints"
  if solver == "clarabel_reduced":
    if nm.kind != "spectral":
      raise ValueError(f"the clarabel_reduced solver solves the spectral SVM only, not {nm.name!r}")
    return svm_nuclear.unit_margin(svm_nuclear.solve_spectral(A, d), A, solver)
  solver = (solver or DEFAULT_SOLVER).upper()
  prob, A_par, W, margin = cvxpy_problem(N, d, nm.name)
  kwargs = SCS_SETTINGS if solver == "SCS" else CLARABEL_SETTINGS if solver == "CLARABEL" else {}
  return solve_problem(prob, A_par, W, margin, A, solver, kwargs)


def solve_problem(prob, A_par, W, margin, A: np.ndarray, solver: str, kwargs: dict):
  """Solve a cached margin problem (parameter A_par, variable W, margin constraint) for the
  constraint matrix A: (status, w rescaled to a smallest margin of exactly 1, the margin
  constraint's duals, message). A solver error, an infeasible problem or an inaccurate
  solution is a status, never an exception."""
  import cvxpy as cp
  A_par.value = A
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")     # "solution may be inaccurate": the status says it
      prob.solve(solver=solver, **kwargs)
  except Exception as e:  # noqa: BLE001 - a solver failure is an outcome
    return "failed", None, None, f"{solver}: {type(e).__name__}: {e}"
  status = prob.status
  if status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
    return "infeasible", None, None, f"{solver}: {status}"
  if status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) or W.value is None:
    return "failed", None, None, f"{solver}: {status}"
  w = np.asarray(W.value, np.float64).reshape(-1)
  lowest = float(np.min(A @ w))
  if not lowest > 0.5:  # an accurate solve has margins 1 - 1e-6 or better
    return "failed", None, None, f"{solver}: {status}, smallest margin {lowest:.3g}"
  dual = None if margin.dual_value is None else np.asarray(margin.dual_value, np.float64).reshape(-1)
  return "optimal", w / lowest, dual, "" if status == cp.OPTIMAL else status
