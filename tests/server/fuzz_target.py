"""The fuzz harness's in-process target (tests/server/test_fuzz.py, benchmarks/fuzz_soak.py).

:class:`InProcess` feeds :class:`~tests.server.fuzzing.Fuzzer`'s bodies through the guard's
real code without a network: the OTLP body through ``_decode.decode_slices`` (the native
decoder, with its fallback to the reference) into ``Registry.ingest``, exactly as the Export
handler does; agent messages (and the messages of an ``AgentBatch``, after the batch is checked
whole) through the control reader's own step (``_control.apply_message``). A
``GuardError`` is the clear status a client would get; anything else is a crash.
:func:`violations` checks the state invariants: no non-finite value in a run budget or a
tenant window, counters >= 0, tracked runs under their cap.
"""

from __future__ import annotations

import math
import time
from typing import Any

from guard.errors import GuardError
from guard.policy import PolicyConfig
from guard.server import MemorySink
from guard.server.control._fanout import AgentSession
from guard.server.control._stream import apply_message
from guard.server.decode._decode import decode_slices
from guard.server.otlp._grpc import CHUNK_SPANS
from guard.server.runs._registry import Registry
from guard.server.runtime._auth import Principal
from guard.v1 import guard_pb2 as pb
from guard.wire import check_batch, check_hello

from .fuzzing import TENANTS, fuzz_config

__all__ = ["InProcess", "violations"]


class InProcess:
    """The guard's decode path and registry, driven directly (no network, no event loop)."""

    def __init__(self, config: PolicyConfig | None = None, sink: Any = None) -> None:
        self.config = config or fuzz_config()
        self.sink = sink if sink is not None else MemorySink()
        self.registry = Registry(self.config, self.sink, guard_id="fuzz")
        self.principals = [Principal(tenant=t, admin=False) for t in TENANTS]
        self.principals.append(Principal(tenant=None, admin=True))
        self.sessions: dict[int, AgentSession] = {}
        self.refused = 0
        self.batches_refused = 0  # AgentBatches refused whole (check_batch)
        self.refusals_that_changed = 0  # must stay 0: a refused batch applies nothing
        # the longest stretch of work between two points where the server would yield to
        # its event loop (the Export handler yields between chunks): the loop hold, in CPU
        # time of this thread (wall time on a shared machine also counts preemption)
        self.max_slice_s = 0.0

    def _principal(self, i: int) -> Principal:
        return self.principals[i % len(self.principals)]

    def export(self, data: bytes, who: int) -> None:
        """What ``_otlp``'s Export does with ``data``, timing the slices between its yields."""
        clock = time.thread_time
        start = clock()
        chunks = []
        try:
            for c in decode_slices(data, CHUNK_SPANS):
                chunks.append(c)
                start = self._slice(start, clock())
        except GuardError:
            self.refused += 1
            self._slice(start, clock())
            return
        for decoded in chunks:
            self.registry.ingest(decoded, self._principal(who))
            start = self._slice(start, clock())

    def _slice(self, start: float, end: float) -> float:
        self.max_slice_s = max(self.max_slice_s, end - start)
        return end

    def control(self, data: bytes, who: int) -> None:
        """What the control reader does with one message body (a fresh session per Hello)."""
        start = time.thread_time()
        try:
            self._control(data, who)
        finally:
            self._slice(start, time.thread_time())

    def _control(self, data: bytes, who: int) -> None:
        principal = self._principal(who)
        reg = self.registry
        try:
            msg = pb.AgentMessage.FromString(data)
        except Exception:
            self.refused += 1  # the safe deserializer's INVALID_ARGUMENT
            return
        body = msg.WhichOneof("body")
        session = self.sessions.get(who)
        try:
            if body == "hello" or session is None:
                if body != "hello":
                    self.refused += 1
                    return
                check_hello(msg.hello)
                tenant = msg.hello.tenant or (principal.tenant or "")
                principal.check_tenant(tenant, "the stream")
                for rs in msg.hello.live_runs:
                    principal.check_tenant(rs.tenant or tenant)
                if session is not None:
                    reg.detach(session)
                session = AgentSession(f"s{who}", principal.tenant, reg.log, reg.clock)
                self.sessions[who] = session
                reg.hello(session, msg.hello, principal)
            elif body == "batch":
                self._batch(session, msg.batch, principal)
            else:
                apply_message(reg, session, msg, body, principal)
        except GuardError:
            self.refused += 1
        # drain what the registry queued for the agent (nobody reads it here)
        while session is not None and not session.queue.empty():
            session.queue.get_nowait()

    def _batch(self, session: AgentSession, batch: Any, principal: Any) -> None:
        """Checked whole, then each message at its turn; a refused batch changes nothing (its
        runs stay as they were: counted in :attr:`refusals_that_changed`)."""
        started = [m.run_started.run_id for m in batch.messages if m.HasField("run_started")]
        before = [rid in self.registry.runs for rid in started]
        try:
            check_batch(batch)
        except GuardError:
            self.batches_refused += 1
            if [rid in self.registry.runs for rid in started] != before:
                self.refusals_that_changed += 1
            raise
        for inner in batch.messages:
            apply_message(self.registry, session, inner, inner.WhichOneof("body"), principal)

    def sweep(self) -> None:
        self.registry.sweep()


def _bad_number(x: Any) -> bool:
    return x is not None and (not math.isfinite(x) or x < 0)


def violations(registry: Registry) -> list[str]:
    """State invariants: finite, non-negative usage in every run and window; runs capped."""
    out = []
    if len(registry.runs) > registry.max_runs:
        out.append(f"{len(registry.runs)} tracked runs > max_tracked_runs {registry.max_runs}")
    # the per-tenant LRUs that make room at the cap hold exactly the span-only runs
    idle = {(t, rid): r for t, lru in registry.table.idle.items() for rid, r in lru.items()}
    if idle != {(r.tenant, rid): r for rid, r in registry.span_only.items()}:
        out.append("the span-only runs by tenant disagree with span_only")
    for run in registry.runs.values():
        u = run.budget.usage()
        counts = (u.steps, u.model_calls, u.tool_calls, u.input_tokens, u.output_tokens)
        if min(counts) < 0 or _bad_number(u.cost_usd) or _bad_number(run.gate_cost_usd):
            out.append(f"run {run.run_id[:40]!r}: usage {u}")
    budgets = registry.budgets
    for name in budgets.known():
        for w in budgets.status(name).windows:
            if not math.isfinite(w.used):
                out.append(f"tenant {name!r}: window {w.metric} used={w.used}")
    return out
