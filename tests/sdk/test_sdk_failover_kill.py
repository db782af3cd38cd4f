"""SDK failover from a SIGKILLed guard, with real processes: three ``otel-guard serve``
guards and agent processes configured with all three. A bounded run of
``benchmarks/bench_failover.py`` (which also measures the time to be guarded again)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_failover  # noqa: E402


def test_a_killed_guards_runs_move_to_another_guard_and_keep_their_limits() -> None:
    out = bench_failover.run(trials=1, agents=2, bounded=2)
    (t,) = out["per_trial"]
    assert t["runs_moved"] >= 2  # the agent's bounded and idle runs were on the killed guard
    # every run ended; bounded runs at exactly max_steps=30 (counters carried over), the idle
    # ones by the operator's cancel through the guard they moved to
    assert (t["runs"], t["runs_ended"]) == (2 * 3, 2 * 3)
    assert (t["early_stops"], t["idle_not_cancelled"]) == (0, 0)
    assert t["records_unacknowledged"] == 0  # every termination record reached a guard
    assert t["spans_exported"] > 0 and t["spans_failed"] == 0  # the spans followed the stream
