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
