"""A fleet agent process for the fault suite: the real SDK (exporter and control stream).

    python _fleet_agent.py ENDPOINT TENANT BOUNDED IDLE [STEP_S]

Runs ``BOUNDED`` runs with ``max_steps=30`` that only ever stop by max_steps (one model call
per step, ``STEP_S`` seconds each, default 0.03), two at a time, and ``IDLE`` runs that step
until an operator cancels them. Prints JSON lines: ``ready`` once configured, then (after a
line on stdin) ``started`` and ``ended`` per run, and ``done`` with the SDK's counters after
``guard.shutdown()`` (which waits for the guard to acknowledge every record).
"""

from __future__ import annotations

import json
import sys
import threading
import time

import guard
from guard.sdk import _runtime

MAX_STEPS = 30
_out = threading.Lock()


def emit(**kw: object) -> None:
    with _out:
        print(json.dumps(kw), flush=True)


def main() -> int:
    endpoint, tenant, bounded, idle, *rest = sys.argv[1:]
    step_s = float(rest[0]) if rest else 0.03
    guard.configure(
        endpoint=endpoint,
        tenant=tenant,
        admit_timeout_ms=1000,
        heartbeat_interval_ms=200,
        shutdown_ack_timeout_s=30.0,
    )

    def body(kind: str) -> str:
        run = guard.current_run()
        emit(event="started", run_id=run.run_id, kind=kind)
        while True:
            with guard.step() as step:
                step.model_call(model="gpt-4.1", input_tokens=100, output_tokens=10)
            time.sleep(step_s)

    bounded_run = guard.run(agent=f"{tenant}-bounded", max_steps=MAX_STEPS, deadline_s=300)(
        lambda: body("bounded")
    )
    idle_run = guard.run(agent=f"{tenant}-idle", max_steps=100_000, deadline_s=300)(
        lambda: body("idle")
    )

    def one(fn: object) -> None:
        try:
            fn()  # type: ignore[operator]
        except guard.RunStopped as stop:
            o = stop.outcome
            emit(
                event="ended",
                run_id=o.run_id,
                status=str(o.status),
                reason=str(o.reason),
                decided_by=str(o.decided_by),
                steps=o.steps,
            )

    pending = [bounded_run] * int(bounded)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not pending:
                    return
                fn = pending.pop()
            one(fn)

    emit(event="ready")
    sys.stdin.readline()
    threads = [threading.Thread(target=worker) for _ in range(2)]
    threads += [threading.Thread(target=one, args=(idle_run,)) for _ in range(int(idle))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rt = _runtime.get_runtime()
    guard.flush(5.0)
    guard.shutdown()
    # the closed runtime's counters: records_unacknowledged is counted by the shutdown itself
    emit(event="done", stats=_runtime.stats(rt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
