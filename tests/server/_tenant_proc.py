"""An agent process for the tenant-overshoot tests and benchmark: the real SDK (its OTLP
exporter and control stream) running several concurrent runs of one tenant, each making
model calls of a fixed price until it is stopped. Prints JSON lines: ``{"event": "ready"}``
once connected, waits for a line on stdin, then ``{"event": "ended", ...}`` per run and
``{"event": "done", "stats": ...}``.

    python _tenant_proc.py ENDPOINT TENANT MODE RUNS COST_USD [THINK_S] [MAX_CALLS]

ENDPOINT is ``host:port``, or ``CONTROL|SPANS`` to send the spans to another guard.

MODE ``reserve``: every call inside ``step.reserve(cost_usd=COST_USD)``; ``plain``: usage
reported after each call only.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import guard

__all__ = ["fleet"]


def fleet(
    endpoint: str | list[str],
    tenant: str,
    mode: str,
    *,
    procs: int,
    runs: int,
    price: float,
    think_s: float = 0.001,
    timeout_s: float = 120.0,
) -> list[dict]:
    """Start ``procs`` agent processes of ``runs`` runs each, let them go at once, and return
    every JSON line they printed (``ended`` per run, ``done`` per process). A list of
    endpoints spreads the processes over several guards (process i uses endpoint[i % n])."""
    endpoints = [endpoint] if isinstance(endpoint, str) else list(endpoint)
    args = [tenant, mode, str(runs), str(price), str(think_s)]
    ps = [
        subprocess.Popen(
            [sys.executable, __file__, endpoints[i % len(endpoints)], *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(procs)
    ]
    try:
        for p in ps:
            line = p.stdout.readline()
            if json.loads(line or "{}").get("event") != "ready":
                raise RuntimeError(f"agent process not ready: {line!r}")
        for p in ps:
            p.stdin.write("go\n")
            p.stdin.flush()
        lines = []
        for p in ps:
            out, _ = p.communicate(timeout=timeout_s)
            if p.returncode != 0:
                raise RuntimeError(f"agent process exited {p.returncode}")
            lines += [json.loads(x) for x in out.splitlines() if x.strip()]
        return lines
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
                p.wait()


def emit(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def main() -> int:
    endpoint, tenant, mode, runs, cost = sys.argv[1:6]
    think_s = float(sys.argv[6]) if len(sys.argv) > 6 else 0.001
    max_calls = int(sys.argv[7]) if len(sys.argv) > 7 else 10_000
    n_runs, price = int(runs), float(cost)
    # "CONTROL|SPANS": the control stream to one guard, the spans to another (trace-ID
    # routing of a collector in front of several replicas)
    endpoint, _, span_endpoint = endpoint.partition("|")
    guard.configure(
        endpoint=endpoint,
        span_endpoint=span_endpoint or None,
        tenant=tenant,
        admit_timeout_ms=2000,
        heartbeat_interval_ms=200,
        reconnect_min_s=0.05,
    )
    lock = threading.Lock()

    @guard.run(agent=f"{mode}-spender", max_steps=max_calls + 1, deadline_s=60)
    def agent() -> int:
        calls = 0
        run = guard.current_run()
        while calls < max_calls:
            if mode == "reserve":
                with guard.step() as step, step.reserve(cost_usd=price, tokens=110):
                    calls += 1  # the call is made: it is paid for
                    time.sleep(think_s)
                    step.model_call(
                        model="gpt-4.1", input_tokens=100, output_tokens=10, cost_usd=price
                    )
            else:
                with guard.step() as step:
                    calls += 1
                    time.sleep(think_s)
                    step.model_call(
                        model="gpt-4.1", input_tokens=100, output_tokens=10, cost_usd=price
                    )
            run.raise_if_cancelled()
        return calls

    def one() -> None:
        try:
            agent()
        except guard.RunStopped as stop:
            o = stop.outcome
            with lock:
                emit(
                    event="ended",
                    run_id=o.run_id,
                    reason=str(o.reason),
                    decided_by=str(o.decided_by),
                    model_calls=o.model_calls,
                    cost_usd=o.cost_usd or 0.0,
                    message=o.message,
                )
            return
        with lock:
            emit(
                event="ended",
                reason="final_answer",
                model_calls=max_calls,
                cost_usd=max_calls * price,
            )

    emit(event="ready")
    sys.stdin.readline()
    threads = [threading.Thread(target=one) for _ in range(n_runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    guard.flush(5.0)
    emit(event="done", stats=guard.stats())
    guard.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
