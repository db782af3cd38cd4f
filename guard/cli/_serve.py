"""`otel-guard serve`: run the guard service (OTLP, GuardControl, GuardAdmin, health) on one port.

The policy file (``--config guard.yaml``) is loaded with PyYAML and validated by
``PolicyConfig.from_dict``. Records go to the embedded ClickHouse under ``--data-dir`` unless
``--clickhouse DSN`` is given; ``--no-store`` runs without one. ``--redis URL`` (or
``OTEL_GUARD_REDIS_URL``) makes the guard one replica of several. SIGTERM/SIGINT drain within
``--drain-s`` seconds (default 10; the Helm chart's terminationGracePeriodSeconds is 15).

The guard's own metrics are off unless ``--metrics-listen`` (a Prometheus scrape endpoint)
or ``--metrics-otlp`` (OTLP export, e.g. to a collector) is given, or the policy file's
``guard.metrics`` section sets them; the flags override the file key by key. ``--guard-id``
(or ``OTEL_GUARD_ID``) names the replica in its records and on every metric series.
``--http-listen`` adds the OTLP/HTTP receiver (``POST /v1/traces``, see ``guard.server.otlp._http``).
``OTEL_GUARD_PURE_PYTHON=1`` runs the pure-Python reference paths instead of the native ones
(the span decoder, fingerprints, loop detection): what an install without a C compiler gets.
Either way, a WARNING at start names the native paths that are not running
(:func:`guard.native_paths`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

__all__ = [
    "DEFAULT_HTTP_LISTEN",
    "add_arguments",
    "http_listen",
    "load_config",
    "metrics_settings",
    "run",
]

DEFAULT_HTTP_LISTEN = "127.0.0.1:4318"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen", default="127.0.0.1:4317", help="HOST:PORT to bind (default 127.0.0.1:4317)"
    )
    parser.add_argument(
        "--http-listen",
        default=None,
        metavar="HOST:PORT",
        help="OTLP/HTTP receiver, POST /v1/traces (protobuf or JSON, gzip); 'none' turns it "
        "off. Default 127.0.0.1:4318 when --listen uses the standard port 4317, else an "
        "ephemeral port on 127.0.0.1 (so a second guard on one host does not collide), "
        "printed at start and in --json as http_address",
    )
    parser.add_argument("--config", default=None, help="policy file (YAML)")
    _env_option(
        parser,
        "--clickhouse",
        "OTEL_GUARD_CLICKHOUSE_DSN",
        "store DSN, e.g. http://user:pass@host:8123/ (env OTEL_GUARD_CLICKHOUSE_DSN, "
        "which keeps a password off the command line)",
    )
    parser.add_argument(
        "--data-dir", default="./.otel-guard", help="embedded store and spool directory"
    )
    parser.add_argument("--no-store", action="store_true", help="keep no records (NullSink)")
    parser.add_argument(
        "--insecure-bind-any",
        action="store_true",
        help="allow a non-loopback --listen without an auth section (development only)",
    )
    parser.add_argument("--tls-cert", default=None, help="PEM server certificate")
    parser.add_argument("--tls-key", default=None, help="PEM server private key")
    parser.add_argument("--tls-client-ca", default=None, help="PEM CA; require client certs")
    parser.add_argument(
        "--drain-s", type=float, default=10.0, help="graceful drain bound on SIGTERM (seconds)"
    )
    _env_option(
        parser,
        "--guard-id",
        "OTEL_GUARD_ID",
        "this replica's id in records and metrics (env OTEL_GUARD_ID; default: "
        "hostname plus a random suffix)",
    )
    _env_option(
        parser,
        "--redis",
        "OTEL_GUARD_REDIS_URL",
        "redis://HOST:PORT/DB or rediss://…: this guard is one replica of several that "
        "share tenant budgets, the run directory and directives through Redis (env "
        "OTEL_GUARD_REDIS_URL; default: one process, state in memory)",
        metavar="URL",
    )
    parser.add_argument(
        "--record-claim-ttl-s",
        type=float,
        default=None,
        help="with --redis: how long a replica's claim of a run record lasts, so another "
        "replica drops a re-sent copy (default 3600)",
    )
    parser.add_argument(
        "--metrics-listen",
        default=None,
        help="HOST:PORT of a Prometheus scrape endpoint for the guard's own metrics "
        "(guard.metrics.listen; default off; 127.0.0.1:9464 is the usual port)",
    )
    parser.add_argument(
        "--metrics-otlp",
        default=None,
        help="export the guard's metrics over OTLP/gRPC to this endpoint, http:// (plaintext) "
        "or https:// (guard.metrics.otlp_endpoint; default off)",
    )
    parser.add_argument(
        "--metrics-interval-s",
        type=float,
        default=None,
        help="OTLP metrics export interval (guard.metrics.otlp_interval_s; default 15)",
    )
    parser.add_argument(
        "--metrics-top-tenants",
        type=int,
        default=None,
        help="live runs are labelled by tenant for this many tenants, the rest as (other) "
        "(guard.metrics.top_tenants; default 20)",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    parser.add_argument("--json", action="store_true", help="print the bound address as JSON")


def _env_option(parser: argparse.ArgumentParser, flag: str, env: str, help: str, **kw: Any) -> None:
    """A flag whose default is the environment variable ``env`` (set but empty: no default),
    so a secret such as a DSN's password can stay off the command line."""
    parser.add_argument(flag, default=os.environ.get(env) or None, help=help, **kw)


