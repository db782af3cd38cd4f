"""The fuzz harness shared by tests/server/test_fuzz.py (bounded) and benchmarks/fuzz_soak.py.

:class:`Fuzzer` makes hostile inputs from a seed: OTLP Export bodies (structurally valid
requests full of extreme attribute values, then often byte-mutated: flips, truncations,
insertions, splices, or plain random bytes), AgentMessages of every kind with extreme fields
(serialized and sometimes byte-mutated), and admin / health request bodies.

:class:`InProcess` feeds them through the guard's real code without a network: the OTLP
body through ``_decode.decode_slices`` (the native decoder, with its fallback to the reference)
into ``Registry.ingest``, exactly as the Export handler does; agent messages
through the ``guard.wire`` checks into the registry as the control reader does. A
``GuardError`` is the clear status a client would get; anything else is a crash.
:func:`violations` checks the state invariants: no non-finite value in a run budget or a
tenant window, counters >= 0, tracked runs under their cap.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from guard.errors import GuardError
from guard.policy import PolicyConfig
from guard.server import MemorySink
from guard.server._auth import Principal
from guard.server._decode import decode_slices
from guard.server._fanout import AgentSession
from guard.server._otlp import CHUNK_SPANS
from guard.server._registry import Registry
from guard.server._schema import FLOAT as _FLOAT
from guard.server._schema import INT as _INT
from guard.server._schema import KEYS as _KEYS
from guard.server._schema import STR as _STR
from guard.v1 import guard_pb2 as pb
from guard.wire import check_heartbeat, check_hello, check_run_started, outcome_from_pb

__all__ = ["TENANTS", "Fuzzer", "InProcess", "fuzz_config", "violations"]

TENANTS = ("acme", "globex")
_INTS = [0, 1, 2, 7, 127, 128, 16383, 16384, 2**31, 2**40, 10**12, 10**12 + 1, 2**62, 2**63 - 1]
_NEG = [-1, -(2**31), -(2**63)]
_FLOATS = [0.0, -0.0, 1e-300, 0.01, 0.5, 1.0, 1e6, 1e6 + 1, 1e9, 1e18, 1e308]
_BAD_FLOATS = [math.inf, -math.inf, math.nan, -1.0, -1e308]
_NOW = time.time()
_TIMES = [0.0, 1.0, 946_684_799.0, _NOW, _NOW + 3600, _NOW + 10 * 86400, 1e18, *_BAD_FLOATS]
_STATUS = ["completed", "failed", "cancelled", "", "bogus", "x" * 300]
_REASON = ["final_answer", "max_steps", "operator_cancel", "error", "", "nope"]
_NAMES = ["guard.step", "execute_tool search", "chat gpt-4.1", "invoke_agent bot", "GET /", ""]
_OTHER_KEYS = ["http.method", "gen_ai.system", "gen_ai.tool.call.id", "", "k" * 200]
_KEY_LIST = sorted(_KEYS)


def fuzz_config(max_runs: int = 400, auth: dict[str, Any] | None = None) -> PolicyConfig:
    """Tenants with rolling windows on every metric the fuzzer spends, a small run cap."""
    rolling = [
        {"metric": m, "limit": lim, "window_s": 3600}
        for m, lim in (("cost_usd", 50.0), ("tokens", 1e7), ("steps", 1e5), ("tool_calls", 1e5))
    ]
    tenants = {t: {"rolling": rolling, "max_concurrent_runs": 200} for t in TENANTS}
    data: dict[str, Any] = {"guard": {"max_tracked_runs": max_runs}, "tenants": tenants}
    if auth is not None:
        data["auth"] = auth
    return PolicyConfig.from_dict(data)


def _set(msg: Any, name: str, value: Any) -> None:
    # a value the field's type cannot hold: the wire cannot carry it either
    with contextlib.suppress(TypeError, ValueError, OverflowError):
        setattr(msg, name, value)


class Fuzzer:
    """Seeded generator of hostile bodies (see the module docstring)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        r = self.rng
        self.run_ids = [f"{t}-r{i}" for t in TENANTS for i in range(6)] + ["", "x" * 300]
        self.traces = [bytes([i]) * 16 for i in range(1, 7)] + [b"", b"\x01" * 3, b"\x02" * 40]
        self._text = ["", "a", "é" * 200, "\x00", "ab" * 32, "ab" * 33, "zz", "y" * 257]
        self._r = r

    # -- values ----------------------------------------------------------------------------
    def pick(self, seq: list[Any]) -> Any:
        return seq[self._r.randrange(len(seq))]

    def text(self) -> str:
        r = self._r
        if r.random() < 0.5:
            return self.pick(self.run_ids)
        if r.random() < 0.1:
            return "q" * r.choice([1000, 5000, 70_000])
        return self.pick(self._text)

    def number(self, good: float = 0.8) -> float:
        r = self._r
        if r.random() < good:
            return r.choice(_FLOATS) if r.random() < 0.5 else r.uniform(0, 10)
        return self.pick(_BAD_FLOATS)

    def count(self, good: float = 0.85) -> int:
        r = self._r
        if r.random() < good:
            return r.choice(_INTS) if r.random() < 0.3 else r.randrange(0, 2000)
        return self.pick(_NEG)

    def any_value(self, typ: int | None) -> common_pb2.AnyValue:
        r = self._r
        v = common_pb2.AnyValue()
        kind = typ if typ is not None and r.random() < 0.75 else r.randrange(7)
        if kind == _STR or kind == 4:
            v.string_value = self.text()
        elif kind == _INT:
            _set(v, "int_value", self.count())
        elif kind == _FLOAT:
            v.double_value = self.number(0.7)
        elif kind == 3:
            v.bool_value = r.random() < 0.5
        elif kind == 5:
            v.bytes_value = r.randbytes(r.randrange(40))
        else:
            v.array_value.values.add().string_value = "nested"
        return v

    # -- OTLP ------------------------------------------------------------------------------
    def span(self) -> trace_pb2.Span:
        r = self._r
        s = trace_pb2.Span(
            name=self.pick(_NAMES),
            trace_id=self.pick(self.traces),
            span_id=r.randbytes(8),
            parent_span_id=r.randbytes(8) if r.random() < 0.3 else b"",
        )
        if r.random() < 0.9:
            s.attributes.add(key="guard.run.id").value.string_value = self.pick(self.run_ids)
        for _ in range(r.randrange(8)):
            key = self.pick(_KEY_LIST) if r.random() < 0.85 else self.pick(_OTHER_KEYS)
            typ = _KEYS[key][1] if key in _KEYS else None
            s.attributes.add(key=key).value.CopyFrom(self.any_value(typ))
        if r.random() < 0.1:
            s.status.code = 2
        return s

    def otlp_body(self) -> bytes:
        r = self._r
        if r.random() < 0.05:
            return r.randbytes(r.randrange(600))
        big = r.random() < 0.002
        req = otlp.ExportTraceServiceRequest()
        for _ in range(r.randrange(1, 3)):
            ss = req.resource_spans.add().scope_spans.add()
            n = CHUNK_SPANS + 100 if big else r.randrange(12)  # big: 2+ chunks
            ss.spans.extend(self.span() for _ in range(n))
        data = req.SerializeToString()
        return self.mutate(data) if r.random() < 0.35 else data

    def mutate(self, data: bytes) -> bytes:
        r = self._r
        b = bytearray(data)
        for _ in range(r.randrange(1, 4)):
            op = r.randrange(5)
            if not b:
                b.extend(r.randbytes(8))
            i = r.randrange(len(b))
            if op == 0:
                b[i] ^= 1 << r.randrange(8)
            elif op == 1:
                del b[i:]
            elif op == 2:
                b[i:i] = r.randbytes(r.randrange(1, 9))
            elif op == 3:
                j = r.randrange(len(b))
                b[i:i] = b[min(i, j) : max(i, j)][:256]
            else:
                b[i] = r.choice((0x00, 0x7F, 0x80, 0xFF))
        return bytes(b)

    # -- control stream --------------------------------------------------------------------
    def usage(self) -> pb.Usage:
        u = pb.Usage()
        for name in ("steps", "model_calls", "tool_calls", "input_tokens", "output_tokens"):
            if self._r.random() < 0.5:
                _set(u, name, self.count())
        if self._r.random() < 0.5:
            u.cost_usd = self.number()
        return u

    def run_started(self) -> pb.RunStarted:
        r = self._r
        rs = pb.RunStarted(run_id=self.pick(self.run_ids), agent=self.pick(["bot", "", "b" * 300]))
        rs.tenant = self.pick(["", *TENANTS, "t" * 300]) if r.random() < 0.4 else ""
        rs.trace_id = self.pick(self.traces).hex() if r.random() < 0.8 else self.text()
        if r.random() < 0.3:
            rs.parent_run_id = self.pick(self.run_ids)
        rs.started_at_unix = self.pick(_TIMES) if r.random() < 0.5 else 0.0
        if r.random() < 0.4:
            _set(rs.requested, "max_steps", self.count())
            rs.requested.max_cost_usd = self.number()
            rs.requested.soft_thresholds.extend(self.number() for _ in range(r.randrange(3)))
        if r.random() < 0.3:
            rs.usage.CopyFrom(self.usage())
        _set(rs, "request_id", self.count())
        return rs

    def agent_message(self) -> pb.AgentMessage:
        r = self._r
        kind = r.randrange(7)
        m = pb.AgentMessage()
        if kind == 0:
            m.hello.process_id = self.text()
            m.hello.tenant = self.pick(["", *TENANTS])
            n = r.choice((0, 1, 3)) if r.random() < 0.97 else r.choice((300, 10_001))
            m.hello.live_runs.extend(self.run_started() for _ in range(n))
        elif kind in (1, 2):
            m.run_started.CopyFrom(self.run_started())
        elif kind == 3:
            for _ in range(r.randrange(4)):
                rp = m.heartbeat.runs.add(run_id=self.pick(self.run_ids), paused=r.random() < 0.3)
                rp.usage.CopyFrom(self.usage())
        elif kind == 4:
            o = m.run_ended.outcome
            o.run_id = self.pick(self.run_ids)
            o.status, o.reason = self.pick(_STATUS), self.pick(_REASON)
            o.tenant = self.pick(["", *TENANTS])
            o.message = self.text()
            o.usage.CopyFrom(self.usage())
            o.started_at_unix, o.ended_at_unix = self.pick(_TIMES), self.pick(_TIMES)
            _set(o, "elapsed_ms", self.count())
        elif kind == 5:
            _set(m.ack, "command_id", self.count())
            m.ack.run_id = self.pick(self.run_ids)
        elif "allowance_request" in pb.AgentMessage.DESCRIPTOR.fields_by_name:
            a = m.allowance_request
            a.run_id = self.pick(self.run_ids)
            a.cost_usd = self.number()
            _set(a, "tokens", self.count())
        return m

    def agent_body(self) -> bytes:
        data = self.agent_message().SerializeToString()
        return self.mutate(data) if self._r.random() < 0.2 else data


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
                session = AgentSession(f"s{who}", principal.tenant, reg.log)
                self.sessions[who] = session
                reg.hello(session, msg.hello, principal)
            elif body == "run_started":
                check_run_started(msg.run_started)
                reg.register(session, msg.run_started, principal)
            elif body == "heartbeat":
                check_heartbeat(msg.heartbeat)
                reg.heartbeat(session, msg.heartbeat)
            elif body == "run_ended":
                reg.ended_by_agent(session, outcome_from_pb(msg.run_ended.outcome), principal)
            elif body == "ack":
                reg.ack(session, msg.ack)
            else:
                self.refused += 1
        except GuardError:
            self.refused += 1
        # drain what the registry queued for the agent (nobody reads it here)
        while session is not None and not session.queue.empty():
            session.queue.get_nowait()

    def sweep(self) -> None:
        self.registry.sweep()


def _bad_number(x: Any) -> bool:
    return x is not None and (not math.isfinite(x) or x < 0)


def violations(registry: Registry) -> list[str]:
    """State invariants: finite, non-negative usage in every run and window; runs capped."""
    out = []
    if len(registry.runs) > registry.max_runs:
        out.append(f"{len(registry.runs)} tracked runs > max_tracked_runs {registry.max_runs}")
    for run in registry.runs.values():
        u = run.budget.usage()
        counts = (u.steps, u.model_calls, u.tool_calls, u.input_tokens, u.output_tokens)
        if min(counts) < 0 or _bad_number(u.cost_usd) or _bad_number(run.cost_used):
            out.append(f"run {run.run_id[:40]!r}: usage {u}")
    budgets = registry.budgets
    for name in budgets.known():
        for w in budgets.status(name).windows:
            if not math.isfinite(w.used):
                out.append(f"tenant {name!r}: window {w.metric} used={w.used}")
    return out
