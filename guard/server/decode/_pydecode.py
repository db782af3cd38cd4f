"""The reference span decoder: OTLP ``Span`` messages (generated classes) -> observations.

Pure Python and the definition of what a span means for a guarded run: the native decoder
(``_nativedecode``) must give exactly the same observations, and hands every request it does
not answer for to this one (tests/server/test_native_decode.py holds the two equal). It is also
what runs when no C compiler built the native one.

No policy calls, no registry, no I/O. Spans that are neither ours nor GenAI model calls (HTTP,
DB, framework internals) are skipped after one pass over their attributes. A span whose
counters are negative, NaN or of the wrong type is *rejected* (reported back through OTLP
``partial_success``), never half-applied.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp

from guard import semconv as sc
from guard.errors import InvalidInput
from guard.server.decode._schema import (
    AGGREGATE_OPS,
    BOOL,
    CACHED,
    ERROR,
    FLOAT,
    FOREIGN,
    HEX,
    HEXCHARS,
    IN,
    INT,
    KEYS,
    KIND,
    KIND_MODEL,
    KIND_RUN,
    KIND_STEP,
    KIND_TOOL,
    MAX_COST,
    MAX_COUNTER,
    MAX_ID_CHARS,
    MODEL,
    MODEL_OPS,
    OP,
    OUT,
    PARENT_SPAN_ID,
    REASONING,
    RESP_MODEL,
    RUN_ID,
    SPAN_ID,
    STR,
    TEMPLATE,
    TOOL_NAME,
    TRACE_ID,
    BadSpan,
    Decoded,
    Observation,
)

__all__ = ["decode_spans", "kv_slot", "parse_request", "request_spans"]

_parse = otlp.ExportTraceServiceRequest.FromString
_TOOL_HEAD = sc.EXECUTE_TOOL + " "  # "execute_tool {tool}": the tool's name follows


def parse_request(data: bytes) -> Any:
    """Parse a serialized ``ExportTraceServiceRequest``; ``InvalidInput`` if malformed.

    What is malformed is protobuf's parser's to say, and the native decoder is held to it,
    down to padded varints: a tag or a length of more than 5 bytes, a tag beyond 32 bits or a
    field value of more than 10 bytes is refused, a 10-byte value keeps its low 64 bits
    (tests/server/test_native_decode_varints.py checks both against this parse)."""
    try:
        return _parse(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidInput(
            f"malformed OTLP ExportTraceServiceRequest ({len(data)} bytes): {exc}"
        ) from None


def request_spans(request: Any) -> Iterable[Sequence[Any]]:
    """The request's span lists, in arrival order."""
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            yield ss.spans


def _value(v: Any, typ: int) -> Any:
    which = v.WhichOneof("value")
    if typ == HEX:  # fingerprints: hex digests (HMAC), never raw text
        if which != "string_value":
            raise BadSpan(f"expected a hex fingerprint, got {which}")
        s = v.string_value
        if not 0 < len(s) <= 64 or not HEXCHARS.issuperset(s):
            raise BadSpan(f"fingerprint {s[:40]!r} is not 1..64 hex characters")
        return s
    if typ == STR:
        if which != "string_value":
            raise BadSpan(f"expected a string, got {which}")
        s = v.string_value
        if len(s) > MAX_ID_CHARS:
            raise BadSpan(f"string of {len(s)} chars exceeds {MAX_ID_CHARS}")
        return s
    if typ == INT:
        if which == "int_value":
            n = v.int_value
        elif which == "double_value":
            d = v.double_value
            if not math.isfinite(d) or d != int(d):
                raise BadSpan(f"expected an integer, got {d!r}")
            n = int(d)
        elif which == "string_value" and v.string_value.isascii() and v.string_value.isdigit():
            n = int(v.string_value)  # ASCII only: "²".isdigit() is True, int("²") raises
        else:
            raise BadSpan(f"expected an integer, got {which}")
        if n < 0 or n > MAX_COUNTER:
            raise BadSpan(f"counter {n} out of range [0, {MAX_COUNTER}]")
        return n
    if typ == FLOAT:
        if which == "double_value":
            d = v.double_value
        elif which == "int_value":
            d = float(v.int_value)
        else:
            raise BadSpan(f"expected a number, got {which}")
        if not math.isfinite(d) or d < 0:
            raise BadSpan(f"cost {d!r} must be finite and >= 0")
        if d > MAX_COST:
            raise BadSpan(f"cost {d!r} exceeds {MAX_COST:g} USD per span")
        return d
    if typ == BOOL and which == "bool_value":
        return v.bool_value
    raise BadSpan(f"expected a bool, got {which}")


