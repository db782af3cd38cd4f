"""The OTLP/HTTP receiver's body helpers: gzip inflation by decompressed size, of every
member, in budget steps; and the framing tracker on its own."""

from __future__ import annotations

import gzip
import zlib

import pytest

from guard.errors import InputTooLarge, InvalidInput
from guard.server.otlp._httpbody import Budget, Hold, gunzip
from guard.server.otlp._httpframe import Framing
from guard.server.runtime._status import Overloaded


def test_every_gzip_member_is_inflated():
    body = gzip.compress(b"a" * 1000) + gzip.compress(b"") + gzip.compress(b"b" * 70_000)
    assert zlib.decompressobj(wbits=31).decompress(body) == b"a" * 1000  # one member only
    assert gunzip(body, 1 << 20, lambda n: None) == b"a" * 1000 + b"b" * 70_000
    assert gunzip(gzip.compress(b"x") + b"\0" * 8, 10, lambda n: None) == b"x"  # padding
    with pytest.raises(InvalidInput, match="does not decompress"):
        gunzip(gzip.compress(b"x") + b"junk", 10, lambda n: None)


def test_a_bomb_costs_the_limit_and_no_more():
    taken: list[int] = []
    one = gzip.compress(b"\0" * (8 << 20))
    with pytest.raises(InputTooLarge, match="more than max_body_bytes 1048576"):
        gunzip(one + one, 1 << 20, taken.append)  # the bound holds across members too
    assert sum(taken) <= 1 << 20 and max(taken) <= 256 * 1024
    with pytest.raises(InputTooLarge):
        gunzip(gzip.compress(b"\0" * 1000) + one, 1 << 20, taken.append)


def test_inflation_takes_from_the_budget_as_it_goes():
    budget = Budget(300_000)
    hold = Hold(budget)
    with pytest.raises(Overloaded, match="in flight"):
        gunzip(gzip.compress(b"\0" * 1_000_000), 1 << 20, hold.take)
    assert budget.held == hold.n > 0
    hold.release()
    assert budget.held == 0


def test_framing_names_the_chunk_beyond_the_limits():
    head = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    f = Framing(lambda: (100, 3))
    assert f.feed(head + b"5\r\nhello\r\n") is None
    data = b"3;ext=1\r\nabc\r\n" + b"60\r\n"  # 5 + 3 + 96 > 100
    assert f.feed(data) == (
        data.index(b"60"),
        413,
        "chunked body announces 104 bytes, over max_body_bytes 100",
    )
    f = Framing(lambda: (100, 3))
    body = head + b"1\r\na\r\n" * 3 + b"1\r\n"
    assert f.feed(body)[1:] == (413, "chunked body of more than 3 chunks")
    # Content-Length bodies are skipped whole, whatever they hold; heads after them followed
    f = Framing(lambda: (100, 3))
    cl = b"POST / HTTP/1.1\r\nContent-Length: 12\r\n\r\n" + b"1\r\n" * 4
    assert f.feed(cl + head + b"1\r\n") is None
    assert f.feed(b"a\r\nzz\r\n") == (3, 400, "chunked body: bad chunk-size line b'zz'")
