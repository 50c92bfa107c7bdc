"""The numerics comparison: each experiment run with exact numerics and with the authors'
(its variant "authors"), side by side (E2's final correlations, E5's per-d statistics)."""
from __future__ import annotations

from svmattn.report import records as records_lib

NUMERICS_NOTE = (
    "The paper's code normalizes each gradient as g / (||g|| + eps) with eps the float64 machine epsilon, "
    "and pools the tokens as X^T s. That is not normalized GD once ||g|| falls to about eps: every step "
    "then shrinks far below eta, ||W|| stops growing and the run freezes. In E5 a frozen W leaves a dead "
    "Y = -1 sequence (no gradient through its ReLU) with all its tokens above tau_H, which W^SVMeq's "
    "equality constraints describe well; with exact numerics W keeps growing, the other sequences sharpen "
    "that dead sequence onto 2-3 tokens, Gen-SVM predicts it poorly, and the tail of 1 - corr is heavier. "
    "X^T s also loses the gradient to rounding once the softmax saturates (our pooled token does not). "
    "Both columns are shown; `exact` is the default of every binary (--numerics).")

VARIANT = "authors"      # the variant holding the authors' numerics


def ids(records) -> list[str]:
  """The experiments of ``records`` run with both numerics (E2, E5)."""
  return list(dict.fromkeys(records_lib.base_id(r) for r in records if r.get("variant") == VARIANT))


def heading(records) -> str:
  return f"Numerics: exact against the authors' ({', '.join(ids(records))})"


def _fmt(v):
  return records_lib.fmt(v) if v is not None else "-"


def rows(records) -> list[list[str]]:
  """[statistic, exact, authors] rows for E2 and E5, from the runs of both numerics."""
  by = {(records_lib.base_id(r), r.get("variant") or "exact"): r.get("summary", {}) for r in records
        if r.get("returncode") == 0}
  out = []
  for key, name in (("W_vs_fro", "corr(W, Frobenius SVM)"), ("KQ_vs_nuc", "corr(KQ^T, nuclear SVM)")):
    vals = [by.get(("E2", v), {}).get("final_corr", {}).get(key, {}).get("mean") for v in ("exact", VARIANT)]
    if any(v is not None for v in vals):
      out.append([f"E2 mean final {name}"] + [_fmt(v) for v in vals])
  per = {v: by.get(("E5", v), {}).get("per_d", {}) for v in ("exact", VARIANT)}
  for d in sorted(set(per["exact"]) | set(per[VARIANT]), key=int):
    for obj, label in (("svmeq", "W^SVMeq"), ("mm", "W^mm"), ("1token", "W^1token")):
      for stat, sname in (("mean", "1 - mean corr"), ("median", "median 1 - corr"), ("q75", "upper quartile")):
        if obj != "svmeq" and stat != "mean":
          continue
        vals = [per[v].get(d, {}).get("final_one_minus_corr", {}).get(obj, {}).get(stat) for v in ("exact", VARIANT)]
        out.append([f"E5 d={d}: {label} {sname}"] + [_fmt(v) for v in vals])
    norms = [per[v].get(d, {}).get("final_W_norm") for v in ("exact", VARIANT)]
    if any(norms):
      out.append([f"E5 d={d}: final ||W||_F median (10th-90th pct)"] + [
          f"{n['median']:.1f} ({n['p10']:.0f}-{n['p90']:.0f})" if n and n.get("median") is not None else "-"
          for n in norms])
  return out
