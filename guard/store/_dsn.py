"""Store DSNs: ``chdb://<dir>`` (embedded engine) and ``http(s)://user:pass@host:8123/?database=``.

Both backends are opened through clickhouse-connect, so the rest of the store runs one code
path. We parse ``chdb://`` ourselves: clickhouse-connect reads ``chdb://rel/dir`` as
location ``rel`` plus database ``dir``, which would silently put a relative data dir in the
wrong place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from guard.errors import ConfigError

__all__ = ["DEFAULT_DATABASE", "Dsn", "connect", "parse_dsn"]

DEFAULT_DATABASE = "otel_guard"


@dataclass(frozen=True, slots=True)
class Dsn:
    """A parsed store DSN. ``path`` is set for chdb, ``host``/``port`` for http(s)."""

    scheme: str  # chdb | http | https
    database: str = DEFAULT_DATABASE
    path: Path | None = None
    host: str = ""
    port: int = 0
    username: str = "default"
    password: str = ""
    settings: tuple[tuple[str, str], ...] = ()

    @property
    def embedded(self) -> bool:
        return self.scheme == "chdb"

    def redacted(self) -> str:
        """The DSN without its password, safe for logs and error messages."""
        if self.embedded:
            return f"chdb://{self.path}?database={self.database}"
        return f"{self.scheme}://{self.username}@{self.host}:{self.port}/?database={self.database}"

    def __repr__(self) -> str:  # never leak the password through a repr
        return f"Dsn({self.redacted()!r})"


def parse_dsn(dsn: str | None, *, data_dir: Path) -> Dsn:
    """Parse a store DSN; ``None`` means the embedded default ``chdb://{data_dir}/clickhouse``."""
    if not dsn:
        return Dsn("chdb", path=(Path(data_dir) / "clickhouse").resolve())
    scheme, sep, rest = dsn.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise ConfigError(f"store DSN {dsn!r} has no scheme (chdb://, http://, https://)")
    if scheme == "chdb":
        location, _, query = rest.partition("?")
        params = {k: v[0] for k, v in parse_qs(query).items()}
        database = params.pop("database", DEFAULT_DATABASE)
        if not location or location in ("memory", ":memory:"):
            raise ConfigError("chdb DSN needs a directory: the store must survive restarts")
        return Dsn(
            "chdb",
            database=_check_db(database),
            path=Path(unquote(location)).expanduser().resolve(),
            settings=tuple(sorted(params.items())),
        )
    if scheme not in ("http", "https"):
        raise ConfigError(f"store DSN scheme {scheme!r} not supported (chdb, http, https)")
    url = urlparse(dsn)
    if not url.hostname:
        raise ConfigError(f"store DSN {scheme}://… has no host")
    params = {k: v[0] for k, v in parse_qs(url.query).items()}
    database = params.pop("database", "") or url.path.strip("/") or DEFAULT_DATABASE
    try:
        port = url.port or (8443 if scheme == "https" else 8123)
    except ValueError as ex:
        raise ConfigError(f"store DSN has a bad port: {ex}") from ex
    return Dsn(
        scheme,
        database=_check_db(database),
        host=url.hostname,
        port=port,
        username=unquote(url.username) if url.username else "default",
        password=unquote(url.password) if url.password else "",
        settings=tuple(sorted(params.items())),
    )


def _check_db(name: str) -> str:
    # The database name is interpolated into DDL, so keep it to a plain identifier.
    if not name.replace("_", "").isalnum() or name[0].isdigit():
        raise ConfigError(f"database name {name!r} must be a plain identifier")
    return name


def connect(dsn: Dsn, **settings: Any) -> Any:
    """Open a clickhouse-connect client for ``dsn`` (no default database: SQL is qualified)."""
    import clickhouse_connect

    merged = dict(dsn.settings)
    merged.update(settings)
    if dsn.embedded:
        assert dsn.path is not None
        os.makedirs(dsn.path, exist_ok=True)
        return clickhouse_connect.get_client(
            interface="chdb", path=str(dsn.path), settings=merged or None
        )
    return clickhouse_connect.get_client(
        interface=dsn.scheme,
        host=dsn.host,
        port=dsn.port,
        username=dsn.username,
        password=dsn.password,
        settings=merged or None,
        connect_timeout=3,
        send_receive_timeout=30,
        autogenerate_session_id=False,  # the writer and readers share no session state
    )
