"""A canary agent process for ``bench_flood.py`` (``--role canary``): the real SDK
(``guard.configure`` + ``@guard.run``) of one tenant with a rolling cost window.

Per phase (a ``phase NAME SECS POOL RATE`` line on stdin), it first starts ``POOL`` runs that
wait to be cancelled and prints ``pool_ready``; on the next line (``go``) it runs for
``SECS`` seconds:

* :data:`CALLERS` caller threads, ``RATE`` paid calls/s between them: each call is
  ``step.reserve(cost_usd=PRICE)`` (timed: the wait for the guard's allowance answer), a
  :data:`MODEL_S` model call, then ``step.model_call`` with its usage and cost. A run
  stopped by the tenant budget is replaced by a new one, and the calls go on (refused);
* a cancel thread: every ``SECS / POOL`` seconds, ``GuardAdmin.Cancel`` (this tenant's
  token) of one pooled run; the latency is from the Cancel call to the run's ``on_cancel``
  callback in this process (the guard's cancel received and applied by the SDK).

It prints one JSON line per phase (every latency, in ms) and, on ``quit``, the SDK's
control counters (``guard.stats()``).
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from collections import Counter
from typing import Any

import _budget_workload as W
import grpc

from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc

__all__ = [
    "CALLERS",
    "PRICE",
    "canary_main",
    "control_figures",
    "merge",
    "policy_lines",
    "summary",
]

CALLERS = 2
MODEL_S = 0.02
INPUT_TOKENS, OUTPUT_TOKENS = 100, 20  # of W.MODEL at $6 / $20 per million: $0.001
PRICE = 0.001


def policy_lines(tenant: str, limit_usd: float) -> list[str]:
    return [
        f"  {tenant}:",
        f"    rolling: [{{metric: cost_usd, limit: {limit_usd}, window_s: 3600}}]",
    ]


def _emit(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


class _Phase:
    def __init__(self, name: str, secs: float, pool: int, rate: float) -> None:
        self.name, self.secs, self.pool, self.rate = name, secs, pool, rate
        self.end_at = 0.0
        self.lock = threading.Lock()
        self.calls: list[dict] = []  # one per paid-call attempt
        self.cancel_ms: list[float] = []
        self.cancel_retries = 0
        self.cancel_lost = 0
        self.cancel_other_stop: list[str] = []
        self.messages: dict[str, list[str]] = {}  # stop reason -> first distinct messages

    def note(self, reason: str, message: str) -> None:
        with self.lock:
            seen = self.messages.setdefault(reason, [])
            if message not in seen and len(seen) < 2:
                seen.append(message[:200])


def _paid_call(rec: dict) -> None:
    import guard

    with guard.step() as step:
        t0 = time.perf_counter()
        try:
            with step.reserve(cost_usd=PRICE):
                rec["allowance_ms"] = (time.perf_counter() - t0) * 1e3
                time.sleep(MODEL_S)
                step.model_call(
                    model=W.MODEL,
                    input_tokens=INPUT_TOKENS,
                    output_tokens=OUTPUT_TOKENS,
                    cost_usd=PRICE,
                )
        except guard.RunStopped:
            rec["allowance_ms"] = (time.perf_counter() - t0) * 1e3
            rec["kind"] = "refused"
            raise
    rec["kind"] = "call"


def _caller(ph: _Phase, k: int, start: float) -> None:
    import guard

    interval = CALLERS / ph.rate
    due = [start + k * interval / CALLERS]

    entered = [False]

    @guard.run(agent="canary-caller", max_steps=10**6, deadline_s=900)
    def agent() -> None:
        entered[0] = True
        while True:
            _wait_until(due[0])
            if time.monotonic() >= ph.end_at:
                return
            rec = {"t": time.monotonic(), "kind": "stopped"}
            with ph.lock:
                ph.calls.append(rec)
            due[0] += interval
            _paid_call(rec)

    while time.monotonic() < ph.end_at:
        entered[0] = False
        try:
            agent()
        except guard.RunStopped as stop:
            ph.note(str(stop.outcome.reason), stop.outcome.message)
            if not entered[0]:  # denied at the run's start, before a call could ask
                rec = {"t": time.monotonic(), "kind": f"denied:{stop.outcome.reason}"}
                with ph.lock:
                    ph.calls.append(rec)
            _wait_until(due[0])
            due[0] += interval


def _wait_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


class _Pool:
    """Runs that wait to be cancelled; ``arrived[i]``: when run i's on_cancel ran."""

    def __init__(self, n: int, secs: float) -> None:
        import guard

        self.ids: list[str | None] = [None] * n
        self.runs: list[Any] = [None] * n
        self.arrived: list[float | None] = [None] * n
        self.done = [threading.Event() for _ in range(n)]
        self.started = [threading.Event() for _ in range(n)]
        self.reasons: list[str] = [""] * n
        self.msgs: list[str] = [""] * n

        def body(i: int) -> None:
            run = guard.current_run()
            self.ids[i], self.runs[i] = run.run_id, run

            def fired() -> None:
                self.arrived[i] = time.monotonic()
                self.done[i].set()

            run.on_cancel(fired)
            self.started[i].set()
            self.done[i].wait(secs + 60)
            run.raise_if_cancelled()

        agent = guard.run(agent="canary-pool", max_steps=100, deadline_s=secs + 120)(body)

        def thread(i: int) -> None:
            try:
                agent(i)
            except guard.RunStopped as stop:
                self.reasons[i] = str(stop.outcome.reason)
                self.msgs[i] = stop.outcome.message
            finally:
                self.started[i].set()
                self.done[i].set()

        self.threads = [threading.Thread(target=thread, args=(i,), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def wait_started(self) -> None:
        for e in self.started:
            e.wait(30)

    def end(self) -> None:
        for r in self.runs:
            if r is not None:
                r.cancel("user_cancel")
        for t in self.threads:
            t.join(10)


def _cancels(ph: _Phase, pool: _Pool, admin: Any, token: str, start: float) -> None:
    meta = (("authorization", f"Bearer {token}"),)
    gap = ph.secs / max(1, ph.pool)
    for i in range(ph.pool):
        _wait_until(start + (i + 0.5) * gap)
        rid = pool.ids[i]
        if rid is None or pool.done[i].is_set():
            ph.cancel_other_stop.append(pool.reasons[i] or "not_started")
            ph.note(pool.reasons[i], pool.msgs[i])
            continue
        while True:
            t0 = time.monotonic()
            try:
                admin.Cancel(
                    pb.CancelRequest(selector=pb.Selector(run_id=rid)), metadata=meta, timeout=30
                )
                break
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.NOT_FOUND or time.monotonic() - t0 > 5:
                    raise
                ph.cancel_retries += 1  # not registered at the guard yet: ask again
                time.sleep(0.005)
        if not pool.done[i].wait(30) or pool.arrived[i] is None:
            ph.cancel_lost += 1
            continue
        ph.cancel_ms.append((pool.arrived[i] - t0) * 1e3)


def _run_phase(ph: _Phase, admin: Any, token: str) -> dict:
    pool = _Pool(ph.pool, ph.secs)
    pool.wait_started()
    _emit(event="pool_ready", phase=ph.name)
    sys.stdin.readline()
    start = time.monotonic()
    ph.end_at = start + ph.secs
    threads = [threading.Thread(target=_caller, args=(ph, k, start)) for k in range(CALLERS)]
    threads.append(threading.Thread(target=_cancels, args=(ph, pool, admin, token, start)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pool.end()
    return {
        "event": "phase",
        "phase": ph.name,
        "wall_s": round(time.monotonic() - start, 3),
        "calls": ph.calls,
        "cancel_ms": ph.cancel_ms,
        "cancel_not_found_retries": ph.cancel_retries,
        "cancel_lost": ph.cancel_lost,
        "pool_stopped_otherwise": ph.cancel_other_stop,
        "stop_messages": ph.messages,
    }


def canary_main(args: Any) -> int:
    import guard

    guard.configure(
        endpoint=args.address,
        tenant=args.tenant,
        token=args.token,
        price_book=W.price_book(),
        admit_timeout_ms=args.admit_timeout_ms,
    )

    @guard.run(agent="canary-warmup", max_steps=5)
    def warm() -> None:  # connects the control stream before the phases
        with guard.step():
            pass

    warm()
    channel = grpc.insecure_channel(args.address)
    admin = guard_pb2_grpc.GuardAdminStub(channel)
    _emit(event="ready", tenant=args.tenant)
    for line in sys.stdin:
        parts = line.split()
        if not parts or parts[0] == "quit":
            break
        name, secs, pool, rate = parts[1], float(parts[2]), int(parts[3]), float(parts[4])
        out = _run_phase(_Phase(name, secs, pool, rate), admin, args.token)
        print(json.dumps(out), flush=True)
    guard.flush(5.0)
    stats = {k: v for k, v in guard.stats().items() if k.startswith(("control_", "spans_"))}
    guard.shutdown()
    channel.close()
    _emit(event="done", stats=stats)
    return 0


# -- the orchestrator's side: figures from the phases' JSON -----------------------------------
def pct(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p99": None, "max": None, "n": 0}
    s = sorted(xs)
    return {
        "p50": round(statistics.median(s), 2),
        "p99": round(s[min(len(s) - 1, int(0.99 * len(s)))], 2),
        "max": round(s[-1], 2),
        "n": len(s),
    }


def merge(ds: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in ds:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def control_figures(results: dict[str, dict]) -> dict[str, Any]:
    """One phase of every canary: allowance and cancel latencies (ms) and what went amiss."""
    rs = results.values()
    return {
        "allowance_ms": pct(
            [c["allowance_ms"] for r in rs for c in r["calls"] if "allowance_ms" in c]
        ),
        "cancel_ms": pct([x for r in rs for x in r["cancel_ms"]]),
        "cancel_not_found_retries": sum(r["cancel_not_found_retries"] for r in rs),
        "cancel_lost": sum(r["cancel_lost"] for r in rs),
        # pooled runs that could not be cancelled: stopped before (e.g. denied at start)
        "pool_runs_stopped_otherwise": merge(
            [dict(Counter(r["pool_stopped_otherwise"])) for r in rs]
        ),
    }


def summary(tenant: str, phases: tuple, window: dict, sdk: dict, limit_usd: float) -> dict:
    """One canary tenant over its phases: paid calls made against what its window pays for."""
    limit_calls = round(limit_usd / PRICE)
    made = sum(c["kind"] == "call" for _, r in phases for c in r[tenant]["calls"])
    return {
        "limit_usd": limit_usd,
        "price_per_call_usd": PRICE,
        "limit_calls": limit_calls,
        "calls_made": made,
        "calls_over": made - limit_calls,
        "attempts_by_outcome": {
            ph: dict(Counter(c["kind"] for c in r[tenant]["calls"])) for ph, r in phases
        },
        "stop_messages": {ph: r[tenant]["stop_messages"] for ph, r in phases},
        "guard_window_at_end": window,
        # what the calls cost that the guard's window never counted (e.g. spans it refused)
        "spent_unseen_by_guard_usd": None
        if window.get("spent_usd") is None
        else round(made * PRICE - window["spent_usd"], 6),
        "sdk_allowance_counters": {k: v for k, v in sdk.items() if "allowance" in k},
        "sdk_span_counters": {k: v for k, v in sdk.items() if k.startswith("spans_")},
    }
