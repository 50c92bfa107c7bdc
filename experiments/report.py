r"""The report of ``experiments.reproduce``: OUT/report.md and OUT/report.html.

Layout (both files):
  1. a summary: one line per experiment of the paper (E1-E9): its claim, its verdict (all checks as
     expected / n of m as expected / failed to run), its key number; then one line per question
     beyond the paper (E10 onwards: "reported" where the experiment has no checks); the share of
     checks that came out as expected;
  2. a table of contents;
  3. the paper: one section per experiment (figures, the claim, its checks against the numbers,
     wall time, the exact command), its variants (E2-authors, E5-authors) inside it, then the
     numerics comparison (exact against the authors' normalization);
  4. beyond the paper, in the same layout;
  5. the environment (versions) and the command line of the run.

report.html stands alone: figures are embedded as base64 data URIs, the CSS is inline, nothing is
loaded from elsewhere. Both files are written atomically.

Re-render the report of a finished run (from OUT/reproduce.json) without running anything:

    python -m experiments.report OUT
"""
from __future__ import annotations

import base64
import html
import json
import os
import re
import shlex
import struct
import sys

from svmattn.io import results

TITLE = "svmattn: reproduction of \u201cTransformers as Support Vector Machines\u201d"
PAPER = "Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898"

# One sentence per experiment of the paper: what it claims (the binaries' docstrings, docs/science.md section 8).
CLAIMS = {
    "E1": "From W(0)=0 (and Q(0)=0), normalized GD selects the optimal tokens and its direction converges to "
          "the Att-SVM: W to the Frobenius-norm W^mm, K Q^T to the nuclear-norm W^mm_*.",
    "E2": "From a random start, normalized GD converges in direction to the Att-SVM of the tokens it selects: "
          "W to the Frobenius-norm one, (K,Q) to the nuclear-norm one (the authors: mean corr 0.996 and 0.997).",
    "E3": "The nuclear-norm Att-SVM (the (K,Q) limit) has lower rank than the Frobenius one (the W limit), "
          "whose rank is min(n, d).",
    "E4": "The larger d, the more often GD converges globally (to the optimal tokens); not-local convergence "
          "vanishes once d >= max(T-1, n).",
    "E5": "With a ReLU head attention selects several tokens per sequence, and GD follows the Gen-SVM "
          "W^SVMeq = W^fin + C W^mm more closely than the single-token W^mm or W^1token.",
    "E6": "With the head v^T r - lambda ||r||^2, attention selects more tokens per sequence as lambda grows, "
          "and W^SVMeq describes GD better than W^mm or W^1token.",
    "E7": "The regularization paths converge in direction to the Att-SVM as the radius R grows: W_R to the "
          "Frobenius W^mm, K_R Q_R^T to the nuclear W^mm_*.",
    "E8": "Sequence-to-sequence and causal attention converge in direction to their own Att-SVMs (one set of "
          "constraints per query position).",
    "E9": "Att-SVM(alpha) is feasible for every selection alpha once d >= max(T-1, n); below that it can be "
          "infeasible.",
}

# Beyond the paper: the question each experiment asks (docs/science.md sections 10-14), and the prediction
# from the literature where one exists.
QUESTIONS = {
    "E10": "Does each optimizer take attention to the Att-SVM of its own norm, as it takes linear classifiers to "
           "their max-margin solution (steepest descent, l_p mirror descent, Adam -> l_inf, Muon -> spectral)?",
    "E11": "Trained jointly, does the head go to v^mm, the max-margin classifier of the selected tokens, and the "
           "attention to the relaxed Att-SVM (Tarzanagh, Li, Zhang, Oymak 2023)?",
    "E12": "Does next-token attention converge in direction to the graph SVM of the token graphs' strongly "
           "connected components, plus a finite part (Li, Huang, Ildiz, Rawat, Oymak 2024)?",
    "E13": "On real images as patch tokens, does attention head for the Att-SVM at small n, and where does "
           "the Gen-SVM take over as n grows?",
    "E14": "With several heads (no theorem), which tokens does each head select, and does each approach the "
           "Att-SVM of its selection?",
    "E15": "With two layers (no theorem), what does each layer select, and does it approach the Att-SVM of its "
           "selection?",
}

BEYOND_NOTE = ("Questions the paper leaves open, on the same engine (docs/science.md sections 10-14). Where the "
               "literature predicts an outcome, the checks state that prediction and a check not as expected "
               "is a finding; where no theorem exists the experiment has no checks and its numbers are reported.")

NUMERICS_NOTE = (
    "The paper's code normalizes each gradient as g / (||g|| + eps) with eps the float64 machine epsilon, "
    "and pools the tokens as X^T s. That is not normalized GD once ||g|| falls to about eps: every step "
    "then shrinks far below eta, ||W|| stops growing and the run freezes. In E5 a frozen W leaves a dead "
    "Y = -1 sequence (no gradient through its ReLU) with all its tokens above tau_H, which W^SVMeq's "
    "equality constraints describe well; with exact numerics W keeps growing, the other sequences sharpen "
    "that dead sequence onto 2-3 tokens, Gen-SVM predicts it poorly, and the tail of 1 - corr is heavier. "
    "X^T s also loses the gradient to rounding once the softmax saturates (our pooled token does not). "
    "Both columns are shown; `exact` is the default of every binary (--numerics).")

NUMERICS_IDS = ("E2", "E5")   # the experiments whose exact and authors' runs the numerics section compares

