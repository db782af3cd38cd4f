"""The examples in examples/ run as a user would run them, and print their outcomes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _run(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_GUARD_")}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def test_async_tool_loop_local_only() -> None:
    proc = _run("async_tool_loop.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "mode: local-only"
    hangzhou = next(line for line in lines if line.startswith("Hangzhou:"))
    assert "completed final_answer" in hangzhou and "bring an umbrella" in hangzhou
    atlantis = next(line for line in lines if line.startswith("Atlantis:"))
    # The same call with the same result three times: stopped by the SDK alone, no guard.
    assert "terminated loop_detected after 3 steps, 3 tool calls" in atlantis
    assert "(last tool get_forecast)" in atlantis


def test_openai_style_agent_local_only() -> None:
    proc = _run("openai_style_agent.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    happy = next(line for line in lines if line.startswith("'Where is my refund"))
    assert "completed final_answer after 3 rounds" in happy
    assert "refund for order 1234 was issued" in happy
    looping = next(line for line in lines if line.startswith("'Where is order 9?'"))
    # Varying arguments, the same empty result: a loop, although no two calls are identical.
    assert "terminated loop_detected" in looping
    steps = int(looping.split(" after ")[1].split(" steps")[0])
    assert 3 <= steps <= 6, looping


@pytest.mark.parametrize(
    ("script", "agent", "reasons"),
    [
        ("async_tool_loop.py", "umbrella-advisor", ["final_answer", "loop_detected"]),
        ("openai_style_agent.py", "refund-bot", ["final_answer", "loop_detected"]),
    ],
)
def test_example_against_a_real_guard(script: str, agent: str, reasons: list[str]) -> None:
    """With --endpoint, the guard records the same outcomes the example printed."""
    from guard.server import MemorySink, ServerThread

    sink = MemorySink()
    with ServerThread(sink=sink) as srv:
        proc = _run(script, "--endpoint", srv.address, "--tenant", "examples-e2e")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.splitlines()[0] == f"mode: guard at {srv.address}"
        assert sink.wait_for(lambda s: len(s.runs) >= 2, timeout=15), sink.runs
    runs = sorted(sink.runs, key=lambda o: o.started_at)
    assert [str(o.reason) for o in runs] == reasons
    assert {o.tenant for o in runs} == {"examples-e2e"}
    assert {o.agent for o in runs} == {agent}
    stopped = runs[1]
    # The outcome printed by the example is the one the guard stored, counter for counter.
    assert f"after {stopped.steps} steps, {stopped.tool_calls} tool calls" in proc.stdout
