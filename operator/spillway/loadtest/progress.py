"""Progress of long runs: a bar on a terminal, periodic log lines elsewhere (a Job's log)."""
from __future__ import annotations

import sys
import time
from typing import TextIO

MODES = ("auto", "bar", "log", "none")


def log(message: str, stream: TextIO | None = None) -> None:
    stream = stream or sys.stderr
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} loadtest: {message}", file=stream, flush=True)


class Progress:
    """Counts finished requests of one phase. Modes: bar | log (every interval_s) | none."""

    def __init__(self, label: str, total: int, mode: str = "auto", interval_s: float = 30.0,
                 stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if self.stream.isatty() else "log"
        self.mode, self.label, self.total, self.interval_s = mode, label, total, interval_s
        self.done = 0
        self.failed = 0
        self.start = time.monotonic()
        self._last_log = self.start
        if mode == "log":
            log(f"{label}: {total} requests", self.stream)

    def update(self, ok: bool = True) -> None:
        self.done += 1
        self.failed += 0 if ok else 1
        now = time.monotonic()
        if self.mode == "bar":
            self._draw(now)
        elif self.mode == "log" and now - self._last_log >= self.interval_s:
            self._last_log = now
            log(self._status(now), self.stream)

    def close(self) -> None:
        now = time.monotonic()
        if self.mode == "bar":
            self._draw(now)
            print(file=self.stream, flush=True)
        elif self.mode == "log":
            log(self._status(now) + " done", self.stream)

    def _status(self, now: float) -> str:
        rate = self.done / max(now - self.start, 1e-9)
        failed = f", {self.failed} failed" if self.failed else ""
        return f"{self.label}: {self.done}/{self.total} requests ({rate:.1f}/s{failed})"

    def _draw(self, now: float) -> None:
        width = 30
        filled = int(width * self.done / max(self.total, 1))
        bar = "#" * filled + "-" * (width - filled)
        print(f"\r{self.label} [{bar}] {self._status(now).split(': ', 1)[1]}", end="", file=self.stream, flush=True)
