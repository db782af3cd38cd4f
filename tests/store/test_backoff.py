"""The store's retry schedule: doubling between its bounds, jittered, reset by a success."""

from __future__ import annotations

import time

from guard.store._backoff import Backoff


def test_doubles_to_the_cap_with_jitter_between_half_and_the_step() -> None:
    b = Backoff(min_s=0.25, max_s=2.0)
    steps = [0.25, 0.5, 1.0, 2.0, 2.0]
    for step in steps:
        wait_s = b.failed()
        assert step * 0.5 <= wait_s <= step
        assert not b.due()
    b.reset()
    assert b.failed() <= 0.25


def test_jitter_spreads_replicas_apart() -> None:
    waits = {round(Backoff(min_s=1.0, max_s=1.0).failed(), 6) for _ in range(50)}
    assert len(waits) > 40  # not one schedule shared by every replica


def test_retry_now_makes_it_due_and_keeps_the_step() -> None:
    b = Backoff(min_s=10.0, max_s=40.0)
    b.failed()
    b.retry_now()
    assert b.due()
    before = time.monotonic()
    assert b.failed() >= 10.0  # the second failure's step is 20 s: at least half of it
    assert b.due_at >= before + 10.0
