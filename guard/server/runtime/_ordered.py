"""An insertion-ordered set, for the guard's collections that are ever iterated.

A built-in ``set`` iterates in hash order: for strings that is the process's hash seed, and for
objects without ``__hash__`` (sessions, runs) their memory address. Anything the guard writes
while walking such a set (decisions expired at a sweep, runs cancelled by tenant, records of a
lost stream's runs) would then come out in an order no one chose, different from one process
to the next. Every iterated collection of the server uses this instead, so the order is always
the order in which members were added.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

__all__ = ["OrderedSet"]

T = TypeVar("T")


class OrderedSet(Generic[T]):
    """A set that iterates in insertion order (a dict's keys underneath)."""

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[T] = ()) -> None:
        self._items: dict[T, None] = dict.fromkeys(items)

    def add(self, item: T) -> None:
        self._items[item] = None

    def update(self, items: Iterable[T]) -> None:
        self._items.update(dict.fromkeys(items))

    def discard(self, item: T) -> None:
        self._items.pop(item, None)

    def clear(self) -> None:
        self._items.clear()

    def __contains__(self, item: object) -> bool:
        return item in self._items

    def __iter__(self) -> Iterator[T]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __repr__(self) -> str:
        return f"OrderedSet({list(self._items)!r})"
