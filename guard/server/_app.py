"""``GuardServer``: one grpc.aio server carrying OTLP, GuardControl, GuardAdmin, health and
reflection on one port, plus :class:`ServerThread` to run it beside synchronous code.

Drain (SIGTERM): health goes NOT_SERVING and new Exports get UNAVAILABLE; every control
stream ends with UNAVAILABLE "guard is draining" (agents reconnect with backoff and re-send
their live runs to the next guard, so no run is ended by a drain); in-flight RPCs get up to
half of ``drain_s``; unacked decisions are written; the sink is flushed with what remains.
The whole drain is bounded by ``drain_s`` (default :data:`DEFAULT_DRAIN_S` = 10 s); the Helm
chart's terminationGracePeriodSeconds (15) leaves a margin above it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from guard._native import native_figures
from guard.errors import ConfigError, GuardUnavailable
from guard.policy import MetricsSettings, PolicyConfig
from guard.server._compose import assemble, guard_metrics, http_receiver, register_services
from guard.server.control._clocks import skew_figures
from guard.server.control._fanout import AgentSession
from guard.server.runs._lifecycle import Readiness
from guard.server.runtime._ordered import OrderedSet
from guard.server.sinks._memory import NullSink

__all__ = [
    "DEFAULT_DRAIN_S",
    "DEFAULT_LISTEN",
    "GuardServer",
    "ServerThread",
    "TlsFiles",
    "is_loopback",
]

log = logging.getLogger("guard.server")

DEFAULT_LISTEN = "127.0.0.1:4317"
DEFAULT_DRAIN_S = 10.0
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # larger OTLP batches get RESOURCE_EXHAUSTED
SWEEP_INTERVAL_S = 0.25
MAX_STREAMS_PER_CONNECTION = 16
SWEEP_BATCH = 256  # runs ended by one sweep slice


@dataclass(frozen=True)
class TlsFiles:
    """PEM paths. With ``client_ca`` the server requires client certificates (mTLS)."""

    cert: str
    key: str
    client_ca: str | None = None


_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def check_redis_url(url: str) -> str:
    """A ``--redis`` URL, checked before anything connects (the password is never echoed)."""
    if not url.startswith(_REDIS_SCHEMES) or len(url) > 2048 or not url.isprintable():
        shown = url.split("://", 1)[0] if "://" in url else url[:20]
        raise ConfigError(
            f"--redis must be a redis://, rediss:// or unix:// URL, got {shown!r}…",
            path="redis",
        )
    return url


def is_loopback(listen: str) -> bool:
    host = listen.rsplit(":", 1)[0].strip("[]") if ":" in listen else listen
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class GuardServer:
    """The guard service. ``async with GuardServer(config, listen="127.0.0.1:0") as srv``."""

    def __init__(
        self,
        config: PolicyConfig | None = None,
        *,
        listen: str = DEFAULT_LISTEN,
        sink: Any = None,
        tls: TlsFiles | None = None,
        insecure_bind_any: bool = False,
        environ: Mapping[str, str] | None = None,
        guard_id: str | None = None,
        drain_s: float = DEFAULT_DRAIN_S,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        metrics: MetricsSettings | None = None,
        redis_url: str | None = None,
        http_listen: str | None = None,
    ) -> None:
        self.config = config if config is not None else PolicyConfig.from_dict(None)
        self.listen = listen
        self.sink = sink if sink is not None else NullSink()
        self.tls = tls
        # The replica's id in records, ListRuns and every metric series: the host (the pod's
        # name under Kubernetes) plus a random part, so two guards on one host differ.
        self.guard_id = guard_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        if len(self.guard_id) > 128 or not self.guard_id.isprintable():
            raise ConfigError(
                f"guard id {self.guard_id[:40]!r}… must be 1-128 printable characters",
                path="guard_id",
            )
        self.drain_s = float(drain_s)
        self.max_message_bytes = int(max_message_bytes)
        # OTLP/HTTP beside the gRPC port (serve --http-listen); None: off. Same bind rule.
        self.http_listen = http_listen
        self.http: Any = None  # the _http.HttpReceiver while running
        open_to_all = self.config.auth is None and not insecure_bind_any
        for addr in (listen, http_listen):
            if addr and open_to_all and not is_loopback(addr):
                raise ConfigError(
                    f"refusing to bind {addr!r} without an auth section: add `auth:` to the "
                    "policy file or pass --insecure-bind-any",
                    path="auth",
                )
        # one replica of several when a Redis URL is given (serve --redis), else one process
        self.redis_url = check_redis_url(redis_url) if redis_url else None
        built = assemble(
            self.config,
            self.sink,
            guard_id=self.guard_id,
            environ=environ,
            redis_url=self.redis_url,
        )
        self.auth, self.registry, self.intake = built.auth, built.registry, built.intake
        self.turns, self.policy_pb = built.turns, built.policy_pb
        self._health, self.loop_lag = built.health, built.loop_lag
        self.draining = False
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self._sessions: OrderedSet[AgentSession] = OrderedSet()
        self._sweeper: asyncio.Task[None] | None = None
        self._stopped: asyncio.Event | None = None
        self.export_refusals: Counter[str] = Counter()  # whole Export requests, by status
        self.metrics_settings = metrics if metrics is not None else self.config.guard.metrics
        self.metrics: Any = None  # a _metrics.GuardMetrics while running, when enabled

    @property
    def address(self) -> str:
        host = self.listen.rsplit(":", 1)[0] if ":" in self.listen else self.listen
        return f"{host}:{self.port}"

    # -- sessions (called by the control servicer) ----------------------------------------
    def attach_session(self, session: AgentSession) -> None:
        self._sessions.add(session)
        if self.draining:
            session.error = GuardUnavailable("guard is draining; reconnect to another guard")
            session.close()

    def detach_session(self, session: AgentSession) -> None:
        self._sessions.discard(session)

    def figures(self) -> dict[str, float]:
        """``GuardAdmin.Stats``: event-loop lag (ms) and the registry's counters."""
        registry = self.registry
        out = self.loop_lag.figures()
        out.update({k: float(v) for k, v in registry.stats.items()})
        out["runs_tracked"] = float(len(registry.runs))
        out["runs_detached"] = float(len(registry.detached))
        out["runs_span_only"] = float(len(registry.span_only))
        out["sessions"] = float(len(self._sessions))
        out.update(self.intake.figures())
        out.update(skew_figures(registry.sessions))  # the attached agents' clocks
        counters = getattr(self.sink, "counters", None)
        if callable(counters):  # the store's disk condition (a full disk refuses acks)
            c = counters()
            out["store_disk_full"] = float(c.get("disk_full", 0))
            out["store_records_held"] = float(c.get("held", 0))
            out["store_records_refused"] = float(c.get("refused", 0))
        out["records_unwritten"] = float(len(registry.lifecycle.unwritten))
        out["tenants_known"] = float(len(registry.budgets.known()))
        # which native paths run (native_policy, _decode, _applier, _rows; 1: native, 0: the
        # pure-Python reference) and native_missing, how many do not (guard.native_paths())
        out.update(native_figures())
        state = getattr(registry, "state", None)  # a replica's Redis connection (--redis)
        if state is not None:
            out.update({f"redis_{k}": float(v) for k, v in state.stats.items()})
        return out

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> GuardServer:
        options = [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            ("grpc.so_reuseport", 0),
            # Exports in flight per connection: a flooding client waits for answers instead
            # of queueing without end (an agent's control stream is one stream)
            ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        ]
        server = grpc.aio.server(options=options)
        names = register_services(server, self, self._health)
        if self.tls is not None:
            creds = _server_credentials(self.tls)
            port = server.add_secure_port(self.listen, creds)
        else:
            port = server.add_insecure_port(self.listen)
        if not port:
            raise GuardUnavailable(f"could not bind {self.listen}")
        self.port = port
        if self.metrics_settings.enabled:  # before serving: a bad metrics address stops here
            self.metrics = guard_metrics(self, self.metrics_settings)
        self.registry.metrics = self.metrics  # the shared state reports through it
        await self.registry.parts.start()  # shared state first: admissions need it
        self.intake.start()
        if self.http_listen:  # after the parts (it ingests at once), before reporting ready
            self.http = http_receiver(self, self.http_listen, self.max_message_bytes, self.tls)
            await self.http.start(grace_s=self.drain_s / 2)
        await server.start()
        self._server = server
        self._stopped = asyncio.Event()
        for name in ("", *names[:3]):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        # NOT_SERVING while records cannot be made durable (disk full): see Readiness
        self.readiness = Readiness(self._health, ("", names[1]))
        self._sweeper = asyncio.ensure_future(self._sweep_forever())
        self.loop_lag.start()
        log.info("otel-guard %s listening on %s", self.guard_id, self.address)
        if self.http is not None:
            log.info("otel-guard OTLP/HTTP on %s%s", self.http.address, "/v1/traces")
        return self

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            try:
                while self.registry.sweep(limit=SWEEP_BATCH):  # a mass agent_lost, in slices
                    await asyncio.sleep(0)
                await self.readiness.update(self.registry.lifecycle, self.draining)
            except Exception:
                log.exception("sweep failed")

    async def stop(self, drain_s: float | None = None) -> None:
        """Drain and stop, bounded by ``drain_s`` seconds (see the module docstring)."""
        if self._server is None or self.draining:
            if self._stopped is not None:
                await self._stopped.wait()
            return
        budget = self.drain_s if drain_s is None else float(drain_s)
        deadline = time.monotonic() + budget
        self.draining = True
        await self._health.enter_graceful_shutdown()
        for session in list(self._sessions):
            session.error = GuardUnavailable("guard is draining; reconnect to another guard")
            session.close()
        if self.http is not None:  # both transports drain their in-flight Exports at once
            await asyncio.gather(self._server.stop(grace=budget / 2), self.http.stop(budget / 2))
        else:
            await self._server.stop(grace=budget / 2)
        await self.intake.stop()  # after the receivers drained: what is left gets UNAVAILABLE
        if self._sweeper is not None:
            self._sweeper.cancel()
        self.loop_lag.stop()
        for session in list(self.registry.sessions):
            session.expire(session.clock(), all_pending=True)
        flush = getattr(self.sink, "flush", None)
        left = max(0.1, deadline - time.monotonic())
        if flush is not None:
            try:
                await asyncio.wait_for(asyncio.to_thread(flush, left), timeout=left)
            except Exception:
                log.warning("store flush did not finish within %.1fs", left)
        try:
            await asyncio.wait_for(
                self.registry.parts.close(), max(0.1, deadline - time.monotonic())
            )
        except Exception:
            log.warning("shared state did not close cleanly", exc_info=True)
        if self.metrics is not None:  # after the flush: the last export has the final counts
            left = max(0.1, deadline - time.monotonic())
            await asyncio.to_thread(self.metrics.shutdown, left)
        assert self._stopped is not None
        self._stopped.set()

    async def wait(self) -> None:
        """Until :meth:`stop` has finished."""
        if self._stopped is not None:
            await self._stopped.wait()

    async def __aenter__(self) -> GuardServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(drain_s=min(self.drain_s, 2.0))


