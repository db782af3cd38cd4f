"""guard.wire: proto <-> policy conversions round-trip and reject bad values."""

from __future__ import annotations

import math

import pytest

from guard.errors import InvalidInput
from guard.policy import (
    DEFAULT_PRICE_BOOK,
    DecidedBy,
    Limits,
    LoopSettings,
    Outcome,
    PolicyConfig,
    Reason,
    Status,
    Usage,
)
from guard.v1 import guard_pb2 as pb
from guard.wire import (
    limits_from_pb,
    limits_to_pb,
    outcome_from_pb,
    outcome_to_pb,
    policy_from_pb,
    policy_to_pb,
    price_book_from_pb,
    price_book_to_pb,
    usage_from_pb,
    usage_to_pb,
)


def test_limits_round_trip_keeps_none_as_unset() -> None:
    lim = Limits(
        max_steps=12,
        max_cost_usd=0.5,
        deadline_s=90.0,
        reserve_tokens=1000,
        soft_thresholds=(0.6, 0.8),
        loop=LoopSettings(window=10, repeat_threshold=2, no_progress_steps=4),
        pause_freezes_deadline=True,
    )
    msg = limits_to_pb(lim)
    assert not msg.HasField("max_tokens")  # None = no limit, never 0
    back = limits_from_pb(msg)
    assert back.max_steps == 12 and back.max_tokens is None
    assert back.soft_thresholds == (0.6, 0.8)
    assert back.loop.window == 10 and back.pause_freezes_deadline is True
    assert limits_from_pb(pb.Limits()) == Limits()


def test_limits_from_pb_rejects_nan_and_negative() -> None:
    with pytest.raises(InvalidInput, match="deadline_s"):
        limits_from_pb(pb.Limits(deadline_s=math.nan))
    with pytest.raises(InvalidInput, match="max_steps"):
        limits_from_pb(pb.Limits(max_steps=-1))


def test_usage_round_trip_and_unpriced_cost() -> None:
    u = Usage(
        steps=3,
        model_calls=2,
        tool_calls=4,
        tool_attempts=5,
        input_tokens=900,
        output_tokens=80,
        reasoning_tokens=10,
        cached_tokens=100,
    )
    msg = usage_to_pb(u)
    assert not msg.HasField("cost_usd")
    assert usage_from_pb(msg) == u
    u.cost_usd = 0.25
    assert usage_from_pb(usage_to_pb(u)).cost_usd == 0.25
    with pytest.raises(InvalidInput, match="cost_usd"):
        usage_from_pb(pb.Usage(cost_usd=math.inf))


def test_outcome_round_trip() -> None:
    o = Outcome(
        run_id="r1",
        status=Status.TERMINATED,
        reason=Reason.MAX_STEPS,
        message="max_steps 3 reached (steps=3)",
        parent_run_id="p0",
        tenant="acme",
        agent="bot",
        trace_id="ab" * 16,
        steps=3,
        tool_calls=2,
        cost_usd=0.01,
        elapsed_ms=1200,
        deadline_ms=90_000,
        last_tool="search",
        last_action_hash="f" * 32,
        loop_hits=1,
        partial_result=True,
        recoverable=True,
        decided_by=DecidedBy.GUARD,
        price_book_version="v1",
        started_at=1_750_000_000.5,  # timestamps are bounded to 2000-01-01 .. now + 1 day
        ended_at=1_750_000_001.5,
    )
    assert outcome_from_pb(outcome_to_pb(o)) == o
    bare = Outcome(run_id="r2", status=Status.COMPLETED, reason=Reason.FINAL_ANSWER)
    assert outcome_from_pb(outcome_to_pb(bare)) == bare


def test_outcome_from_pb_rejects_unknown_reason() -> None:
    with pytest.raises(InvalidInput, match="reason"):
        outcome_from_pb(pb.Outcome(run_id="r", status="completed", reason="bored"))
    with pytest.raises(InvalidInput, match="run_id"):
        outcome_from_pb(pb.Outcome(status="completed", reason="final_answer"))


def test_price_book_and_policy_round_trip() -> None:
    msg = price_book_to_pb(DEFAULT_PRICE_BOOK)
    book = price_book_from_pb(msg)
    assert book.version == DEFAULT_PRICE_BOOK.version
    assert book.models == DEFAULT_PRICE_BOOK.models
    cfg = PolicyConfig.from_dict({"runs": {"max_steps": 50, "deadline_s": 300}})
    version, defaults, prices = policy_from_pb(policy_to_pb(cfg, version="cfg-1"))
    assert version == "cfg-1" and defaults.max_steps == 50 and defaults.deadline_s == 300
    assert prices.models == cfg.prices.models
