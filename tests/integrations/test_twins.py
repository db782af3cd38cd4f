"""The drivers that run one wrapper body as its sync and its async form
(``guard.integrations._twins``): what the body sees where the async form awaits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator
from typing import Any

import pytest

from guard.integrations._twins import Wait, adrive, async_generator, drive


def _body(fn: Any, is_async: bool, seen: list[Any]) -> Generator[Any, Any, Any]:
    try:
        result = fn()
        if is_async:
            result = yield result
    except BaseException as exc:
        seen.append(type(exc))
        raise
    return result


def test_the_sync_form_returns_what_the_body_returns_and_lets_its_errors_out() -> None:
    seen: list[Any] = []
    assert drive(_body(lambda: 5, False, seen)) == 5

    def boom() -> None:
        raise StopIteration("the wrapped call's own")

    with pytest.raises(StopIteration, match="the wrapped call's own"):  # not a RuntimeError
        drive(_body(boom, False, seen))
    assert seen == [StopIteration]


def test_the_async_form_throws_what_the_awaitable_raised_in_at_the_yield() -> None:
    seen: list[Any] = []

    async def ok() -> int:
        return 7

    async def fails() -> None:
        raise ValueError("from the client")

    assert asyncio.run(adrive(_body(ok, True, seen))) == 7
    with pytest.raises(ValueError, match="from the client"):
        asyncio.run(adrive(_body(fails, True, seen)))
    assert seen == [ValueError]  # the body's own except saw it

    async def cancelled() -> None:
        task = asyncio.ensure_future(adrive(_body(lambda: asyncio.sleep(10), True, seen)))
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    assert seen[-1] is asyncio.CancelledError


def test_an_async_stream_body_is_closed_when_the_caller_stops_reading() -> None:
    events: list[str] = []

    def stream() -> Generator[Any, Any, None]:
        try:
            for i in range(5):
                item = yield Wait(asyncio.sleep(0, result=i))
                yield item
        except GeneratorExit:
            events.append("closed")
            raise

    async def read() -> list[Any]:
        out = []
        items = async_generator(lambda: stream(), contextlib.nullcontext())()
        async for item in items:
            out.append(item)
            if len(out) == 2:
                break
        await items.aclose()  # type: ignore[attr-defined]
        events.append("after aclose")
        return out

    assert asyncio.run(read()) == [0, 1]
    assert events == ["closed", "after aclose"]  # at once, not when collected


def test_an_async_iterable_instead_of_a_body_is_passed_on_inside_around() -> None:
    entered: list[Any] = []

    class Around:
        def __enter__(self) -> None:
            entered.append("in")

        def __exit__(self, *exc: Any) -> None:
            entered.append(exc[0])

    async def source() -> Any:
        for i in range(3):
            yield i

    async def read() -> list[Any]:
        return [i async for i in async_generator(lambda: source(), Around())()]

    assert asyncio.run(read()) == [0, 1, 2]
    assert entered == ["in", None]
