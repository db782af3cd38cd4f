"""Over-long varints: the native decoder, the reference and protobuf's parser agree.

Protobuf's wire format lets a writer pad a varint with continuation bytes (``0x80`` ...), and
its parser (upb, what the reference decoder ``_pydecode`` parses with) accepts some padded
forms and refuses others, by what the varint is:

- a tag or a length is read as a 32-bit number: at most 5 bytes (a 6th byte is malformed even
  when it only pads a zero), and a tag beyond 32 bits is malformed;
- a field value is read as a 64-bit number: at most 10 bytes, the 10th byte's bits beyond
  bit 63 dropped; an 11th byte is malformed.

The native decoder must never accept what that parse refuses, and must read the same value
where it accepts. Every varint of a real request (each tag, each length, each varint value, at
every level from the request down to the AnyValue in a span attribute) is re-encoded at every
width 1..11, and with odd last bytes at widths 5 and 10; for each variant the outcome of the
native path, of the reference and of protobuf's parser must agree, and protobuf's parser must
behave as the rule above says (so a change of that rule upstream fails here first).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from _hyp import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from guard.server.decode import _nativedecode

from .conftest import field, raw_request, raw_span
from .test_native_decode import _answered, _full_parse_ok, _same

pytestmark = pytest.mark.skipif(
    not _nativedecode.available(), reason="the native decoder is not built"
)

TAG, LENGTH, VALUE = "tag", "length", "value"
MAX_WIDTH = {TAG: 5, LENGTH: 5, VALUE: 10}  # protobuf's parser: wider is malformed

# Which length-delimited fields are messages (the rest are strings and bytes), so the walk
# below reaches every varint of the request, however deep.
_MESSAGES: dict[str, dict[int, str]] = {
    "request": {1: "resource_spans"},
    "resource_spans": {1: "resource", 2: "scope_spans"},
    "resource": {1: "kv", 3: "entity_ref"},
    "entity_ref": {},
    "scope_spans": {1: "scope", 2: "span"},
    "scope": {3: "kv"},
    "span": {9: "kv", 11: "event", 13: "link", 15: "status"},
    "event": {3: "kv"},
    "link": {4: "kv"},
    "status": {},
    "kv": {2: "any"},
    "any": {5: "array", 6: "kvlist"},
    "array": {1: "any"},
    "kvlist": {1: "kv"},
}


def _attr(key: str, **value: object) -> common_pb2.KeyValue:
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(**value))


def _base_request() -> bytes:
    """A request with every kind of varint the native path reads or validates."""
    attrs = [
        _attr("guard.run.id", string_value="r-1"),
        _attr("gen_ai.operation.name", string_value="chat"),
        _attr("gen_ai.request.model", string_value="m"),
        _attr("gen_ai.usage.input_tokens", int_value=300),  # a 2-byte value
        _attr("gen_ai.usage.output_tokens", int_value=7),
        _attr("guard.cost.usd", double_value=0.25),
        _attr("guard.progress", bool_value=True),
        _attr("http.status_code", int_value=200),  # not ours: validated, skipped
        _attr(
            "nested",
            array_value=common_pb2.ArrayValue(
                values=[
                    common_pb2.AnyValue(bool_value=True),
                    common_pb2.AnyValue(
                        kvlist_value=common_pb2.KeyValueList(values=[_attr("a", int_value=1)])
                    ),
                ]
            ),
        ),
    ]
    model = trace_pb2.Span(
        trace_id=b"\x03" * 16,
        span_id=b"\x01" * 8,
        name="chat m",
        kind=3,
        start_time_unix_nano=10**18,
        attributes=attrs,
        dropped_attributes_count=2,
        events=[
            trace_pb2.Span.Event(
                name="e", attributes=[_attr("k", int_value=1)], dropped_attributes_count=1
            )
        ],
        dropped_events_count=1,
        links=[
            trace_pb2.Span.Link(
                trace_id=b"\x04" * 16,
                span_id=b"\x05" * 8,
                attributes=[_attr("k", bool_value=False)],
                dropped_attributes_count=1,
            )
        ],
        dropped_links_count=1,
        status=trace_pb2.Status(code=2, message="x"),
    )
    tool = trace_pb2.Span(
        trace_id=b"\x03" * 16,
        name="execute_tool search",
        attributes=[
            _attr("guard.run.id", string_value="r-1"),
            _attr("guard.action.fingerprint", string_value="ab" * 8),
        ],
        status=trace_pb2.Status(code=2),
    )
    req = otlp.ExportTraceServiceRequest()
    rs = req.resource_spans.add(
        resource=resource_pb2.Resource(
            attributes=[_attr("service.name", string_value="svc")], dropped_attributes_count=1
        )
    )
    ss = rs.scope_spans.add(
        scope=common_pb2.InstrumentationScope(
            name="s", version="1", attributes=[_attr("k", int_value=5)], dropped_attributes_count=1
        )
    )
    ss.spans.extend([model, tool])
    return req.SerializeToString()


# -- the request as a tree of fields, and its serialization with one varint re-encoded -------
Node = list[tuple[int, int, "int | bytes | Node"]]  # (field number, wire type, payload)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, pos


def _parse(data: bytes, message: str) -> Node:
    out: Node = []
    pos = 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
            out.append((number, 0, value))
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            out.append((number, wire, data[pos : pos + size]))
            pos += size
        else:
            assert wire == 2
            n, pos = _read_varint(data, pos)
            body = data[pos : pos + n]
            pos += n
            sub = _MESSAGES[message].get(number)
            out.append((number, 2, _parse(body, sub) if sub else body))
    return out


def _wide(value: int, width: int, last: int | None = None) -> bytes:
    """``value`` as a varint of exactly ``width`` bytes (padded with continuation bytes);
    ``last`` replaces the final byte (bits beyond what the value needs)."""
    out = bytearray()
    for i in range(width):
        b = (value >> (7 * i)) & 0x7F
        out.append(b | 0x80 if i < width - 1 else b)
    if last is not None:
        out[-1] = last
    return bytes(out)


def _min_width(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


@dataclass(frozen=True)
class Site:
    """One varint of the request: the ``index``-th in serialization order."""

    index: int
    kind: str  # TAG, LENGTH or VALUE
    value: int
    where: str  # the message it is in, for failure messages


class _Writer:
    """Serializes a tree; the varint numbered ``target`` is written by ``encode``."""

    def __init__(self, target: int = -1, encode=None) -> None:
        self.target = target
        self.encode = encode
        self.sites: list[Site] = []

    def varint(self, value: int, kind: str, where: str) -> bytes:
        index = len(self.sites)
        self.sites.append(Site(index, kind, value, where))
        if index == self.target:
            return self.encode(value)
        return _wide(value, _min_width(value))

    def message(self, node: Node, where: str) -> bytes:
        out = bytearray()
        for number, wire, payload in node:
            out += self.varint(number << 3 | wire, TAG, where)
            if wire == 0:
                out += self.varint(payload, VALUE, where)  # type: ignore[arg-type]
            elif wire in (1, 5):
                out += payload  # type: ignore[arg-type]
            else:
                sub = _MESSAGES[where].get(number)
                body = self.message(payload, sub) if sub else payload  # type: ignore[arg-type]
                # the body first: its length is only known once its own varints are written
                out += self.varint(len(body), LENGTH, where) + body  # type: ignore[arg-type]
        return bytes(out)


BASE = _base_request()
TREE = _parse(BASE, "request")
_probe = _Writer()
assert _probe.message(TREE, "request") == BASE  # the tree is the request, byte for byte
SITES = _probe.sites


def _variant(site: Site, width: int, last: int | None = None) -> bytes:
    return _Writer(site.index, lambda v: _wide(v, width, last)).message(TREE, "request")


def _variants() -> Iterator[tuple[Site, int, int | None]]:
    for site in SITES:
        for width in range(_min_width(site.value), 12):
            yield site, width, None
        if _min_width(site.value) <= 5:
            for last in (0x01, 0x0F, 0x10, 0x7F):  # past 32 bits, or not (0x0F) for a tag
                yield site, 5, last
        for last in (0x01, 0x02, 0x7E, 0x7F):  # bit 63, and bits beyond 64
            yield site, 10, last


def _check(data: bytes) -> bool:
    """Native == reference == protobuf's parser on ``data``; whether it is accepted."""
    outcome = _same(data)
    accepted = _full_parse_ok(data)
    assert (outcome != "malformed") == accepted
    if not accepted:
        assert not _answered(data)
    return accepted


