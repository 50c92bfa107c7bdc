"""svmattn.io.progress: structured log lines off a terminal, a redrawn bar on one."""
import io
import re

from svmattn.io import progress as progress_lib

LINE = re.compile(r"^progress label=(\S+) done=(\d+) total=(\d+) unit=(\S+) rate=(\S+) elapsed_s=(\S+) eta_s=(\S+)$")


class FakeTTY(io.StringIO):
  def isatty(self):
    return True


def _parse(text):
  lines = text.splitlines()
  parsed = [LINE.match(line) for line in lines]
  assert all(parsed), lines
  return [m.groups() for m in parsed]


def test_non_tty_gets_structured_lines():
  stream = io.StringIO()
  bar = progress_lib.Progress("train W", total=10, unit="steps", stream=stream, log_every=0.0)
  for _ in range(5):
    bar.update(2)
  bar.close()
  rows = _parse(stream.getvalue())
  assert len(rows) == 5  # one line per update (log_every=0), none more at close
  assert [int(r[1]) for r in rows] == [2, 4, 6, 8, 10]
  assert all(r[0] == "train_W" and r[2] == "10" and r[3] == "steps" for r in rows)
  assert float(rows[-1][6]) == 0.0 and float(rows[-1][4]) > 0
  assert "\r" not in stream.getvalue()


def test_non_tty_rate_limited_but_reports_the_end():
  stream = io.StringIO()
  with progress_lib.Progress("svm", total=100, stream=stream, log_every=3600.0) as bar:
    for _ in range(100):
      bar.update()
  rows = _parse(stream.getvalue())
  assert len(rows) == 1 and rows[0][1] == "100"


def test_unfinished_work_reported_at_close():
  stream = io.StringIO()
  with progress_lib.Progress("svm", total=100, stream=stream, log_every=3600.0) as bar:
    bar.update(30)
  rows = _parse(stream.getvalue())
  assert len(rows) == 1 and rows[0][1] == "30" and rows[0][2] == "100"


def test_disabled_prints_nothing():
  stream = io.StringIO()
  with progress_lib.Progress("x", total=3, stream=stream, log_every=0.0, enabled=False) as bar:
    bar.update(3)
  assert stream.getvalue() == ""


def test_tty_bar_redrawn_in_place():
  stream = FakeTTY()
  with progress_lib.Progress("train", total=4, unit="steps", stream=stream) as bar:
    bar.update(2)
    bar.update(2)
  out = stream.getvalue()
  assert out.count("\r") == 3 and out.endswith("\n") and out.count("\n") == 1
  assert "4/4 steps" in out and "[" + "#" * 30 + "]" in out
  assert "progress label=" not in out
