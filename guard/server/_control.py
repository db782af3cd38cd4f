"""``GuardControl.Attach``: the bidirectional stream to one agent process.

The servicer only adapts: a reader task turns AgentMessages into registry calls, the handler
coroutine writes whatever the registry queued for this session. A protocol violation (no
Hello first, an empty run id, another tenant's run) ends the stream with a clear status; a
dropped stream detaches the session's runs (``agent_grace_s`` before ``agent_lost``). A
termination record out of bounds is not a protocol violation: it is answered with a
``Reject`` and the stream goes on (``_record_in``).

Every message is validated whole against :mod:`guard.bounds` before any of it is applied
(``guard.wire.check_*``), and a Hello re-registering many live runs is applied in slices of
:data:`HELLO_SLICE` runs that yield to the event loop between them, so one agent's reconnect
cannot hold the loop (and every other tenant's decisions) for long.

Batches (``AgentBatch`` / ``GuardBatch``) cut the grpc.aio cost per run, which is per stream
message: every message is read from an agent's batch and applied in order, exactly as if it
had come alone (a batch that holds a Hello or another batch, or more than
``MAX_BATCH_MESSAGES``, ends the stream before any of it applies); whatever the registry
queued for the session by the time the writer runs goes out as one GuardBatch (bounded:
``guard.wire.take_encoded``: serialized once, the batch framed as bytes), to an agent
whose Hello set ``accepts_batches`` (any other gets one GuardMessage per write, as before).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import grpc

from guard.errors import GuardError, InvalidInput
from guard.server._fanout import AgentSession
from guard.server._record_in import end_record
from guard.server._status import abort_for
from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc
from guard.wire import (
    check_allowance_request,
    check_batch,
    check_heartbeat,
    check_hello,
    check_run_started,
    policy_to_pb,
    take_encoded,
    welcome_to_pb,
)

__all__ = [
    "HELLO_CHECK_SLICE",
    "HELLO_SLICE",
    "ControlServicer",
    "add_to_server",
    "apply_message",
]

HELLO_SLICE = 32  # Hello.live_runs registered between two yields to the event loop
HELLO_CHECK_SLICE = 256  # Hello.live_runs validated between two yields


def apply_message(
    registry: Any, session: AgentSession, msg: pb.AgentMessage, body: str | None, principal: Any
) -> None:
    """One AgentMessage after the Hello (alone, or one of a batch): checked, applied (the
    caller then settles with shared budgets: ``budgets.sync``, when they settle). The control
    reader's step, and the fuzz harness's in-process target's."""
    if body == "run_started":
        rs = msg.run_started
        check_run_started(rs)
        registry.register(session, rs, principal)
    elif body == "run_ended":
        # refused on its own (Reject), never ending the stream: see _record_in
        end_record(registry, session, msg.run_ended.outcome, principal)
    elif body == "heartbeat":
        check_heartbeat(msg.heartbeat)
        registry.heartbeat(session, msg.heartbeat)
    elif body == "ack":
        registry.ack(session, msg.ack)
    elif body == "allowance_request":
        check_allowance_request(msg.allowance_request)
        registry.budgets.request(session, msg.allowance_request, principal)
    elif body == "hello":
        raise InvalidInput("hello sent twice on one stream")
    else:
        raise InvalidInput("empty AgentMessage")