# -- the tests ---------------------------------------------------------------------------------
def test_the_base_request_reaches_every_kind_of_varint_natively():
    assert _answered(BASE)
    assert {s.kind for s in SITES} == {TAG, LENGTH, VALUE}
    assert {s.where for s in SITES if s.kind == VALUE} >= {"span", "status", "any", "event"}
    _check(BASE)


@pytest.mark.parametrize(
    "hexdata",
    [
        "8a808080800000",  # the request's first tag in 6 bytes
        "8a80808080808080800000",  # ... in 10
        "0a80808080808080808000",  # a zero length in 10 bytes
        "0a808080808000",  # a zero length in 6 bytes
    ],
)
def test_over_long_tags_and_lengths_are_refused(hexdata):
    data = bytes.fromhex(hexdata)
    assert not _check(data)


def test_every_varint_at_every_width():
    """Each tag, length and value of the request, at widths 1..11 and with odd last bytes."""
    seen = {TAG: set(), LENGTH: set(), VALUE: set()}
    for site, width, last in _variants():
        data = _variant(site, width, last)
        try:
            accepted = _check(data)
        except AssertionError as exc:
            raise AssertionError(f"{site} at {width} bytes, last byte {last}: {exc}") from exc
        if last is None:
            # protobuf's rule, as the module docstring states it
            assert accepted == (width <= MAX_WIDTH[site.kind]), (site, width)
            seen[site.kind].add((width, accepted))
        elif site.kind == VALUE and width == 10:
            assert accepted, (site, last)  # the 10th byte's bits beyond 64 are dropped
        elif site.kind == TAG and width == 5 and last >= 0x10:
            assert not accepted, (site, last)  # a tag beyond 32 bits
    for kind in (TAG, LENGTH, VALUE):
        assert {w for w, _ in seen[kind]} == set(range(1, 12))


