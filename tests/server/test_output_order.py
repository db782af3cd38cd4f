"""The order of what the guard writes when one event concerns many runs or sessions.

It is the order in which they came: sessions in attach order, a tenant's runs in admission
order, a session's runs in registration order. Nothing depends on the hash seed or on where
objects happen to live in memory (a ``set`` iterates in that order), so two guards given the
same events write the same records in the same order.
"""

from __future__ import annotations

import random

from guard.server import MemorySink
from guard.server.control._fanout import ACK_TIMEOUT_S, AgentSession
from guard.server.runs._registry import Registry
from guard.server.runtime._auth import ANONYMOUS
from guard.v1 import guard_pb2 as pb

from .conftest import config, trace_id_of

N = 40


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _guard(n_sessions: int) -> tuple[Registry, list[AgentSession], MemorySink, Clock]:
    sink, clock = MemorySink(), Clock()
    reg = Registry(config(guard={"agent_grace_s": 5.0}), sink, guard_id="t", clock=clock)
    sessions = []
    # session ids in an order unrelated to attach order, and objects allocated in between,
    # so neither the ids nor the addresses line up with the order asked for
    ids = [f"s{i:03d}" for i in range(n_sessions)]
    random.Random(7).shuffle(ids)
    ballast = []
    for sid in ids:
        ballast.append(bytearray(random.Random(sid).randrange(16, 4096)))
        session = AgentSession(sid, None, reg.log, reg.clock)
        reg.hello(session, pb.Hello(process_id=sid, tenant="acme"), ANONYMOUS)
        sessions.append(session)
    return reg, sessions, sink, clock


def _register(reg: Registry, session: AgentSession, run_id: str, n: int) -> None:
    rs = pb.RunStarted(run_id=run_id, trace_id=trace_id_of(n).hex(), tenant="acme", agent="a")
    reg.register(session, rs, ANONYMOUS)


def _run_ids(n: int) -> list[str]:
    ids = [f"run-{i:03d}" for i in range(n)]
    random.Random(11).shuffle(ids)  # admission order is not the ids' sorted order
    return ids


def test_unacked_decisions_expire_in_the_order_their_sessions_attached() -> None:
    reg, sessions, sink, clock = _guard(N)
    order = []
    for n, (session, run_id) in enumerate(zip(sessions, _run_ids(N), strict=True), start=1):
        _register(reg, session, run_id, n)
        order.append(run_id)
    reg.cancel("all", None, "stop", ANONYMOUS)
    assert sink.decisions == []  # pushed, waiting for acks that never come
    clock.t += ACK_TIMEOUT_S + 1
    reg.sweep()
    assert [d.run_id for d in sink.decisions] == order


def test_a_tenant_cancel_stops_its_runs_in_admission_order() -> None:
    reg, (session,), _, _ = _guard(1)
    order = _run_ids(N)
    for n, run_id in enumerate(order, start=1):
        _register(reg, session, run_id, n)
    assert reg.cancel("tenant", "acme", "stop", ANONYMOUS) == order
    cancels = []
    while not session.queue.empty():
        m = session.queue.get_nowait()
        if isinstance(m, pb.GuardMessage) and m.WhichOneof("body") == "cancel":
            cancels.append(m.cancel.run_id)
    assert cancels == order


def test_a_lost_streams_runs_are_recorded_in_registration_order() -> None:
    reg, (session,), sink, clock = _guard(1)
    order = _run_ids(N)
    for n, run_id in enumerate(order, start=1):
        _register(reg, session, run_id, n)
    reg.detach(session)
    clock.t += 6.0  # past agent_grace_s
    reg.sweep()
    assert [o.reason.value for o in sink.runs] == ["agent_lost"] * N
    assert [o.run_id for o in sink.runs] == order
