"""Progress reports: a redrawn bar on a terminal, structured log lines otherwise."""
from __future__ import annotations

import sys
import time


class Progress:
  """Progress of ``total`` units of work named ``label``.

      bar = Progress("train W", total=2000, unit="steps")
      bar.update(500)
      bar.close()

  On a terminal the bar is redrawn in place with rate and ETA; elsewhere a log
  line ``progress label=... done=... total=... rate=... eta_s=...`` is printed at
  most every ``log_every`` seconds and at the end.
  """

  def __init__(self, label: str, total: int, unit: str = "it", stream=None, log_every: float = 5.0,
               enabled: bool = True):
    self.label, self.total, self.unit = label, max(int(total), 0), unit
    self.stream = stream or sys.stderr
    self.enabled = enabled
    self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
    self.log_every = log_every
    self.done = 0
    self.start = self._last = time.perf_counter()
    self._closed = False

  def update(self, k: int = 1) -> None:
    self.done += k
    now = time.perf_counter()
    if self.tty or now - self._last >= self.log_every or self.done >= self.total:
      self._emit(now)

  def _emit(self, now: float, final: bool = False) -> None:
    if not self.enabled:
      return
    self._last = now
    elapsed = now - self.start
    rate = self.done / elapsed if elapsed > 0 else float("nan")
    eta = (self.total - self.done) / rate if rate and rate > 0 else float("nan")
    if self.tty:
      width = 30
      frac = self.done / self.total if self.total else 1.0
      bar = "#" * int(width * frac) + "-" * (width - int(width * frac))
      self.stream.write(f"\r{self.label:>14} [{bar}] {self.done}/{self.total} {self.unit} "
                        f"{rate:,.1f} {self.unit}/s eta {eta:5.1f}s" + ("\n" if final else ""))
    else:
      self.stream.write(f"progress label={self.label.replace(' ', '_')} done={self.done} total={self.total} "
                        f"unit={self.unit} rate={rate:.3g} elapsed_s={elapsed:.2f} eta_s={eta:.1f}\n")
    self.stream.flush()

  def close(self) -> None:
    if not self._closed:
      self._closed = True
      if self.tty or self.done < self.total:
        self._emit(time.perf_counter(), final=True)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


class MultiProgress:
  """One display for several counters (e.g. training steps and SVM solves), each with
  its rate and ETA: one redrawn line on a terminal, structured log lines otherwise.

      bar = MultiProgress({"train": (40000, "steps"), "svm": (20000, "sets")})
      bar.update("train", 500); bar.update("svm", 1000); bar.close()
  """

  def __init__(self, counters: dict[str, tuple[int, str]], stream=None, log_every: float = 5.0,
               enabled: bool = True):
    self.total = {k: max(int(t), 0) for k, (t, _) in counters.items()}
    self.unit = {k: u for k, (_, u) in counters.items()}
    self.done = {k: 0 for k in counters}
    self.stream = stream or sys.stderr
    self.enabled = enabled
    self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
    self.log_every = log_every
    self.start = self._last = time.perf_counter()

  def update(self, name: str, k: int = 1) -> None:
    now = time.perf_counter()
    self.done[name] += k
    if self.tty or now - self._last >= self.log_every:
      self._emit(now)

  def _parts(self, now):
    parts = []
    for name in self.total:
      elapsed = now - self.start
      rate = self.done[name] / elapsed if elapsed > 0 else float("nan")
      eta = (self.total[name] - self.done[name]) / rate if rate and rate > 0 else float("nan")
      parts.append((name, self.done[name], self.total[name], self.unit[name], rate, eta))
    return parts

  def _emit(self, now, final=False):
    if not self.enabled:
      return
    self._last = now
    parts = self._parts(now)
    if self.tty:
      text = " | ".join(f"{n} {d}/{t} {u} {r:,.1f}/s eta {e:.0f}s" for n, d, t, u, r, e in parts)
      self.stream.write("\r" + text + ("\n" if final else ""))
    else:
      for n, d, t, u, r, e in parts:
        self.stream.write(f"progress label={n} done={d} total={t} unit={u} rate={r:.3g} "
                          f"elapsed_s={now - self.start:.2f} eta_s={e:.1f}\n")
    self.stream.flush()

  def close(self) -> None:
    self._emit(time.perf_counter(), final=True)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
