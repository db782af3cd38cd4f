"""An agent process for the end-to-end tests: the real SDK, its real OTLP exporter and control
stream, pointed at a guard. Prints JSON lines: ``{"event": "ready"}`` once connected, then
waits for a line on stdin before running, then ``{"event": "ended", ...}`` per run.

    python _agent_proc.py ENDPOINT TENANT SCENARIO RUN_ID [RUN_ID ...]

Scenarios: ``loop`` (the same tool call, a parallel batch per step), ``spend`` (0.02 USD per step),
``idle`` (steps without spend, until cancelled).
"""

from __future__ import annotations

import json
import sys
import time

import guard


def emit(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def main() -> int:
    endpoint, tenant, scenario, *run_ids = sys.argv[1:]
    guard.configure(
        endpoint=endpoint,
        tenant=tenant,
        admit_timeout_ms=3000,
        reconnect_min_s=0.05,
        reconnect_max_s=0.5,
        heartbeat_interval_ms=200,
    )

    # The decorator's loop detection is lenient (10 repeats); the guard's policy is tighter
    # and the SDK adopts it from the Admit. The loop scenario still shows the guard's cancel
    # winning: its calls run as one parallel batch that only the guard judges while in flight.
    @guard.run(
        agent=f"{scenario}-bot",
        max_steps=400,
        deadline_s=60,
        loop={"window": 20, "repeat_threshold": 10, "no_progress_steps": 20},
    )
    def agent(run_id: str) -> str:
        steps = 0
        while steps < 400:
            steps += 1
            with guard.step() as step:
                if scenario == "loop":
                    # Parallel tool calls repeating one call. The SDK judges a batch when it
                    # completes (its loop settings are the guard's: the Admit's tightest
                    # win); the guard sees each call's span as it ends and cancels the run
                    # while the batch's slowest tool still runs (bounded: 10 s).
                    with guard.admit_tools(["a", "b", "c"]) as batch:
                        for _ in batch.admitted:
                            step.tool_call("search", {"q": "where is my refund"}, result="none")
                        slowest = time.monotonic() + 10.0
                        while time.monotonic() < slowest:
                            guard.current_run().raise_if_cancelled()
                            time.sleep(0.01)
                elif scenario == "spend":
                    step.model_call(
                        model="gpt-4.1", input_tokens=100, output_tokens=10, cost_usd=0.02
                    )
                else:
                    step.progress(True)
            time.sleep(0.03)  # the model "thinks"; the guard's verdict lands meanwhile
            guard.current_run().raise_if_cancelled()
        return f"done after {steps} steps"

    emit(event="ready")
    sys.stdin.readline()
    for run_id in run_ids:
        try:
            value = agent(run_id)
            emit(event="ended", run=run_id, status="completed", value=value)
        except guard.RunStopped as stop:
            o = stop.outcome
            emit(
                event="ended",
                run=run_id,
                run_id=o.run_id,
                status=str(o.status),
                reason=str(o.reason),
                decided_by=str(o.decided_by),
                steps=o.steps,
                message=o.message,
            )
    guard.flush(5.0)
    guard.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
