"""OTLP/HTTP receiver bounds on a real guard, through raw sockets: connection caps, requests
and bytes in flight (decompressed bytes counted), head size, chunked framing (announced
sizes, chunk count) and timeouts; each answered at once with its status."""

from __future__ import annotations

import asyncio
import gzip

import pytest
from _wait import wait_until_async
from google.rpc import status_pb2

from guard.server import GuardServer

from .conftest import Agent, config, model_span, request, trace_id_of

HEAD = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"


@pytest.fixture
async def srv(sink):
    async with GuardServer(
        config(runs={"max_tokens": 1_000_000}),
        listen="127.0.0.1:0",
        sink=sink,
        http_listen="127.0.0.1:0",
        max_message_bytes=1 << 20,
    ) as server:
        yield server


async def connect(srv: GuardServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = srv.http.address.rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response (its body by Content-Length), within a generous timeout."""

    async def read() -> tuple[int, dict[str, str], bytes]:
        status = await reader.readline()
        assert status.startswith(b"HTTP/1."), status
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        return int(status.split()[1]), headers, body

    return await asyncio.wait_for(read(), 10)


async def exchange(srv: GuardServer, data: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await connect(srv)
    try:
        writer.write(data)
        await writer.drain()
        return await read_response(reader)
    finally:
        writer.close()


async def closed(reader: asyncio.StreamReader) -> bool:
    """The server closed the connection (EOF) within a generous timeout."""
    try:
        return await asyncio.wait_for(reader.read(), 10) == b""
    except ConnectionResetError:
        return True


def message(body: bytes) -> str:
    return status_pb2.Status.FromString(body).message


async def running(srv: GuardServer, run_id: str, n: int) -> Agent:
    agent = Agent(srv.address)
    await agent.connect()
    await agent.start_run(run_id, trace_id_of(n))
    return agent


def good(run_id: str, n: int, *, spans: int = 1, tokens_in: int = 5) -> bytes:
    sp = [model_span(run_id, trace_id_of(n), tokens_in=tokens_in, tokens_out=1)] * spans
    return request(*sp).SerializeToString()


def post(body: bytes, *extra: bytes) -> bytes:
    return HEAD + b"".join(extra) + f"Content-Length: {len(body)}\r\n\r\n".encode() + body


def chunked(*chunks: bytes) -> bytes:
    out = [HEAD, b"Transfer-Encoding: chunked\r\n\r\n"]
    out += [f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks]
    return b"".join([*out, b"0\r\n\r\n"])


def usage(srv: GuardServer, run_id: str) -> int:
    return srv.registry.runs[run_id].budget.usage().input_tokens


async def test_connections_per_client_ip_are_capped_with_503(srv):
    srv.http.max_connections_per_ip = 2
    held = [await connect(srv) for _ in range(2)]
    await wait_until_async(lambda: srv.http.connections.total == 2, 10, "two connections")
    reader, writer = await connect(srv)
    code, headers, body = await read_response(reader)  # before it sent anything
    assert code == 503 and headers["retry-after"] == "1" and headers["server"] == "otel-guard"
    assert "connections from 127.0.0.1 at their bound (2)" in message(body)
    assert await closed(reader)
    writer.close()
    # one of the two goes: a new connection is served again
    held[0][1].close()
    await wait_until_async(lambda: srv.http.connections.total == 1, 10, "one given back")
    assert (await exchange(srv, post(good("x", 1))))[0] == 200
    for _, w in held[1:]:
        w.close()
    assert srv.http.connections.refused == 1


async def test_total_connections_are_capped_with_503(srv):
    srv.http.max_connections = 1
    reader0, writer0 = await connect(srv)
    await wait_until_async(lambda: srv.http.connections.total == 1, 10, "one connection")
    reader, writer = await connect(srv)
    code, headers, body = await read_response(reader)
    assert code == 503 and headers["retry-after"] == "1"
    assert "connections at their bound (1)" in message(body)
    writer.close()
    # the admitted one is served as usual
    writer0.write(post(good("x", 1)))
    assert (await read_response(reader0))[0] == 200
    writer0.close()


async def test_requests_in_flight_are_capped_with_429(srv):
    srv.http.max_requests = 1
    _reader, writer = await connect(srv)  # a request whose body is slow: it stays in flight
    writer.write(HEAD + b"Content-Length: 100\r\n\r\nabc")
    await wait_until_async(lambda: srv.http.active == 1, 10, "the slow request in flight")
    code, headers, body = await exchange(srv, post(good("x", 1)))
    assert code == 429 and headers["retry-after"] == "1"
    assert "requests in flight at their bound (1)" in message(body)
    writer.close()
    await wait_until_async(lambda: srv.http.active == 0, 10, "the slow request gone")
    assert (await exchange(srv, post(good("x", 1))))[0] == 200
    assert srv.export_refusals["RESOURCE_EXHAUSTED"] == 1


async def test_decompressed_bytes_count_in_flight(srv):
    agent = await running(srv, "z", 1)
    # a slow body holds 3/4 of the budget
    budget = srv.http.budget.cap
    slow = budget * 3 // 4
    srv.http.max_body_bytes = slow
    _reader, writer = await connect(srv)
    writer.write(HEAD + f"Content-Length: {slow}\r\n\r\n".encode())
    await wait_until_async(lambda: srv.http.budget.held == slow, 10, "the slow body held")
    # a small gzip body inflating to little fits beside it (counted by what it inflates to)
    small = good("z", 1, spans=50)
    gz = b"Content-Encoding: gzip\r\n"
    code, _, _ = await exchange(srv, post(gzip.compress(small), gz))
    assert code == 200 and usage(srv, "z") == 50 * 5
    # one inflating beyond what is left is refused with 429 though it is tiny on the wire
    bomb = gzip.compress(b"\0" * (budget // 2))
    assert len(bomb) < budget // 100
    code, headers, body = await exchange(srv, post(bomb, gz))
    assert code == 429 and headers["retry-after"] == "1" and "in flight" in message(body)
    writer.close()
    await wait_until_async(lambda: srv.http.budget.held == 0, 10, "every byte given back")
    await agent.close()


async def test_gzip_of_two_members_is_inflated_whole(srv):
    agent = await running(srv, "m", 2)
    first = request(*[model_span("m", trace_id_of(2), tokens_in=7, tokens_out=1)] * 3)
    second = request(*[model_span("m", trace_id_of(2), tokens_in=11, tokens_out=1)] * 4)
    # two protobuf messages concatenated are one message with both span lists; each gzipped
    # on its own and the members concatenated, as `cat a.gz b.gz` makes
    body = gzip.compress(first.SerializeToString()) + gzip.compress(second.SerializeToString())
    code, _, _ = await exchange(srv, post(body, b"Content-Encoding: gzip\r\n"))
    assert code == 200
    assert usage(srv, "m") == 3 * 7 + 4 * 11
    assert srv.registry.stats["spans"] == 7
    # a second member that is cut short is refused, not half counted
    body = gzip.compress(first.SerializeToString()) + gzip.compress(b"x" * 100)[:-5]
    code, _, out = await exchange(srv, post(body, b"Content-Encoding: gzip\r\n"))
    assert code == 400 and "truncated" in message(out)
    assert usage(srv, "m") == 3 * 7 + 4 * 11
    await agent.close()


async def test_oversized_heads_get_431(srv):
    big_field = b"X-Big: " + b"a" * 9000 + b"\r\n"
    code, headers, body = await exchange(srv, post(good("x", 1), big_field))
    assert code == 431 and headers["server"] == "otel-guard"
    assert "bad HTTP request" in message(body)
    many = b"".join(f"X-H{i}: v\r\n".encode() for i in range(100))
    code, headers, _ = await exchange(srv, post(good("x", 1), many))
    assert code == 431 and headers["server"] == "otel-guard"


async def test_a_slow_head_is_closed_after_the_idle_timeout(srv):
    srv.http.idle_timeout_s = 0.3  # read per connection
    reader, writer = await connect(srv)
    writer.write(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    assert await closed(reader)
    writer.close()


async def test_a_chunk_announcing_2_63_bytes_gets_413_at_once(srv):
    assert srv.http.body_timeout_s >= 30  # a 408 would come far beyond the wait below
    reader, writer = await connect(srv)
    writer.write(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"8000000000000000\r\nabc")
    code, headers, body = await read_response(reader)
    assert code == 413 and headers["connection"] == "close"
    assert "announces 9223372036854775808 bytes, over max_body_bytes" in message(body)
    assert await closed(reader)
    writer.close()
    assert srv.export_refusals["RESOURCE_EXHAUSTED"] == 1
    # chunks adding up to more than max_body_bytes: refused at the one that passes it
    reader, writer = await connect(srv)
    writer.write(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"80000\r\n" + b"\0" * 0x80000)
    writer.write(b"\r\n80001\r\n")
    code, _, body = await read_response(reader)
    assert code == 413 and "announces 1048577 bytes" in message(body)
    writer.close()


async def test_too_many_chunks_get_413(srv):
    body = chunked(*[b"x"] * 100_000)  # 100k one-byte chunks, 100 KB of data
    code, _headers, out = await exchange(srv, body)
    assert code == 413 and "more than 8192 chunks" in message(out)
    srv.http.max_chunks = 3
    agent = await running(srv, "c", 3)
    data = good("c", 3)
    third = len(data) // 3
    parts = [data[:third], data[third : 2 * third], data[2 * third :]]
    assert (await exchange(srv, chunked(*parts)))[0] == 200  # within the cap: counted
    assert usage(srv, "c") == 5
    code, _, out = await exchange(srv, chunked(*parts, b"\n"))
    assert code == 413 and "more than 3 chunks" in message(out)
    assert usage(srv, "c") == 5
    await agent.close()


async def test_a_malformed_chunk_size_line_gets_400(srv):
    code, _, out = await exchange(srv, HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n")
    assert code == 400 and "bad chunk-size line" in message(out)


async def test_pipelined_requests_are_framed_one_by_one(srv):
    srv.http.max_chunks = 2
    agent = await running(srv, "p", 4)
    one = good("p", 4, tokens_in=3)
    reader, writer = await connect(srv)
    # one write, four requests: Content-Length, two chunks, Content-Length, three chunks
    writer.write(post(one) + chunked(one[:10], one[10:]) + post(one) + chunked(one, b"x", b"y"))
    for _ in range(3):
        assert (await read_response(reader))[0] == 200
    code, _, out = await read_response(reader)  # the fourth, over the cap of its own chunks
    assert code == 413 and "more than 2 chunks" in message(out)
    writer.close()
    assert usage(srv, "p") == 9
    await agent.close()
