"""One body for a wrapper's sync and async forms.

A guarded wrapper is the same in its sync and its async form except at the calls the async
form awaits (the wrapped method, the reservation's tenant wait, a stream's next item). So it is
written once, as a generator body taking ``is_async``: at such a point it makes the call, and
in the async form hands what it got back to its driver with ``yield`` and goes on with the
result sent back::

    result = orig(self, *args, **kwargs)
    if is_async:
        result = yield result  # the awaitable, awaited by adrive

The sync form never yields, so its driver, :func:`drive`, only runs the body to its end; the
async one, :func:`adrive`, awaits what the body yields and throws its exception back in at
the ``yield``, where the body's own ``try`` / ``with`` see it as the async form's ``await``
would. The body's frame runs in the caller's context (a generator has none of its own), so a
context variable it sets (the OpenTelemetry context around the request) is the one the
awaited call sees.

A stream body (a wrapper that is itself a generator) yields its items for the caller too;
there the async form yields what it awaits as a :class:`Wait`, and an async generator made by
:func:`async_generator` drives it. Its sync form yields only items: the sync wrapper
delegates to it with ``yield from``.

The cost is a generator object per call (two inside a run: the reservation step is a body of
its own, ``yield from``-ed): nothing is allocated per item in the sync form, and one
:class:`Wait` per awaited call in the async one.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Generator
from contextlib import AbstractContextManager
from types import GeneratorType
from typing import Any, TypeVar

__all__ = ["Body", "Wait", "adrive", "async_generator", "drive"]

T = TypeVar("T")
_PEP479 = ("generator raised StopIteration",)

# A call body: yields (in its async form only) what to await, is sent its result, returns
# the wrapper's result.
Body = Generator[Any, Any, T]


def drive(body: Body[T]) -> T:
    """The sync form: run ``body``, which never yields, and return what it returns."""
    try:
        body.send(None)
    except StopIteration as done:
        return done.value
    except RuntimeError as exc:
        # A StopIteration the wrapped call raised became a RuntimeError on leaving the body
        # (generators may not raise it): the caller gets it as the unwrapped call raised it.
        if type(exc.__cause__) is StopIteration and exc.args == _PEP479:
            raise exc.__cause__.with_traceback(exc.__cause__.__traceback__) from None
        raise
    body.close()
    raise RuntimeError("the sync form of a wrapper body yielded")


async def adrive(body: Body[T]) -> T:
    """The async form: await each awaitable ``body`` yields, send back its result (or throw
    its exception in), and return what ``body`` returns."""
    try:
        pending = body.send(None)
        while True:
            try:
                value = await pending
            except BaseException as exc:  # a cancellation too: the body sees it where it waits
                pending = body.throw(exc)
            else:
                pending = body.send(value)
    except StopIteration as done:
        return done.value


class Wait:
    """What a stream body's async form awaits (sent back its result), told apart from the
    items it yields for the caller."""

    __slots__ = ("awaitable",)

    def __init__(self, awaitable: Awaitable[Any]) -> None:
        self.awaitable = awaitable


def async_generator(
    body_of: Callable[..., Generator[Any, Any, None] | AsyncIterable[Any]],
    around: AbstractContextManager[Any],
) -> Callable[..., AsyncIterator[Any]]:
    """An async generator function driving the stream bodies ``body_of`` makes (called with
    its arguments): a :class:`Wait` a body yields is awaited and its result sent back;
    anything else goes to the caller. An exception from either (a ``GeneratorExit`` when the
    caller stops reading) is thrown into the body. The driver is the async generator itself,
    not a layer over one: closing it closes the body at once.

    ``body_of`` may return an async iterable instead (nothing to guard): its items are
    passed on as they come, inside ``around``, with no body and no ``Wait``."""

    async def items(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        body = body_of(*args, **kwargs)
        if type(body) is not GeneratorType:
            with around:
                async for item in body:  # type: ignore[union-attr]
                    yield item
            return
        step: Any = body.send
        arg: Any = None
        while True:
            try:
                item = step(arg)
            except StopIteration:
                return
            if type(item) is Wait:
                try:
                    arg = await item.awaitable
                except BaseException as exc:
                    step, arg = body.throw, exc
                else:
                    step = body.send
                continue
            try:
                yield item
            except BaseException as exc:
                step, arg = body.throw, exc
            else:
                step, arg = body.send, None

    return items
