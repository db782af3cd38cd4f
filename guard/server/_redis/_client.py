"""The Redis connection of the shared state: one script, bounded timeouts, one error type.

Every call runs :data:`~guard.server.tenants._redis_lua.TENANT_LUA` by ``EVALSHA``; on ``NOSCRIPT``
(a restarted or failed-over Redis, ``SCRIPT FLUSH``) it is loaded and the call repeated: a
NOSCRIPT reply means the script did not run, so the repeat cannot apply anything twice.
Several calls go out as one pipeline, i.e. one round trip (redis-py's own ``Script`` in a
pipeline would add a ``SCRIPT EXISTS`` round trip to each).

Failure: any error of Redis or of the socket (refused, reset, ``socket_timeout_ms``, OOM,
``LOADING``) raises :class:`guard.errors.StateUnavailable`, and for ``retry_after_s`` after
it every call raises at once without touching the network, so a caller falling back to its
local state is not slowed down by a dead Redis. ``healthy`` says which side it is on.

Commands are packed by hiredis (C), as redis-py does for its sync client only: its asyncio
connections pack in Python, at several µs per argument, which was most of a replica's own
CPU per Export request with Redis-backed budgets (``benchmarks/bench_redis_ingest.py``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError
from redis.retry import Retry

from guard.errors import StateUnavailable
from guard.server.tenants._redis_lua import TENANT_LUA

_c_pack: Callable[..., Any] | None
try:
    from hiredis import pack_command as _c_pack
except ImportError:  # pragma: no cover (redis[hiredis] is a dependency; Python packs then)
    _c_pack = None

__all__ = ["Call", "StateClient"]

Call = tuple[Sequence[str], Sequence[str]]  # (KEYS, ARGV) of one script call


class _CPacked:
    """A redis-py asyncio connection whose commands hiredis packs: the same bytes (a test
    holds them equal); anything hiredis does not take (a command name with a space, an
    argument of another type) goes to redis-py's own packer, with its own errors."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if type(args[0]) is str and " " not in args[0]:
            try:
                return [_c_pack(args)]  # type: ignore[misc]  # only used with hiredis there
            except TypeError:
                pass
        return super().pack_command(*args)  # type: ignore[misc]


def c_packed(pool: Any) -> None:
    """Make the connections ``pool`` opens from now on pack commands in C (when hiredis
    is there; its connection class stays what the URL chose: TCP, TLS or a Unix socket)."""
    base = pool.connection_class
    if _c_pack is not None and not issubclass(base, _CPacked):
        pool.connection_class = type(f"CPacked{base.__name__}", (_CPacked, base), {})


class StateClient:
    """One replica's connection pool to the shared Redis (``redis://`` or ``rediss://``)."""

    def __init__(
        self,
        url: str,
        *,
        socket_timeout_ms: float = 100.0,
        retry_after_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self._redis = aioredis.Redis.from_url(
            url,
            socket_timeout=socket_timeout_ms / 1000.0,
            socket_connect_timeout=socket_timeout_ms / 1000.0,
            retry=Retry(NoBackoff(), 0),  # no hidden retries: the caller falls back instead
            health_check_interval=0,
            decode_responses=True,
        )
        c_packed(self._redis.connection_pool)
        self.sha = hashlib.sha1(TENANT_LUA.encode()).hexdigest()
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._down_until = 0.0
        self.last_error: str | None = None
        self.stats = {"round_trips": 0, "calls": 0, "errors": 0, "noscript": 0, "fast_fail": 0}

    @property
    def healthy(self) -> bool:
        """False from a failed call until a call succeeds again."""
        return self.last_error is None

    def _check(self) -> None:
        if self.last_error is not None and self._clock() < self._down_until:
            self.stats["fast_fail"] += 1
            raise StateUnavailable(f"redis {self._where()} unavailable: {self.last_error}")

    def _where(self) -> str:
        return self.url.rsplit("@", 1)[-1]  # never the password

    def _failed(self, exc: BaseException) -> StateUnavailable:
        self.stats["errors"] += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:200]
        self._down_until = self._clock() + self.retry_after_s
        return StateUnavailable(f"redis {self._where()} unavailable: {self.last_error}")

    async def call(self, keys: Sequence[str], args: Sequence[str]) -> Any:
        """One script call, one round trip (two after a NOSCRIPT)."""
        return (await self.call_many([(keys, args)]))[0]

    async def call_many(self, calls: Sequence[Call]) -> list[Any]:
        """Several script calls in one round trip (each atomic on its own, in order)."""
        self._check()
        self.stats["calls"] += len(calls)
        try:
            out = await self._pipeline(calls)
            missing = [i for i, r in enumerate(out) if isinstance(r, NoScriptError)]
            if missing:
                self.stats["noscript"] += 1
                self.stats["round_trips"] += 1
                await self._redis.script_load(TENANT_LUA)
                again = await self._pipeline([calls[i] for i in missing])
                for i, r in zip(missing, again, strict=True):
                    out[i] = r
            for r in out:
                if isinstance(r, Exception):
                    raise r
        except (RedisError, OSError, TimeoutError) as exc:
            raise self._failed(exc) from exc
        self.last_error = None
        return out

    async def _pipeline(self, calls: Sequence[Call]) -> list[Any]:
        self.stats["round_trips"] += 1
        pipe = self._redis.pipeline(transaction=False)
        for keys, args in calls:
            pipe.evalsha(self.sha, len(keys), *keys, *args)
        return list(await pipe.execute(raise_on_error=False))

    async def ping(self) -> bool:
        """Probe (ignores the fast-fail pause): True and healthy again when Redis answers."""
        try:
            await self._redis.ping()
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(exc)
            return False
        self.last_error = None
        return True

    async def command(self, *args: Any) -> Any:
        """A plain command (benchmarks and tests: ``MEMORY USAGE``, ``INFO``...)."""
        self._check()
        try:
            return await self._redis.execute_command(*args)
        except (RedisError, OSError, TimeoutError) as exc:
            raise self._failed(exc) from exc

    async def pipeline(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Plain commands (the run directory, the directive bus) in one round trip, in order,
        with the same bounded timeout and fast fail as the script calls."""
        self._check()
        self.stats["round_trips"] += 1
        try:
            pipe = self._redis.pipeline(transaction=False)
            for args in commands:
                pipe.execute_command(*args)
            out = list(await pipe.execute(raise_on_error=True))
        except (RedisError, OSError, TimeoutError) as exc:
            raise self._failed(exc) from exc
        self.last_error = None
        return out

    def blocking(self, block_ms: float) -> StateClient:
        """A client of its own (own connection) for blocking reads such as ``XREAD BLOCK``:
        its socket timeout covers ``block_ms``, so a blocked read never stalls this one's
        short-timeout calls, and a dead Redis still fails within a bounded time."""
        return StateClient(
            self.url,
            socket_timeout_ms=block_ms + 1000.0,
            retry_after_s=self.retry_after_s,
            clock=self._clock,
        )

    async def aclose(self) -> None:
        await self._redis.aclose()