VARIANT_LABELS = {"authors": "the authors' numerics", "toy": "the public code's toy setting",
                  "local": "local setting"}


# ----------------------------------------------------------------------------------------------------------
# Numbers


def _fmt(value):
  if isinstance(value, float):
    return f"{value:.4g}"
  if isinstance(value, list):
    return ", ".join(_fmt(v) for v in value)
  return str(value)


def numerics_rows(records) -> list[list[str]]:
  """[statistic, exact, authors] rows for E2 and E5, from the runs of both numerics."""
  by = {(r["id"].split("-")[0], r.get("variant") or "exact"): r.get("summary", {}) for r in records
        if r.get("returncode") == 0}
  rows = []
  for key, name in (("W_vs_fro", "corr(W, Frobenius SVM)"), ("KQ_vs_nuc", "corr(KQ^T, nuclear SVM)")):
    vals = [by.get(("E2", v), {}).get("final_corr", {}).get(key, {}).get("mean") for v in ("exact", "authors")]
    if any(v is not None for v in vals):
      rows.append([f"E2 mean final {name}"] + [_fmt(v) if v is not None else "-" for v in vals])
  per = {v: by.get(("E5", v), {}).get("per_d", {}) for v in ("exact", "authors")}
  for d in sorted(set(per["exact"]) | set(per["authors"]), key=int):
    for obj, label in (("svmeq", "W^SVMeq"), ("mm", "W^mm"), ("1token", "W^1token")):
      for stat, sname in (("mean", "1 - mean corr"), ("median", "median 1 - corr"), ("q75", "upper quartile")):
        if obj != "svmeq" and stat != "mean":
          continue
        vals = [per[v].get(d, {}).get("final_one_minus_corr", {}).get(obj, {}).get(stat) for v in ("exact", "authors")]
        rows.append([f"E5 d={d}: {label} {sname}"] + [_fmt(v) if v is not None else "-" for v in vals])
    norms = [per[v].get(d, {}).get("final_W_norm") for v in ("exact", "authors")]
    if any(norms):
      rows.append([f"E5 d={d}: final ||W||_F median (10th-90th pct)"] + [
          f"{n['median']:.1f} ({n['p10']:.0f}-{n['p90']:.0f})" if n and n.get("median") is not None else "-"
          for n in norms])
  return rows


def base_id(record) -> str:
  return record["id"].split("-")[0]


def anchor(record_or_id) -> str:
  key = record_or_id if isinstance(record_or_id, str) else record_or_id["id"]
  return re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")


def failed(record) -> bool:
  return record.get("returncode") != 0 or "error" in record


def counts(record) -> tuple[int, int]:
  """(checks as expected, checks) of one record."""
  checks = record.get("checks") or []
  return sum(bool(c.get("ok")) for c in checks), len(checks)


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


def _missed(names) -> str:
  if not names:
    return ""
  more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
  return f"not as expected: {names[0]}{more}"


def _short_verdict(record) -> str:
  if failed(record):
    return "failed to run"
  ok, n = counts(record)
  if n == 0:
    return "reported"
  return f"all {n}" if ok == n and n > 1 else f"{ok} of {n}"


def _summary_json(record, out):
  """The experiment's own summary.json (for key numbers the record does not carry), or {}."""
  if not out or not record.get("dir"):
    return {}
  try:
    with open(os.path.join(out, record["dir"], "summary.json")) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def _matching(record, pattern):
  return [c for c in record.get("checks") or [] if re.search(pattern, c.get("name", ""))]


def _from_checks(record, pattern, label):
  """'label: value' from the checks whose names match; several matches name their prefix ('d=6: ...')."""
  found = _matching(record, pattern)
  if not found:
    return None
  values = [_fmt(c["value"]) for c in found]
  if len(found) == 1:
    return f"{label} {values[0]}"
  if len(set(values)) == 1:
    return f"{label} {values[0]} (all {len(found)})"
  prefixes = [c["name"].split(":")[0] if ":" in c["name"] else "" for c in found]
  if all(prefixes) and len(set(prefixes)) == len(prefixes):
    return f"{label} " + ", ".join(f"{p} {v}" for p, v in zip(prefixes, values))
  return f"{label} " + ", ".join(values)


def _nearest_norms(record, summary):
  """E10: how many optimizers end nearest (mean final corr) to the Att-SVM of their predicted norm, and the others."""
  pairs = []
  for opt, v in (summary.get("nearest") or {}).items():
    if isinstance(v, dict) and v.get("by_corr"):
      pairs.append((opt, v["by_corr"], v.get("predicted")))
  if not pairs:
    found = _matching(record, r"nearest")
    if not found:
      return None
    ok = sum(bool(c.get("ok")) for c in found)
    return f"{ok} of {len(found)} optimizers end nearest to the Att-SVM of their predicted norm"
  hits = sum(n == p for _, n, p in pairs)
  text = f"{hits} of {len(pairs)} optimizers end nearest to the Att-SVM of their predicted norm"
  misses = [f"{o} nearest {n} (predicted {p})" for o, n, p in pairs if p and n != p]
  return text + ("; " + ", ".join(misses) if misses else "")


def _real_data(record, summary):
  per_n = summary.get("per_n") or {}
  try:
    vals = [(int(n), per_n[n]["W"]["corr_svm_final"]["mean"]) for n in per_n]
  except (KeyError, TypeError, ValueError):
    vals = []
  if not vals:
    return _from_checks(record, r"corr\(W, Att-SVM\)", "corr(W, Att-SVM)")
  return "mean corr(W, Att-SVM) by n: " + ", ".join(f"n={n} {_fmt(float(v))}" for n, v in sorted(vals)
                                                      if v is not None)


