"""A reproduce run's records (OUT/reproduce.json) and what the report reads from them.

One record per experiment run (a variant is its own record, id E2-authors, directory
local_convergence_authors). The claim or question, the beyond-the-paper split, the titles, the
variants' labels and the key numbers come from the experiment's registry entry
(``svmattn.registry``); a record whose experiment is not registered keeps what it carries.
"""
from __future__ import annotations

import json
import os
import re

from svmattn import registry
from svmattn.analysis import checks as checks_lib


def expected(check: dict) -> str:
  """A check's expectation, with its calibration note where the run is below the paper's size."""
  return str(check["expected"]) + (f" ({check['note']})" if check.get("note") else "")


def load(out: str) -> tuple[list[dict], dict]:
  """(records, meta) of the reproduce run in ``out`` (its reproduce.json)."""
  with open(os.path.join(out, "reproduce.json")) as f:
    run = json.load(f)
  return run["experiments"], run["meta"]


def read_summary(path: str) -> dict | None:
  """The summary.json at ``path`` (a file or its directory), or None when absent or unreadable."""
  if os.path.isdir(path):
    path = os.path.join(path, "summary.json")
  try:
    with open(path) as f:
      got = json.load(f)
  except (OSError, ValueError):
    return None
  return got if isinstance(got, dict) else None


def summary_json(record, out) -> dict:
  """The experiment's own summary.json (for key numbers the record does not carry), or {}."""
  if not out or not record.get("dir"):
    return {}
  return read_summary(os.path.join(out, record["dir"])) or {}


# ----------------------------------------------------------------------------------------------------------
# The registry's entry of a record


def base_id(record) -> str:
  return record["id"].split("-")[0]


def experiment(record_or_id) -> registry.Experiment | None:
  """The registry entry of a record (or an id), None where it is not registered."""
  eid = record_or_id if isinstance(record_or_id, str) else base_id(record_or_id)
  try:
    return registry.get(eid)
  except registry.UnknownExperiment:
    return None


def variant_of(record) -> registry.Variant | None:
  exp, name = experiment(record), record.get("variant") or ""
  if exp is None or not name:
    return None
  return next((v for v in exp.variants if v.name == name), None)


def title(record) -> str:
  """The experiment's (or the variant's) title in the registry, else the record's."""
  variant = variant_of(record)
  if variant is not None:
    return variant.title
  exp = experiment(record)
  if exp is not None and not record.get("variant"):
    return exp.title
  return record.get("title", "")


def beyond(record) -> bool:
  exp = experiment(record)
  return bool(exp.beyond) if exp is not None else bool(record.get("beyond"))


def claim_text(record) -> tuple[str, bool]:
  """(the paper's claim or the question beyond it, beyond) of a record's experiment."""
  exp = experiment(record)
  if exp is not None:
    return exp.claim, bool(exp.beyond)
  return "", bool(record.get("beyond"))


def variant_label(record) -> str:
  """A variant's short name: its title after the experiment's name, without the parenthesis
  ("Local convergence, the authors' numerics (g / ...)" -> "the authors' numerics"), else its name."""
  name = record.get("variant") or ""
  full = title(record) if name else ""
  if ", " in full:
    label = full.split(", ", 1)[1]
    label = re.sub(r"\s*\(.*$", "", label).strip()
    if label:
      return label
  return name


# ----------------------------------------------------------------------------------------------------------
# Verdicts and numbers


def fmt(value) -> str:
  if isinstance(value, bool):
    return str(value)
  if isinstance(value, float):
    return f"{value:.4g}"
  if isinstance(value, (list, tuple)):
    return ", ".join(fmt(v) for v in value)
  if isinstance(value, dict):
    return ", ".join(f"{k} {fmt(v)}" for k, v in value.items())
  return str(value)


def anchor(record_or_id) -> str:
  key = record_or_id if isinstance(record_or_id, str) else record_or_id["id"]
  return re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")


def failed(record) -> bool:
  return record.get("returncode") != 0 or "error" in record


def counts(record) -> tuple[int, int]:
  """(checks as expected, checks evaluated) of one record."""
  t = checks_lib.tally(record.get("checks"))
  return t["ok"], t["total"]


def verdict(record) -> tuple[str, str]:
  """(css class, words): ok / partial / fail / info."""
  if failed(record):
    return "fail", "failed to run"
  ok, n = counts(record)
  if n == 0:
    return "info", "reported (no checks)"
  if ok == n:
    return "ok", f"all {n} checks as expected" if n > 1 else "1 of 1 as expected"
  return "partial", f"{ok} of {n} as expected"


def short_verdict(record) -> str:
  if failed(record):
    return "failed to run"
  ok, n = counts(record)
  if n == 0:
    return "reported"
  return f"all {n}" if ok == n and n > 1 else f"{ok} of {n}"


