"""The reproduce report (svmattn.report): its structure on a fake run, no subprocess.

The fake run has three paper experiments with checks and a figure each (E2 with its authors'
variant, E5 with a check not as expected), a paper experiment that failed to run (E3), and two
experiments beyond the paper (E10 with a check, E14 without). Claims, titles and key numbers come
from the registry (svmattn.registry): the key numbers from each run's summary.json.
"""
import html
import json
import os
import re
import struct
import zlib

import pytest

from svmattn import registry
from svmattn import report as report_lib
from svmattn.report import records as records_lib


def tiny_png(path):
  """A valid 1x1 PNG."""
  def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
  raw = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
  raw += chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b"")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb") as f:
    f.write(raw)


def check(name, value, expected, ok):
  return {"name": name, "value": value, "expected": expected, "ok": ok}


def record(id_, module, title, checks=(), figures=(), variant="", beyond=False, summary=None, error=None):
  dir_ = module + (f"_{variant}" if variant else "")
  r = {"id": id_, "module": module, "title": title, "variant": variant, "beyond": beyond, "dir": dir_,
       "command": f"-m svmattn {module} --out=OUT/{dir_} --seed=0 --noprogress", "wall_s": 1.5,
       "returncode": 0}
  if error is not None:
    r.update(returncode=1, error=error)
    return r
  r.update(checks=list(checks), summary=summary or {}, timings_s={}, figures=[f"{dir_}/{f}" for f in figures],
           stdout=f"{id_} program output\n  a table of numbers")
  return r


@pytest.fixture
def run(tmp_path):
  out = str(tmp_path)
  corr = lambda w, k: {"final_corr": {"W_vs_fro": {"mean": w}, "KQ_vs_nuc": {"mean": k}}}
  records = [
      record("E1", "paths_2d", "2-D picture", [check("min over data sets of corr(final W, Frobenius W^mm(opt))",
                                                      0.994, ">= 0.99", True)], ["paths.png"]),
      record("E2", "local_convergence", "Local convergence",
             [check("mean final corr W_vs_fro", 0.9987, ">= 0.99 (authors: 0.996)", True),
              check("mean final corr KQ_vs_nuc", 0.9975, ">= 0.99 (authors: 0.997)", True)],
             ["correlation.png", "softmax.png"], summary=corr(0.9987, 0.9975)),
      record("E2-authors", "local_convergence", "Local convergence, the authors' numerics",
             [check("mean final corr W_vs_fro", 0.9971, ">= 0.99", True)], ["correlation.png"],
             variant="authors", summary=corr(0.9971, 0.9975)),
      record("E3", "svm_rank", "Rank of SVM solutions", error="Traceback ...\nValueError: boom"),
      record("E5", "multi_token", "Multi-token selection",
             [check("d=6: median final 1-corr(W_GD, W^SVMeq) after 2001 steps", 0.011, "<= 0.003", False),
              check("d=8: median final 1-corr(W_GD, W^SVMeq) after 2001 steps", 0.0008, "<= 0.003", True),
              check("mean |O_i| vs lambda", "1 | 2", "a | pipe", True)], ["scatter.png"]),
      record("E10", "optimizer_geometry", "Optimizer geometry",
             [check("sd_l1: Att-SVM nearest by mean final corr", "l1", "l1", True)], ["geometry.png"], beyond=True),
      record("E14", "multi_head", "Multi-head attention", [], ["heads.png"], beyond=True),
  ]
  for r in records:
    for fig in r.get("figures", []):
      tiny_png(os.path.join(out, fig))
  heads = {"heads": {"head0": {"corr_final": {"mean": 0.99}}, "head1": {"corr_final": {"mean": 0.98}}},
           "sum": {"corr_final": {"mean": 0.7}}}
  with open(os.path.join(out, "multi_head", "summary.json"), "w") as f:
    json.dump({"params": {"W": heads}, "checks": []}, f)
  meta = {"quick": True, "seed": 0, "total_s": 12.5, "command": "python -m experiments.reproduce --out=OUT --quick",
          "environment": {"python": "3.11.7", "jax": "0.10.2", "devices": ["cpu:0", "cpu:1"]}}
  report_lib.write(out, records, meta)
  with open(os.path.join(out, "report.md")) as f:
    md = f.read()
  with open(os.path.join(out, "report.html")) as f:
    page = f.read()
  return {"out": out, "records": records, "meta": meta, "md": md, "html": page}


PAPER = ["E1", "E2", "E3", "E5"]
BEYOND = ["E10", "E14"]
SECTIONS = ["e1", "e2", "e2-authors", "e3", "e5", "e10", "e14"]


