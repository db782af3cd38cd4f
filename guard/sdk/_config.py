"""SDK settings: one validated object, built from arguments > environment > defaults."""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass, field, fields, replace
from typing import Any

from guard.errors import ConfigError
from guard.sdk._clock import is_clock
from guard.sdk._targets import parse_endpoints, strip_scheme

__all__ = ["ENV", "SPAN_EXPORT_MODES", "Settings", "get_settings", "make_settings", "swap_settings"]

# Environment variables read by configure() (argument > environment > default).
ENV = {
    "endpoint": "OTEL_GUARD_ENDPOINT",
    "token": "OTEL_GUARD_TOKEN",
    "tenant": "OTEL_GUARD_TENANT",
    "hmac_key": "OTEL_GUARD_HMAC_KEY",
    "disabled": "OTEL_GUARD_DISABLED",
    "span_export": "OTEL_GUARD_SPAN_EXPORT",
    "span_endpoint": "OTEL_GUARD_SPAN_ENDPOINT",
    "tls": "OTEL_GUARD_TLS",
    "tls_ca_file": "OTEL_GUARD_TLS_CA_FILE",
    "tls_cert_file": "OTEL_GUARD_TLS_CERT_FILE",
    "tls_key_file": "OTEL_GUARD_TLS_KEY_FILE",
    "shutdown_ack_timeout_s": "OTEL_GUARD_SHUTDOWN_ACK_TIMEOUT_S",
}
_NUMBERS_FROM_ENV = ("shutdown_ack_timeout_s",)
_TLS_FILES = ("tls_ca_file", "tls_cert_file", "tls_key_file")
SPAN_EXPORT_MODES = ("direct", "none")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True, slots=True)
class Settings:
    """Process-wide SDK settings. ``endpoint=None`` is local-only mode (limits still enforced).

    Fields:
      endpoint: guard address ``host:port``, or several, comma-separated
        (``"g1:4317,g2:4317"``; a list works too); a name may have several addresses. The
        control stream fails over between them (``_targets``), re-registering its live runs
        with their counters on the guard it reaches. ``http://`` / ``https://`` prefixes are
        accepted (one kind for all entries); ``https``, ``tls=True`` or any ``tls_*_file``
        selects TLS, the same for every guard.
      tls_ca_file: PEM bundle of the CA(s) that verify the guard's certificate, for a guard
        with a private CA (default: the system roots).
      tls_cert_file / tls_key_file: PEM client certificate and key, for a guard that requires
        client certificates (``otel-guard serve --tls-client-ca``). Both or neither. The files
        apply to the control stream and the SDK's own span export alike. The control stream
        reads them again at every reconnect (rotated certificates take effect there); the
        span exporter reads them when ``configure()`` builds it.
      token: bearer token for the guard (tenant-bound). Never exported on spans.
      tenant: default tenant of runs that do not name one.
      hmac_key: key of the argument/result fingerprints; ``None`` = random per process.
      disabled: turn everything off (decorators become pass-through).
      fail_closed: default for ``@guard.run(fail_closed=...)``: refuse to start a run when
        the guard does not admit it within ``admit_timeout_ms``.
      admit_timeout_ms: how long a run start waits for the guard's admit/deny.
      heartbeat_interval_ms: control-stream heartbeat (the guard's Welcome may override).
      export_max_delay_ms / export_max_batch / export_queue_size: the low-latency span export
        to the guard (spans are sent as soon as they end, batched only by what is queued).
      export_timeout_s: per-export OTLP deadline (a down guard must not stall the exporter).
      kill_grace_s: SIGTERM -> SIGKILL grace for tracked process groups.
      tracer_provider: an explicit OpenTelemetry SDK TracerProvider; default: the global one
        when it is an SDK provider; else, with a guard configured, an SDK provider installed
        globally when the first run starts (so third-party instrumentations' spans reach the
        guard; guard.sdk._providers); else (local-only) a private provider.
      price_book: a ``guard.policy.PriceBook`` overriding the built-in prices.
      clock: the monotonic clock of run deadlines and pauses (``guard.sdk._clock.Clock``);
        default the system clock. Tests pass a ``ManualClock`` to move time by hand.
      reconnect_min_s / reconnect_max_s: jittered exponential backoff of the control stream,
        applied once every guard of ``endpoint`` failed in one cycle (the next guard of a
        cycle is tried at once); the cap is 1 s so a restarted guard sees its agents back
        within about a second.
      shutdown_ack_timeout_s: how long ``guard.shutdown()`` (and interpreter exit) waits for
        the guard to acknowledge every termination record, reconnecting and resending
        meanwhile; the run ids still unacknowledged then are named in one warning line.
        ``0`` does not wait.
      span_export: how the guard gets the spans. ``"direct"`` (default): the SDK attaches its
        own low-latency OTLP exporter (to ``span_endpoint``, else ``endpoint``). ``"none"``:
        the application's own OpenTelemetry pipeline (e.g. a collector) already delivers the
        guarded runs' spans to the guard; the SDK exports nothing itself, so nothing is sent
        twice, and the control stream still goes straight to ``endpoint``.
      span_endpoint: ``host:port`` for the direct span export when it is not the guard
        itself, e.g. a local collector that load-balances by trace ID to guard replicas.
        Several, comma-separated: the export starts at a per-process random one and moves
        to the next when an export fails. Unset (default), the spans go to the guard that
        holds the control stream and move with it when it fails over. TLS as for
        ``endpoint`` (``https://`` or ``tls=True``); the bearer token goes with the spans too
        (a collector can forward it). Given without an ``endpoint``, spans are exported and
        runs stay under local control only.
    """

    endpoint: str | None = None
    token: str | None = field(default=None, repr=False)  # secrets stay out of logs
    tenant: str = "default"
    hmac_key: bytes | None = field(default=None, repr=False)
    disabled: bool = False
    tls: bool = False
    fail_closed: bool = False
    admit_timeout_ms: float = 200.0
    heartbeat_interval_ms: float = 1000.0
    export_max_delay_ms: float = 1.0
    export_max_batch: int = 512
    export_queue_size: int = 4096
    export_timeout_s: float = 2.0
    kill_grace_s: float = 2.0
    tracer_provider: Any = field(default=None, repr=False)
    price_book: Any = field(default=None, repr=False)
    clock: Any = field(default=None, repr=False)
    reconnect_min_s: float = 0.1
    reconnect_max_s: float = 1.0
    shutdown_ack_timeout_s: float = 5.0
    span_export: str = "direct"
    span_endpoint: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    @property
    def local_only(self) -> bool:
        return self.endpoint is None

    @property
    def targets(self) -> tuple[str, ...]:
        """Every guard of ``endpoint`` without a URL scheme, as grpc wants them."""
        return _targets(self.endpoint)

    @property
    def target(self) -> str | None:
        """The first guard of ``endpoint`` without a URL scheme."""
        return next(iter(self.targets), None)

    @property
    def tls_files(self) -> bool:
        """Whether any TLS file is configured (which implies TLS)."""
        return any(getattr(self, name) is not None for name in _TLS_FILES)

    @property
    def secure(self) -> bool:
        return (
            self.tls
            or self.tls_files
            or bool(self.endpoint and self.endpoint.startswith("https://"))
        )  # parse_endpoints: every entry has the first one's scheme, or none

    @property
    def span_targets(self) -> tuple[str, ...]:
        """Where the SDK's own span export goes (empty: no span export of its own)."""
        if self.span_export != "direct":
            return ()
        return _targets(self.span_endpoint or self.endpoint)

    @property
    def span_target(self) -> str | None:
        """The first of :attr:`span_targets` (``None``: no span export of its own)."""
        return next(iter(self.span_targets), None)

    @property
    def spans_follow_control(self) -> bool:
        """Spans go to whichever guard holds the control stream (no ``span_endpoint``)."""
        return self.span_endpoint is None and self.endpoint is not None

    @property
    def span_secure(self) -> bool:
        ep = self.span_endpoint or self.endpoint
        return self.tls or self.tls_files or bool(ep and ep.startswith("https://"))


