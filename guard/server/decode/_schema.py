"""What the guard reads from a span: the observation layout, the key table, the decode result.

The one schema both span decoders import (the pure-Python reference in ``_pydecode`` and the
native one in ``_nativedecode``); nothing here decodes. An :class:`Observation` is one flat
list per span, indexed by the slot constants below (a list copy is far cheaper than an object
with thirty attributes); the span path indexes it (``o[IN]``), everyone else reads named
properties (``o.input_tokens``).

The key table (:data:`KEYS`) maps every attribute the guard reads to its slot and type: our
own ``guard.*`` attributes and every usage spelling of :data:`guard.semconv.USAGE_KEYS`, so
spans of other instrumentations count too.
"""

from __future__ import annotations

from operator import itemgetter

from guard import semconv as sc
from guard.bounds import MAX_COST_USD_PER_SPAN, MAX_COUNTER, MAX_ID_CHARS

__all__ = [
    "ACTION_FP",
    "AGENT",
    "AGGREGATE_OPS",
    "ATTEMPTS",
    "BOOL",
    "CACHED",
    "CACHE_CREATION",
    "COST",
    "ERROR",
    "FLOAT",
    "FOREIGN",
    "HEX",
    "HEXCHARS",
    "IN",
    "INT",
    "KEYS",
    "KIND",
    "KIND_MODEL",
    "KIND_RUN",
    "KIND_STEP",
    "KIND_TOOL",
    "MAX_COST",
    "MAX_COUNTER",
    "MAX_ID_CHARS",
    "MODEL",
    "MODEL_OPS",
    "NSLOTS",
    "OP",
    "OUT",
    "PARENT_RUN",
    "PARENT_SPAN_ID",
    "PROGRESS",
    "REASONING",
    "RESP_ID",
    "RESP_MODEL",
    "RESULT_HASH",
    "RUN_ID",
    "SEQ",
    "SLOTS",
    "SPAN_ID",
    "STATE_HASH",
    "STEP_INDEX",
    "STOP_REASON",
    "STOP_STATUS",
    "STR",
    "TEMPLATE",
    "TENANT",
    "TOOL_NAME",
    "TRACE_ID",
    "USAGE_SLOTS",
    "USAGE_STEPS",
    "USAGE_TOOLS",
    "BadSpan",
    "Decoded",
    "Observation",
]

KIND_RUN = 1  # the run span (``invoke_agent {agent}``) ended
KIND_STEP = 2  # a ``guard.step`` span ended
KIND_MODEL = 3  # a model call (ours or a foreign GenAI span)
KIND_TOOL = 4  # a tool call (``execute_tool {tool}``)

# -- the observation layout: attribute slots, then span fields ------------------------------
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
    # guard.seq: the record number of a counted SDK span within its run (see
    # RunStarted.span_seq)
    SEQ,
    # span fields: the kind (KIND_*), whether the span is not ours (a GenAI span of another
    # instrumentation), its trace id, and for model calls its span and parent span ids
    KIND,
    FOREIGN,
    TRACE_ID,
    SPAN_ID,
    PARENT_SPAN_ID,
) = range(32)
NSLOTS = 32
TEMPLATE: list[None] = [None] * NSLOTS

# value types of the key table
STR, INT, FLOAT, BOOL, HEX = 0, 1, 2, 3, 4
HEXCHARS = frozenset("0123456789abcdefABCDEF")

MAX_ID_CHARS = MAX_ID_CHARS  # run ids, tenants, hashes: anything longer is not ours
MAX_COUNTER = MAX_COUNTER  # 1e12 tokens in one call is an attack or a bug, not usage
MAX_COST = MAX_COST_USD_PER_SPAN  # per span: any sum of them stays far from float overflow

# The alias table's fields the guard reads -> (slot, type); every spelling of a field in
# guard.semconv.USAGE_ATTRIBUTES shares its slot.
USAGE_SLOTS: dict[str, tuple[int, int]] = {
    "operation": (OP, STR),
    "model": (MODEL, STR),
    "response_model": (RESP_MODEL, STR),
    "input_tokens": (IN, INT),
    "output_tokens": (OUT, INT),
    "cache_read_tokens": (CACHED, INT),
    "cache_write_tokens": (CACHE_CREATION, INT),
    "reasoning_tokens": (REASONING, INT),
    "response_id": (RESP_ID, STR),
    "tool_name": (TOOL_NAME, STR),
}
# key -> (slot, type): the names the SDK emits (guard.semconv's "emitted by the SDK" block),
# then every spelling of the alias table.
KEYS: dict[str, tuple[int, int]] = {
    sc.RUN_ID: (RUN_ID, STR),
    sc.PARENT_RUN_ID: (PARENT_RUN, STR),
    sc.TENANT: (TENANT, STR),
    sc.AGENT_NAME: (AGENT, STR),
    sc.COST_USD: (COST, FLOAT),
    sc.STEP_INDEX: (STEP_INDEX, INT),
    sc.PROGRESS: (PROGRESS, BOOL),
    sc.STATE_HASH: (STATE_HASH, STR),  # only compared, never stored
    sc.ACTION_FP: (ACTION_FP, HEX),  # stored: must be a digest
    sc.RESULT_HASH: (RESULT_HASH, STR),  # only compared, never stored
    sc.TOOL_ATTEMPTS: (ATTEMPTS, INT),
    sc.ERROR_TYPE: (ERROR, STR),
    sc.STOP_STATUS: (STOP_STATUS, STR),
    sc.STOP_REASON: (STOP_REASON, STR),
    sc.USAGE_STEPS: (USAGE_STEPS, INT),
    sc.USAGE_TOOL_CALLS: (USAGE_TOOLS, INT),
    sc.SEQ: (SEQ, INT),
}
KEYS.update((key, USAGE_SLOTS[f]) for key, f in sc.USAGE_KEYS.items() if f in USAGE_SLOTS)

MODEL_OPS = sc.MODEL_OPERATIONS
# Foreign spans with these operations aggregate their children: never count them as a call.
AGGREGATE_OPS = sc.AGGREGATE_OPERATIONS

# property name -> slot, for Observation's named reads (and its repr)
SLOTS: dict[str, int] = {
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
    "seq": SEQ,
    "kind": KIND,
    "foreign": FOREIGN,
    "trace_id": TRACE_ID,
    "span_id": SPAN_ID,
    "parent_span_id": PARENT_SPAN_ID,
}


class Observation(list):
    """What one span means for a guarded run: a flat list indexed by the slot constants.

    Unset attributes are ``None``; the counters of model spans are 0 when unset.
    ``span_id`` / ``parent_span_id`` are read for model calls only (their one use).
    """

    __slots__ = ()

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={self[i]!r}" for k, i in SLOTS.items() if self[i] is not None)
        return f"Observation({fields})"


for _name, _index in SLOTS.items():
    setattr(Observation, _name, property(itemgetter(_index)))
del _name, _index


class Decoded:
    """The result of decoding (a slice of) one request: observations in arrival order plus
    rejections."""

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

    def extend(self, other: Decoded) -> None:
        """Append another slice of the same request."""
        self.observations.extend(other.observations)
        self.spans += other.spans
        self.rejected += other.rejected
        self.errors.extend(other.errors[: max(0, 5 - len(self.errors))])


class BadSpan(Exception):
    """A span the guard refuses (a bad counter, an oversized id): reported, never applied."""