def test_files_written_atomically(run):
  leftovers = [f for f in os.listdir(run["out"]) if f.endswith(".tmp") or f.startswith(".report")]
  assert leftovers == []
  assert os.path.getsize(os.path.join(run["out"], "report.md")) > 0


def test_verdicts_and_key_numbers(run):
  by = {r["id"]: r for r in run["records"]}
  assert report_lib.verdict(by["E1"]) == ("ok", "1 of 1 as expected")
  assert report_lib.verdict(by["E2"]) == ("ok", "all 2 checks as expected")
  assert report_lib.verdict(by["E5"]) == ("partial", "2 of 3 as expected")
  assert report_lib.verdict(by["E3"]) == ("fail", "failed to run")
  assert report_lib.verdict(by["E14"])[0] == "info"
  # the registry's key numbers of the experiment, read from the summary the record carries
  assert report_lib.key_number(by["E2"]) == "mean corr(W, Frobenius SVM) 0.9987; mean corr(KQ^T, nuclear SVM) 0.9975"
  assert report_lib.key_number(by["E3"]) == "ValueError: boom"
  assert report_lib.key_number(by["E14"]) == "-"       # no checks, no summary.json
  # ... or from the experiment's own summary.json in OUT
  with open(os.path.join(run["out"], "multi_head", "summary.json")) as f:
    e14 = records_lib.join_key_numbers(registry.key_numbers(json.load(f), registry.get("E14")))
  assert e14 and report_lib.key_number(by["E14"], run["out"]) == e14
  # key numbers reproduce recorded come first; a run without any shows its first check
  assert report_lib.key_number({**by["E5"], "key_numbers": [["median 1 - corr(W, W^SVMeq)", 0.011], ["none", None]]}) \
      == "median 1 - corr(W, W^SVMeq) 0.011"
  assert report_lib.key_number({**by["E1"], "key_numbers": []}) == \
      "min over data sets of corr(final W, Frobenius W^mm(opt)): 0.994"
  # every experiment of the paper has its claim in the registry
  paper = [e for e in registry.experiments() if not e.beyond]
  assert {e.id for e in paper} == {f"E{i}" for i in range(1, 10)} and all(e.claim for e in paper)


def test_summary_first_with_a_line_per_experiment(run):
  md, page = run["md"], run["html"]
  # the summary comes before any experiment's section
  assert md.index("## Summary") < md.index("## Contents") < md.index('<a id="e1"></a>')
  assert page.index("id='summary'") < page.index("id='contents'") < page.index("<section id='e1'")
  assert ("The paper (E1, E2, E3, E5), 4 experiments: 2 with all checks as expected, 1 with some not as expected, "
          "1 failed to run; 6 of 7 checks as expected.") in md        # the E2-authors variant's check included
  assert ("Beyond the paper (E10, E14), 2 experiments: 1 with all checks as expected, 1 reported (no checks); "
          "1 of 1 checks as expected.") in md
  assert "Failed to run: E3." in md
  summary_md = md[md.index("## Summary"):md.index("## Contents")]
  summary_html = page[page.index("id='summary'"):page.index("id='contents'")]
  lines = {line.split("|")[1].strip(): line for line in summary_md.splitlines() if line.startswith("| [E")}
  assert list(lines) == [f"[{e}](#{e.lower()})" for e in PAPER + BEYOND]
  assert "all 2 checks as expected" in lines["[E2](#e2)"] and "E2-authors" in lines["[E2](#e2)"]
  assert registry.get("E2").claim.split(":")[0] in lines["[E2](#e2)"]
  assert "failed to run" in lines["[E3](#e3)"]
  assert "**2 of 3 as expected**" in lines["[E5](#e5)"] and "not as expected: d=6" in lines["[E5](#e5)"]
  assert "| reported |" in lines["[E14](#e14)"] and "as expected" not in lines["[E14](#e14)"]
  for e in PAPER + BEYOND:
    assert re.search(rf"<tr><td class='idc'><a href='#{e.lower()}'>{e}</a></td>", summary_html), e
  assert "failed to run" in summary_html and "badge partial" in summary_html and "badge info'>reported" in summary_html


def test_table_of_contents(run):
  md, page = run["md"], run["html"]
  toc_md = md[md.index("## Contents"):md.index("# The paper")]
  toc_html = page[page.index("id='contents'"):page.index("id='paper'")]
  for anchor in SECTIONS + ["paper", "beyond", "numerics", "environment"]:
    assert f"](#{anchor})" in toc_md, anchor
    assert f"<a href='#{anchor}'>" in toc_html, anchor