def http_listen(args: argparse.Namespace) -> str | None:
    """``--http-listen``, resolved: ``None`` when turned off (see the flag's help)."""
    value = args.http_listen
    if value is None:
        return DEFAULT_HTTP_LISTEN if args.listen.endswith(":4317") else "127.0.0.1:0"
    return None if value.strip().lower() == "none" else value.strip()


def load_config(path: str | None) -> Any:
    """Read and validate a policy file (``None`` -> built-in defaults)."""
    from guard.errors import ConfigError
    from guard.policy import PolicyConfig

    if path is None:
        return PolicyConfig.from_dict(None)
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read policy file: {exc}", path=path) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", path=path) from None
    return PolicyConfig.from_dict(data)


def metrics_settings(args: argparse.Namespace, config: Any) -> Any:
    """The policy file's ``guard.metrics`` with the ``--metrics-*`` flags laid over it, validated
    as one settings object (a bad flag is a ConfigError naming the key)."""
    from dataclasses import asdict

    from guard.policy import parse_metrics

    merged = asdict(config.guard.metrics)
    for key, flag in (
        ("listen", args.metrics_listen),
        ("otlp_endpoint", args.metrics_otlp),
        ("otlp_interval_s", args.metrics_interval_s),
        ("top_tenants", args.metrics_top_tenants),
    ):
        if flag is not None:
            merged[key] = flag
    return parse_metrics(merged, "guard.metrics")


def _open_sink(args: argparse.Namespace, config: Any) -> Any:
    if args.no_store:
        return None
    try:
        from guard.store import open_store
    except ImportError:
        print("otel-guard: guard.store unavailable; running without a store", file=sys.stderr)
        return None
    from pathlib import Path

    retention = getattr(getattr(config, "store", None), "retention_days", 90)
    claims: dict[str, Any] = {}
    if args.redis:  # one replica of several: claim each run record fleet-wide
        from guard.server._app import check_redis_url

        claims = {"redis_url": check_redis_url(args.redis), "guard_id": args.guard_id}
        if args.record_claim_ttl_s is not None:
            claims["claim_ttl_s"] = args.record_claim_ttl_s
    elif args.record_claim_ttl_s is not None:
        from guard.errors import ConfigError

        raise ConfigError("--record-claim-ttl-s needs --redis", path="record_claim_ttl_s")
    return open_store(
        args.clickhouse, data_dir=Path(args.data_dir), retention_days=retention, **claims
    )


async def _serve(args: argparse.Namespace, config: Any, sink: Any) -> None:
    import asyncio
    import signal

    from guard.server import GuardServer, TlsFiles

    tls = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            from guard.errors import ConfigError

            raise ConfigError("--tls-cert and --tls-key go together", path="tls")
        tls = TlsFiles(cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_client_ca)
    server = GuardServer(
        config,
        listen=args.listen,
        sink=sink,
        tls=tls,
        insecure_bind_any=args.insecure_bind_any,
        drain_s=args.drain_s,
        guard_id=args.guard_id,
        metrics=metrics_settings(args, config),
        redis_url=args.redis,
        http_listen=http_listen(args),
    )
    await server.start()
    from guard.server.runtime._gc import bound_gc_pauses

    bound_gc_pauses()  # full collections would otherwise hold the loop for 100 ms
    metrics = server.metrics.address if server.metrics is not None else None
    http = server.http.address if server.http is not None else None
    if args.json:
        shown = {"address": server.address, "guard_id": server.guard_id}
        print(json.dumps({**shown, "http_address": http, "metrics_address": metrics}), flush=True)
    else:
        print(f"otel-guard listening on {server.address} (guard_id {server.guard_id})", flush=True)
        if http is not None:
            scheme = "https" if tls is not None else "http"
            print(f"otel-guard OTLP/HTTP on {scheme}://{http}/v1/traces", flush=True)
        if metrics is not None:
            print(f"otel-guard metrics on http://{metrics}/metrics", flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print(f"otel-guard draining (at most {args.drain_s:g}s)", file=sys.stderr, flush=True)
    await server.stop()


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from guard.errors import GuardError

    if os.environ.get("OTEL_GUARD_PURE_PYTHON", "") == "1":
        from guard.policy import use_native
        from guard.server.decode import _nativedecode
        from guard.store import _rows

        use_native(False)
        _nativedecode.set_enabled(False)
        _rows.use_native(False)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from guard._native import warn_pure_paths

    warn_pure_paths()  # once: a pure-Python path costs ingest speed, and nothing else says so
    try:
        config = load_config(args.config)
        sink = _open_sink(args, config)
    except GuardError as exc:
        print(f"otel-guard serve: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(args, config, sink))
    except GuardError as exc:
        print(f"otel-guard serve: {exc}", file=sys.stderr)
        return 2
    finally:
        close = getattr(sink, "close", None)
        if close is not None:
            close(timeout_s=2.0)  # already flushed inside the drain; this only closes
    return 0
