"""Guard -> agent messages of the control stream (``ControlClient``'s read side)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from guard.policy import DecidedBy, Reason
from guard.v1 import guard_pb2 as pb
from guard.wire import limits_from_pb, policy_from_pb

if TYPE_CHECKING:  # pragma: no cover
    from guard.sdk._control import ControlClient
    from guard.sdk._runtime import Runtime

__all__ = ["apply_policy", "handle", "on_reject"]

log = logging.getLogger("guard.sdk.control")


def handle(client: ControlClient, msg: pb.GuardMessage) -> None:
    """One guard message, on the control thread: Welcome, Policy, RecordAck, Reject,
    Allowance, the per-run Admit and the Deny / Cancel / Warn / WrapUp directives (each of
    those acked), or a batch of them (each handled in order)."""
    kind = msg.WhichOneof("body")
    if kind == "batch":
        client.counters["batches_in"] += 1
        for inner in msg.batch.messages:
            if inner.WhichOneof("body") != "batch":  # never nested (the proto says so)
                handle(client, inner)
        return
    client.counters[kind or "unknown"] += 1
    if kind == "welcome":
        w = msg.welcome
        client.guard_batches = w.accepts_batches
        client.guard_id = w.guard_id
        if w.heartbeat_interval_ms:
            client.heartbeat_s = w.heartbeat_interval_ms / 1000.0
        if w.HasField("policy"):
            apply_policy(client.rt, w.policy)
        client.counters["welcomes"] += 1
        client._failing_over = False
        client.route.up()
        client.connected.set()
        client.first_attempt_done.set()
        return
    if kind == "policy":
        apply_policy(client.rt, msg.policy)
        return
    if kind == "record_ack":  # durable on the guard: stop resending it (never acked back)
        client.unacked.ack(msg.record_ack.run_id)
        return
    if kind == "reject":  # one message refused, the stream goes on (never acked back)
        r = msg.reject
        if r.body == "run_ended" and r.run_id:
            if client.unacked.reject(r.run_id, r.reason, r.code):
                client.counters["records_rejected"] += 1
        else:
            on_reject(client, r)
        return
    if kind == "allowance":  # not acked: ceilings are cumulative, a repeat is harmless
        client.allowances.on_allowance(msg.allowance)
        return
    body = getattr(msg, kind) if kind else None
    run_id = getattr(body, "run_id", "")
    with client._lock:
        run = client._runs.get(run_id)
    applied = run is not None and run.live
    if kind == "admit":
        if applied:
            assert run is not None  # applied: a live run
            run.adopt_limits(limits_from_pb(msg.admit.effective))
            if msg.admit.price_book_version:
                run.price_book_version = msg.admit.price_book_version
        client._resolve(msg.admit.request_id, "admit")
        return  # not acked: the Hello said so (accepts_batches), nothing waits for that ack
    if kind in ("deny", "cancel"):
        d = getattr(msg, kind)
        reason = _reason(d.reason)
        by = DecidedBy.OPERATOR if reason is Reason.OPERATOR_CANCEL else DecidedBy.GUARD
        if applied:
            assert run is not None
            applied = run.interrupt(reason, d.detail, by, cancel=True)
        if kind == "deny":
            client._resolve(d.request_id, "deny")
    elif kind in ("warn", "wrap_up") and applied:
        assert run is not None
        d = getattr(msg, kind)
        run.directive(kind, d.reason, d.detail, "guard")
    if run_id:
        ack = pb.Ack(command_id=msg.command_id, run_id=run_id, applied=bool(applied))
        client._enqueue(pb.AgentMessage(ack=ack))  # already on the loop thread
        client.counters["acks"] += 1


_LOGGED_PER_KIND = 100  # refusals of one message kind logged one by one, then 1 in 1000
_REJECTED_RUNS_KEPT = 1024  # run ids whose RunStarted was refused, for a repeat's Reject


def on_reject(client: ControlClient, r: pb.Reject) -> None:
    """The guard refused one message other than a RunEnded (it changed nothing there; it
    would be refused again, so it is not sent again). Counted (``messages_rejected``,
    ``rejected_<body>``) and logged at WARNING with the run and the reason. A refused
    RunStarted: the run goes on under its local limits, as without a guard (its admission
    wait ends now, and it is left out of the Hello after a reconnect and of the
    heartbeats); a refused AllowanceRequest: its waiter gets no ceilings (fail-open)."""
    body = r.body or "unknown"
    if body == "run_started":
        client.unregister(r.run_id, r.request_id)
        # a run registered while the stream was being opened travels twice (in the Hello
        # and on its own): one refusal, counted and logged once
        seen = client.rejected_runs
        if r.run_id in seen:
            return
        seen[r.run_id] = None
        if len(seen) > _REJECTED_RUNS_KEPT:
            seen.popitem(last=False)
    elif body == "allowance_request" and r.request_id:
        client.allowances.on_reject(r.request_id)
    client.counters["messages_rejected"] += 1
    client.counters[f"rejected_{body}"] += 1
    n = client.counters[f"rejected_{body}"]
    if n <= _LOGGED_PER_KIND or n % 1000 == 0:
        log.warning(
            "otel-guard: the guard refused a %s message%s (status %d: %s); it is not sent "
            "again%s (%d refused so far)",
            body,
            f" of run {r.run_id}" if r.run_id else "",
            r.code,
            r.reason,
            "; the run goes on under its local limits" if body == "run_started" else "",
            n,
        )


def apply_policy(rt: Runtime, policy: pb.Policy) -> None:
    """Apply a policy the guard pushed (Welcome or Policy) to the runtime."""
    try:
        _, defaults, book = policy_from_pb(policy)
    except Exception:
        log.warning("otel-guard: ignoring an invalid policy from the guard", exc_info=True)
        return
    has_defaults = policy.HasField("run_defaults")
    rt.set_policy(defaults if has_defaults else None, book)


def _reason(value: str) -> Reason:
    try:
        return Reason(value)
    except ValueError:
        return Reason.OPERATOR_CANCEL
