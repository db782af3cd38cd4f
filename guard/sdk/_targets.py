"""Where the SDK connects: the list of guards in ``endpoint``, resolved and ordered.

``endpoint`` names one guard or several (``"g1:4317,g2:4317"``); any of them may be a DNS name
with several addresses. The control stream tries them in a per-process random order (so a
fleet spreads over the guards, and the agents of a dead guard spread over the others) and
fails over to the next one when a connect fails or a stream drops. Names are resolved by the
SDK itself at the start of every cycle (``getaddrinfo``), each address becoming a target of
its own: a dead address is then skipped like a dead guard, and the span export can follow the
control stream to exactly the address it holds (:class:`Route`). A name that does not
resolve is kept as is, for grpc's own resolver to try.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

from guard.errors import ConfigError

__all__ = ["SCHEMES", "Address", "Route", "TargetRing", "parse_endpoints", "strip_scheme"]

SCHEMES = ("http://", "https://", "grpc://")
_RESOLVE_TIMEOUT_S = 2.0  # a hung resolver must not hold the failover


def strip_scheme(entry: str) -> str:
    """``https://g1:4317/`` -> ``g1:4317`` (what grpc dials)."""
    for scheme in SCHEMES:
        if entry.startswith(scheme):
            entry = entry[len(scheme) :]
            break
    return entry.rstrip("/")


def split_host_port(target: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); ValueError naming what is wrong."""
    if target.startswith("["):
        host, sep, port = target[1:].partition("]:")
        if not sep:
            raise ValueError("expected [ipv6]:port")
    else:
        host, sep, port = target.rpartition(":")
        if not sep:
            raise ValueError("expected host:port")
    if not host or any(c in host for c in " /,@"):
        raise ValueError(f"bad host {host!r}")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"bad port {port!r} (expected 1-65535)")
    return host, int(port)


def parse_endpoints(path: str, value: Any) -> str | None:
    """Validate ``endpoint`` / ``span_endpoint``: one ``host:port`` or several, comma-separated
    (a list or tuple of strings is accepted too). Returns the entries joined by ``,``, or
    ``None`` for empty. Every entry is checked; an empty entry or a bad port raises
    :class:`ConfigError` naming it. ``http://`` / ``https://`` apply to every entry alike (TLS
    is one setting for all guards), so mixing them is an error."""
    if value is None:
        return None
    if isinstance(value, list | tuple):
        if not all(isinstance(v, str) for v in value):
            raise ConfigError(f"expected host:port strings, got {value!r}", path=path)
        text = ",".join(value)
    elif isinstance(value, str):
        text = value
    else:
        raise ConfigError(f"expected host:port, got {value!r}", path=path)
    if not text.strip():
        return None
    entries = [e.strip() for e in text.split(",")]
    for i, entry in enumerate(entries):
        if not entry:
            raise ConfigError(f"empty entry #{i + 1} in {text.strip()!r}", path=path)
        try:
            split_host_port(strip_scheme(entry))
        except ValueError as exc:
            raise ConfigError(f"entry {entry!r}: {exc}", path=path) from None
    kinds = {e.split("://", 1)[0] for e in entries if e.startswith(("http://", "https://"))}
    if len(kinds) > 1:
        raise ConfigError(
            f"mixes http:// and https:// entries ({text.strip()!r}); TLS is one setting for all",
            path=path,
        )
    return ",".join(entries)


@dataclass(frozen=True, slots=True)
class Address:
    """One place to connect to. ``target`` is what grpc dials (an IP address when the SDK
    resolved a name), ``host`` the configured name (TLS verifies the certificate against
    it), ``entry`` the configured ``host:port``."""

    target: str
    host: str
    entry: str

    @property
    def resolved(self) -> bool:
        return self.target != self.entry

    def channel_options(self) -> list[tuple[str, Any]]:
        """For a resolved address: the name TLS checks and the ``:authority`` stay the
        configured ones, not the IP."""
        if not self.resolved:
            return []
        return [
            ("grpc.ssl_target_name_override", self.host),
            ("grpc.default_authority", self.entry),
        ]


class TargetRing:
    """The configured guards, each name expanded to all its addresses, in this process's
    order: a random permutation chosen once per process, stable across re-resolutions."""

    def __init__(self, endpoint: str, seed: bytes | None = None) -> None:
        self.entries = [strip_scheme(e) for e in endpoint.split(",")]
        self._seed = seed if seed is not None else os.urandom(16)

    def _key(self, a: Address) -> bytes:
        return hashlib.blake2b(a.target.encode(), key=self._seed, digest_size=8).digest()

    async def resolve(self, after: str | None = None) -> list[Address]:
        """Every address, in process order, rotated to start just after ``after`` (the
        address that was used last): the cycle goes on from where it stopped."""
        found: list[Address] = []
        for entry in self.entries:
            found += await _expand(entry)
        unique = {a.target: a for a in reversed(found)}  # one per target, the first entry's
        found = sorted(unique.values(), key=self._key)
        targets = [a.target for a in found]
        if after in targets:
            i = targets.index(after) + 1
            found = found[i:] + found[:i]
        return found


async def _expand(entry: str) -> list[Address]:
    host, port = split_host_port(entry)
    bare = host.strip("[]")
    try:
        ipaddress.ip_address(bare)
        return [Address(entry, bare, entry)]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), _RESOLVE_TIMEOUT_S
        )
    except (TimeoutError, OSError):
        return [Address(entry, host, entry)]  # grpc's resolver may do better
    out: list[Address] = []
    for family, *_, sockaddr in infos:
        ip = sockaddr[0]
        target = f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}"
        a = Address(target, host, entry)
        if a not in out:
            out.append(a)
    return out or [Address(entry, host, entry)]


class Route:
    """Which guard the control stream holds (thread-safe). The span export follows it, so a
    run's spans reach the guard that holds its stream, and move with it on failover."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._addr: Address | None = None
        self._up = False
        self.generation = 0  # +1 per established session

    def trying(self, addr: Address) -> None:
        with self._cond:
            self._addr, self._up = addr, False

    def up(self) -> None:
        with self._cond:
            self._up = True
            self.generation += 1
            self._cond.notify_all()

    def down(self) -> None:
        with self._cond:
            self._up = False

    def state(self) -> tuple[Address | None, bool, int]:
        with self._cond:
            return self._addr, self._up, self.generation

    def wait_newer(self, generation: int, timeout_s: float) -> Address | None:
        """The address of a session established after ``generation``, waiting at most
        ``timeout_s`` for one; ``None`` when none came."""
        with self._cond:
            ok = self._cond.wait_for(
                lambda: self._up and self.generation > generation, max(0.0, timeout_s)
            )
            return self._addr if ok else None