def _heads(params):
  units = [(("heads", h), h.replace("head", "head ")) for h in sorted(params.get("heads", {}))]
  return units + ([("sum", "their sum")] if "sum" in params else [])


def _layers(params):
  return [(k, k.replace("layer", "layer ")) for k in sorted(params) if k.startswith("layer")]


def _nested(params, key):
  return params[key[0]][key[1]] if isinstance(key, tuple) else params[key]


def _unit_key(units, label):
  def key(record, summary):
    try:
      params = summary["params"]["W"]
      parts = [f"{u} {_fmt(float(_nested(params, k)['corr_final']['mean']))}" for k, u in units(params)]
    except (KeyError, TypeError, ValueError):
      return None
    return f"{label}: " + ", ".join(parts) if parts else None
  return key


# The most telling number of each experiment: [(regex on check names, label)] or fn(record, summary).
KEYS = {
    "E1": [(r"corr\(final W,", "min corr(W, W^mm)"), (r"corr\(final K Q\^T", "min corr(KQ^T, W^mm_*)")],
    "E2": [(r"final corr W_vs_fro", "mean corr(W, Frobenius SVM)"),
           (r"final corr KQ_vs_nuc", "mean corr(KQ^T, nuclear SVM)")],
    "E3": [(r"rows with some d where mean nuclear rank <", "(n, T) rows where the nuclear rank is lower:")],
    "E4": [(r"global share at d=\d+ minus", "global share, largest minus smallest d:")],
    "E5": [(r"median final 1-corr\(W_GD, W\^SVMeq\)", "median 1 - corr(W, W^SVMeq):")],
    "E6": [(r"mean \|O_i\|", "mean tokens selected over lambda:")],
    "E7": [(r"corr\(W_R.*at the largest", "corr(W_R, W^mm) at the largest R"),
           (r"corr\(K_R Q_R\^T.*at the largest", "corr(K_R Q_R^T, W^mm_*)")],
    "E8": [(r"^seq2seq: final corr", "corr(W, SVM): seq2seq"), (r"^causal: final corr", "causal")],
    "E9": [(r"feasible fraction at d >=", "feasible at d >= max(T-1, n):"),
           (r"feasible fraction at smallest d", "at the smallest d:")],
    "E10": _nearest_norms,
    "E11": [(r"mean final corr\(v, v\^mm\)", "corr(v, v^mm):")],
    "E12": [(r"corr\(W, (local )?graph SVM\)", "mean corr(W, graph SVM)")],
    "E13": _real_data,
    "E14": _unit_key(_heads, "mean corr(W_h, Att-SVM)"),
    "E15": _unit_key(_layers, "mean corr(W, Att-SVM)"),
}


def key_number(record, out=None) -> str:
  """The most telling value of one record (its KEYS entry; else its first check; '-' if none)."""
  if failed(record):
    err = (record.get("error") or "").strip().splitlines()
    return err[-1][:120] if err else "-"
  spec = KEYS.get(base_id(record))
  text = None
  if callable(spec):
    text = spec(record, _summary_json(record, out))
  elif spec:
    parts = [p for p in (_from_checks(record, pat, label) for pat, label in spec) if p]
    text = "; ".join(parts) or None
  if text is None and record.get("checks"):
    c = record["checks"][0]
    text = f"{c['name']}: {_fmt(c['value'])}"
  return text or "-"


def group(records) -> list[list[dict]]:
  """Records grouped by experiment id in order of first appearance, the main run (no variant) first."""
  groups: dict[str, list[dict]] = {}
  for r in records:
    groups.setdefault(base_id(r), []).append(r)
  return [sorted(g, key=lambda r: bool(r.get("variant"))) for g in groups.values()]


def totals(records) -> tuple[int, int]:
  ok = sum(counts(r)[0] for r in records)
  return ok, sum(counts(r)[1] for r in records)


def claim(group_) -> str:
  eid = base_id(group_[0])
  return CLAIMS.get(eid) or QUESTIONS.get(eid) or group_[0].get("title", "")


def variant_label(record) -> str:
  v = record.get("variant") or ""
  return VARIANT_LABELS.get(v, v)


def summary_lines(records, out=None) -> list[dict]:
  """One dict per experiment: id, anchor, beyond, title, claim, css, verdict, key, missed (the names of its
  checks not as expected), variants [(label, id, short verdict, css)]."""
  lines = []
  for g in group(records):
    main = g[0]
    css, words = verdict(main)
    if main.get("beyond") and css == "info":
      words = "reported"
    variants = [(variant_label(r), r["id"], _short_verdict(r), verdict(r)[0]) for r in g[1:]]
    missed = [c.get("name", "") for c in main.get("checks") or [] if not c.get("ok")]
    lines.append({"id": base_id(main), "anchor": anchor(main), "beyond": bool(main.get("beyond")),
                  "title": main.get("title", ""), "claim": claim(g), "css": css, "verdict": words,
                  "key": key_number(main, out), "variants": variants, "missed": missed})
  return lines


