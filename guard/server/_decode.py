"""Pure translation layer: OTLP ``ExportTraceServiceRequest`` -> step observations.

No policy calls, no registry, no I/O: this module only reads spans and says what each one
means for a guarded run. It accepts the current GenAI semconv spellings and the previous
ones (``gen_ai.usage.prompt_tokens`` / ``completion_tokens``, ...), OpenLLMetry's older
underscore forms, OpenInference ``llm.token_count.*``, OpenLIT and Pydantic AI spellings, all
from the one alias table in :mod:`guard.semconv`, so spans of other instrumentations count too.

Spans that are neither ours nor GenAI model calls (HTTP, DB, framework internals) are skipped
after one pass over their attributes and cost no allocation beyond that pass. A span whose
counters are negative, NaN or of the wrong type is *rejected* (reported back through OTLP
``partial_success``), never half-applied.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from guard.bounds import MAX_COST_USD_PER_SPAN, MAX_COUNTER, MAX_ID_CHARS
from guard.semconv import AGGREGATE_OPERATIONS, MODEL_OPERATIONS, USAGE_KEYS

__all__ = [
    "ACTION_FP",
    "AGENT",
    "ATTEMPTS",
    "CACHED",
    "COST",
    "FOREIGN",
    "IN",
    "KIND",
    "KIND_MODEL",
    "KIND_RUN",
    "KIND_STEP",
    "KIND_TOOL",
    "MODEL",
    "OUT",
    "PARENT_RUN",
    "PARENT_SPAN_ID",
    "PROGRESS",
    "REASONING",
    "RESP_ID",
    "RESULT_HASH",
    "RUN_ID",
    "SEQ",
    "SPAN_ID",
    "STATE_HASH",
    "STEP_INDEX",
    "STOP_REASON",
    "STOP_STATUS",
    "TENANT",
    "TOOL_NAME",
    "TRACE_ID",
    "Decoded",
    "Observation",
    "decode_request",
    "decode_spans",
]

KIND_RUN = 1  # the run span (``invoke_agent {agent}``) ended
KIND_STEP = 2  # a ``guard.step`` span ended
KIND_MODEL = 3  # a model call (ours or a foreign GenAI span)
KIND_TOOL = 4  # a tool call (``execute_tool {tool}``)

_MAX_ID_CHARS = MAX_ID_CHARS  # run ids, tenants, hashes: anything longer is not ours
_MAX_COUNTER = MAX_COUNTER  # 1e12 tokens in one call is an attack or a bug, not usage
_MAX_COST = MAX_COST_USD_PER_SPAN  # per span: any sum of them stays far from float overflow

# Observation layout: one flat list per span (a list copy is far cheaper than an object with
# thirty attributes). Indices 0..25 are attribute slots, 26..30 span fields, 31 spare, 32 the
# ``guard.seq`` attribute (added after the spare so the other indices stay where they were).
(
    RUN_ID,
    PARENT_RUN,
    TENANT,
    OP,
    AGENT,
    MODEL,
    RESP_MODEL,
    IN,
    OUT,
    CACHED,
    REASONING,
    COST,
    RESP_ID,
    STEP_INDEX,
    PROGRESS,
    STATE_HASH,
    ACTION_FP,
    RESULT_HASH,
    ATTEMPTS,
    TOOL_NAME,
    ERROR,
    STOP_STATUS,
    STOP_REASON,
    USAGE_STEPS,
    USAGE_TOOLS,
    CACHE_CREATION,
    KIND,
    FOREIGN,
    TRACE_ID,
    SPAN_ID,
    PARENT_SPAN_ID,
) = range(31)
# One more slot, always None: the fast decoder (_rawdecode) writes the None of an attribute
# it skips there, one store instead of a test per attribute. Nothing else reads it.
_SPARE = 31
# guard.seq: the record number of a counted SDK span within its run (an int >= 0, bounded by
# _MAX_COUNTER like every counter); see RunStarted.span_seq.
SEQ = 32
_NSLOTS = 33
_TEMPLATE = [None] * _NSLOTS
# private aliases used below
_RUN_ID, _PARENT_RUN, _TENANT, _OP, _AGENT, _MODEL, _RESP_MODEL = range(7)
_IN, _OUT, _CACHED, _REASONING, _COST, _RESP_ID, _STEP_INDEX, _PROGRESS = range(7, 15)
_STATE_HASH, _ACTION_FP, _RESULT_HASH, _ATTEMPTS, _TOOL_NAME, _ERROR = range(15, 21)
_STOP_STATUS, _STOP_REASON, _USAGE_STEPS, _USAGE_TOOLS, _CACHE_CREATION = range(21, 26)

_STR, _INT, _FLOAT, _BOOL, _HEX = 0, 1, 2, 3, 4
_HEXCHARS = frozenset("0123456789abcdefABCDEF")

# The alias table's fields this decoder reads -> (slot, type); every spelling of a field in
# guard.semconv.USAGE_ATTRIBUTES shares its slot. Built once at import (so is _rawdecode's
# canonical-head table, from _KEYS): the per-span path is one dict probe per attribute.
_USAGE_SLOTS: dict[str, tuple[int, int]] = {
    "operation": (_OP, _STR),
    "model": (_MODEL, _STR),
    "response_model": (_RESP_MODEL, _STR),
    "input_tokens": (_IN, _INT),
    "output_tokens": (_OUT, _INT),
    "cache_read_tokens": (_CACHED, _INT),
    "cache_write_tokens": (_CACHE_CREATION, _INT),
    "reasoning_tokens": (_REASONING, _INT),
    "response_id": (_RESP_ID, _STR),
    "tool_name": (_TOOL_NAME, _STR),
}
# key -> (slot, type): our own guard.* attributes, then the alias table.
_KEYS: dict[str, tuple[int, int]] = {
    "guard.run.id": (_RUN_ID, _STR),
    "guard.parent_run.id": (_PARENT_RUN, _STR),
    "guard.tenant": (_TENANT, _STR),
    "gen_ai.agent.name": (_AGENT, _STR),
    "guard.cost.usd": (_COST, _FLOAT),
    "guard.step.index": (_STEP_INDEX, _INT),
    "guard.progress": (_PROGRESS, _BOOL),
    "guard.state.hash": (_STATE_HASH, _STR),  # only compared, never stored
    "guard.action.fingerprint": (_ACTION_FP, _HEX),  # stored: must be a digest
    "guard.result.hash": (_RESULT_HASH, _STR),  # only compared, never stored
    "guard.tool.attempts": (_ATTEMPTS, _INT),
    "error.type": (_ERROR, _STR),
    "guard.stop.status": (_STOP_STATUS, _STR),
    "guard.stop.reason": (_STOP_REASON, _STR),
    "guard.usage.steps": (_USAGE_STEPS, _INT),
    "guard.usage.tool_calls": (_USAGE_TOOLS, _INT),
    "guard.seq": (SEQ, _INT),
}
_KEYS.update(
    (key, _USAGE_SLOTS[field]) for key, field in USAGE_KEYS.items() if field in _USAGE_SLOTS
)
_KEYS_GET = _KEYS.get

_MODEL_OPS = MODEL_OPERATIONS
# Foreign spans with these operations aggregate their children: never count them as a call.
_NOT_A_CALL = AGGREGATE_OPERATIONS


_FIELDS = {
    "run_id": RUN_ID,
    "parent_run_id": PARENT_RUN,
    "tenant": TENANT,
    "operation": OP,
    "agent": AGENT,
    "model": MODEL,
    "input_tokens": IN,
    "output_tokens": OUT,
    "cached_tokens": CACHED,
    "reasoning_tokens": REASONING,
    "cost_usd": COST,
    "response_id": RESP_ID,
    "step_index": STEP_INDEX,
    "progress": PROGRESS,
    "state_hash": STATE_HASH,
    "action_fp": ACTION_FP,
    "result_hash": RESULT_HASH,
    "attempts": ATTEMPTS,
    "tool_name": TOOL_NAME,
    "error": ERROR,
    "stop_status": STOP_STATUS,
    "stop_reason": STOP_REASON,
    "total_steps": USAGE_STEPS,
    "total_tool_calls": USAGE_TOOLS,
    "kind": KIND,
    "foreign": FOREIGN,
    "trace_id": TRACE_ID,
    "span_id": SPAN_ID,
    "parent_span_id": PARENT_SPAN_ID,
    "seq": SEQ,
}


class Observation(list):
    """What one span means for a guarded run: a flat list indexed by the constants above.

    The hot path indexes it (``o[IN]``); everyone else reads named properties
    (``o.input_tokens``). Unset attributes are ``None``; counters of model spans are 0.
    ``span_id`` / ``parent_span_id`` are read for model calls only (their one use).
    """

    __slots__ = ()

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={self[i]!r}" for k, i in _FIELDS.items() if self[i] is not None)
        return f"Observation({fields})"


for _name, _index in _FIELDS.items():
    setattr(Observation, _name, property(lambda self, _i=_index: self[_i]))
del _name, _index


class Decoded:
    """The result of decoding one request: observations in arrival order plus rejections."""

    __slots__ = ("errors", "observations", "rejected", "spans")

    def __init__(self) -> None:
        self.observations: list[Observation] = []
        self.rejected = 0  # spans refused (bad counters, oversized ids)
        self.errors: list[str] = []  # first few reasons, with the numbers
        self.spans = 0  # spans seen in total

    def reject(self, span_name: str, reason: object) -> None:
        """Count a refused span; the first few reasons are kept for the response."""
        self.rejected += 1
        if len(self.errors) < 5:
            self.errors.append(f"span {span_name[:64]!r}: {reason}")


class _Bad(Exception):
    pass


def _value(v, typ: int):
    which = v.WhichOneof("value")
    if typ == _HEX:  # fingerprints: hex digests (HMAC), never raw text
        if which != "string_value":
            raise _Bad(f"expected a hex fingerprint, got {which}")
        s = v.string_value
        if not 0 < len(s) <= 64 or not _HEXCHARS.issuperset(s):
            raise _Bad(f"fingerprint {s[:40]!r} is not 1..64 hex characters")
        return s
    if typ == _STR:
        if which != "string_value":
            raise _Bad(f"expected a string, got {which}")
        s = v.string_value
        if len(s) > _MAX_ID_CHARS:
            raise _Bad(f"string of {len(s)} chars exceeds {_MAX_ID_CHARS}")
        return s
    if typ == _INT:
        if which == "int_value":
            n = v.int_value
        elif which == "double_value":
            d = v.double_value
            if not math.isfinite(d) or d != int(d):
                raise _Bad(f"expected an integer, got {d!r}")
            n = int(d)
        elif which == "string_value" and v.string_value.isdigit():
            n = int(v.string_value)
        else:
            raise _Bad(f"expected an integer, got {which}")
        if n < 0 or n > _MAX_COUNTER:
            raise _Bad(f"counter {n} out of range [0, {_MAX_COUNTER}]")
        return n
    if typ == _FLOAT:
        if which == "double_value":
            d = v.double_value
        elif which == "int_value":
            d = float(v.int_value)
        else:
            raise _Bad(f"expected a number, got {which}")
        if not math.isfinite(d) or d < 0:
            raise _Bad(f"cost {d!r} must be finite and >= 0")
        if d > _MAX_COST:
            raise _Bad(f"cost {d!r} exceeds {_MAX_COST:g} USD per span")
        return d
    if which == "bool_value":
        return v.bool_value
    raise _Bad(f"expected a bool, got {which}")


def _kv_slot(kv: Any) -> tuple[int, Any] | None:
    """The reference reading of one ``KeyValue`` message: (slot, value), or None if the key
    is not one we read. Raises ``_Bad`` like the loop in :func:`decode_spans`."""
    hit = _KEYS_GET(kv.key)
    if hit is None:
        return None
    return hit[0], _value(kv.value, hit[1])


def _observe(span, o: Observation) -> Observation | None:
    run_id = o[_RUN_ID]
    op = o[_OP]
    name = span.name
    if run_id:
        if name == "guard.step":
            kind = KIND_STEP
        elif op == "invoke_agent" or name.startswith("invoke_agent"):
            kind = KIND_RUN
        elif op == "execute_tool" or name.startswith("execute_tool"):
            kind = KIND_TOOL
            if o[_TOOL_NAME] is None and name.startswith("execute_tool "):
                o[_TOOL_NAME] = name[13:]
            # STATUS_CODE_ERROR; HasField first: most spans carry no status, and reading
            # one allocates a wrapper
            if span.HasField("status") and span.status.code == 2:
                o[_ERROR] = o[_ERROR] or "error"
        elif o[_IN] is not None or o[_OUT] is not None or op in _MODEL_OPS:
            kind = KIND_MODEL
        else:
            return None
        o[FOREIGN] = False
    elif (o[_IN] is not None or o[_OUT] is not None) and op not in _NOT_A_CALL:
        kind = KIND_MODEL
        o[FOREIGN] = True
    else:
        return None
    if kind == KIND_MODEL:
        if o[_MODEL] is None:
            o[_MODEL] = o[_RESP_MODEL] or ""
        inp = o[_IN] or 0
        o[_IN] = inp
        o[_OUT] = o[_OUT] or 0
        cached = o[_CACHED] or 0
        o[_CACHED] = cached
        o[_REASONING] = o[_REASONING] or 0
        if cached > inp and run_id:
            raise _Bad(f"gen_ai.usage.cache_read.input_tokens {cached} exceeds input_tokens {inp}")
        # span ids only serve to count each model call once (SeenCalls); other kinds skip
        # the two reads (each allocates a bytes object)
        o[SPAN_ID] = span.span_id
        o[PARENT_SPAN_ID] = span.parent_span_id
    o[KIND] = kind
    o[TRACE_ID] = span.trace_id
    return o


def decode_spans(spans: Sequence, out: Decoded | None = None) -> Decoded:
    """Decode a sequence of OTLP ``Span`` messages into ``out`` and return it."""
    out = out if out is not None else Decoded()
    append = out.observations.append
    get = _KEYS_GET
    template = _TEMPLATE
    hexchars = _HEXCHARS.issuperset
    out.spans += len(spans)
    for span in spans:
        o = None
        try:
            for kv in span.attributes:
                hit = get(kv.key)
                if hit is None:
                    continue
                if o is None:
                    o = Observation(template)
                slot, typ = hit  # two spellings on one span: the last one wins
                v = kv.value
                # Fast paths read the expected field directly; a zero/empty/odd value falls
                # through to _value, which checks the oneof and says what is wrong.
                if typ == _INT:
                    n = v.int_value
                    o[slot] = n if 0 < n <= _MAX_COUNTER else _value(v, typ)
                elif typ == _STR:
                    x = v.string_value
                    o[slot] = x if x and len(x) <= _MAX_ID_CHARS else _value(v, typ)
                elif typ == _HEX:
                    x = v.string_value
                    ok = x and len(x) <= 64 and hexchars(x)
                    o[slot] = x if ok else _value(v, typ)
                elif typ == _FLOAT:
                    d = v.double_value
                    o[slot] = d if 0.0 < d <= _MAX_COST else _value(v, typ)
                else:
                    o[slot] = True if v.bool_value else _value(v, typ)
            if o is None:
                continue  # no attribute we care about: not ours, not GenAI
            o = _observe(span, o)
        except _Bad as exc:
            out.reject(span.name, exc)
            continue
        if o is not None:
            append(o)
    return out


def decode_request(request) -> Decoded:
    """Decode every span of an ``ExportTraceServiceRequest`` in arrival order.

    Goes through the server's fast path (``_rawdecode``), which yields exactly what
    :func:`decode_spans` yields; see the differential test in tests/server/test_decode.py.
    """
    from guard.server._rawdecode import decode_payload

    return decode_payload(request.SerializeToString())