def _server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    def read(path: str) -> bytes:
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc}", path="tls") from None

    ca = read(tls.client_ca) if tls.client_ca else None
    return grpc.ssl_server_credentials(
        [(read(tls.key), read(tls.cert))], root_certificates=ca, require_client_auth=ca is not None
    )


class ServerThread:
    """Run a :class:`GuardServer` on its own event loop in a background thread.

    ``with ServerThread(config, sink=...) as srv: srv.port``; ``srv.call(fn)`` runs ``fn()``
    on the server's loop (the registry is not thread-safe) and returns its result.
    """

    def __init__(self, config: PolicyConfig | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("listen", "127.0.0.1:0")
        self._config = config
        self._kwargs = kwargs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="otel-guard-server", daemon=True)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.server: GuardServer | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self.server = GuardServer(self._config, **self._kwargs)
            self._loop.run_until_complete(self.server.start())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    def start(self) -> ServerThread:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def call(self, fn: Any, timeout: float = 10.0) -> Any:
        async def _call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(_call(), self._loop).result(timeout)

    def stop(self, drain_s: float = 2.0) -> None:
        if self.server is not None and self._thread.is_alive():
            fut = asyncio.run_coroutine_threadsafe(self.server.stop(drain_s), self._loop)
            try:
                fut.result(drain_s + 5)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(10)
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
