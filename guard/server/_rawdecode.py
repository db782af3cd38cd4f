"""The fast decode path: span attributes read from their wire bytes, not through wrappers.

Why: with upb, every attribute read through the generated classes allocates a ``KeyValue``
wrapper, an ``AnyValue`` wrapper, a key string and the value (measured on the ingest
benchmark's spans: ~2.6 µs per span for key + value reads alone, before any decoding logic).
Here the request is parsed once, with a copy of the OTLP schema that differs in one field:
``Span.attributes`` is ``repeated bytes``, so each ``KeyValue`` arrives still encoded (~0.1
µs per attribute to hand over). Most attributes repeat verbatim from span to span (run id,
tenant, operation, model, tool name, ...) and are answered by one dict probe on their exact
bytes (``_MEMO``); the others by one probe on their first bytes (``_HEAD``) plus a few byte
checks. Per-call values (hashes, ids, call ids under keys we skip) are read inline in the
decode loop from their head (``_PERCALL``): a UTF-8 (and hex digit) check of the bytes.

Exactness: the fast path only accepts the canonical encoding every OTLP exporter writes (key,
then value, one-byte lengths, the expected value type). Anything else (an unknown type for a
known key, a zero, a long value, fields out of order, a repeated field) is parsed with the
real ``KeyValue`` class and read by the reference code (``_decode._kv_slot``), so results and
error messages are those of ``_decode.decode_spans``. Validation is the full parse's too: the
rest of the request is checked by upb against the real schema, and every attribute is checked
as it is decoded (strict UTF-8 on the fast path, the real parser otherwise), before anything
of the request is applied (``_otlp`` decodes all chunks first). tests/server/test_decode.py
checks both properties against the generated classes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from struct import Struct
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from guard.errors import InvalidInput
from guard.semconv import is_content_attribute
from guard.server._decode import (
    _ACTION_FP,
    _BOOL,
    _CACHED,
    _ERROR,
    _FLOAT,
    _HEX,
    _HEXCHARS,
    _IN,
    _INT,
    _KEYS,
    _MAX_COST,
    _MODEL,
    _MODEL_OPS,
    _OP,
    _OUT,
    _REASONING,
    _RESP_ID,
    _RESP_MODEL,
    _RESULT_HASH,
    _RUN_ID,
    _SPARE,
    _STATE_HASH,
    _STR,
    _TEMPLATE,
    _TOOL_NAME,
    FOREIGN,
    KIND,
    KIND_MODEL,
    KIND_STEP,
    KIND_TOOL,
    PARENT_SPAN_ID,
    SPAN_ID,
    TRACE_ID,
    Decoded,
    Observation,
    _Bad,
    _kv_slot,
    _observe,
)

__all__ = ["LiteRequest", "decode_lite_spans", "decode_payload", "lite_chunks"]


def _build_lite() -> Any:
    """``ExportTraceServiceRequest`` from a private pool holding copies of the OTLP files with
    one change: ``Span.attributes`` is ``repeated bytes`` (each ``KeyValue`` still encoded).

    Everything else is the real schema, so upb validates the rest of the request (structure,
    UTF-8 of every other string) exactly as the generated class does; the attributes are
    validated as they are decoded (see ``_validate``).
    """
    pool = descriptor_pool.DescriptorPool()
    for module in (common_pb2, resource_pb2, trace_pb2, otlp):
        fdp = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(fdp)
        for msg in fdp.message_type:
            if module is trace_pb2 and msg.name == "Span":
                (attrs,) = [f for f in msg.field if f.name == "attributes"]
                attrs.type = attrs.TYPE_BYTES
                attrs.ClearField("type_name")
        pool.Add(fdp)
    name = otlp.ExportTraceServiceRequest.DESCRIPTOR.full_name
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


LiteRequest = _build_lite()
_lite_parse = LiteRequest.FromString

# Decoded attributes by their exact bytes. Agents repeat most attributes verbatim on every
# span (run id, tenant, operation, model, tool name, attempts, progress, ...), so most lookups
# hit and cost one dict probe. Per-call hashes and ids are not kept (they never repeat); the
# memo is bounded and simply cleared when full. It only ever holds what _read returned.
_MEMO: dict[bytes, tuple[int, Any]] = {}
_MEMO_MAX = 8192
_MEMO_RAW_MAX = 160  # bytes; longer attributes are decoded each time
_SKIP = (_SPARE, None)  # an attribute we do not read: its None goes to the spare slot
_UNIQUE = frozenset({_ACTION_FP, _RESULT_HASH, _STATE_HASH, _RESP_ID})


# The canonical head of a known attribute: KeyValue.key tag (0x0a), key length, key, value tag
# (0x12), value length, AnyValue tag. Looked up as ``raw[: len(key) + 5]``; the entry says
# where the value goes and the exact total length the attribute must have.
_TAG = {_STR: 0x0A, _HEX: 0x0A, _INT: 0x18, _FLOAT: 0x21, _BOOL: 0x10}
_HEAD: dict[bytes, tuple[int, int, int, bool]] = {}
_KNOWN: set[bytes] = set()  # canonical key prefixes (tag, length, key) of every known key
for _key, (_slot, _typ) in _KEYS.items():
    _k = _key.encode()
    _prefix = bytes((0x0A, len(_k))) + _k
    _KNOWN.add(_prefix)
    # strings: 1..125 chars (one-byte lengths); ints: 1..3-byte varints; double; bool
    _lengths = {_STR: range(3, 128), _HEX: range(3, 67), _INT: range(2, 5)}.get(_typ)
    for _vlen in _lengths or ((9,) if _typ == _FLOAT else (2,)):
        _size = len(_prefix) + 2 + _vlen
        _HEAD[_prefix + bytes((0x12, _vlen, _TAG[_typ]))] = (
            _slot,
            _typ,
            _size,
            _slot not in _UNIQUE,
        )
# Per-call strings and digests (see _UNIQUE) never hit _MEMO; their canonical head through
# the string's length byte says everything _read would check but the bytes themselves, so the
# decode loop reads them inline: head -> (slot, total size, value offset, hex digest?). _read
# adds the heads of strings under keys we skip (the spare slot), e.g. per-call tool call ids.
_PERCALL: dict[bytes, tuple[int, int, int, bool]] = {}
for _head, (_slot, _typ, _size, _keep) in _HEAD.items():
    if not _keep and _typ in (_STR, _HEX):
        _PERCALL[_head + bytes((_head[-2] - 2,))] = (_slot, _size, len(_head) + 1, _typ == _HEX)
del _key, _slot, _typ, _k, _prefix, _lengths, _vlen, _size, _head, _keep
_PERCALL_KNOWN = len(_PERCALL)
_PERCALL_MAX = _PERCALL_KNOWN + 4096  # learnt heads of skipped strings: bounded, like _MEMO


def _forget_skips() -> None:
    for head in [h for h, v in _PERCALL.items() if v[0] == _SPARE]:
        del _PERCALL[head]


_HEAD_GET = _HEAD.get
_HEXBYTES = "".join(sorted(_HEXCHARS)).encode()
_DOUBLE = Struct("<d").unpack_from


def _validate(raw: bytes) -> Any:
    """Parse one encoded ``KeyValue`` with the real schema; a malformed one (bad structure,
    invalid UTF-8) makes the whole request malformed, as the full parse would have."""
    try:
        return common_pb2.KeyValue.FromString(raw)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidInput(
            f"malformed OTLP ExportTraceServiceRequest: a span attribute ({len(raw)} bytes) "
            f"does not parse: {exc}"
        ) from None


def _unknown_key(raw: bytes) -> bool:
    """True when ``raw`` is a well-formed canonical KeyValue whose key is none of ours (skip).

    Canonical: the key field first and once, then at most one value field running to the end,
    holding nothing, a short string (UTF-8 checked here) or a one-byte int/bool. False sends
    the attribute to the reference path, which validates it and decides what it says; a
    ValueError (invalid UTF-8) does too.
    """
    n = raw[1]
    if raw[0] != 0x0A or n > 0x7F or raw[: n + 2] in _KNOWN:
        return False
    p = n + 2
    raw[2:p].decode()  # the key must be valid UTF-8
    size = len(raw)
    if p == size:
        return True  # no value at all
    if raw[p] != 0x12:
        return False
    vlen = raw[p + 1]
    if vlen < 0x80:
        q = p + 2
    elif raw[p + 2] < 0x80:
        vlen = (vlen & 0x7F) | (raw[p + 2] << 7)
        q = p + 3
    else:
        return False  # values of 16 KiB and more: the reference path
    if q + vlen != size:
        return False
    if q == size:
        return True  # an empty AnyValue
    tag, length = raw[q], raw[q + 1]
    if tag == 0x0A and length < 0x80 and q + 2 + length == size:
        raw[q + 2 :].decode()  # string_value: valid UTF-8, as the full parse requires
        return True
    # int_value / bool_value of one byte; anything else (arrays, maps, bytes, doubles, long
    # strings or varints) is left to the reference path
    return (tag == 0x18 or tag == 0x10) and length < 0x80 and q + 2 == size


def _content_key(raw: bytes) -> bool:
    """True when the (valid) KeyValue ``raw`` has a content key (``guard.semconv``). Parsed,
    not sliced: the key protobuf reads is the last key field. Only on a memo miss."""
    return is_content_attribute(common_pb2.KeyValue.FromString(raw).key)


def _read(raw: bytes) -> tuple[int, Any]:
    """(slot, value) of one serialized KeyValue, or _SKIP. Raises ``_Bad`` like the reference
    path. Remembers the answer in ``_MEMO`` unless it is per-call (see ``_UNIQUE``)."""
    try:
        n = raw[1]
        hit = _HEAD_GET(raw[: n + 5])
        if hit is None:
            if not _unknown_key(raw):
                raise IndexError  # not canonical, or a known key in another shape
            out = _SKIP
            # A string under a key of no interest (a call id, a provider): later ones with the
            # same head only need their UTF-8 checked (see decode_lite_spans).
            size = len(raw)
            if (
                size > n + 6
                and raw[n + 2] == 0x12
                and raw[n + 3] == size - n - 4
                and raw[n + 4] == 0x0A
                and raw[n + 5] == size - n - 6
            ):
                if len(_PERCALL) >= _PERCALL_MAX:
                    _forget_skips()
                _PERCALL[raw[: n + 6]] = (_SPARE, size, n + 6, False)
        else:
            slot, typ, size, keep = hit
            if len(raw) != size:
                raise IndexError
            if typ == _STR:
                if raw[n + 5] != size - n - 6:
                    raise IndexError
                value: Any = raw[n + 6 :].decode()
                if not keep:
                    return slot, value  # a per-call hash: not worth remembering
            elif typ == _HEX:
                data = raw[n + 6 :]
                # something left after deleting the hex digits: not a digest
                if raw[n + 5] != size - n - 6 or data.translate(None, _HEXBYTES):
                    raise IndexError
                value = data.decode()
                if not keep:
                    return slot, value
            elif typ == _INT:
                if size == n + 6:
                    value = raw[n + 5]
                    if value > 0x7F:
                        raise IndexError
                elif size == n + 7:
                    b0, b1 = raw[n + 5], raw[n + 6]
                    if b0 < 0x80 or b1 > 0x7F:
                        raise IndexError
                    value = (b0 & 0x7F) | (b1 << 7)
                else:
                    b0, b1, b2 = raw[n + 5], raw[n + 6], raw[n + 7]
                    if b0 < 0x80 or b1 < 0x80 or b2 > 0x7F:
                        raise IndexError
                    value = (b0 & 0x7F) | ((b1 & 0x7F) << 7) | (b2 << 14)
            elif typ == _FLOAT:
                value = _DOUBLE(raw, n + 5)[0]
                if not 0.0 < value <= _MAX_COST:
                    raise IndexError  # zero, negative, NaN, too large: the reference path
            elif raw[n + 5] == 1:
                value = True
            else:
                raise IndexError
            out = (slot, value)
    except (IndexError, ValueError):
        # Not the canonical shape (or too short to say): the reference path decides.
        ref = _kv_slot(_validate(raw))
        out = _SKIP if ref is None else ref
    if out[0] not in _UNIQUE and len(raw) <= _MEMO_RAW_MAX:
        if out is _SKIP and _content_key(raw):
            return out  # content is never kept, not even as a cache key (DESIGN §3.3)
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.clear()
        _MEMO[raw] = out
    return out


def decode_lite_spans(spans: Sequence[Any], out: Decoded) -> Decoded:
    """Decode lite ``Span`` messages into ``out`` (same result as ``decode_spans``)."""
    append = out.observations.append
    memo = _MEMO.get
    percall = _PERCALL.get
    spare = _SPARE
    hexbytes = _HEXBYTES
    template = _TEMPLATE
    out.spans += len(spans)
    for span in spans:
        o = Observation(template)
        try:
            for raw in span.attributes[:]:  # a plain list iterates faster
                hit = memo(raw)
                if hit is None:
                    # a per-call hash or id in canonical form: _read's checks, inline
                    u = percall(raw[: raw[1] + 6]) if len(raw) > 8 else None
                    if u is not None and len(raw) == u[1]:
                        data = raw[u[2] :]
                        try:
                            if u[3] and data.translate(None, hexbytes):
                                raise ValueError  # not a digest: the reference path says why
                            value = data.decode()
                        except ValueError:
                            hit = _read(raw)
                        else:
                            if u[0] != spare:
                                o[u[0]] = value
                            continue
                    else:
                        hit = _read(raw)
                # two spellings on one span: the last one wins; skipped ones write None to
                # the spare slot
                o[hit[0]] = hit[1]
            if not o[_RUN_ID] and o[_IN] is None and o[_OUT] is None:
                continue  # not ours, not a GenAI call (_observe would say so too)
            # _decode._observe, inlined for the three kinds of most spans (steps, tool and
            # model calls of guarded runs); everything else goes through it
            name = span.name
            if o[_RUN_ID] and (op := o[_OP]) != "invoke_agent":
                if name == "guard.step":
                    o[FOREIGN] = False
                    o[KIND] = KIND_STEP
                    o[TRACE_ID] = span.trace_id
                    append(o)
                    continue
                tool = op == "execute_tool" or name.startswith("execute_tool")
                if tool and not name.startswith("invoke_agent"):
                    if o[_TOOL_NAME] is None and name.startswith("execute_tool "):
                        o[_TOOL_NAME] = name[13:]
                    if span.HasField("status") and span.status.code == 2:  # STATUS_CODE_ERROR
                        o[_ERROR] = o[_ERROR] or "error"
                    o[FOREIGN] = False
                    o[KIND] = KIND_TOOL
                    o[TRACE_ID] = span.trace_id
                    append(o)
                    continue
                if not tool and not name.startswith("invoke_agent"):
                    # a model call of a guarded run, unless its counters are inconsistent
                    # (cached > input: _observe refuses it and says why)
                    inp, out_ = o[_IN], o[_OUT]
                    if inp is not None or out_ is not None or op in _MODEL_OPS:
                        inp = inp or 0
                        cached = o[_CACHED] or 0
                        if cached <= inp:
                            if o[_MODEL] is None:
                                o[_MODEL] = o[_RESP_MODEL] or ""
                            o[_IN] = inp
                            o[_OUT] = out_ or 0
                            o[_CACHED] = cached
                            o[_REASONING] = o[_REASONING] or 0
                            o[SPAN_ID] = span.span_id
                            o[PARENT_SPAN_ID] = span.parent_span_id
                            o[FOREIGN] = False
                            o[KIND] = KIND_MODEL
                            o[TRACE_ID] = span.trace_id
                            append(o)
                            continue
            o = _observe(span, o)
        except _Bad as exc:
            for raw in span.attributes:  # the rest of the span must still be well-formed
                if memo(raw) is None:
                    _validate(raw)
            out.reject(span.name, exc)
            continue
        if o is not None:
            append(o)
    return out


def lite_chunks(request: Any, chunk_spans: int) -> Iterator[list[Any]]:
    """Group the (lite) request's span lists into chunks of about ``chunk_spans`` spans."""
    chunk: list[Any] = []
    size = 0
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            spans = ss.spans
            n = len(spans)
            for start in range(0, n, chunk_spans) if n > chunk_spans else (0,):
                part = spans[start : start + chunk_spans] if n > chunk_spans else spans
                chunk.append(part)
                size += min(n - start, chunk_spans)
                if size >= chunk_spans:
                    yield chunk
                    chunk, size = [], 0
    if chunk:
        yield chunk


def decode_payload(data: bytes) -> Decoded:
    """Decode every span of a serialized request, in arrival order.

    Raises ``InvalidInput`` when the request is malformed (as the ``_otlp`` handler does).
    """
    try:
        request = _lite_parse(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidInput(
            f"malformed OTLP ExportTraceServiceRequest ({len(data)} bytes): {exc}"
        ) from None
    out = Decoded()
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            decode_lite_spans(ss.spans, out)
    return out
