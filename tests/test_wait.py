"""The shared waiting helper (``tests/_wait.py``): returns what the predicate returned, fails
saying what it waited for and the last value seen, and wakes on an event."""

from __future__ import annotations

import asyncio
import threading

import pytest
from _wait import WaitTimeout, wait_until, wait_until_async


def test_returns_the_first_truthy_value_once_another_thread_makes_it_true() -> None:
    box: list[int] = []
    go = threading.Event()
    threading.Thread(target=lambda: (go.wait(10), box.append(7))).start()
    go.set()
    assert wait_until(lambda: box and box[0], 10, "the value") == 7


def test_timeout_names_what_was_awaited_and_the_last_value() -> None:
    calls: list[int] = []
    with pytest.raises(WaitTimeout) as info:
        wait_until(lambda: calls.append(1) or [], 0.05, "three runs ended")
    text = str(info.value)
    assert "waiting for three runs ended" in text and "timed out after 0.05 s" in text
    assert text.endswith("last value: []")  # what the last call returned
    assert len(calls) >= 2  # once at the start, once more at the deadline
    assert isinstance(info.value, AssertionError)  # a test failure, not an error


def test_without_a_description_the_predicate_source_says_what() -> None:
    ended: set[str] = set()
    with pytest.raises(WaitTimeout, match=r'waiting for wait_until\(lambda: "r1" in ended, 0.01\)'):
        wait_until(lambda: "r1" in ended, 0.01)


def test_a_predicate_that_raises_fails_at_once() -> None:
    def boom() -> bool:
        raise RuntimeError("the worker died")

    with pytest.raises(RuntimeError, match="the worker died"):
        wait_until(boom, 60)


async def test_async_twin_awaits_coroutine_predicates() -> None:
    seen: list[int] = []

    async def probe() -> int | None:
        seen.append(1)
        return len(seen) if len(seen) >= 3 else None

    assert await wait_until_async(probe, 10, "a third probe", interval_s=0.001) == 3


async def test_async_twin_wakes_on_the_event_and_times_out_with_what() -> None:
    wake = asyncio.Event()
    box: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    loop.call_later(0.01, lambda: (box.setdefault("n", 1), wake.set()))
    # with ``wake`` there is no polling tick: only the event ends the 60 s wait within 10 s
    waiting = wait_until_async(lambda: box.get("n"), 60, "n", wake=wake)
    assert await asyncio.wait_for(waiting, 10) == 1
    with pytest.raises(WaitTimeout, match=r"waiting for a message; got \[\]"):
        await wait_until_async(lambda: None, 0.01, lambda: "a message; got []", wake=wake)
