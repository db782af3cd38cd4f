"""The fuzz harness shared by tests/server/test_fuzz.py (bounded) and benchmarks/fuzz_soak.py.

:class:`Fuzzer` makes hostile inputs from a seed: OTLP Export bodies (structurally valid
requests full of extreme attribute values, then often byte-mutated: flips, truncations,
insertions, splices, or plain random bytes), AgentMessages of every kind with extreme fields
(serialized and sometimes byte-mutated), AgentBatches of every shape (:data:`BATCHES`: valid,
odd content, oversized by count or bytes, nested), and admin / health request bodies. The in-process target is
:mod:`tests.server.fuzz_target`; the network side :mod:`tests.server.fuzz_remote`.
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

from guard.policy import PolicyConfig
from guard.server.decode._schema import FLOAT as _FLOAT
from guard.server.decode._schema import INT as _INT
from guard.server.decode._schema import KEYS as _KEYS
from guard.server.decode._schema import STR as _STR
from guard.server.otlp._grpc import CHUNK_SPANS
from guard.v1 import guard_pb2 as pb
from guard.wire import (
    MAX_BATCH_BYTES,
    MAX_BATCH_MESSAGES,
)

__all__ = ["BAD_BATCHES", "BATCHES", "TENANTS", "Fuzzer", "fuzz_config"]

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
# AgentBatch shapes -> the status the guard must answer the whole batch with (None: accepted;
# "odd": whatever its messages earn, each at its turn, as if alone)
BATCHES: dict[str, str | None] = {
    "valid": None,
    "odd": None,
    "too_many": "RESOURCE_EXHAUSTED",  # > MAX_BATCH_MESSAGES
    "too_big": "RESOURCE_EXHAUSTED",  # > MAX_BATCH_BYTES, every message valid alone
    "nested_hello": "INVALID_ARGUMENT",
    "nested_batch": "INVALID_ARGUMENT",
    "empty_inner": "INVALID_ARGUMENT",
}
BAD_BATCHES = tuple(k for k, v in BATCHES.items() if v is not None)


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
        self._batches = 0  # AgentBatches made: their run ids are fresh
        self.last_batch = ""  # the shape (BATCHES key) of the last one
        self._beat: pb.AgentMessage | None = None  # the heartbeat of an over-4-MiB batch

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

    def agent_message(self, batches: bool = True) -> pb.AgentMessage:
        r = self._r
        kind = r.randrange(8 if batches else 7)
        m = pb.AgentMessage()
        if kind == 7:
            return self.batch()[0]
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

    # -- control batches ---------------------------------------------------------------------
    def batch(self, kind: str | None = None) -> tuple[pb.AgentMessage, list[str]]:
        """An AgentMessage holding an AgentBatch of ``kind`` (a key of :data:`BATCHES`; drawn
        when ``None``: mostly valid or odd, sometimes oversized or nested), and the run ids its
        ``RunStarted`` messages register, fresh ones: a refused batch must register none."""
        r = self._r
        if kind is None:
            roll = r.random()
            bad = [k for k in BAD_BATCHES if k != "too_big"]
            kind = "valid" if roll < 0.45 else "odd" if roll < 0.8 else r.choice(bad)
            kind = "too_big" if roll > 0.99 else kind  # rare: over 4 MiB each
        self.last_batch = kind
        self._batches += 1
        fresh = [f"fz-batch-{self._batches}-{i}" for i in range(r.randrange(1, 4))]
        msgs = [self._started(rid) for rid in fresh]
        if kind == "valid":
            msgs += [self._ok_message(fresh) for _ in range(r.randrange(0, 12))]
            msgs += [self._ended(rid) for rid in fresh if r.random() < 0.5]
        elif kind == "odd":  # hostile content, each message at its turn
            msgs += [self.agent_message(batches=False) for _ in range(r.randrange(1, 8))]
            msgs = [m for m in msgs if m.WhichOneof("body") != "hello"]
        elif kind == "too_many":
            ack = pb.AgentMessage(ack=pb.Ack(command_id=1, run_id=fresh[0]))
            msgs += [ack] * (MAX_BATCH_MESSAGES + 1 - len(msgs) + r.randrange(50))
        elif kind == "too_big":  # heartbeats, each well within its own bounds
            msgs += [self._big_beat()] * 2  # just over 4 MiB with the rest (stream: 16 MiB)
        else:
            inner = {
                "nested_hello": pb.AgentMessage(hello=pb.Hello(process_id="again")),
                "nested_batch": pb.AgentMessage(batch=pb.AgentBatch(messages=msgs[:1])),
                "empty_inner": pb.AgentMessage(),
            }[kind]
            msgs.insert(r.randrange(len(msgs) + 1), inner)
        return pb.AgentMessage(batch=pb.AgentBatch(messages=msgs)), fresh

    def _big_beat(self) -> pb.AgentMessage:
        """A heartbeat of half the batch byte bound (made once: 8k runs, 256-character ids)."""
        beat = self._beat
        if beat is None:
            beat = self._beat = pb.AgentMessage()
            n = MAX_BATCH_BYTES // 2 // 261 + 1
            beat.heartbeat.runs.extend(pb.RunProgress(run_id=f"{i:0256d}") for i in range(n))
        return beat

    def _started(self, run_id: str) -> pb.AgentMessage:
        rs = pb.RunStarted(run_id=run_id, agent="fz", trace_id=self.pick(self.traces[:6]).hex())
        rs.request_id = self._r.randrange(1, 2**31)
        return pb.AgentMessage(run_started=rs)

    def _ended(self, run_id: str) -> pb.AgentMessage:
        m = pb.AgentMessage()
        o = m.run_ended.outcome
        o.run_id, o.status, o.reason = run_id, "completed", "final_answer"
        r = self._r
        o.usage.steps, o.usage.input_tokens, o.usage.cost_usd = (
            r.randrange(9),
            r.randrange(999),
            0.5,
        )
        return m

    def _ok_message(self, fresh: list[str]) -> pb.AgentMessage:
        """A message valid on its own (a heartbeat, an ack, an allowance request)."""
        r, m = self._r, pb.AgentMessage()
        kind = r.randrange(3)
        if kind == 0:
            for rid in fresh:
                m.heartbeat.runs.add(run_id=rid, paused=r.random() < 0.2)
        elif kind == 1:
            m.ack.command_id, m.ack.run_id = r.randrange(1, 1000), self.pick(fresh)
        else:
            a = m.allowance_request
            a.run_id, a.cost_usd, a.tokens = self.pick(fresh), r.uniform(0, 1), r.randrange(1000)
        return m

    def agent_body(self) -> bytes:
        data = self.agent_message().SerializeToString()
        return self.mutate(data) if self._r.random() < 0.2 else data