class ControlServicer(guard_pb2_grpc.GuardControlServicer):
    def __init__(self, app: Any) -> None:
        self.app = app

    async def Attach(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        app = self.app
        registry = app.registry
        try:
            principal = app.auth.principal(context.invocation_metadata())
        except GuardError as exc:
            await abort_for(context, exc)
        session = AgentSession(uuid.uuid4().hex, principal.tenant, registry.log, registry.clock)
        app.attach_session(session)

        batches = False  # the agent's Hello said it reads GuardMessage.batch

        async def read() -> None:
            nonlocal batches
            try:
                first = True
                async for msg in request_iterator:
                    body = msg.WhichOneof("body")
                    if first:
                        if body != "hello":
                            raise InvalidInput(f"first message must be hello, got {body}")
                        first = False
                        batches = msg.hello.accepts_batches
                        await self._hello(session, msg.hello, principal)
                    elif body == "batch":
                        check_batch(msg.batch)  # then each message at its turn, as if alone
                        settles = registry.budgets.settles
                        for inner in msg.batch.messages:
                            apply_message(
                                registry, session, inner, inner.WhichOneof("body"), principal
                            )
                            if settles:
                                await registry.budgets.sync()  # see _parts
                    else:
                        apply_message(registry, session, msg, body, principal)
                        if registry.budgets.settles:
                            await registry.budgets.sync()  # see _parts: settle with shared budgets
            except GuardError as exc:
                session.error = exc
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                session.error = InvalidInput(f"bad message: {type(exc).__name__}: {exc}")
            session.close()

        reader = asyncio.ensure_future(read())
        try:
            queue, carry = session.queue, None
            while True:
                item = carry if carry is not None else await queue.get()
                # whatever else is ready goes in the same write (one GuardBatch for an agent
                # that reads them: one grpc message instead of one per command), as bytes
                if batches:
                    payload, carry, closing = take_encoded(queue, item, AgentSession.is_close)
                else:
                    closing = AgentSession.is_close(item)
                    payload, carry = None if closing else item, None
                if payload is not None:
                    await context.write(payload)
                if closing:
                    break
            if session.error is not None:
                await abort_for(context, session.error)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            registry.detach(session)
            app.detach_session(session)

    async def _hello(self, session: AgentSession, hello: pb.Hello, principal: Any) -> None:
        """The first message: checked whole, then welcomed, then its live runs registered in
        slices (a large one takes its tenant's turn, see ``_fair``)."""
        registry = self.app.registry
        check_hello(hello, live_runs=False)
        # authorise before welcoming: a refused stream gets no policy
        tenant = hello.tenant or (principal.tenant or "")
        principal.check_tenant(tenant, "the stream")
        big = len(hello.live_runs) > HELLO_SLICE
        async with self.app.turns.turn(principal.tenant) if big else contextlib.nullcontext():
            # all or nothing: every live run is checked before any is applied
            for i, rs in enumerate(hello.live_runs, 1):
                check_run_started(rs)
                principal.check_tenant(rs.tenant or tenant)
                if i % HELLO_CHECK_SLICE == 0:
                    await asyncio.sleep(0)
            session.send("welcome", self._welcome(session))
            registry.hello(session, hello, principal, restore=False)
            for i, rs in enumerate(hello.live_runs, 1):
                registry.register(session, rs, principal, restoring=True)
                if i % HELLO_SLICE == 0:
                    await asyncio.sleep(0)

    def _welcome(self, session: AgentSession) -> pb.Welcome:
        cfg = self.app.config
        return welcome_to_pb(
            self.app.guard_id,
            session.session_id,
            int(cfg.guard.heartbeat_interval_ms),
            round(cfg.guard.agent_grace_s),
            self.app.policy_pb,
        )

    @staticmethod
    def policy(config: Any) -> pb.Policy:
        return policy_to_pb(config)


def _serialize(msg: Any) -> bytes:
    """The Attach stream's response serializer: a GuardMessage, or bytes already serialized
    (a batch, see ``take_encoded``), which go out as they are."""
    return msg if type(msg) is bytes else msg.SerializeToString()


def add_to_server(servicer: ControlServicer, server: Any) -> None:
    """``guard_pb2_grpc.add_GuardControlServicer_to_server`` with :func:`_serialize` as the
    response serializer (the writer hands grpc a batch as bytes)."""
    handlers = {
        "Attach": grpc.stream_stream_rpc_method_handler(
            servicer.Attach,
            request_deserializer=pb.AgentMessage.FromString,
            response_serializer=_serialize,
        )
    }
    name = "guard.v1.GuardControl"
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)