def command_line(argv=None, package=None) -> str:
  """How this process was started, as a shell command (python -m PACKAGE.reproduce ...)."""
  argv = list(sys.argv if argv is None else argv)
  package = package or __package__ or "experiments"
  head = argv[0] if argv and argv[0].startswith("svmattn ") else f"python -m {package}.reproduce"
  return " ".join([head] + [shlex.quote(a) for a in argv[1:]])


def _command(record) -> str:
  cmd = record.get("command", "")
  return f"python {cmd}" if cmd.startswith("-m ") else cmd


def _mode(meta) -> str:
  return (f"Mode: {'quick (small run counts)' if meta.get('quick') else 'the paper run counts'}; "
          f"seed {meta.get('seed', 0)}; total wall time {meta.get('total_s', 0.0):.1f} s.")


def _span(ids) -> str:
  """'E1-E9' for a contiguous run of ids, else 'E2, E5'."""
  try:
    nums = [int(i[1:]) for i in ids]
  except ValueError:
    nums = []
  if len(ids) > 2 and nums == list(range(nums[0], nums[0] + len(nums))):
    return f"{ids[0]}-{ids[-1]}"
  return ", ".join(ids)


def _overall(records) -> list[str]:
  """The verdict at a glance, one line per part: experiments whose checks all held, checks as expected."""
  lines = []
  for name, beyond in (("The paper", False), ("Beyond the paper", True)):
    groups = [g for g in group(records) if bool(g[0].get("beyond")) == beyond]
    if not groups:
      continue
    kinds = [verdict(g[0])[0] for g in groups]
    bits = [f"{kinds.count(kind)} {words}" for kind, words in (
        ("ok", "with all checks as expected"), ("partial", "with some not as expected"),
        ("info", "reported (no checks)"), ("fail", "failed to run")) if kinds.count(kind)]
    ok, total = totals([r for g in groups for r in g])
    n = len(groups)
    lines.append(f"{name} ({_span([base_id(g[0]) for g in groups])}), {n} experiment{'s' if n > 1 else ''}: "
                 + ", ".join(bits) + (f"; {ok} of {total} checks as expected." if total else "."))
  nfail = [r["id"] for r in records if failed(r)]
  if nfail:
    lines.append(f"Failed to run: {', '.join(nfail)}.")
  return lines


def _not_run(records) -> list[str]:
  have = {base_id(r) for r in records}
  return [e for e in list(CLAIMS) + list(QUESTIONS) if e not in have]


def _png_width(path) -> int:
  try:
    with open(path, "rb") as f:
      head = f.read(24)
    return struct.unpack(">I", head[16:20])[0] if head[:8] == b"\x89PNG\r\n\x1a\n" else 0
  except (OSError, struct.error):
    return 0


# ----------------------------------------------------------------------------------------------------------
# Markdown


def _md(text) -> str:
  """Text for a markdown table cell or paragraph: |, *, _, ` and \\ escaped."""
  return re.sub(r"([\\|*_`])", r"\\\1", str(text))


def _md_checks(record) -> list[str]:
  lines = ["| check | value | expected | as expected |", "|---|---|---|---|"]
  for c in record.get("checks") or []:
    lines.append(f"| {_md(c['name'])} | {_md(_fmt(c['value']))} | {_md(c['expected'])} | "
                 f"{'yes' if c.get('ok') else '**no**'} |")
  return lines


def _md_record(record, level, lead, out=None, numerics=False) -> list[str]:
  hashes = "#" * level
  _, words = verdict(record)
  title = f"{record['id']}: {record['title']}"
  lines = [f'<a id="{anchor(record)}"></a>', "", f"{hashes} {_md(title)}", ""]
  for fig in record.get("figures") or []:
    lines += [f"![{_md(fig)}]({fig})", ""]
  if lead:
    eid = base_id(record)
    if eid in CLAIMS:
      lines += [f"**The paper claims.** {_md(CLAIMS[eid])}", ""]
    elif eid in QUESTIONS:
      lines += [f"**The question.** {_md(QUESTIONS[eid])}", ""]
  if failed(record):
    where = f" Its full output: [{_md(record['dir'])}/log.txt]({record['dir']}/log.txt)." if record.get("dir") else ""
    lines += [f"**Failed to run.**{where}", "", "```", record.get("error") or "(no error output)", "```", ""]
  elif record.get("checks"):
    lines += [f"**Against the numbers: {words}.**", ""] + _md_checks(record) + [""]
  else:
    lines += [f"**Reported** (no checks: no theorem predicts the outcome). Found: {_md(key_number(record, out))}; "
              "every number is in the program output below.", ""]
  lines += [f"Wall time {record.get('wall_s', 0.0):.1f} s{_stage_words(record)}. Command:", "", "```",
            _command(record), "```", ""]
  if record.get("stdout"):
    show = " open" if not record.get("checks") else ""
    lines += [f"<details{show}><summary>Program output</summary>", "", "```", record["stdout"], "```", "",
              "</details>", ""]
  if lead and base_id(record) in NUMERICS_IDS and numerics:
    lines += ["Exact against the authors' numerics, side by side: [Numerics](#numerics).", ""]
  return lines


def _md_summary_table(lines_, paper) -> list[str]:
  head = "claim" if paper else "question"
  rows = [f"| exp. | {head} | verdict | key number |", "|---|---|---|---|"]
  for s in lines_:
    v = _md(s["verdict"])
    if s["css"] in ("partial", "fail"):
      v = f"**{v}**"
    if s["missed"]:
      v += f" ({_md(_missed(s['missed']))})"
    v += "".join(f"; {_md(label)} ({_md(vid)}): {_md(short)}" for label, vid, short, _ in s["variants"])
    rows.append(f"| [{s['id']}](#{s['anchor']}) | {_md(s['claim'])} | {v} | {_md(s['key'])} |")
  return rows


