"""The loader's progress: a plain line every few seconds when there is no terminal."""

from __future__ import annotations

import asyncio
import io

from gateway.progress import progress_line, report_progress


def test_progress_line_says_count_share_rate_and_time_left() -> None:
    assert progress_line(2_500, 10_000, 2.0) == (
        "2,500/10,000 records (25%), 1,250 records/s, about 6 s left"
    )
    assert progress_line(10_000, 10_000, 4.0) == "10,000/10,000 records (100%), 2,500 records/s"
    assert progress_line(0, 10, 1.0) == "0/10 records (0%), 0 records/s"
    assert "about 1 h 23 min left" in progress_line(1, 5_001, 1.0)


async def test_lines_keep_coming_while_a_batch_is_slow() -> None:
    out = io.StringIO()
    async with report_progress(10, out, terminal=False, interval_s=0.02) as advance:
        advance(4)
        await asyncio.sleep(0.15)  # one slow batch: lines continue meanwhile
        advance(6)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3
    assert all(x.startswith("loading: ") for x in lines)
    assert lines[0].startswith("loading: 4/10 records (40%)")
    assert lines[-1].startswith("loading: 10/10 records (100%)")


async def test_a_quick_load_prints_no_lines() -> None:
    out = io.StringIO()
    async with report_progress(3, out, terminal=False, interval_s=60) as advance:
        advance(3)
    assert out.getvalue() == ""
