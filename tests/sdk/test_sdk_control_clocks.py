"""An agent process whose wall clock is 25 hours ahead or ten years behind, against a real
guard: the real SDK in a subprocess whose ``time.time`` / ``time.time_ns`` are moved. Its
runs are admitted (never refused, never the whole process), every record is stored with
the guard's receive time and flagged, none is dropped, and the guard saw the skew once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from _sdk_real_guard import guard_in_thread

from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc

pytest.importorskip("guard.server")

RUNS = 4
AGENT = r"""
import json, sys, time
offset = float(sys.argv[2])
real_time, real_ns = time.time, time.time_ns
time.time = lambda: real_time() + offset
time.time_ns = lambda: real_ns() + int(offset * 1e9)
import guard
guard.configure(endpoint=sys.argv[1], tenant="acme", admit_timeout_ms=5000,
                reconnect_min_s=0.05, reconnect_max_s=0.2, shutdown_ack_timeout_s=10.0)

@guard.run(agent="skewed")
def one():
    with guard.step() as step:
        step.model_call(model="gpt-4.1", input_tokens=10, output_tokens=1)
    return guard.current_run().run_id

ids = [one() for _ in range(int(sys.argv[3]))]
stats = guard.stats()
guard.shutdown()
print(json.dumps({"ids": ids, "stats": stats}))
"""


def _agent(port: int, offset_s: float) -> dict[str, Any]:
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", AGENT, f"127.0.0.1:{port}", repr(offset_s), str(RUNS)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _guard_figures(port: int) -> dict[str, float]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        resp = guard_pb2_grpc.GuardAdminStub(ch).Stats(pb.StatsRequest(), timeout=10)
    return dict(resp.figures)


@pytest.mark.parametrize(
    "offset_s", [25 * 3600.0, -10 * 365.25 * 86_400.0], ids=["ahead-25h", "behind-10y"]
)
def test_a_skewed_agent_process_gets_every_record_stored(offset_s: float) -> None:
    with guard_in_thread({}) as box:
        out = _agent(box["port"], offset_s)
        figures = _guard_figures(box["port"])
        sink = box["sink"]
        ids, stats = out["ids"], out["stats"]
        stored = {o.run_id: o for o in sink.runs if o.decided_by.value == "sdk"}
        dead = [d[1] for d in sink.dead_letters]
    assert len(ids) == RUNS
    # every record stored (clamped, flagged) or dead-lettered: none dropped, none refused
    assert set(ids) <= set(stored) | set(dead) and not dead
    for rid in ids:
        assert "agent clock out of bounds" in stored[rid].message
    assert stats.get("control_admit", 0) >= RUNS  # guarded, not fail-open
    assert not stats.get("control_messages_rejected") and not stats.get("control_auth_errors")
    assert not stats.get("control_records_unacknowledged")
    assert figures["sessions_clock_skewed"] >= 1
    assert figures["clock_skew_max_abs_s"] == pytest.approx(abs(offset_s), abs=30)
    assert figures.get("records_clamped", 0) >= RUNS
