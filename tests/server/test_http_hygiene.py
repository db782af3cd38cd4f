"""What the OTLP/HTTP receiver shows of itself: client mistakes logged as one rate-limited
line (no traceback), and no response naming the library or its version."""

from __future__ import annotations

import asyncio
import logging

from .conftest import request
from .test_http_limits import HEAD, connect, exchange, post, read_response, srv  # noqa: F401


async def test_a_thousand_malformed_requests_log_a_handful_of_lines(srv, caplog):  # noqa: F811
    caplog.set_level(logging.DEBUG)
    garbage = [
        b"GARBAGE\r\n\r\n",
        b"POST /v1/traces HTTP/1.1\r\nBad Header Without Colon\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 40,  # TLS to a plain port
        b"POST /v1/traces HTTP/9.9\r\n\r\n",
    ]

    async def one(i: int) -> int:
        reader, writer = await connect(srv)
        try:
            writer.write(garbage[i % len(garbage)])
            await writer.drain()
            code, headers, _ = await read_response(reader)
            assert headers["server"] == "otel-guard"
            return code
        finally:
            writer.close()

    codes = []
    for start in range(0, 1000, 50):  # 50 connections at a time
        codes += await asyncio.gather(*(one(i) for i in range(start, start + 50)))
    assert set(codes) <= {400, 505}, set(codes)
    lines = [r for r in caplog.records if r.name.startswith(("aiohttp", "guard.server"))]
    lines = [r for r in lines if "OTLP/HTTP" in r.getMessage() or r.name.startswith("aiohttp")]
    assert 1 <= len(lines) <= 8, [r.getMessage() for r in lines]
    assert all(r.levelno <= logging.WARNING for r in lines)
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in lines)
    assert "Traceback" not in caplog.text
    assert srv.http.log_limiter.suppressed >= 990
    # the next line of a kind says how many were left out
    srv.http.log_limiter._kinds = {
        k: (v[0] - 60, v[1]) for k, v in srv.http.log_limiter._kinds.items()
    }
    await one(0)
    assert "more like it" in caplog.records[-1].getMessage()


async def test_no_response_names_the_library(srv):  # noqa: F811
    good = request().SerializeToString()
    raw = [
        post(good),  # 200
        b"GET /v1/traces HTTP/1.1\r\nHost: x\r\n\r\n",  # 405
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # 404
        b"GET /favicon.ico HTTP/1.0\r\n\r\n",  # 404
        b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
        b"Content-Length: 0\r\n\r\n",  # 415
        HEAD + b"Content-Length: 99999999\r\n\r\n",  # 413
        b"NOT HTTP AT ALL\r\n\r\n",  # malformed request line
        b"POST /v1/traces HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n",  # head too large
        b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    ]
    seen = set()
    for data in raw:
        code, headers, _ = await exchange(srv, data)
        seen.add(code)
        assert headers.get("server") == "otel-guard", (code, headers)
        assert not any("aiohttp" in v.lower() or "python" in v.lower() for v in headers.values())
    assert {200, 400, 404, 405, 413, 415, 431} <= seen, seen
    # Expect: 100-continue gets its interim answer, and the final one, without the banner
    reader, writer = await connect(srv)
    writer.write(
        HEAD + b"Expect: 100-continue\r\n" + f"Content-Length: {len(good)}\r\n\r\n".encode()
    )
    assert (
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        == b"HTTP/1.1 100 Continue\r\n\r\n"
    )
    writer.write(good)
    code, headers, _ = await read_response(reader)
    assert code == 200 and headers["server"] == "otel-guard"
    writer.close()