def test_a_ten_byte_value_reads_its_low_64_bits():
    """Where the native path reads a value, it reads what protobuf reads: the low 64 bits."""
    run = _attr("guard.run.id", string_value="r").SerializeToString()
    for key, which, value in (
        ("gen_ai.usage.input_tokens", "int_value", 300),
        ("guard.progress", "bool_value", 1),
    ):
        number = common_pb2.AnyValue.DESCRIPTOR.fields_by_name[which].number
        for last in (0x00, 0x01, 0x02, 0x7E, 0x7F):
            kv = field(1, 2, key.encode()) + field(
                2, 2, bytes([number << 3]) + _wide(value, 10, last)
            )
            low64 = value | (last & 1) << 63  # the rest of the 10th byte is dropped
            got = getattr(common_pb2.KeyValue.FromString(kv).value, which)
            if which == "int_value":
                assert got == struct.unpack("<q", struct.pack("<Q", low64))[0]
            else:
                assert got is bool(low64)
            data = raw_request(raw_span("chat m", b"\x03" * 16, [run, kv]))
            assert _check(data)
            if not last & 1:  # the value of the canonical encoding: read natively
                assert _answered(data), (key, last)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_several_over_long_varints_at_once(data):
    """Two varints re-encoded in one request (a padded tag inside a padded length, ...)."""
    first, second = sorted(
        data.draw(
            st.lists(st.sampled_from(SITES), min_size=2, max_size=2, unique=True), label="sites"
        ),
        key=lambda s: s.index,
    )
    widths = {
        s.index: data.draw(st.integers(_min_width(s.value), 11), label=f"width of {s}")
        for s in (first, second)
    }

    class Two(_Writer):
        def varint(self, value: int, kind: str, where: str) -> bytes:
            index = len(self.sites)
            self.sites.append(Site(index, kind, value, where))
            return _wide(value, widths.get(index, _min_width(value)))

    request = Two().message(TREE, "request")
    accepted = _check(request)
    assert accepted == all(widths[s.index] <= MAX_WIDTH[s.kind] for s in (first, second))