def _html_section(page, anchor):
  start = page.index(f"<section id='{anchor}'")
  return page[start:page.index("</section>", start)]


def test_one_section_per_experiment_with_its_figures(run):
  md, page = run["md"], run["html"]
  for r in run["records"]:
    anchor = report_lib.anchor(r)
    assert page.count(f"<section id='{anchor}'") == 1 and md.count(f'<a id="{anchor}"></a>') == 1
    sec = _html_section(page, anchor)
    md_start = md.index(f'<a id="{anchor}"></a>')
    md_sec = md[md_start:md.index("<a id=", md_start + 1)]
    assert "python -m svmattn " + r["module"] in sec and "python -m svmattn " + r["module"] in md_sec
    assert "Wall time 1.5 s" in sec and "Wall time 1.5 s" in md_sec
    for fig in r.get("figures", []):
      assert f"![{fig.replace('_', chr(92) + '_')}]({fig})" in md_sec
      assert "src='data:image/png;base64,iVBORw0KGgo" in sec
    assert sec.count("data:image/png;base64,") == len(r.get("figures", []))
    if r.get("figures"):                  # the figures open the section, before the claim and the checks
      assert sec.index("<figure") < sec.index("<p")
    if r.get("checks"):
      assert sec.count("<tr") == len(r["checks"]) + 1
  e5 = _html_section(page, "e5")
  assert "The paper claims." in e5 and "<tr class=miss>" in e5 and "class='no'>no</td>" in e5
  assert "a \\| pipe" in md                                            # markdown tables survive a '|'
  e3 = _html_section(page, "e3")
  assert "Failed to run." in e3 and "ValueError: boom" in e3 and "href='svm_rank/log.txt'" in e3
  assert "<details open>" in _html_section(page, "e14")               # no checks: its output is the result
  e14 = next(r for r in run["records"] if r["id"] == "E14")
  found = report_lib.key_number(e14, run["out"])                         # its key numbers, from its summary.json
  assert found != "-" and f"Found: {found}" in _html_section(page, "e14")
  # the variant sits right after its experiment, before the next one
  assert page.index("<section id='e2'") < page.index("<section id='e2-authors'") < page.index("<section id='e3'")


def test_numerics_then_beyond_then_environment(run):
  md, page = run["md"], run["html"]
  last_paper = page.index("<section id='e5'")
  assert last_paper < page.index("<section id='numerics'") < page.index("id='beyond'")
  assert page.index("id='beyond'") < page.index("<section id='e10'") < page.index("<section id='e14'")
  assert "0.9987</td><td class='num'>0.9971" in page                 # exact against authors, E2
  assert md.index('<a id="e5"></a>') < md.index("# Beyond the paper") < md.index('<a id="e10"></a>')
  for text, heading in ((page, "id='environment'>Environment and command line"),
                        (md, '<a id="environment"></a>\n\n# Environment and command line')):
    tail = text[text.index(heading) + len(heading):]
    assert text.index(heading) > text.index("section id='e14'" if text is page else '<a id="e14"></a>')
    assert "python -m experiments.reproduce --out=OUT --quick" in tail
    assert "0.10.2" in tail and "3.11.7" in tail and "cpu:0, cpu:1" in tail
    assert "section id=" not in tail and '<a id="e' not in tail


def test_html_stands_alone(run):
  page = run["html"]
  assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
  assert "max-width:1000px" in page
  assert not re.search(r"""(src|href)=['"]?(https?:|//)""", page)
  assert "<link" not in page and "<script" not in page


def test_rerender_from_reproduce_json(run, tmp_path):
  from svmattn.io import atomic_files as results_io
  results_io.write_json(os.path.join(run["out"], "reproduce.json"), {"meta": run["meta"], "experiments": run["records"]})
  os.remove(os.path.join(run["out"], "report.html"))
  assert report_lib.main([run["out"]]) == 0
  with open(os.path.join(run["out"], "report.html")) as f:
    assert f.read() == run["html"]


