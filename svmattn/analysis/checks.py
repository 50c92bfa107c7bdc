"""A check's verdict: ok, FAIL, or not evaluated (most of the runs it speaks of did not train).

A study's check is {"name", "value", "expected", "ok": bool, ...}. One that names the health
groups of its runs ("runs": [group, ...], keys of ``analysis.health.summary``) is not evaluated
where at least half of those runs diverged or stalled: its value would describe runs that never
reached a result (at --lr=1e8 every md_l3 run of E10 stalls at its first step). ``gate`` then
sets "ok" to None and a "reason"; the value is kept, for the record. Unsaturated runs count as
trained (still on their way to a selection; the checks' own notes say so).
"""
from __future__ import annotations

NOT_TRAINED = ("diverged", "stalled")


def gate(checks: list, health: dict | None) -> list:
  """``checks`` with every check over mostly diverged or stalled runs marked not evaluated."""
  out = []
  for c in checks:
    groups = c.get("runs")
    counts = [health[g] for g in groups if g in health] if groups and isinstance(health, dict) else []
    total = sum(sum(v for v in h.values()) for h in counts)
    bad = {label: sum(h.get(label, 0) for h in counts) for label in NOT_TRAINED}
    if total and 2 * sum(bad.values()) >= total:
      said = ", ".join(f"{k} {label}" for label, k in bad.items() if k)
      c = {**c, "ok": None, "reason": f"{said} of its {total} runs (no trained result to check)"}
    out.append(c)
  return out


def verdict(check: dict) -> str:
  """"ok", "FAIL" or "not evaluated"."""
  ok = check.get("ok")
  return "not evaluated" if ok is None else ("ok" if ok else "FAIL")


def tally(checks: list) -> dict:
  """{"ok": held, "total": evaluated, "failing": [names], "not_evaluated": [names]}."""
  checks = checks or []
  return {"ok": sum(c.get("ok") is True for c in checks),
          "total": sum(c.get("ok") is not None for c in checks),
          "failing": [c.get("name", "") for c in checks if c.get("ok") is False],
          "not_evaluated": [c.get("name", "") for c in checks if c.get("ok") is None]}
