"""Which run ids are already in ClickHouse: the store's exactly-once check, across processes.

The writer's in-memory ``recent`` set only knows what *this* process claimed. A run record can
also come back after a restart (the recovered WAL, the SDK re-sending an unacknowledged
``RunEnded``, a span-derived record for a run whose agent record exists). Asking ClickHouse
about every id of every batch costs ~40 ms per 10k-id batch at 1M stored rows (uuid4 ids hit
every granule), so :class:`CommittedRuns` keeps a Bloom filter of every run id in ``runs``
(loaded once per process, then fed by every batch) and asks ClickHouse only about the ids the
filter cannot rule out: false positives (~0.05 %) and true repeats. A Bloom filter has no
false negatives, so a repeat is never missed.

Correctness does not depend on the filter being current for rows committed *later*: a batch is
only checked right before its insert, after every batch before it (the spool is replayed in
order, and new batches queue behind it) has committed and been added.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["CommittedRuns", "RecentIds", "RunIdFilter", "without"]

log = logging.getLogger("guard.store")

_LOOKUP_CHUNK = 1000  # ids per lookup query (the query text stays far below max_query_size)


class RunIdFilter:
    """A scalable Bloom filter of strings: no false negatives, ~0.05 % false positives.

    Uses Python's ``hash`` (randomised per process): the filter is rebuilt in each process and
    never persisted. When one layer is full a new, larger one is added; a probe ORs the layers.
    """

    _BITS_PER_KEY = 20
    _K = 5

    def __init__(self, capacity: int = 1 << 20) -> None:
        self._layers: list[tuple[np.ndarray, int, int]] = []  # (bits, mask, capacity)
        self._count = 0  # keys in the newest layer
        self._add_layer(capacity)

    def _add_layer(self, capacity: int) -> None:
        m = 1 << max(16, (capacity * self._BITS_PER_KEY - 1).bit_length())
        self._layers.append((np.zeros(m >> 3, dtype=np.uint8), m - 1, capacity))
        self._count = 0

    def _cells(self, keys: list[str], mask: int) -> tuple[np.ndarray, np.ndarray]:
        """(byte index, bit within the byte) of each key's K bits, each of shape (n, K).

        The byte index is ``intp`` and the bit a ``uint8``: with those types ``ufunc.at``
        takes numpy's fast path (10x the uint64 indices it was given before).
        """
        h = np.fromiter(map(hash, keys), dtype=np.int64, count=len(keys)).view(np.uint64)
        a = h & np.uint64(0xFFFFFFFF)
        b = (h >> np.uint64(32)) | np.uint64(1)
        steps = np.arange(self._K, dtype=np.uint64)
        pos = (a[:, None] + steps[None, :] * b[:, None]) & np.uint64(mask)
        byte = (pos >> np.uint64(3)).astype(np.intp)
        return byte, np.left_shift(np.uint8(1), (pos & np.uint64(7)).astype(np.uint8))

    @property
    def nbytes(self) -> int:
        return sum(bits.nbytes for bits, _, _ in self._layers)

    def add(self, keys: list[str]) -> None:
        if not keys:
            return
        bits, mask, capacity = self._layers[-1]
        if self._count + len(keys) > capacity:
            self._add_layer(max(capacity * 2, len(keys)))
            bits, mask, capacity = self._layers[-1]
        byte, bit = self._cells(keys, mask)
        np.bitwise_or.at(bits, byte.ravel(), bit.ravel())
        self._count += len(keys)

    def maybe(self, keys: list[str]) -> list[str]:
        """The keys that may have been added (every added key is among them)."""
        if not keys:
            return []
        hit = np.zeros(len(keys), dtype=bool)
        for bits, mask, _ in self._layers:
            byte, bit = self._cells(keys, mask)
            hit |= (bits[byte] & bit).all(axis=1)
        return [keys[i] for i in np.flatnonzero(hit)]


class RecentIds:
    """The run ids this process claimed most recently: at least the last ``capacity``.

    One set of them all, so a batch with no repeat is ruled out by one C-level ``isdisjoint``
    (one lookup per id; a set per batch cost one per id and batch), and the ids of each
    ``add``, oldest first, each id in the set of the add that brought it last: forgetting the
    oldest add is one set difference.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._all: set[str] = set()
        self._adds: deque[set[str]] = deque()

    def __contains__(self, run_id: str) -> bool:
        return run_id in self._all

    def isdisjoint(self, ids: list[str]) -> bool:
        return self._all.isdisjoint(ids)

    def add(self, ids: list[str]) -> None:
        if not ids:
            return
        batch = set(ids)
        again = batch & self._all
        if again:  # brought again (the writer never does): it belongs to this add now
            for older in self._adds:
                older -= again
        self._all |= batch
        self._adds.append(batch)
        while len(self._all) - len(self._adds[0]) >= self._capacity:
            self._all -= self._adds.popleft()


class CommittedRuns:
    """Run ids already committed to ``{db}.runs``: a filter in memory, ClickHouse for the rest.

    ``present(client, ids)`` raises whatever the client raises (ClickHouse down): the caller
    then spools the batch and checks again before it is replayed.
    """

    def __init__(self, database: str) -> None:
        self._db = database
        self._filter: RunIdFilter | None = None
        self.lookups = 0  # ClickHouse lookup queries issued (the benchmark reads it)

    @property
    def loaded(self) -> bool:
        return self._filter is not None

    @property
    def filter_bytes(self) -> int:
        return 0 if self._filter is None else self._filter.nbytes

    def load(self, client: Any) -> int:
        """Build the filter from every run id in ClickHouse (once per process). Returns the count."""
        if self._filter is not None:
            return 0
        n = int(client.command(f"SELECT count() FROM {self._db}.runs"))
        f = RunIdFilter(max(1 << 20, 2 * n))
        if n:
            # Arrow: exact strings, no text escaping, ~3x faster than parsing a text format
            column = client.query_arrow(f"SELECT run_id FROM {self._db}.runs").column(0)
            for i in range(0, len(column), 200_000):
                ids = column.slice(i, 200_000).to_pylist()
                f.add([x if type(x) is str else bytes(x).decode("utf-8", "replace") for x in ids])
        self._filter = f
        return n

    def add(self, ids: list[str]) -> None:
        """Record ids that are committed (or claimed by a batch that commits before any later one)."""
        if self._filter is not None:
            self._filter.add(ids)

    def present(self, client: Any, ids: Iterable[str]) -> set[str]:
        """The ids among ``ids`` that already have a row in ``runs``."""
        self.load(client)
        assert self._filter is not None
        maybe = self._filter.maybe(list(dict.fromkeys(ids)))
        found: set[str] = set()
        for i in range(0, len(maybe), _LOOKUP_CHUNK):
            self.lookups += 1
            rows = client.query(
                f"SELECT DISTINCT run_id FROM {self._db}.runs WHERE run_id IN {{ids:Array(String)}}",
                parameters={"ids": maybe[i : i + _LOOKUP_CHUNK]},
            ).result_rows
            found.update(r[0] for r in rows)
        return found


def without(rows: list[str], ids: list[str], drop: set[str]) -> tuple[list[str], list[str]]:
    """The rows (and their run ids) whose run id is not in ``drop``."""
    kept = [(r, i) for r, i in zip(rows, ids, strict=True) if i not in drop]
    return [r for r, _ in kept], [i for _, i in kept]
