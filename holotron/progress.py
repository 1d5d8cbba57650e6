"""A one-line progress display on stderr for long loops (training, evaluation), with no dependency.

    bar = Progress(total=1000, desc="train")
    for step in ...:
        bar.update(step + 1, loss=f"{loss:.3f}", tok_s=f"{tps:,.0f}")
    bar.close()

On a terminal the line is rewritten in place (carriage return); otherwise (a log file, CI) one full
line is written at most every ``every_s`` seconds and at the end, so logs stay short.
"""

from __future__ import annotations

import sys
import time

__all__ = ["Progress", "format_seconds"]


def format_seconds(s: float) -> str:
    s = max(0, int(round(s)))
    h, m, sec = s // 3600, s // 60 % 60, s % 60
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


class Progress:
    def __init__(self, total: int | None, desc: str = "", stream=None, every_s: float = 10.0, enabled: bool = True,
                 deadline: float | None = None):
        self.total, self.desc = total, desc
        self.deadline = deadline  # a time.perf_counter() by which the loop stops anyway (caps the ETA)
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every_s = 0.1 if self.tty else every_s
        self.enabled = enabled
        self.t0 = time.perf_counter()
        self._last = -1e9
        self._width = 0
        self.done = 0

    def line(self, done: int, **fields) -> str:
        elapsed = time.perf_counter() - self.t0
        parts = [self.desc] if self.desc else []
        if self.total:
            pct = 100 * done / self.total
            eta = elapsed / done * (self.total - done) if done else 0.0
            if self.deadline is not None:
                eta = min(eta, max(0.0, self.deadline - time.perf_counter()))
            parts.append(f"{done}/{self.total} ({pct:3.0f}%)")
        else:
            parts.append(str(done))
        parts += [f"{k.replace('_', '/')} {v}" for k, v in fields.items()]
        parts.append(format_seconds(elapsed) + (f" < {format_seconds(eta)}" if self.total and done else ""))
        return " | ".join(parts)

    def update(self, done: int, force: bool = False, **fields) -> None:
        self.done = done
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self._last < self.every_s and done != self.total:
            return
        self._last = now
        text = self.line(done, **fields)
        if self.tty:
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def write(self, message: str) -> None:
        """A log line that does not get mixed into the progress line."""
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self._width = 0
        self.stream.write(message + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0