def markdown(records, meta, out=None) -> str:
  """The report as markdown (figures linked relative to OUT)."""
  paper = [g for g in group(records) if not g[0].get("beyond")]
  beyond = [g for g in group(records) if g[0].get("beyond")]
  summ = summary_lines(records, out)
  rows = numerics_rows(records)
  lines = [f"# {TITLE}", "", f"{PAPER}. {_mode(meta)}", "", '<a id="summary"></a>', "", "## Summary", "",
           ] + [f"- **{_md(line)}**" for line in _overall(records)] + [""]
  if paper:
    lines += ["Claims of the paper:", ""] + _md_summary_table([s for s in summ if not s["beyond"]], True) + [""]
  if beyond:
    lines += ["Beyond the paper:", ""] + _md_summary_table([s for s in summ if s["beyond"]], False) + [""]
  missing = _not_run(records)
  if missing:
    lines += [f"Not run this time: {', '.join(missing)}.", ""]
  lines += ['<a id="contents"></a>', "", "## Contents", ""]
  if paper:
    lines.append("- [The paper](#paper)")
    for g in paper:
      lines.append(f"  - [{_md(g[0]['id'])}: {_md(g[0]['title'])}](#{anchor(g[0])})")
      lines += [f"    - [{_md(r['id'])}: {_md(r['title'])}](#{anchor(r)})" for r in g[1:]]
    if rows:
      lines.append("  - [Numerics: exact against the authors' (E2, E5)](#numerics)")
  if beyond:
    lines.append("- [Beyond the paper](#beyond)")
    for g in beyond:
      lines.append(f"  - [{_md(g[0]['id'])}: {_md(g[0]['title'])}](#{anchor(g[0])})")
      lines += [f"    - [{_md(r['id'])}: {_md(r['title'])}](#{anchor(r)})" for r in g[1:]]
  lines += ["- [Environment and command line](#environment)", ""]
  if paper:
    lines += ['<a id="paper"></a>', "", "# The paper", ""]
    for g in paper:
      for i, r in enumerate(g):
        lines += _md_record(r, 2 if i == 0 else 3, lead=i == 0, out=out, numerics=bool(rows))
    if rows:
      lines += ['<a id="numerics"></a>', "", "## Numerics: exact against the authors' (E2, E5)", "",
                _md(NUMERICS_NOTE), "", "| statistic | exact | authors |", "|---|---|---|"]
      lines += [f"| {_md(a)} | {_md(b)} | {_md(c)} |" for a, b, c in rows] + [""]
  if beyond:
    lines += ['<a id="beyond"></a>', "", "# Beyond the paper", "", _md(BEYOND_NOTE), ""]
    for g in beyond:
      for i, r in enumerate(g):
        lines += _md_record(r, 2 if i == 0 else 3, lead=i == 0, out=out, numerics=bool(rows))
  lines += ['<a id="environment"></a>', "", "# Environment and command line", "", "Command line:", "", "```",
            meta.get("command") or "(not recorded)", "```", "", "| component | version |", "|---|---|"]
  for k, v in (meta.get("environment") or {}).items():
    lines.append(f"| {_md(k)} | {_md(', '.join(map(str, v)) if isinstance(v, list) else v)} |")
  return "\n".join(lines) + "\n"


def write_markdown(path, records, meta, out=None):
  text = markdown(records, meta, out if out is not None else os.path.dirname(os.path.abspath(path)))
  with results.atomic_path(path) as tmp:
    with open(tmp, "w") as f:
      f.write(text)


# ----------------------------------------------------------------------------------------------------------
# HTML

