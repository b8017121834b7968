"""Progress of a long command: a bar on a terminal, a plain line every few seconds elsewhere.

A command run from a script, a container or CI has no terminal: a bar would
print nothing useful there (or control characters), and silence for minutes
looks like a hang. So off a terminal the same counts go out as one line every
``every_s`` seconds (and a last one at the end): done, total, rate, ETA.
The bar is rich's (already a dependency), with its own rate and ETA columns.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, TextIO


class Report(Protocol):
    def __call__(self, done: int, total: int) -> None: ...


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class PlainLines:
    """One line per ``every_s`` seconds: ``what: done/total (pct), rate/s, ETA``."""

    def __init__(self, what: str, out: TextIO, every_s: float = 5.0) -> None:
        self.what = what
        self.out = out
        self.every_s = every_s
        self._now = time.monotonic
        self._started: float | None = None
        self._start_done = 0
        self._last = float("-inf")
        self._printed: int | None = None
        self._done = 0
        self._total = 0

    def __call__(self, done: int, total: int) -> None:
        now = self._now()
        if self._started is None:
            self._started, self._start_done = now, done
        self._done, self._total = done, total
        if now - self._last >= self.every_s:
            self._last = now
            self._line(now)

    def finish(self) -> None:
        """The last count, unless it was the last line already."""
        if self._started is not None and self._printed != self._done:
            self._line(self._now())

    def _line(self, now: float) -> None:
        assert self._started is not None
        elapsed = now - self._started
        rate = (self._done - self._start_done) / elapsed if elapsed > 0 else 0.0
        pct = 100.0 * self._done / self._total if self._total else 100.0
        eta = _duration((self._total - self._done) / rate) if rate > 0 else "unknown"
        self._printed = self._done
        print(
            f"{self.what}: {self._done}/{self._total} ({pct:.0f}%), {rate:.1f}/s, ETA {eta}",
            file=self.out,
            flush=True,
        )


@contextmanager
def progress(what: str, out: TextIO, *, every_s: float = 5.0) -> Iterator[Report]:
    """A reporter for ``(done, total)`` counts, shaped for where ``out`` goes."""
    if not out.isatty():
        lines = PlainLines(what, out, every_s)
        try:
            yield lines
        finally:
            lines.finish()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        Task,
        TaskProgressColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class Rate(ProgressColumn):
        """Items per second (rich's own speed column counts bytes)."""

        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            return Text(f"{speed:.1f}/s" if speed else "-/s")

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        Rate(),
        TimeRemainingColumn(),
        console=Console(file=out),
        transient=False,
    ) as bar:
        task = bar.add_task(what, total=None)

        def report(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield report
