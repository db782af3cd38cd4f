"""Shared helpers for the store tests (real embedded ClickHouse in tmp dirs)."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
from clickhouse_connect.driver.exceptions import OperationalError

from guard.policy._types import REASON_STATUS, DecidedBy, Outcome, Reason
from guard.store import DecisionRecord, Store, open_store

REASONS = [
    Reason.FINAL_ANSWER,
    Reason.MAX_STEPS,
    Reason.LOOP_DETECTED,
    Reason.COST_BUDGET,
    Reason.AGENT_LOST,
]


def outcome(
    i: int, *, now: float | None = None, rng: random.Random | None = None, **kw: Any
) -> Outcome:
    """A varied but deterministic run record: tenants, agents, reasons, minutes, costs."""
    rng = rng or random.Random(i)
    now = time.time() if now is None else now
    reason = REASONS[i % len(REASONS)]
    ended = now - rng.randint(0, 3 * 3600)
    fields: dict[str, Any] = {
        "run_id": f"run-{i:06d}",
        "status": REASON_STATUS[reason],
        "reason": reason,
        "message": f"{reason.value} after {i % 40} steps",
        "tenant": ("acme", "globex")[i % 2],
        "agent": ("refund-bot", "research", "coder")[i % 3],
        "trace_id": f"{i:032x}",
        "steps": rng.randint(1, 50),
        "model_calls": rng.randint(1, 50),
        "tool_calls": rng.randint(0, 80),
        "tool_attempts": rng.randint(0, 90),
        "input_tokens": rng.randint(100, 90_000),
        "output_tokens": rng.randint(10, 9_000),
        "cost_usd": None if i % 7 == 0 else round(rng.random(), 6),
        "elapsed_ms": rng.randint(10, 90_000),
        "deadline_ms": None if i % 3 else 90_000,
        "loop_hits": rng.randint(0, 3),
        "decided_by": (DecidedBy.SDK, DecidedBy.GUARD, DecidedBy.OPERATOR)[i % 3],
        "started_at": ended - 30,
        "ended_at": ended,
    }
    fields.update(kw)
    return Outcome(**fields)


def decision(i: int, **kw: Any) -> DecisionRecord:
    fields: dict[str, Any] = {
        "decided_at": time.time(),
        "run_id": f"run-{i:06d}",
        "tenant": "acme",
        "agent": "refund-bot",
        "action": ("warn", "wrap_up", "cancel", "deny")[i % 4],
        "reason": "max_steps",
        "utilisation": 0.7 + (i % 3) / 10,
        "metric": "steps",
        "command_id": i,
        "delivery_latency_ms": 3.5 if i % 5 else None,
    }
    fields.update(kw)
    return DecisionRecord(**fields)


class FlakyClient:
    """Wraps the writer's real client; while ``down`` every call fails like a dead server."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.down = False
        self.failures = 0

    def _check(self) -> None:
        if self.down:
            self.failures += 1
            raise OperationalError("injected: connection refused (ClickHouse down)")

    def __getattr__(self, name: str) -> Any:
        # every client call (insert, query, command, ...) fails while the server is down
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*a: Any, **kw: Any) -> Any:
            self._check()
            return attr(*a, **kw)

        return call

    def close(self) -> None:
        self.inner.close()


def flaky(store: Store) -> FlakyClient:
    wrapper = FlakyClient(store._writer.client)
    store._writer.client = wrapper
    return wrapper


def count(store: Store, sql: str) -> int:
    return int(store.query(sql)[0][0])


@pytest.fixture
def store(tmp_path):
    s = open_store(None, data_dir=tmp_path / "guard", flush_interval_s=0.05)
    yield s
    s.close()