def _targets(endpoint: str | None) -> tuple[str, ...]:
    if endpoint is None:
        return ()
    return tuple(strip_scheme(e) for e in endpoint.split(","))


_NAMES = {f.name for f in fields(Settings)}


def _bool(path: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(f"expected a boolean (1/0/true/false), got {value!r}", path=path)


def _pem_file(path: str, value: Any) -> str | None:
    """A readable PEM file's path, checked now so a typo fails at configure(), not later in
    a background reconnect loop."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str | os.PathLike):
        raise ConfigError(f"expected a file path, got {value!r}", path=path)
    name = os.fspath(value)
    try:
        with open(name, "rb") as f:
            head = f.read(1 << 16)
    except OSError as exc:
        raise ConfigError(f"cannot read {name!r}: {exc.strerror or exc}", path=path) from None
    if b"-----BEGIN " not in head:
        raise ConfigError(f"{name!r} is not a PEM file (no -----BEGIN line)", path=path)
    return name


def _validate(s: Settings) -> Settings:
    kw: dict[str, Any] = {}
    kw["endpoint"] = parse_endpoints("endpoint", s.endpoint)
    kw["span_endpoint"] = parse_endpoints("span_endpoint", s.span_endpoint)
    mode = s.span_export.strip().lower() if isinstance(s.span_export, str) else s.span_export
    if mode not in SPAN_EXPORT_MODES:
        raise ConfigError(
            f"expected one of {', '.join(SPAN_EXPORT_MODES)}, got {s.span_export!r}",
            path="span_export",
        )
    kw["span_export"] = mode
    if mode == "none" and kw["span_endpoint"] is not None:
        raise ConfigError(
            f"span_endpoint {kw['span_endpoint']!r} is set but span_export is 'none'",
            path="span_endpoint",
        )
    if s.token is not None and not isinstance(s.token, str):
        raise ConfigError("expected a string", path="token")
    if not isinstance(s.tenant, str) or not s.tenant.strip():
        raise ConfigError(f"expected a non-empty string, got {s.tenant!r}", path="tenant")
    if s.hmac_key is not None:
        key = s.hmac_key.encode() if isinstance(s.hmac_key, str) else s.hmac_key
        if not isinstance(key, bytes | bytearray) or len(key) < 8:
            raise ConfigError("hmac_key must be at least 8 bytes", path="hmac_key")
        kw["hmac_key"] = bytes(key)
    for name in ("disabled", "tls", "fail_closed"):
        kw[name] = _bool(name, getattr(s, name))
    for name in _TLS_FILES:
        kw[name] = _pem_file(name, getattr(s, name))
    if (kw["tls_cert_file"] is None) != (kw["tls_key_file"] is None):
        raise ConfigError(
            "tls_cert_file and tls_key_file go together (a client certificate needs its key)",
            path="tls_cert_file" if kw["tls_cert_file"] is None else "tls_key_file",
        )
    for name in _NUMBERS_FROM_ENV:
        v = getattr(s, name)
        if isinstance(v, str):
            try:
                kw[name] = float(v)
            except ValueError:
                raise ConfigError(f"expected a number of seconds, got {v!r}", path=name) from None
    for name in (
        "shutdown_ack_timeout_s",
        "admit_timeout_ms",
        "heartbeat_interval_ms",
        "export_max_delay_ms",
        "export_timeout_s",
        "kill_grace_s",
        "reconnect_min_s",
        "reconnect_max_s",
    ):
        v = kw.get(name, getattr(s, name))
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"expected a finite number >= 0, got {v!r}", path=name)
    for name in ("export_max_batch", "export_queue_size"):
        v = getattr(s, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"expected an int >= 1, got {v!r}", path=name)
    if s.clock is not None and not is_clock(s.clock):
        raise ConfigError(
            f"expected a clock with monotonic() and schedule(delay_s, fn), got {s.clock!r}",
            path="clock",
        )
    if s.reconnect_max_s < s.reconnect_min_s:
        raise ConfigError(
            f"reconnect_max_s {s.reconnect_max_s} < reconnect_min_s {s.reconnect_min_s}",
            path="reconnect_max_s",
        )
    return replace(s, **kw)


def _from_env(environ: dict[str, str] | os._Environ[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, var in ENV.items():
        if var in environ:
            out[name] = environ[var]
    for name in ("endpoint", "span_endpoint"):
        if name in out and not out[name].strip():
            out[name] = None
    return out


_lock = threading.Lock()
_settings: Settings | None = None


def make_settings(**kwargs: Any) -> Settings:
    """Validated settings: arguments over ``OTEL_GUARD_*`` environment variables over defaults.

    Unknown keys raise :class:`guard.errors.ConfigError`. Installs nothing (``configure`` does).
    """
    unknown = sorted(set(kwargs) - _NAMES)
    if unknown:
        raise ConfigError(
            f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(_NAMES))}",
            path=unknown[0],
        )
    merged: dict[str, Any] = _from_env(os.environ)
    merged.update({k: v for k, v in kwargs.items()})
    if "disabled" in merged and "disabled" not in kwargs:
        merged["disabled"] = _bool(ENV["disabled"], merged["disabled"])
    return _validate(Settings(**merged))


def swap_settings(settings: Settings | None) -> Settings | None:
    """Install ``settings`` process-wide (``None``: read the environment again on next use);
    returns the previous ones. The runtime built from them is ``guard.sdk._api``'s concern."""
    global _settings
    with _lock:
        old, _settings = _settings, settings
    return old


def get_settings() -> Settings:
    """The current settings; the first call without ``configure`` reads the environment."""
    global _settings
    s = _settings
    if s is not None:
        return s
    with _lock:
        if _settings is None:
            _settings = _validate(Settings(**_from_env(os.environ)))
        return _settings
