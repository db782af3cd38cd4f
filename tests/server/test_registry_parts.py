"""The registry is parts with explicit interfaces (issue 12 §6), and the servicers convert
protobuf only through ``guard.wire``.

- ``Registry`` mixes nothing in: each part is built with what it needs, none of them holds
  the registry (a part may hold a narrow callback: one bound method), and the facade's
  methods are the parts' own (so the span path pays no extra call);
- the GuardAdmin / GuardControl / OTLP servicers build no ``guard.v1`` message themselves;
- the admin answers built by ``guard.wire`` carry what they are given, and one replica's run
  statuses survive their trip between replicas as text.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from guard.policy import Limits, PolicyConfig, Usage
from guard.server.decisions._router import DecisionRouter
from guard.server.runs._admission import Admission
from guard.server.runs._lifecycle import Lifecycle
from guard.server.runs._registry import Registry
from guard.server.runs._rejoin import Rejoin
from guard.v1 import guard_pb2 as pb
from guard.wire import (
    cancel_response_to_pb,
    list_runs_response_to_pb,
    run_status_from_hex,
    run_status_to_hex,
    run_status_to_pb,
    stats_response_to_pb,
    tenant_budget_to_pb,
    tenant_budgets_response_to_pb,
)

SERVER = Path(__file__).resolve().parents[2] / "guard" / "server"
SERVICERS = ("admin/_admin.py", "control/_stream.py", "otlp/_grpc.py", "otlp/_http.py")
PARTS = {
    "decisions": DecisionRouter,
    "lifecycle": Lifecycle,
    "rejoin": Rejoin,
    "admission": Admission,
}


class _Sink:
    def write_run(self, outcome: object) -> None:
        pass

    def write_decision(self, record: object) -> None:
        pass


@pytest.fixture
def registry() -> Registry:
    return Registry(PolicyConfig(), _Sink(), guard_id="t")


def test_the_registry_mixes_nothing_in() -> None:
    assert Registry.__bases__ == (object,)


@pytest.mark.parametrize("cls", PARTS.values(), ids=PARTS.keys())
def test_no_part_is_given_the_registry(cls: type) -> None:
    params = inspect.signature(cls).parameters
    assert "registry" not in params and "scope" in params and len(params) >= 3, list(params)


def test_the_parts_hold_parts_not_the_registry(registry: Registry) -> None:
    for name, cls in PARTS.items():
        part = getattr(registry, name)
        assert type(part) is cls
        for attr, value in vars(part).items():
            assert value is not registry, f"{name}.{attr} is the registry"
            if inspect.ismethod(value) and value.__self__ is registry:
                # the one callback into the facade: the span path, whichever applier the
                # registry has at the time (tests swap it)
                assert (name, attr, value.__func__) == ("rejoin", "ingest", Registry.ingest)
    # the parts share the registry's table, stats and shared-state parts
    for name in PARTS:
        part = getattr(registry, name)
        assert part.table is registry.table and part.stats is registry.stats
    assert registry.decisions.bus is registry.bus
    assert registry.lifecycle.budgets is registry.budgets
    assert registry.lifecycle.directory is registry.directory


def test_the_facade_methods_are_the_parts_own(registry: Registry) -> None:
    expected = {
        "admission": ("register", "hello", "detach", "ack", "heartbeat", "new_run", "make_room"),
        "decisions": (
            "act",
            "forecast",
            "tenant_cut",
            "check_deadline",
            "issue",
            "stop_run",
            "cancel",
            "deny_starts",
            "cancelling",
            "remote_decision",
        ),
        "lifecycle": ("ended_by_agent", "end_run", "sweep", "moved_away"),
        "rejoin": ("gate", "set_tenant", "located", "remote_moved", "ended_remotely"),
    }
    for part_name, methods in expected.items():
        part = getattr(registry, part_name)
        for m in methods:
            bound = getattr(registry, m)
            assert bound.__self__ is part and bound.__func__ is getattr(type(part), m), m


def _pb_aliases(tree: ast.Module) -> set[str]:
    """Names a module binds to ``guard.v1`` message modules (``guard_pb2 as pb``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("guard.v1"):
            names.update(a.asname or a.name for a in node.names if a.name.endswith("_pb2"))
    return names


@pytest.mark.parametrize("module", SERVICERS)
def test_servicers_build_no_guard_messages_themselves(module: str) -> None:
    tree = ast.parse((SERVER / module).read_text())
    aliases = _pb_aliases(tree)
    built = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        # pb.CancelResponse(...), pb.RunStatus.FromString(...)
        base = f.value if isinstance(f, ast.Attribute) else None
        while isinstance(base, ast.Attribute):
            base = base.value
        if isinstance(base, ast.Name) and base.id in aliases:
            built.append(f"{module}:{node.lineno} {ast.unparse(f)}")
    assert built == [], "convert through guard.wire: " + "; ".join(built)


def _status(run_id: str) -> pb.RunStatus:
    return run_status_to_pb(
        run_id=run_id,
        parent_run_id="",
        tenant="acme",
        agent="a",
        process_id="p",
        usage=Usage(steps=3, input_tokens=40),
        limits=Limits(max_steps=12),
        elapsed_s=1.5,
        utilisation=0.25,
        metric="steps",
        state="running",
        connected=True,
        guard_id="g1",
    )


def test_admin_answers_carry_what_they_are_given() -> None:
    assert list(cancel_response_to_pb(["r1", "r2"]).run_ids) == ["r1", "r2"]
    listed = list_runs_response_to_pb([_status("r1"), _status("r2")], 7)
    assert [s.run_id for s in listed.runs] == ["r1", "r2"] and listed.total == 7
    budgets = tenant_budgets_response_to_pb([tenant_budget_to_pb("acme", live_runs=2)])
    assert [(t.tenant, t.live_runs) for t in budgets.tenants] == [("acme", 2)]
    stats = stats_response_to_pb("g1", {"spans": 12.0, "loop_lag_max_ms": 0.5})
    assert stats.guard_id == "g1" and dict(stats.figures) == {"spans": 12.0, "loop_lag_max_ms": 0.5}


def test_a_run_status_survives_the_trip_between_replicas() -> None:
    status = _status("r1")
    text = run_status_to_hex(status)
    assert isinstance(text, str) and run_status_from_hex(text) == status
    with pytest.raises(ValueError):
        run_status_from_hex("not hex")


def _pending(session) -> list:
    """The decision records a session holds until its agent acks them, in send order."""
    return [record for _, (_, record) in sorted(session.pending.items())]


def test_the_router_builds_the_deny_and_the_resent_cancel(registry: Registry) -> None:
    from guard.policy import DecidedBy, Reason
    from guard.server.control._fanout import AgentSession
    from guard.server.runtime._auth import ANONYMOUS

    session = AgentSession("s", None, registry.log, registry.clock)
    registry.hello(session, pb.Hello(process_id="p", tenant="acme"), ANONYMOUS)
    registry.register(session, pb.RunStarted(run_id="r1", tenant="acme", agent="bot"), ANONYMOUS)
    registry.register(session, pb.RunStarted(run_id="r1", tenant="acme"), ANONYMOUS)  # attach
    run = registry.runs["r1"]
    registry.stop_run(
        run, Reason.MAX_STEPS, "max_steps 3 reached (steps=3)", 1.0, "steps", DecidedBy.GUARD
    )
    # its stream moved to another replica: the cancel is sent again, the same decision
    registry.remote_moved(run, "g2")
    # an ended id is denied (through the router: counted, recorded on the ack)
    registry.end_run(run, run.stop_reason, run.stop_reason, run.stop_detail, DecidedBy.GUARD)
    registry.register(session, pb.RunStarted(run_id="r1", tenant="acme"), ANONYMOUS)
    first, again, deny = _pending(session)
    assert (first.action, first.reason, first.decided_by, first.agent) == (
        "cancel",
        "max_steps",
        "guard",
        "bot",
    )
    assert (again.action, again.reason, again.detail, again.decided_by, again.tenant) == (
        "cancel",
        "max_steps",
        "max_steps 3 reached (steps=3)",
        "guard",
        "acme",
    )
    assert (deny.action, deny.reason, deny.detail) == ("deny", "error", "run_id already ended")
    assert registry.stats["denied"] == 1
