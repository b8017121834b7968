"""Progress of a long command: a bar on a terminal, a plain line every few seconds elsewhere.

A load or a re-embed run from a script, a container or CI has no terminal; without a line
now and then it is silent for minutes and looks hung. Counts advance when a
batch commits, so what is shown has been written, never merely read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

DEFAULT_INTERVAL_S = 5.0


class _RateColumn(ProgressColumn):
    """Items per second over rich's recent window (the bar's ETA uses the same)."""

    def __init__(self, unit: str = "records") -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.0f} {self.unit}/s")


def progress_line(done: int, total: int, elapsed: float, unit: str = "records") -> str:
    """``done/total records (p%), rate, time left`` from the average rate so far."""
    rate = done / elapsed if elapsed > 0 else 0.0
    share = done / total if total else 1.0
    line = f"{done:,}/{total:,} {unit} ({share:.0%}), {rate:,.0f} {unit}/s"
    if 0 < done < total and rate > 0:
        line += f", about {_duration((total - done) / rate)} left"
    return line


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


@asynccontextmanager
async def report_progress(
    total: int,
    out: TextIO,
    *,
    terminal: bool,
    label: str = "loading",
    interval_s: float = DEFAULT_INTERVAL_S,
    unit: str = "records",
) -> AsyncIterator[Callable[[int], None]]:
    """Yields ``advance(n)``. On a terminal: a bar with count, rate, elapsed time
    and ETA. Elsewhere: a line on ``out`` every ``interval_s`` seconds while the
    work runs (even when no batch finished since the last line), and a last one."""
    if terminal:
        with Progress(
            f"[progress.description]{label}",
            BarColumn(),
            MofNCompleteColumn(),
            _RateColumn(unit),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(file=out),
            transient=True,
        ) as bar:
            task = bar.add_task(label, total=total)
            yield lambda n: bar.advance(task, n)
        return
    done = [0]
    started = time.monotonic()

    def emit() -> None:
        line = progress_line(done[0], total, time.monotonic() - started, unit)
        print(f"{label}: {line}", file=out, flush=True)

    async def tick() -> None:
        while True:
            await asyncio.sleep(interval_s)
            emit()

    ticker = asyncio.create_task(tick())
    try:
        yield lambda n: done.__setitem__(0, done[0] + n)
    finally:
        ticker.cancel()
        if time.monotonic() - started >= interval_s:
            emit()
