"""The fused span applier against its plain reference (``_reference_applier``), by hypothesis.

Two registries with the same policy, the same fake clock and the same sessions are fed the
same generated traffic: OTLP requests (model, tool, step and run spans; foreign GenAI spans
counted by trace; repeated spans and response ids; spans of unknown and ended runs and of
other tenants' runs; ``guard.seq`` numbers above and below a re-registration's floor), runs
registered (fresh, or re-registered with a snapshot) and ended over the control stream, and
the clock moving. One registry applies spans with the fused loop, the other with the
reference; after every step both must hold the same budgets, loop state, tenant usage,
records, decisions, commands and rejections.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from _hyp import examples
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from guard.policy import Outcome, Reason, Status
from guard.server import MemorySink, decode_request
from guard.server.control._fanout import AgentSession
from guard.server.runs._registry import Registry
from guard.server.runtime._auth import ANONYMOUS, Principal
from guard.v1 import guard_pb2 as pb

from ._reference_applier import ReferenceApplier
from .conftest import config, request, span, trace_id_of

TENANTS = ("acme", "globex")
RUNS = 6  # run i belongs to TENANTS[i % 2]; trace trace_id_of(i + 1)
POLICY = {
    "runs": {
        "max_steps": 5,
        "max_tokens": 3000,
        "max_tool_calls": 12,
        "loop": {"window": 6, "repeat_threshold": 3, "no_progress_steps": 3},
    },
    "tenants": {
        "acme": {
            "max_concurrent_runs": 4,
            "rolling": [{"metric": "tokens", "limit": 5000, "window_s": 60}],
        },
        "globex": {"rolling": [{"metric": "cost_usd", "limit": 0.012, "window_s": 30}]},
    },
    "prices": {"version": "t", "models": {"gpt-4.1": {"input": 2.0, "output": 8.0}}},
    "guard": {"max_tracked_runs": 5},
}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _rid(i: int) -> str:
    return f"run-{i}"


# -- generated traffic ------------------------------------------------------------------------
span_spec = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["model", "model", "tool", "tool", "step", "run", "foreign"]),
        "run": st.integers(0, RUNS),  # RUNS: a run id nobody registered (made implicitly)
        "tokens": st.sampled_from([0, 40, 300, 900, 1500]),
        "fp": st.integers(0, 3),
        "result": st.integers(0, 2),
        "seq": st.sampled_from([None, None, 1, 2, 3, 4, 6, 9]),
        "resp": st.sampled_from([None, None, 0, 1]),
        "progress": st.booleans(),
        "repeat": st.booleans(),  # send this span twice (same span id)
        "bad": st.integers(0, 15),  # 0: a counter the policy refuses
    }
)
export = st.tuples(
    st.just("export"),
    st.sampled_from([None, None, *TENANTS]),  # None: no auth (every tenant's runs)
    st.lists(span_spec, min_size=3, max_size=24),
)
op = st.one_of(
    export,
    export,
    export,
    st.tuples(st.just("register"), st.integers(0, RUNS - 1), st.sampled_from([0, 0, 2, 5])),
    st.tuples(st.just("end"), st.integers(0, RUNS), st.booleans()),
    st.tuples(st.just("tick"), st.sampled_from([0.1, 1.0, 20.0, 45.0])),
)


def _span(spec: dict[str, Any], n: int) -> Any:
    i = spec["run"]
    tenant = TENANTS[i % 2]
    trace = trace_id_of(i + 1)
    kind = spec["kind"]
    attrs: dict[str, Any] = {"guard.tenant": tenant}
    if kind != "foreign":
        attrs["guard.run.id"] = _rid(i) if i < RUNS else "stray"
    if spec["seq"] is not None and kind != "foreign":
        attrs["guard.seq"] = spec["seq"]
    if kind in ("model", "foreign"):
        name = "chat gpt-4.1"
        attrs.update(
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4.1",
                "gen_ai.usage.input_tokens": spec["tokens"],
                "gen_ai.usage.output_tokens": spec["tokens"] // 7,
            }
        )
        if spec["bad"] == 0:
            attrs["guard.cost.usd"] = 1e300  # far beyond any budget: refused by the policy
        if spec["resp"] is not None:
            attrs["gen_ai.response.id"] = f"resp-{spec['resp']}"
    elif kind == "tool":
        name = "execute_tool search"
        attrs.update(
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": f"tool{spec['fp']}",
                "guard.action.fingerprint": f"{spec['fp']:02x}",
                "guard.result.hash": f"{spec['result']:02x}",
                "guard.tool.attempts": 1 + spec["bad"] % 3,
            }
        )
    elif kind == "step":
        name = "guard.step"
        attrs["guard.step.index"] = 0
        attrs["guard.progress"] = spec["progress"]
        attrs["guard.state.hash"] = f"{spec['fp']:02x}"
    else:
        name = "invoke_agent bot"
        attrs.update(
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "bot",
                "guard.stop.status": "completed",
                "guard.stop.reason": "final_answer",
            }
        )
    return span(name, trace, attrs, span_id=n.to_bytes(8, "big"))


# -- the two sides ----------------------------------------------------------------------------
class Side:
    def __init__(self, reference: bool) -> None:
        self.clock = Clock()
        self.sink = MemorySink()
        self.reg = Registry(config(**POLICY), self.sink, guard_id="t", clock=self.clock)
        if reference:
            self.reg.applier = ReferenceApplier(self.reg)
        self.sessions = {}
        for tenant in TENANTS:
            session = AgentSession(f"s-{tenant}", tenant, self.reg.log, self.reg.clock)
            self.reg.hello(session, pb.Hello(process_id=tenant, tenant=tenant), ANONYMOUS)
            self.sessions[tenant] = session
        self.results: list[Any] = []

    def apply(self, step: tuple[Any, ...], payload: bytes | None) -> None:
        reg = self.reg
        kind = step[0]
        if kind == "export":
            principal = ANONYMOUS if step[1] is None else Principal(step[1], False)
            decoded = decode_request(pb_request(payload))
            self.results.append(reg.ingest(decoded, principal))
        elif kind == "register":
            i, floor = step[1], step[2]
            tenant = TENANTS[i % 2]
            rs = pb.RunStarted(
                run_id=_rid(i),
                trace_id=trace_id_of(i + 1).hex(),
                tenant=tenant,
                agent="bot",
                started_at_unix=1.7e9,
            )
            restoring = floor > 0
            if restoring:
                rs.span_seq = floor
                rs.usage.input_tokens = 10 * floor
                rs.usage.steps = floor // 2
            reg.register(self.sessions[tenant], rs, ANONYMOUS, restoring=restoring)
        elif kind == "end":
            i, by_agent = step[1], step[2]
            run = reg.runs.get(_rid(i)) if i < RUNS else None
            if run is None:
                return
            if by_agent:
                outcome = Outcome(
                    run_id=run.run_id,
                    status=Status.COMPLETED,
                    reason=Reason.FINAL_ANSWER,
                    tenant=run.tenant,
                    started_at=1.7e9,
                    ended_at=1.7e9,
                )
                reg.ended_by_agent(self.sessions[run.tenant], outcome, ANONYMOUS)
            else:
                reg.cancel("run_id", run.run_id, "stop", ANONYMOUS)
        else:
            self.clock.t += step[1]
            reg.sweep()

    def state(self) -> dict[str, Any]:
        reg = self.reg
        runs = {}
        for run_id, run in reg.runs.items():
            gate = run.seq_gate
            runs[run_id] = (
                run.tenant,
                run.agent,
                dataclasses.asdict(run.budget.usage()),
                run.stop_reason,
                run.stop_by,
                run.soft.level,
                run.detector.hits,
                run.last_tool,
                run.last_action_hash,
                run.last_step,
                run.step_tools,
                run.step_input_tokens,
                run.gate_tokens,
                run.gate_cost_usd,
                run.model,
                run.forecast_warned,
                run.loop_warned,
                run.touched_at,
                None
                if gate is None
                else len(gate)
                if type(gate) is list
                else (gate.floor, sorted(gate.above)),
                run.end_hint,
                run.session is not None and run.session.session_id,
            )
        tenants = {t: reg.budgets.status(t).SerializeToString() for t in reg.budgets.known()}
        return {
            "runs": runs,
            "ended": list(reg.ended),
            "by_tenant": {t: sorted(ids) for t, ids in reg.by_tenant.items()},
            "span_only": sorted(reg.span_only),
            "provisional_spans": reg.provisional_spans,
            "stats": dict(reg.stats),
            "tenants": tenants,
            "records": [_outcome(o) for o in self.sink.runs],
            "decisions": [_decision(d) for d in self.sink.decisions],
            "commands": {t: _commands(s) for t, s in self.sessions.items()},
            "results": list(self.results),
        }


def pb_request(payload: bytes | None) -> Any:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp

    return otlp.ExportTraceServiceRequest.FromString(payload or b"")


def _outcome(o: Outcome) -> dict[str, Any]:
    d = dataclasses.asdict(o)
    d.pop("ended_at", None)
    return d


def _decision(d: Any) -> dict[str, Any]:
    out = d.to_dict()
    out.pop("decided_at")
    return out


def _commands(session: AgentSession) -> list[bytes]:
    out = []
    while not session.queue.empty():
        m = session.queue.get_nowait()
        if isinstance(m, pb.GuardMessage):
            m.sent_at_unix = 0.0
            out.append(m.SerializeToString())
    return out


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# Two runs cancelled by the operator, in two sessions, then past the ack timeout: the sweep
# writes both unacked cancels, in the order the sessions attached.
@example(
    [
        ("tick", 0.1),
        ("register", 0, 0),
        ("register", 1, 0),
        ("end", 0, False),
        ("end", 1, False),
        ("tick", 45.0),
    ]
)
@given(st.lists(op, min_size=6, max_size=30))
def test_fused_applier_matches_the_reference(ops: list[tuple[Any, ...]]) -> None:
    fused, ref = Side(reference=False), Side(reference=True)
    n = 1
    for step in ops:
        payload = None
        if step[0] == "export":
            spans = []
            for spec in step[2]:
                spans.append(_span(spec, n))
                if spec["repeat"]:
                    spans.append(_span(spec, n))
                n += 1
            payload = request(*spans).SerializeToString()
        fused.apply(step, payload)
        ref.apply(step, payload)
        assert fused.state() == ref.state(), step


class _CountingBudgets:
    """The in-memory tenant budgets, counting the calls that would be round trips."""

    def __init__(self, registry: Any) -> None:
        from guard.server.tenants._local import LocalTenantBudgets

        self.inner = LocalTenantBudgets(registry)
        self.records: list[str] = []

    def record(self, tenant: str, usage: Any) -> Any:
        self.records.append(tenant)
        return self.inner.record(tenant, usage)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_request_reaches_each_tenants_budget_once() -> None:
    from guard.server._parts import Parts
    from guard.server.bus._local import LocalBus
    from guard.server.directory._local import LocalDirectory

    counting: list[_CountingBudgets] = []

    def parts(registry: Any) -> Parts:
        counting.append(_CountingBudgets(registry))
        return Parts(counting[0], LocalDirectory(registry), LocalBus())

    reg = Registry(config(**POLICY), MemorySink(), guard_id="t", clock=Clock(), parts=parts)
    spans = [
        _span({**spec, "run": i % 4}, n)
        for n, (i, spec) in enumerate(
            (
                (
                    i,
                    {
                        "kind": k,
                        "tokens": 40,
                        "fp": i % 3,
                        "result": 0,
                        "seq": None,
                        "resp": None,
                        "progress": True,
                        "bad": 1,
                    },
                )
                for i in range(40)
                for k in ("model", "tool", "step")
            ),
            start=1,
        )
    ]
    decoded = decode_request(request(*spans))
    assert len(decoded.observations) == 120
    reg.ingest(decoded, ANONYMOUS)
    assert sorted(counting[0].records) == ["acme", "globex"]  # 120 spans, one call per tenant
    assert reg.runs["run-0"].budget.usage().model_calls == 10
