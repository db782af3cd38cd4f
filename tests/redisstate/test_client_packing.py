"""The shared state's connections pack commands in C (hiredis): the same bytes as redis-py's
own Python packer, for every argument the guard sends, and the same errors for the others.

Real parts: redis-py's own connection classes (TCP, TLS, Unix socket, as ``from_url`` picks
them) and a real redis-server for the round trip."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from _hyp import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.exceptions import DataError

from guard.server._redis import StateClient
from guard.server._redis._client import _CPacked

URLS = ("redis://127.0.0.1:1/0", "rediss://127.0.0.1:1/0", "unix:///tmp/no-such.sock")


def _pair(url: str) -> tuple[object, object]:
    """(a connection of the class StateClient uses for ``url``, redis-py's own)."""
    pool = StateClient(url)._redis.connection_pool
    ours = pool.connection_class(**pool.connection_kwargs)
    theirs = aioredis.Redis.from_url(url).connection_pool
    return ours, theirs.connection_class(**theirs.connection_kwargs)


@pytest.mark.parametrize("url", URLS)
def test_every_connection_kind_packs_in_c_and_keeps_its_transport(url):
    ours, theirs = _pair(url)
    assert isinstance(ours, _CPacked) and isinstance(ours, type(theirs))


ARG = st.one_of(
    st.text(),
    st.binary(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
)


@settings(max_examples=examples(300), deadline=None)
@given(name=st.sampled_from(["EVALSHA", "HSET", "CONFIG GET", "PEXPIRE"]), args=st.lists(ARG))
def test_c_packing_gives_redis_pys_bytes(name, args):
    ours, theirs = _pair(URLS[0])
    assert b"".join(ours.pack_command(name, *args)) == b"".join(theirs.pack_command(name, *args))


@pytest.mark.parametrize("bad", [None, True, [1]])
def test_an_argument_redis_py_refuses_is_refused_the_same_way(bad):
    ours, theirs = _pair(URLS[0])
    with pytest.raises(DataError):
        theirs.pack_command("SET", "k", bad)
    with pytest.raises(DataError):
        ours.pack_command("SET", "k", bad)


async def test_a_script_call_packed_in_c_round_trips_through_redis(redis_url):
    c = StateClient(redis_url, socket_timeout_ms=5000)
    try:
        key = "og:{t\u00e9}:probe"
        got = await c.pipeline(
            [
                ("HSET", key, "f\u00e9", "v\u00e9 1.5"),
                ("HGET", key, "f\u00e9"),
                ("PEXPIRE", key, 5000),
            ]
        )
        assert got == [1, "v\u00e9 1.5", 1]
    finally:
        await c.aclose()