@pytest.mark.slow   # (the fast set keeps a sibling of this check; CI runs the slow ones too)
def test_rerender_as_a_command(run):
  """`python -m experiments.report OUT`, as a user runs it (every function defined before main runs)."""
  import subprocess
  import sys
  from svmattn.io import atomic_files as results_io
  results_io.write_json(os.path.join(run["out"], "reproduce.json"), {"meta": run["meta"], "experiments": run["records"]})
  os.remove(os.path.join(run["out"], "report.html"))
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run([sys.executable, "-m", "experiments.report", run["out"]], cwd=root, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  with open(os.path.join(run["out"], "report.html")) as f:
    assert f.read() == run["html"]


def test_command_line():
  assert report_lib.command_line(["/x/reproduce.py", "--out=a b", "--quick"], "experiments") == \
      "python -m experiments.reproduce '--out=a b' --quick"
  assert report_lib.command_line(["svmattn reproduce", "--out=r"], "svmattn.experiments") == "svmattn reproduce --out=r"
  assert report_lib.command_line(["/x/experiments/reproduce.py", "--quick"]) == "python -m experiments.reproduce --quick"
  assert report_lib.command_line(["/x/svmattn/report/reproduce.py"]) == "python -m svmattn.report.reproduce"


def test_from_the_registry(run):
  """Claims and questions, titles, variants, order and what was not run come from svmattn.registry."""
  md, page = run["md"], run["html"]
  by = {r["id"]: r for r in run["records"]}
  e10 = registry.get("E10")
  assert e10.beyond and "The question." in _html_section(page, "e10")
  assert html.escape(e10.claim.split(",")[0]) in _html_section(page, "e10")
  assert f"**The paper claims.** " in md and "The paper claims." in _html_section(page, "e2")
  assert html.escape(f"E2: {registry.get('E2').title}") in _html_section(page, "e2")                 # the registry's title
  authors = next(v for v in registry.get("E2").variants if v.name == "authors")
  assert html.escape(f"E2-authors: {authors.title}") in page
  assert records_lib.variant_label(by["E2-authors"]) == "the authors' numerics"
  ran = {"E1", "E2", "E3", "E5", "E10", "E14"}
  missing = [e.id for e in registry.experiments() if e.id not in ran]
  assert records_lib.not_run(run["records"]) == missing and f"Not run this time: {', '.join(missing)}." in md
  # the groups follow the registry's order whatever the records' order
  order = [g[0]["id"] for g in records_lib.group(list(reversed(run["records"])))]
  assert order == [e.id for e in registry.experiments() if e.id in ran]


def test_key_numbers_of_a_function(monkeypatch):
  """An entry's key_numbers may be fn(summary) -> [(label, value)]; None values are left out."""
  fake = registry.Experiment(id="E99", name="fake", title="A fake experiment", settings=registry.get("E2").settings,
                             key_numbers=lambda s: [("largest d", s["d"]), ("absent", None), ("per d", {"4": 0.5})])
  real = registry.get
  monkeypatch.setattr(registry, "get", lambda name: fake if name == "E99" else real(name))
  r = {"id": "E99", "dir": "fake", "returncode": 0, "checks": [], "summary": {"d": 8}}
  assert report_lib.key_number(r) == "largest d 8; per d 4 0.5"
  assert report_lib.key_number({**r, "summary": {}}) == "-"


@pytest.mark.slow
def test_reproduce_builds_its_runs_from_the_registry(tmp_path):
  """Every registered experiment and variant; --quick passes the entry's quick settings as flags."""
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  code = ("import json, sys\nfrom absl import flags\nfrom svmattn.report import reproduce as r\n"
          "flags.FLAGS(['x', '--quick', '--only=E2,E3', '--out=" + str(tmp_path) + "'])\n"
          "print(json.dumps([[x.key, x.dir, r.command(x, 'OUT')[1:]] for x in r.selected(flags.FLAGS.only)]))\n"
          "print(json.dumps([x.key for x in r.runs()]))")
  proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  chosen, every = (json.loads(line) for line in proc.stdout.splitlines()[-2:])
  assert [c[:2] for c in chosen] == [["E2", "local_convergence"], ["E2-authors", "local_convergence_authors"],
                                     ["E3", "svm_rank"]]
  assert chosen[0][2][:3] == ["-m", "svmattn", "local_convergence"] and "--runs=30" in chosen[0][2]
  assert "--numerics=authors" in chosen[1][2] and "--runs=30" in chosen[1][2]
  assert "--ds=1,2,5,10" in chosen[2][2] and "--shapes=5:5,10:5" in chosen[2][2]          # lists comma-joined
  expected = [e.id + (f"-{v.name}" if v else "") for e in registry.experiments() for v in (None, *e.variants)]
  assert every == expected
  bad = subprocess.run([sys.executable, "-m", "svmattn.report.reproduce", "--only=E99", f"--out={tmp_path}"],
                       cwd=root, capture_output=True, text=True, timeout=300)
  assert bad.returncode != 0 and "unknown experiment(s) ['E99']" in bad.stderr
