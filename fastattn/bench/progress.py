"""The progress display of a benchmark run, on stderr: one line per finished
measurement, a ``\\r``-updated status line on a terminal, and notes."""

from __future__ import annotations

import sys
import time


class Progress:
    """Progress of ``total`` measurements on ``stream`` (stderr)."""

    def __init__(self, total: int, stream=None, enabled: bool = True):
        self.total = total
        self.done = 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()
        self._width = 0

    def _elapsed(self) -> str:
        e = time.perf_counter() - self.t0
        return f"{int(e // 60):d}:{e % 60:04.1f}"

    def status(self, text: str) -> None:
        """Transient status line (only on a terminal)."""
        if not self.tty:
            return
        line = f"[{min(self.done + 1, self.total)}/{self.total} {self._elapsed()}] {text}"
        cols = 120
        line = line[:cols]
        pad = max(0, self._width - len(line))
        self.stream.write("\r" + line + " " * pad)
        self.stream.flush()
        self._width = len(line)

    def step(self, text: str) -> None:
        """A finished measurement: one permanent line."""
        self.done += 1
        if not self.enabled:
            return
        line = f"[{self.done}/{self.total} {self._elapsed()}] {text}"
        if self.tty:
            pad = max(0, self._width - len(line))
            self.stream.write("\r" + line + " " * pad + "\n")
            self._width = 0
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        if not self.enabled:
            return
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self._width = 0
        self.stream.write(text + "\n")
        self.stream.flush()
