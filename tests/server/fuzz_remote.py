"""The fuzz harness's network side: raw bodies into a real guard's servicers over grpc.

Bodies go out as raw bytes (no client-side serializer), so every mutation reaches the
server's own decoding: the OTLP handler's ``decode_slices`` (native, then the reference), the
safe deserializers of GuardControl, GuardAdmin and Health. :data:`CRASH_CODES` are the answers a client's
mistake must never get (UNKNOWN / INTERNAL: a server bug; DEADLINE_EXCEEDED: it hung).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import grpc
from grpc_health.v1 import health_pb2

from guard.v1 import guard_pb2 as pb

from .fuzzing import BATCHES, Fuzzer

__all__ = ["ADMIN_METHODS", "CRASH_CODES", "Remote", "drive", "remote_violations"]

CRASH_CODES = frozenset(
    {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED}
)
_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_ATTACH = "/guard.v1.GuardControl/Attach"
_HEALTH = "/grpc.health.v1.Health/Check"
ADMIN_METHODS = {
    "Cancel": lambda f: pb.CancelRequest(
        selector=pb.Selector(run_id=f.pick(f.run_ids) or "x"), reason=f.text()
    ),
    "ListRuns": lambda f: pb.ListRunsRequest(tenant=f.pick(["", "acme", "globex"]), limit=5),
    "TenantBudgets": lambda f: pb.TenantBudgetsRequest(tenant=f.pick(["", "acme", f.text()])),
    "Report": lambda f: pb.ReportRequest(since_unix=f.number(0.6), until_unix=f.number(0.6)),
    "Stats": lambda f: pb.StatsRequest(),
}


class Remote:
    """Sync grpc client for one guard. ``tokens[i]`` is caller ``i``'s token (None: none)."""

    def __init__(self, address: str, tokens: list[str | None], timeout_s: float = 10.0) -> None:
        self.channel = grpc.insecure_channel(address)
        self.tokens = tokens
        self.timeout_s = timeout_s
        self.codes: dict[str, int] = {}
        self.crashes: list[str] = []
        # run ids of the AgentBatches the guard refused whole: none may ever be registered
        self.refused_run_ids: set[str] = set()

    def _md(self, who: int) -> tuple[tuple[str, str], ...]:
        token = self.tokens[who % len(self.tokens)]
        return (("authorization", f"Bearer {token}"),) if token else ()

    def _note(self, what: str, code: grpc.StatusCode, details: str | None) -> grpc.StatusCode:
        self.codes[code.name] = self.codes.get(code.name, 0) + 1
        if code in CRASH_CODES or (details and "Traceback" in details):
            self.crashes.append(f"{what}: {code.name}: {(details or '')[:300]}")
        return code

    def unary(self, method: str, body: bytes, who: int) -> grpc.StatusCode:
        call = self.channel.unary_unary(method)
        try:
            call(body, metadata=self._md(who), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            return self._note(method, exc.code(), exc.details())
        return self._note(method, grpc.StatusCode.OK, None)

    def export(self, body: bytes, who: int) -> grpc.StatusCode:
        return self.unary(_EXPORT, body, who)

    def admin(self, f: Fuzzer, who: int) -> grpc.StatusCode:
        method = f.pick(sorted(ADMIN_METHODS))
        body = ADMIN_METHODS[method](f).SerializeToString()
        if f.rng.random() < 0.4:
            body = f.mutate(body)
        return self.unary(f"/guard.v1.GuardAdmin/{method}", body, who)

    def attach(self, bodies: Iterable[bytes], who: int) -> grpc.StatusCode:
        """The stream's final status; the Rejects it carried (messages refused on their
        own, the stream going on) are in :attr:`rejects`."""
        call = self.channel.stream_stream(_ATTACH)
        self.rejects: list[pb.Reject] = []
        try:
            for raw in call(iter(list(bodies)), metadata=self._md(who), timeout=self.timeout_s):
                msg = pb.GuardMessage.FromString(raw)
                inner = msg.batch.messages if msg.HasField("batch") else [msg]
                self.rejects += [m.reject for m in inner if m.HasField("reject")]
        except grpc.RpcError as exc:
            return self._note(_ATTACH, exc.code(), exc.details())
        return self._note(_ATTACH, grpc.StatusCode.OK, None)

    def batch(self, f: Fuzzer, who: int) -> grpc.StatusCode:
        """A Hello then one AgentBatch of a drawn shape (:data:`~tests.server.fuzzing.BATCHES`):
        a bad one is refused whole (a Reject with its status in a stream that goes on, or
        the stream ended before it, e.g. a bad token) and its runs never registered."""
        hello = pb.AgentMessage(hello=pb.Hello(process_id=f"b{who}", accepts_batches=True))
        msg, fresh = f.batch()
        kind = f.last_batch
        code = self.attach([hello.SerializeToString(), msg.SerializeToString()], who)
        want = BATCHES[kind]
        if want is not None:
            refused = [r for r in self.rejects if r.body == "batch"]
            if code == grpc.StatusCode.OK and [c.name for c in _codes(refused)] != [want]:
                self.crashes.append(f"a {kind} batch was answered OK without its Reject")
            self.refused_run_ids.update(fresh)
        return code

    def health_raw(self, body: bytes, who: int) -> grpc.StatusCode:
        return self.unary(_HEALTH, body, who)

    def serving(self) -> bool:
        """The guard answers a health check SERVING."""
        check = self.channel.unary_unary(
            _HEALTH,
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        resp = check(health_pb2.HealthCheckRequest(), timeout=self.timeout_s)
        return resp.status == health_pb2.HealthCheckResponse.SERVING

    def stats(self, admin_token: str | None) -> dict[str, float]:
        call = self.channel.unary_unary(
            "/guard.v1.GuardAdmin/Stats",
            request_serializer=pb.StatsRequest.SerializeToString,
            response_deserializer=pb.StatsResponse.FromString,
        )
        md = (("authorization", f"Bearer {admin_token}"),) if admin_token else ()
        return dict(call(pb.StatsRequest(), metadata=md, timeout=self.timeout_s).figures)

    def close(self) -> None:
        self.channel.close()


def remote_violations(remote: Remote, admin_token: str | None, max_runs: int) -> list[str]:
    """The state invariants read through GuardAdmin (for a guard in another process)."""
    md = (("authorization", f"Bearer {admin_token}"),) if admin_token else ()
    ch = remote.channel
    listed = ch.unary_unary(
        "/guard.v1.GuardAdmin/ListRuns",
        request_serializer=pb.ListRunsRequest.SerializeToString,
        response_deserializer=pb.ListRunsResponse.FromString,
    )(pb.ListRunsRequest(limit=100_000), metadata=md, timeout=30)
    out = []
    registered = remote.refused_run_ids.intersection(r.run_id for r in listed.runs)
    if registered:
        out.append(f"runs of refused batches registered: {sorted(registered)[:3]}")
    if listed.total > max_runs:
        out.append(f"{listed.total} tracked runs > {max_runs}")
    for r in listed.runs:
        if r.usage.HasField("cost_usd") and not (
            math.isfinite(r.usage.cost_usd) and r.usage.cost_usd >= 0
        ):
            out.append(f"run {r.run_id[:40]!r}: cost_usd {r.usage.cost_usd}")
    budgets = ch.unary_unary(
        "/guard.v1.GuardAdmin/TenantBudgets",
        request_serializer=pb.TenantBudgetsRequest.SerializeToString,
        response_deserializer=pb.TenantBudgetsResponse.FromString,
    )(pb.TenantBudgetsRequest(), metadata=md, timeout=30)
    for t in budgets.tenants:
        out.extend(
            f"tenant {t.tenant!r}: {w.metric} used={w.used}"
            for w in t.windows
            if not math.isfinite(w.used)
        )
    return out


def drive(remote: Remote, f: Fuzzer, n: int) -> int:
    """Send about ``n`` fuzzed bodies over every servicer; returns how many were sent."""
    sent = 0
    r = f.rng
    while sent < n:
        who = r.randrange(8)
        kind = r.random()
        if kind < 0.45:
            remote.export(f.otlp_body(), who)
            sent += 1
        elif kind < 0.55:
            remote.batch(f, who)
            sent += 2
        elif kind < 0.8:
            hello = pb.AgentMessage(hello=pb.Hello(process_id=f"p{who}")).SerializeToString()
            bodies = [hello] if r.random() < 0.8 else []
            bodies += [f.agent_body() for _ in range(r.randrange(1, 6))]
            remote.attach(bodies, who)
            sent += len(bodies)
        elif kind < 0.95:
            remote.admin(f, who)
            sent += 1
        else:
            remote.health_raw(f.mutate(b"\x0a\x00"), who)
            sent += 1
    return sent


_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}


def _codes(rejects: list[pb.Reject]) -> list[grpc.StatusCode]:
    return [_BY_VALUE[r.code] for r in rejects]