def kv_slot(kv: Any) -> tuple[int, Any] | None:
    """The reading of one ``KeyValue`` message: (slot, value), or None if the key is not one
    we read. Raises ``BadSpan`` for a value the guard refuses."""
    hit = KEYS.get(kv.key)
    if hit is None:
        return None
    return hit[0], _value(kv.value, hit[1])


def _observe(span: Any, o: Observation) -> Observation | None:
    """The span's kind and span fields, or None when it means nothing for a run."""
    run_id = o[RUN_ID]
    op = o[OP]
    name = span.name
    if run_id:
        if name == sc.STEP_SPAN:
            kind = KIND_STEP
        elif op == sc.INVOKE_AGENT or name.startswith(sc.INVOKE_AGENT):
            kind = KIND_RUN
        elif op == sc.EXECUTE_TOOL or name.startswith(sc.EXECUTE_TOOL):
            kind = KIND_TOOL
            if o[TOOL_NAME] is None and name.startswith(_TOOL_HEAD):
                o[TOOL_NAME] = name[len(_TOOL_HEAD) :]
            # STATUS_CODE_ERROR; HasField first: most spans carry no status, and reading
            # one allocates a wrapper
            if span.HasField("status") and span.status.code == 2:
                o[ERROR] = o[ERROR] or "error"
        elif o[IN] is not None or o[OUT] is not None or op in MODEL_OPS:
            kind = KIND_MODEL
        else:
            return None
        o[FOREIGN] = False
    elif (o[IN] is not None or o[OUT] is not None) and op not in AGGREGATE_OPS:
        kind = KIND_MODEL
        o[FOREIGN] = True
    else:
        return None
    if kind == KIND_MODEL:
        if o[MODEL] is None:
            o[MODEL] = o[RESP_MODEL] or ""
        inp = o[IN] or 0
        o[IN] = inp
        o[OUT] = o[OUT] or 0
        cached = o[CACHED] or 0
        o[CACHED] = cached
        o[REASONING] = o[REASONING] or 0
        if cached > inp and run_id:
            raise BadSpan(
                f"gen_ai.usage.cache_read.input_tokens {cached} exceeds input_tokens {inp}"
            )
        # span ids only serve to count each model call once (SeenCalls); other kinds skip
        # the two reads (each allocates a bytes object)
        o[SPAN_ID] = span.span_id
        o[PARENT_SPAN_ID] = span.parent_span_id
    o[KIND] = kind
    o[TRACE_ID] = span.trace_id
    return o


def decode_spans(spans: Sequence[Any], out: Decoded | None = None) -> Decoded:
    """Decode a sequence of OTLP ``Span`` messages into ``out`` and return it."""
    out = out if out is not None else Decoded()
    append = out.observations.append
    get = KEYS.get
    out.spans += len(spans)
    for span in spans:
        o = None
        try:
            for kv in span.attributes:
                hit = get(kv.key)
                if hit is None:
                    continue
                if o is None:
                    o = Observation(TEMPLATE)
                slot, typ = hit  # two spellings on one span: the last one wins
                v = kv.value
                # Fast paths read the expected field directly; a zero/empty/odd value falls
                # through to _value, which checks the oneof and says what is wrong.
                if typ == INT:
                    n = v.int_value
                    o[slot] = n if 0 < n <= MAX_COUNTER else _value(v, typ)
                elif typ == STR:
                    x = v.string_value
                    o[slot] = x if x and len(x) <= MAX_ID_CHARS else _value(v, typ)
                elif typ == HEX:
                    x = v.string_value
                    ok = x and len(x) <= 64 and HEXCHARS.issuperset(x)
                    o[slot] = x if ok else _value(v, typ)
                elif typ == FLOAT:
                    d = v.double_value
                    o[slot] = d if 0.0 < d <= MAX_COST else _value(v, typ)
                else:
                    o[slot] = True if v.bool_value else _value(v, typ)
            if o is None:
                continue  # no attribute we care about: not ours, not GenAI
            o = _observe(span, o)
        except BadSpan as exc:
            out.reject(span.name, exc)
            continue
        if o is not None:
            append(o)
    return out