def missed(names) -> str:
  if not names:
    return ""
  more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
  return f"not as expected: {names[0]}{more}"


def key_numbers(record, out=None) -> list[tuple[str, object]]:
  """[(label, value)] of a record: those reproduce recorded, else the registry's key numbers read
  from the experiment's summary.json in ``out`` (or the part of it the record carries)."""
  if record.get("key_numbers") is not None:
    return [(str(label), value) for label, value in record["key_numbers"]]
  exp = experiment(record)
  if exp is None:
    return []
  summary = summary_json(record, out) or record.get("summary") or {}
  if not summary:
    return []
  try:
    return registry.key_numbers(summary, exp)
  except (KeyError, TypeError, ValueError, AttributeError, IndexError):
    return []


def join_key_numbers(pairs) -> str:
  return "; ".join(f"{label} {fmt(value)}" for label, value in pairs if value is not None)


def key_number(record, out=None) -> str:
  """The most telling values of one record (its experiment's key numbers; else its first check;
  the error's last line if it failed to run; '-' if none)."""
  if failed(record):
    err = (record.get("error") or "").strip().splitlines()
    return err[-1][:120] if err else "-"
  text = join_key_numbers(key_numbers(record, out))
  if not text and record.get("checks"):
    c = record["checks"][0]
    text = f"{c['name']}: {fmt(c['value'])}"
  return text or "-"


def group(records) -> list[list[dict]]:
  """Records grouped by experiment, in the registry's order (experiments it does not know after, in
  order of first appearance), the main run (no variant) first."""
  groups: dict[str, list[dict]] = {}
  for r in records:
    groups.setdefault(base_id(r), []).append(r)
  order = {e.id: i for i, e in enumerate(registry.experiments())}
  ids = sorted(groups, key=lambda eid: order.get(eid, len(order)))
  return [sorted(groups[eid], key=lambda r: bool(r.get("variant"))) for eid in ids]


def totals(records) -> tuple[int, int]:
  ok = sum(counts(r)[0] for r in records)
  return ok, sum(counts(r)[1] for r in records)


def claim(group_) -> str:
  text, _ = claim_text(group_[0])
  return text or title(group_[0])


def summary_lines(records, out=None) -> list[dict]:
  """One dict per experiment: id, anchor, beyond, title, claim, css, verdict, key, missed (the names of its
  checks not as expected), variants [(label, id, short verdict, css)]."""
  lines = []
  for g in group(records):
    main = g[0]
    css, words = verdict(main)
    if beyond(main) and css == "info":
      words = "reported"
    variants = [(variant_label(r), r["id"], short_verdict(r), verdict(r)[0]) for r in g[1:]]
    missed_ = checks_lib.tally(main.get("checks"))["failing"]
    lines.append({"id": base_id(main), "anchor": anchor(main), "beyond": beyond(main),
                  "title": title(main), "claim": claim(g), "css": css, "verdict": words,
                  "key": key_number(main, out), "variants": variants, "missed": missed_})
  return lines


def span(ids) -> str:
  """'E1-E9' for a contiguous run of ids, else 'E2, E5'."""
  try:
    nums = [int(i[1:]) for i in ids]
  except ValueError:
    nums = []
  same = len({i[:1] for i in ids}) == 1
  if same and len(ids) > 2 and nums == list(range(nums[0], nums[0] + len(nums))):
    return f"{ids[0]}-{ids[-1]}"
  return ", ".join(ids)


def overall(records) -> list[str]:
  """The verdict at a glance, one line per part: experiments whose checks all held, checks as expected."""
  lines = []
  for name, part in (("The paper", False), ("Beyond the paper", True)):
    groups = [g for g in group(records) if beyond(g[0]) == part]
    if not groups:
      continue
    kinds = [verdict(g[0])[0] for g in groups]
    bits = [f"{kinds.count(kind)} {words}" for kind, words in (
        ("ok", "with all checks as expected"), ("partial", "with some not as expected"),
        ("info", "reported (no checks)"), ("fail", "failed to run")) if kinds.count(kind)]
    ok, total = totals([r for g in groups for r in g])
    n = len(groups)
    lines.append(f"{name} ({span([base_id(g[0]) for g in groups])}), {n} experiment{'s' if n > 1 else ''}: "
                 + ", ".join(bits) + (f"; {ok} of {total} checks as expected." if total else "."))
  nfail = [r["id"] for r in records if failed(r)]
  if nfail:
    lines.append(f"Failed to run: {', '.join(nfail)}.")
  return lines


def not_run(records) -> list[str]:
  """The registered experiments this run has no record of."""
  have = {base_id(r) for r in records}
  return [e.id for e in registry.experiments() if e.id not in have]


def paper_span() -> str:
  """'E1-E9': the registered experiments of the paper."""
  return span([e.id for e in registry.experiments() if not e.beyond])
