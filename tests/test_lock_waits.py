"""The retry policy of short lock-taking transactions (gateway/services/lock_waits.py):
the behaviour the hand-written loop had, now tenacity's. No database: the policy
is checked by driving tenacity's own retry loop, without sleeping."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
import tenacity

from gateway.services import lock_waits


def _waits(policy: tenacity.AsyncRetrying, attempts: int) -> list[float]:
    out = []
    for n in range(1, attempts + 1):
        state = tenacity.RetryCallState(policy, None, (), {})
        state.attempt_number = n
        assert policy.wait is not None
        out.append(policy.wait(state))
    return out


def test_each_wait_is_between_half_and_all_of_a_step_doubling_from_50_ms_to_2_s() -> None:
    policy = lock_waits.retrying()
    steps = [min(0.05 * 2 ** (n - 1), 2.0) for n in range(1, 41)]
    for _ in range(200):
        for step, wait in zip(steps, _waits(policy, 40), strict=True):
            assert step / 2 <= wait <= step
    assert steps[:3] == [0.05, 0.1, 0.2] and steps[-1] == 2.0


async def test_busy_tries_are_repeated_40_times_then_given_up_other_errors_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []

    async def no_sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", no_sleep)
    tries = 0
    with pytest.raises(tenacity.RetryError):
        async for attempt in lock_waits.retrying():
            with attempt:
                tries += 1
                raise asyncpg.LockNotAvailableError("canceling statement due to lock timeout")
    assert tries == lock_waits.ATTEMPTS == 40
    assert len(slept) == 39 and 30 < sum(slept) < 70  # about a minute in all

    tries = 0
    with pytest.raises(ValueError):
        async for attempt in lock_waits.retrying():
            with attempt:
                tries += 1
                raise ValueError("not a lock")
    assert tries == 1

    tries = 0
    async for attempt in lock_waits.retrying():
        with attempt:
            tries += 1
            if tries < 3:
                raise asyncpg.DeadlockDetectedError("deadlock detected")
    assert tries == 3
