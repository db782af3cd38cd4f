"""Pure translation layer: OTLP ``ExportTraceServiceRequest`` -> step observations.

No policy calls, no registry, no I/O: this module only reads spans and says what each one
means for a guarded run. It accepts the current GenAI semconv spellings and the previous
ones (``gen_ai.system``, ``gen_ai.usage.prompt_tokens`` / ``completion_tokens``, ...) plus the
OpenInference ``llm.token_count.*`` names, so spans from other instrumentations count too.

Spans that are neither ours nor GenAI model calls (HTTP, DB, framework internals) are skipped
after one pass over their attributes and cost no allocation beyond that pass. A span whose
counters are negative, NaN or of the wrong type is *rejected* (reported back through OTLP
``partial_success``), never half-applied.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = [
    "KIND_MODEL",
    "KIND_RUN",
    "KIND_STEP",
    "KIND_TOOL",
    "Decoded",
    "Observation",
    "decode_request",
    "decode_spans",
]

KIND_RUN = 1  # the run span (``invoke_agent {agent}``) ended
KIND_STEP = 2  # a ``guard.step`` span ended
KIND_MODEL = 3  # a model call (ours or a foreign GenAI span)
KIND_TOOL = 4  # a tool call (``execute_tool {tool}``)

_MAX_ID_CHARS = 256  # run ids, tenants, hashes: anything longer is not ours
_MAX_COUNTER = 1 << 40  # ~1e12 tokens in one call is an attack or a bug, not usage

# Attribute slots. Values land in a per-span list indexed by these numbers.
(
    _RUN_ID,
    _PARENT_RUN,
    _TENANT,
    _OP,
    _AGENT,
    _MODEL,
    _RESP_MODEL,
    _IN,
    _OUT,
    _CACHED,
    _REASONING,
    _COST,
    _RESP_ID,
    _STEP_INDEX,
    _PROGRESS,
    _STATE_HASH,
    _ACTION_FP,
    _RESULT_HASH,
    _ATTEMPTS,
    _TOOL_NAME,
    _ERROR,
    _STOP_STATUS,
    _STOP_REASON,
    _USAGE_STEPS,
    _USAGE_TOOLS,
    _CACHE_CREATION,
) = range(26)
_NSLOTS = 26

_STR, _INT, _FLOAT, _BOOL, _HEX = 0, 1, 2, 3, 4
_HEXCHARS = frozenset("0123456789abcdefABCDEF")

# key -> (slot, type). Several spellings share one slot; the first one seen on a span wins.
_KEYS: dict[str, tuple[int, int]] = {
    "guard.run.id": (_RUN_ID, _STR),
    "guard.parent_run.id": (_PARENT_RUN, _STR),
    "guard.tenant": (_TENANT, _STR),
    "gen_ai.operation.name": (_OP, _STR),
    "gen_ai.agent.name": (_AGENT, _STR),
    "gen_ai.request.model": (_MODEL, _STR),
    "llm.model_name": (_MODEL, _STR),  # OpenInference
    "gen_ai.response.model": (_RESP_MODEL, _STR),
    # input tokens (cached included): current, previous, OpenInference
    "gen_ai.usage.input_tokens": (_IN, _INT),
    "gen_ai.usage.prompt_tokens": (_IN, _INT),
    "llm.token_count.prompt": (_IN, _INT),
    # output tokens (reasoning included)
    "gen_ai.usage.output_tokens": (_OUT, _INT),
    "gen_ai.usage.completion_tokens": (_OUT, _INT),
    "llm.token_count.completion": (_OUT, _INT),
    # cache reads
    "gen_ai.usage.cache_read.input_tokens": (_CACHED, _INT),
    "gen_ai.usage.cache_read_input_tokens": (_CACHED, _INT),
    "llm.token_count.prompt_details.cache_read": (_CACHED, _INT),
    # cache writes (previous spelling): validated, already inside input_tokens
    "gen_ai.usage.cache_creation.input_tokens": (_CACHE_CREATION, _INT),
    "gen_ai.usage.cache_creation_input_tokens": (_CACHE_CREATION, _INT),
    # reasoning
    "gen_ai.usage.reasoning.output_tokens": (_REASONING, _INT),
    "gen_ai.usage.reasoning_tokens": (_REASONING, _INT),
    "guard.cost.usd": (_COST, _FLOAT),
    "gen_ai.response.id": (_RESP_ID, _STR),
    "guard.step.index": (_STEP_INDEX, _INT),
    "guard.progress": (_PROGRESS, _BOOL),
    "guard.state.hash": (_STATE_HASH, _HEX),
    "guard.action.fingerprint": (_ACTION_FP, _HEX),
    "guard.result.hash": (_RESULT_HASH, _HEX),
    "guard.tool.attempts": (_ATTEMPTS, _INT),
    "gen_ai.tool.name": (_TOOL_NAME, _STR),
    "error.type": (_ERROR, _STR),
    "guard.stop.status": (_STOP_STATUS, _STR),
    "guard.stop.reason": (_STOP_REASON, _STR),
    "guard.usage.steps": (_USAGE_STEPS, _INT),
    "guard.usage.tool_calls": (_USAGE_TOOLS, _INT),
}
_KEYS_GET = _KEYS.get

_MODEL_OPS = frozenset(
    {"chat", "text_completion", "generate_content", "embeddings", "completion", "responses"}
)
# Foreign spans with these operations aggregate their children: never count them as a call.
_NOT_A_CALL = frozenset({"invoke_agent", "create_agent", "execute_tool", "invoke_workflow"})


class Observation:
    """What one span means for a guarded run. Unset fields are ``None`` / 0 / ``""``."""

    __slots__ = (
        "action_fp",
        "agent",
        "attempts",
        "cached_tokens",
        "cost_usd",
        "error",
        "foreign",
        "input_tokens",
        "kind",
        "model",
        "output_tokens",
        "parent_run_id",
        "parent_span_id",
        "progress",
        "reasoning_tokens",
        "response_id",
        "result_hash",
        "run_id",
        "span_id",
        "state_hash",
        "step_index",
        "stop_reason",
        "stop_status",
        "tenant",
        "tool_name",
        "total_steps",
        "total_tool_calls",
        "trace_id",
    )

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"Observation({fields})"


class Decoded:
    """The result of decoding one request: observations in arrival order plus rejections."""

    __slots__ = ("errors", "observations", "rejected", "spans")

    def __init__(self) -> None:
        self.observations: list[Observation] = []
        self.rejected = 0  # spans refused (bad counters, oversized ids)
        self.errors: list[str] = []  # first few reasons, with the numbers
        self.spans = 0  # spans seen in total


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
        return d
    if which == "bool_value":
        return v.bool_value
    raise _Bad(f"expected a bool, got {which}")


def _observe(span, vals: list) -> Observation | None:
    run_id = vals[_RUN_ID]
    op = vals[_OP]
    name = span.name
    has_tokens = vals[_IN] is not None or vals[_OUT] is not None
    if run_id:
        if name == "guard.step":
            kind = KIND_STEP
        elif op == "invoke_agent" or name.startswith("invoke_agent"):
            kind = KIND_RUN
        elif op == "execute_tool" or name.startswith("execute_tool"):
            kind = KIND_TOOL
        elif has_tokens or op in _MODEL_OPS:
            kind = KIND_MODEL
        else:
            return None
        foreign = False
    elif has_tokens and op not in _NOT_A_CALL:
        kind = KIND_MODEL
        foreign = True
    else:
        return None
    o = Observation()
    o.kind = kind
    o.foreign = foreign
    o.run_id = run_id or ""
    o.trace_id = span.trace_id
    o.span_id = span.span_id
    o.parent_span_id = span.parent_span_id
    o.tenant = vals[_TENANT] or ""
    o.agent = vals[_AGENT] or ""
    o.parent_run_id = vals[_PARENT_RUN] or ""
    o.model = vals[_MODEL] or vals[_RESP_MODEL] or ""
    o.response_id = vals[_RESP_ID] or ""
    o.input_tokens = vals[_IN] or 0
    o.output_tokens = vals[_OUT] or 0
    o.cached_tokens = vals[_CACHED] or 0
    o.reasoning_tokens = vals[_REASONING] or 0
    o.cost_usd = vals[_COST]
    o.step_index = vals[_STEP_INDEX] or 0
    o.progress = vals[_PROGRESS]
    o.state_hash = vals[_STATE_HASH]
    o.action_fp = vals[_ACTION_FP]
    o.result_hash = vals[_RESULT_HASH]
    o.attempts = vals[_ATTEMPTS]
    o.tool_name = vals[_TOOL_NAME] or (name[13:] if name.startswith("execute_tool ") else "")
    o.error = vals[_ERROR] is not None or span.status.code == 2  # STATUS_CODE_ERROR
    o.stop_status = vals[_STOP_STATUS] or ""
    o.stop_reason = vals[_STOP_REASON] or ""
    o.total_steps = vals[_USAGE_STEPS]
    o.total_tool_calls = vals[_USAGE_TOOLS]
    if o.cached_tokens > o.input_tokens and kind == KIND_MODEL and not foreign:
        raise _Bad(
            f"gen_ai.usage.cache_read.input_tokens {o.cached_tokens} exceeds "
            f"input_tokens {o.input_tokens}"
        )
    return o


def decode_spans(spans: Iterable, out: Decoded | None = None) -> Decoded:
    """Decode OTLP ``Span`` messages (any iterable) into ``out`` and return it."""
    out = out if out is not None else Decoded()
    append = out.observations.append
    get = _KEYS_GET
    for span in spans:
        out.spans += 1
        vals = None
        try:
            for kv in span.attributes:
                hit = get(kv.key)
                if hit is None:
                    continue
                if vals is None:
                    vals = [None] * _NSLOTS
                slot, typ = hit
                if vals[slot] is None:
                    vals[slot] = _value(kv.value, typ)
            if vals is None:
                continue  # no attribute we care about: not ours, not GenAI
            obs = _observe(span, vals)
        except _Bad as exc:
            out.rejected += 1
            if len(out.errors) < 5:
                out.errors.append(f"span {span.name[:64]!r}: {exc}")
            continue
        if obs is not None:
            append(obs)
    return out


def decode_request(request) -> Decoded:
    """Decode every span of an ``ExportTraceServiceRequest`` in arrival order."""
    out = Decoded()
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            decode_spans(ss.spans, out)
    return out
