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