CSS = """
:root{--line:#d0d7de;--muted:#57606a;--bg:#f6f8fa}
*{box-sizing:border-box}
body{font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:#1f2328;
 max-width:1000px;margin:0 auto;padding:1.5em 1.25em 4em}
h1{font-size:1.75em;line-height:1.25;margin:.4em 0 .2em}
h1.part{font-size:1.6em;margin-top:2.2em;padding-bottom:.2em;border-bottom:3px solid #1f2328}
h2{font-size:1.3em;margin:2.2em 0 .5em;padding-bottom:.2em;border-bottom:1px solid var(--line)}
h3{font-size:1.1em;margin:1.8em 0 .4em}
p.meta{color:var(--muted);margin-top:0}
a{color:#0969da;text-decoration:none} a:hover{text-decoration:underline}
table{border-collapse:collapse;width:100%;font-size:14px;margin:.6em 0 1em}
th,td{border:1px solid var(--line);padding:5px 8px;text-align:left;vertical-align:top}
th{background:var(--bg);font-weight:600;white-space:nowrap}
tbody tr:nth-child(even) td{background:#fbfcfd}
td.num{font-variant-numeric:tabular-nums}
td.nowrap{white-space:nowrap}
tbody tr.miss td{background:#fff1f0}
td.idc{white-space:nowrap;font-weight:600}
td.yes{color:#1a7f37;font-weight:600} td.no{color:#cf222e;font-weight:700} p.no{color:#a40e26}
.badge{display:inline-block;padding:1px 9px;border-radius:10px;font-size:13px;font-weight:600;white-space:nowrap}
.ok{background:#dafbe1;color:#116329}.partial{background:#fff8c5;color:#7d4e00}
.fail{background:#ffebe9;color:#a40e26}.info{background:#ddf4ff;color:#0550ae}
ul.overall{font-weight:600;margin:.8em 0;padding-left:1.2em}
.variants{display:block;font-size:12.5px;color:var(--muted);margin-top:3px}
table.summary td:nth-child(2){width:42%} table.summary td:nth-child(4){width:27%}
.claim{border-left:4px solid #0969da;background:var(--bg);padding:.55em .9em;margin:1em 0}
.claim.question{border-left-color:#8250df}
.figs{display:flex;flex-wrap:wrap;gap:12px;margin:.8em 0}
figure{margin:0;flex:0 1 100%;max-width:100%}
figure.half{flex:0 1 calc(50% - 6px)}
.missed{display:block;font-size:12.5px;color:#a40e26;margin-top:3px}
img{display:block;width:100%;height:auto;border:1px solid #eaeef2}
figcaption{font-size:12.5px;color:var(--muted);text-align:center;margin-top:2px}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:13px}
pre{background:var(--bg);padding:.6em .8em;overflow-x:auto;border-radius:6px;margin:.4em 0 .8em}
pre.cmd{white-space:pre-wrap;overflow-wrap:anywhere}
p.run{color:var(--muted);font-size:14px;margin-bottom:.2em}
details{margin:.4em 0 1em}
summary{cursor:pointer;color:var(--muted);font-size:14px}
nav.toc ul{margin:.2em 0;padding-left:1.3em} nav.toc li{margin:.1em 0}
section.variant{margin-left:0;padding-left:1em;border-left:3px solid #eaeef2}
"""


HALF_MAX_PX = 640   # figures up to this natural width sit two to a row


def _badge(css, words) -> str:
  return f"<span class='badge {css}'>{html.escape(words)}</span>"


def _html_figures(record, out) -> str:
  figs = []
  for fig in record.get("figures") or []:
    path = os.path.join(out, fig)
    try:
      with open(path, "rb") as f:
        data = base64.b64encode(f.read()).decode()
    except OSError:
      figs.append(f"<p class='no'>figure {html.escape(fig)} is missing</p>")
      continue
    # small figures two to a row; larger ones at their own width, at most the column's (never upscaled)
    width = _png_width(path)
    attr = " class='half'" if 0 < width <= HALF_MAX_PX else (f" style='max-width:{width}px'" if width else "")
    figs.append(f"<figure{attr}><img alt='{html.escape(fig)}' "
                f"src='data:image/png;base64,{data}'><figcaption>{html.escape(fig)}</figcaption></figure>")
  return f"<div class='figs'>{''.join(figs)}</div>" if figs else ""


def _html_checks(record) -> str:
  rows = []
  for c in record.get("checks") or []:
    ok = bool(c.get("ok"))
    value = _fmt(c["value"])
    rows.append(f"<tr{'' if ok else ' class=miss'}><td>{html.escape(c['name'])}</td>"
                f"<td class='num{' nowrap' if len(value) <= 36 else ''}'>{html.escape(value)}</td>"
                f"<td>{html.escape(str(c['expected']))}</td><td class='{'yes' if ok else 'no'}'>"
                f"{'yes' if ok else 'no'}</td></tr>")
  return ("<table class='checks'><thead><tr><th>check</th><th>value</th><th>expected</th><th>as expected</th>"
          f"</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _html_record(record, out, lead, numerics=False) -> str:
  esc = html.escape
  css, words = verdict(record)
  if record.get("beyond") and css == "info":
    words = "reported"
  tag = "h2" if lead else "h3"
  title = f"{record['id']}: {record['title']}"
  parts = [f"<section id='{anchor(record)}'{'' if lead else ' class=variant'}>",
           f"<{tag}>{esc(title)} {_badge(css, words)}</{tag}>", _html_figures(record, out)]
  if lead:
    eid = base_id(record)
    if eid in CLAIMS:
      parts.append(f"<p class='claim'><b>The paper claims.</b> {esc(CLAIMS[eid])}</p>")
    elif eid in QUESTIONS:
      parts.append(f"<p class='claim question'><b>The question.</b> {esc(QUESTIONS[eid])}</p>")
  if failed(record):
    log = f"{record['dir']}/log.txt" if record.get("dir") else ""
    where = f" Its full output: <a href='{esc(log)}'>{esc(log)}</a>." if log else ""
    parts.append(f"<p class='no'><b>Failed to run.</b>{where}</p>"
                 f"<pre>{esc(record.get('error') or '(no error output)')}</pre>")
  elif record.get("checks"):
    parts.append(f"<p><b>Against the numbers:</b> {esc(words)}.</p>" + _html_checks(record))
  else:
    parts.append(f"<p><b>Reported</b> (no checks: no theorem predicts the outcome). Found: "
                 f"{esc(key_number(record, out))}; every number is in the program output below.</p>")
  parts.append(f"<p class='run'>Wall time {record.get('wall_s', 0.0):.1f} s{esc(_stage_words(record))}. Command:</p>"
               f"<pre class='cmd'>{esc(_command(record))}</pre>")
  if record.get("stdout"):
    # without checks the program output is the result: shown open
    show = " open" if not record.get("checks") else ""
    parts.append(f"<details{show}><summary>Program output</summary><pre>{esc(record['stdout'])}</pre></details>")
  if lead and base_id(record) in NUMERICS_IDS and numerics:
    parts.append("<p class='run'>Exact against the authors' numerics, side by side: "
                 "<a href='#numerics'>Numerics</a>.</p>")
  parts.append("</section>")
  return "".join(parts)


def _html_summary_table(lines_, paper) -> str:
  esc = html.escape
  rows = []
  for s in lines_:
    var = "".join(f"<span class='variants'>{esc(label)} ({esc(vid)}): {esc(short)}</span>"
                  for label, vid, short, _ in s["variants"])
    missed = f"<span class='missed'>{esc(_missed(s['missed']))}</span>" if s["missed"] else ""
    rows.append(f"<tr><td class='idc'><a href='#{s['anchor']}'>{esc(s['id'])}</a></td><td>{esc(s['claim'])}</td>"
                f"<td>{_badge(s['css'], s['verdict'])}{missed}{var}</td><td>{esc(s['key'])}</td></tr>")
  head = "claim" if paper else "question"
  return (f"<table class='summary'><thead><tr><th>exp.</th><th>{head}</th><th>verdict</th><th>key number</th>"
          f"</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def html_report(records, meta, out) -> str:
  """The report as one self-contained HTML page (figures read from OUT and embedded)."""
  esc = html.escape
  paper = [g for g in group(records) if not g[0].get("beyond")]
  beyond = [g for g in group(records) if g[0].get("beyond")]
  summ = summary_lines(records, out)
  rows = numerics_rows(records)
  p = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
       "<meta name='viewport' content='width=device-width, initial-scale=1'>",
       f"<title>svmattn report</title><style>{CSS}</style></head><body>",
       f"<header><h1>{esc(TITLE)}</h1><p class='meta'>{esc(PAPER)}. {esc(_mode(meta))}</p></header>",
       "<section id='summary'><h2>Summary</h2><ul class='overall'>"
       + "".join(f"<li>{esc(line)}</li>" for line in _overall(records)) + "</ul>"]
  if paper:
    p.append("<h3>Claims of the paper</h3>" + _html_summary_table([s for s in summ if not s["beyond"]], True))
  if beyond:
    p.append("<h3>Beyond the paper</h3>" + _html_summary_table([s for s in summ if s["beyond"]], False))
  missing = _not_run(records)
  if missing:
    p.append(f"<p class='meta'>Not run this time: {esc(', '.join(missing))}.</p>")
  p.append("</section><nav class='toc' id='contents'><h2>Contents</h2><ul>")

  def toc(groups):
    items = []
    for g in groups:
      sub = "".join(f"<li><a href='#{anchor(r)}'>{esc(r['id'])}: {esc(r['title'])}</a></li>" for r in g[1:])
      items.append(f"<li><a href='#{anchor(g[0])}'>{esc(g[0]['id'])}: {esc(g[0]['title'])}</a>"
                   + (f"<ul>{sub}</ul>" if sub else "") + "</li>")
    return "".join(items)

  if paper:
    p.append(f"<li><a href='#paper'>The paper</a><ul>{toc(paper)}"
             + ("<li><a href='#numerics'>Numerics: exact against the authors' (E2, E5)</a></li>" if rows else "")
             + "</ul></li>")
  if beyond:
    p.append(f"<li><a href='#beyond'>Beyond the paper</a><ul>{toc(beyond)}</ul></li>")
  p.append("<li><a href='#environment'>Environment and command line</a></li></ul></nav>")
  if paper:
    p.append("<h1 class='part' id='paper'>The paper</h1>")
    for g in paper:
      p.append(_html_record(g[0], out, True, bool(rows)) + "".join(_html_record(r, out, False) for r in g[1:]))
    if rows:
      p.append("<section id='numerics'><h2>Numerics: exact against the authors' (E2, E5)</h2>"
               f"<p>{esc(NUMERICS_NOTE)}</p><table><thead><tr><th>statistic</th><th>exact</th><th>authors</th>"
               "</tr></thead><tbody>"
               + "".join(f"<tr><td>{esc(a)}</td><td class='num'>{esc(b)}</td><td class='num'>{esc(c)}</td></tr>"
                         for a, b, c in rows) + "</tbody></table></section>")
  if beyond:
    p.append(f"<h1 class='part' id='beyond'>Beyond the paper</h1><p>{esc(BEYOND_NOTE)}</p>")
    for g in beyond:
      p.append(_html_record(g[0], out, True) + "".join(_html_record(r, out, False) for r in g[1:]))
  env = "".join(f"<tr><td>{esc(str(k))}</td><td>{esc(', '.join(map(str, v)) if isinstance(v, list) else str(v))}"
                "</td></tr>" for k, v in (meta.get("environment") or {}).items())
  p.append("<h1 class='part' id='environment'>Environment and command line</h1><p>Command line:</p>"
           f"<pre class='cmd'>{esc(meta.get('command') or '(not recorded)')}</pre>"
           f"<table class='env'><thead><tr><th>component</th><th>version</th></tr></thead><tbody>{env}</tbody></table>"
           "</body></html>")
  return "\n".join(p) + "\n"


def write_html(path, records, meta, out):
  text = html_report(records, meta, out)
  with results.atomic_path(path) as tmp:
    with open(tmp, "w") as f:
      f.write(text)


def write(out, records, meta):
  """OUT/report.md and OUT/report.html."""
  write_markdown(os.path.join(out, "report.md"), records, meta, out)
  write_html(os.path.join(out, "report.html"), records, meta, out)


def main(argv=None):
  argv = list(sys.argv if argv is None else argv)
  if len(argv) != 2 or argv[1].startswith("-"):
    sys.exit("usage: python -m experiments.report OUT   (re-renders OUT/report.md and OUT/report.html from "
             "OUT/reproduce.json)")
  out = argv[1]
  with open(os.path.join(out, "reproduce.json")) as f:
    run = json.load(f)
  write(out, run["experiments"], run["meta"])
  print(f"report: {out}/report.md and {out}/report.html")



# ----------------------------------------------------------------------------
# Stages of a reproduce run, and their floors (benchmark --suites=stages)
# ----------------------------------------------------------------------------

STAGES = ("startup", "compile", "data", "train", "svm_analysis", "write", "other")


def _stage_words(record) -> str:
  """" (startup 1.5 s, compile 2.2 s, ...)": the record's nonzero stages, or "" without them."""
  st = record.get("stages_s") or {}
  shown = [f"{s.replace('svm_analysis', 'SVMs and analysis')} {st[s]:.1f} s" for s in STAGES if st.get(s, 0.0) >= 0.05]
  return f" ({', '.join(shown)})" if shown else ""


def stages(t: dict, wall: float) -> dict:
  """An experiment's wall time cut into STAGES (seconds) from its summary's ``timings_s``:
  startup (process start, imports, flags: wall minus the binary's own total), compile (XLA),
  data (generating or loading data sets), train (device steps, compile excluded; E7's
  regularization paths), svm_analysis (host solvers and analysis: svm, feasibility, analysis),
  write (results, figures, summary) and other (the rest of the binary: reductions). The host
  analysis may run beside training in worker processes, so stages can add up to more than
  the wall time (the summary's ``overlap``)."""
  compile_s = float(t.get("compile", 0.0))
  out = {"startup": max(wall - float(t.get("total", wall)), 0.0), "compile": compile_s,
         "data": float(t.get("data", 0.0)),
         "train": max(float(t.get("train", 0.0)) - compile_s, 0.0) + float(t.get("paths", 0.0)),
         "svm_analysis": sum(float(t.get(k, 0.0)) for k in ("svm", "feasibility", "analysis")),
         "write": float(t.get("write", 0.0))}
  inside = float(t.get("pipeline_wall", 0.0)) + out["write"]
  out["other"] = max(float(t.get("total", 0.0)) - inside, 0.0)
  return out


def stage_table(records: list) -> str:
  """A text table: one row per experiment, one column per stage, then the totals of the
  paper's experiments (E1-E9) and of the ones beyond it."""
  head = f"{'experiment':<14}{'wall':>8}" + "".join(f"{s:>13}" for s in STAGES)
  lines = [head]

  def row(name, wall, st):
    return f"{name:<14}{wall:>8.1f}" + "".join(f"{st.get(s, 0.0):>13.1f}" for s in STAGES)
  for part, beyond in (("paper E1-E9", False), ("beyond", True)):
    chosen = [r for r in records if bool(r.get("beyond")) == beyond]
    if not chosen:
      continue
    for r in chosen:
      lines.append(row(r["id"], r["wall_s"], r.get("stages_s", {})))
    total = {s: sum(r.get("stages_s", {}).get(s, 0.0) for r in chosen) for s in STAGES}
    lines.append(row(part, sum(r["wall_s"] for r in chosen), total))
  return "\n".join(lines)


def stage_floors(record: dict, rates: dict) -> list[dict]:
  """One row per stage of a reproduce.json record that has a floor: train (its data-set-steps at
  the kernel's rate), data (its bytes at the memory bandwidth) and svm_analysis (one NNLS solve
  per analyzed data set: a lower bound, every data set needs at least one SVM). Compile has no
  floor below itself on a cold run; startup's is the import time (the e2 suite)."""
  work, st = record.get("work") or {}, record.get("stages_s") or {}
  rows = []

  def add(stage, floor, cause):
    seconds = float(st.get(stage, 0.0))
    if floor > 0 and seconds > 0:
      rows.append({"experiment": record["id"], "stage": stage, "seconds": seconds, "floor_s": floor,
                   "over_floor": seconds / floor, "cause": cause})
  steps = work.get("dataset_steps", 0)
  if steps:
    rate = steps / max(st.get("train", 0.0), 1e-9)
    add("train", steps / rates["kernel_dataset_steps_per_s"],
        f"{steps:.3g} data-set-steps at {rate:.3g}/s; the kernel runs {rates['kernel_dataset_steps_per_s']:.3g}/s "
        f"at E2's sizes with the linear head")
  if work.get("data_bytes"):
    cells = max(work.get("cells", 1), 1)
    add("data", work["data_bytes"] / rates["bandwidth_bytes_per_s"],
        f"{cells} shapes, {st.get('data', 0.0) / cells:.2f} s each; a new shape's generator takes "
        f"{rates['generator_first_call_s']:.2f} s on its first call (compiling) and "
        f"{rates['generator_run_s']:.3f} s after")
  if work.get("sets_analyzed"):
    sets = work["sets_analyzed"]
    add("svm_analysis", sets / rates["nnls_solves_per_s"],
        f"{sets} data sets, {1e3 * st.get('svm_analysis', 0.0) / sets:.1f} ms each; one Frobenius NNLS solve takes "
        f"{1e3 / rates['nnls_solves_per_s']:.2f} ms")
  return rows


if __name__ == "__main__":
  main()
