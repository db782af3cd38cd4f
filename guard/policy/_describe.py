"""Every key of the policy file, described from the settings objects (for the documentation).

:func:`describe_settings` walks the dataclasses the policy file is validated into
(:class:`~guard.policy.Limits`, :class:`~guard.policy.GuardSettings`, ...): each field gives a
key with its type and default; :data:`_DOCS` adds what the code cannot say by itself, the
description, the unit and the validator's bounds. The documentation site renders the policy
file reference from this, and ``tests/test_docs.py`` fails when a field has no entry here, an
entry names no field, or a stated bound disagrees with what :meth:`PolicyConfig.from_dict`
accepts.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, replace
from typing import Any

from guard.policy._config import AuthConfig, GuardSettings, StoreSettings
from guard.policy._parse import MAX_LOOP_WINDOW, MAX_UNCHANGED_POLLS
from guard.policy._prices import DEFAULT_PRICE_BOOK, ModelPrice, PriceBook
from guard.policy._rolling import ROLLING_METRICS, RollingLimit, TenantLimits
from guard.policy._telemetry import MAX_TOP_TENANTS, MetricsSettings
from guard.policy._types import Limits, LoopSettings

__all__ = ["Doc", "Key", "Section", "describe_settings"]

REQUIRED: Any = MISSING  # the default of a key that must be given


@dataclass(frozen=True)
class Doc:
    """What a key means and which values the validator takes (beyond its type)."""

    text: str
    unit: str = ""
    minimum: float | None = None
    exclusive: bool = False  # the minimum itself is refused
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    rule: str = ""  # a constraint in words that the bounds above cannot say
    type: str = ""  # the key's type in words, when the annotation does not say it well
    example: Any = None  # a value for the examples, where the default shows nothing


@dataclass(frozen=True)
class Key:
    name: str
    type: str  # in YAML's words: integer, number, boolean, string, list of ..., mapping
    nullable: bool
    default: Any  # REQUIRED when the key must be given
    doc: Doc

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True)
class Section:
    path: str  # "runs", "tenants.<tenant>", "tenants.<tenant>.rolling[]"
    source: type  # the dataclass its keys are the fields of
    text: str
    keys: tuple[Key, ...]


_DOCS: dict[type, dict[str, Doc]] = {
    Limits: {
        "max_steps": Doc(
            "Steps (``guard.step`` blocks, one decision iteration each) a run may take; a step "
            "is refused once the count has reached it.",
            unit="steps",
            minimum=1,
        ),
        "max_tool_calls": Doc("Tool calls a run may make.", unit="tool calls", minimum=1),
        "max_model_calls": Doc(
            "Model calls a run may make (counted like steps: the stop reason is max_steps).",
            unit="model calls",
            minimum=1,
        ),
        "max_tokens": Doc(
            "Input plus output tokens a run may use (cached input included).",
            unit="tokens",
            minimum=1,
        ),
        "max_cost_usd": Doc(
            "Spend of a run, priced from the price book. Usage of an unpriced model is never "
            "counted as free, and never trips this limit.",
            minimum=0,
            exclusive=True,
        ),
        "deadline_s": Doc(
            "Wall time of the whole run, on a monotonic clock.", minimum=0, exclusive=True
        ),
        "reserve_tokens": Doc(
            "Held back from ``max_tokens`` for the final answer: the soft thresholds and the "
            "forecast count it as spent.",
            unit="tokens",
            minimum=1,
            rule="below max_tokens",
        ),
        "reserve_s": Doc(
            "Held back from ``deadline_s`` for the final answer.",
            minimum=0,
            exclusive=True,
            rule="below deadline_s",
        ),
        "soft_thresholds": Doc(
            "Fractions of any limit at which the run is told to ``warn`` (stop exploring) and "
            "then to ``wrap_up`` (answer now). An empty list sends neither.",
            unit="fraction of each limit",
            minimum=0,
            exclusive=True,
            maximum=1,
            rule="at most two; the first not above the second",
        ),
        "pause_freezes_deadline": Doc(
            "``true``: time a run spends paused (waiting for an approval) does not count "
            "toward ``deadline_s``. Holds only when both the policy and the run allow it."
        ),
        "timeout_margin_s": Doc(
            "``run.timeout()`` reaches zero this long before the deadline, so the code has "
            "time to answer.",
            minimum=0,
        ),
        "implicit_estimates": Doc(
            "A step or paid tool call that reserves nothing itself holds the run's mean cost "
            "and tokens per step (per call of that tool) while it runs. A switch, not a "
            "limit: ``false`` on either side turns it off."
        ),
    },
    LoopSettings: {
        "window": Doc(
            "Tool calls remembered per run for loop detection.",
            minimum=2,
            maximum=MAX_LOOP_WINDOW,
        ),
        "repeat_threshold": Doc(
            "The same call (tool and canonical arguments) this many times within the window, "
            "with nothing new learnt, is a loop (loop_detected).",
            minimum=2,
            maximum=MAX_LOOP_WINDOW,
            rule="not above window",
        ),
        "no_progress_steps": Doc(
            "Steps in a row without progress (an unchanged state and no new tool result) "
            "end the run (no_progress).",
            minimum=2,
            maximum=MAX_LOOP_WINDOW,
        ),
        "ignore_fields": Doc(
            "Tool-argument fields left out when calls are compared, such as pagination "
            "cursors and request ids."
        ),
        "poll_tools": Doc(
            "Tools that are polls (a job status checked until it changes). Their calls are "
            "never repeats; ``max_unchanged_polls`` judges them instead.",
            example=["job_status"],
        ),
        "max_unchanged_polls": Doc(
            "The same poll answering the same result this many times in a row is a loop; "
            "``null``: never.",
            minimum=2,
            maximum=MAX_UNCHANGED_POLLS,
        ),
    },
    TenantLimits: {
        "max_concurrent_runs": Doc(
            "Live runs of the tenant at once; a run over it is denied at its start.",
            unit="runs",
            minimum=1,
            example=20,
        ),
        "rolling": Doc(
            "Rolling limits over sliding windows (the keys below). Reaching one stops the "
            "tenant's live runs and denies new ones until the window has room again.",
            type="list of rolling limits",
        ),
    },
    RollingLimit: {
        "metric": Doc(
            "What the window counts; ``runs`` counts admissions.",
            choices=ROLLING_METRICS,
            example="cost_usd",
        ),
        "limit": Doc(
            "The most of ``metric`` per window (USD for ``cost_usd``).",
            minimum=0,
            exclusive=True,
            example=5.0,
        ),
        "window_s": Doc(
            "The window's length. It is cut into 60 buckets, so it covers between 59/60 of "
            "this and all of it.",
            minimum=0,
            exclusive=True,
            example=3600,
        ),
    },
    AuthConfig: {
        "admin_token_env": Doc(
            "Environment variable holding the admin token (may do everything, ``cancel "
            "--all`` included). Tokens are never written in the file.",
            example="OTEL_GUARD_ADMIN_TOKEN",
        ),
        "tenants": Doc(
            "Tenant name to ``{token_env: VARIABLE}`` (or the variable name alone): the "
            "environment variable holding that tenant's token. A tenant token sees and "
            "cancels only its tenant's runs.",
            type="mapping of tenant to token",
            example={"acme": {"token_env": "ACME_GUARD_TOKEN"}},
        ),
    },
    PriceBook: {
        "version": Doc(
            "Name of this price book, recorded with every run (``price_book_version``).",
            type="string",
            example="2026-11",
        ),
        "models": Doc(
            "Model name to its prices. A model is found by its exact name, then by the "
            "longest listed prefix (``gpt-4.1`` prices ``gpt-4.1-2025-04-14``); an unlisted "
            "model is unpriced.",
            type="mapping of model to prices",
        ),
    },
    ModelPrice: {
        "input": Doc("Input tokens.", minimum=0, example=2.0),
        "output": Doc("Output tokens.", minimum=0, example=8.0),
        "cached_input": Doc(
            "Cached input tokens; ``null``: billed as ordinary input.", minimum=0, example=0.5
        ),
    },
    GuardSettings: {
        "agent_grace_s": Doc(
            "A disconnected agent's runs are kept this long for it to come back, then "
            "recorded as agent_lost.",
            minimum=0,
        ),
        "max_tracked_runs": Doc(
            "Runs the guard tracks at once, shared out per tenant (this over the tenants "
            "tracked). At the cap a new run takes the place of a run known only from its "
            "spans; a run with an agent is never displaced; with no room it is refused.",
            unit="runs",
            minimum=1,
        ),
        "max_queued_span_bytes": Doc(
            "Span requests waiting for the applier. A tenant past its share (this over the "
            "tenants with spans queued) is shed with a retry delay (RESOURCE_EXHAUSTED, or "
            "HTTP 429), the others are not.",
            minimum=65536,
        ),
        "max_new_span_runs_per_s": Doc(
            "Per tenant: runs made from spans alone (no RunStarted). Past it such spans are "
            "refused in the OTLP partial_success; ``null``: no limit.",
            minimum=1,
        ),
        "heartbeat_interval_ms": Doc(
            "Heartbeat interval the guard gives every agent in its Welcome.", minimum=1
        ),
        "admit_timeout_ms": Doc(
            "Validated and kept, but read by no part of the guard: how long a run start waits "
            "for the guard is the SDK setting of the same name.",
            minimum=1,
        ),
        "allowance_fraction": Doc(
            "No effect: a tenant allowance grant is exactly what a call asks for. Still "
            "accepted so that older policy files load.",
            unit="fraction",
            minimum=0,
            exclusive=True,
            maximum=1,
        ),
        "allowance_ttl_s": Doc(
            "A tenant allowance grant holds this long unless renewed; the guard renews the "
            "grants of live runs at half of it.",
            minimum=0,
            exclusive=True,
        ),
        "fail_closed": Doc(
            "With ``serve --redis``: while Redis is unreachable, deny new runs (reason "
            "error) instead of enforcing this replica's own windows. Live runs go on."
        ),
        "slot_lease_s": Doc(
            "With ``serve --redis``: a run's concurrency slot lapses this long after its "
            "replica last renewed it (renewed every third of that), so a dead replica's runs "
            "free their slots.",
            minimum=0.3,
        ),
        "redis_timeout_ms": Doc(
            "With ``serve --redis``: a Redis call (connect included) slower than this counts "
            "as Redis unreachable (fail-open, or ``fail_closed``).",
            minimum=1,
        ),
        "metrics": Doc("The guard's own metrics (the keys below).", type="mapping"),
    },
    MetricsSettings: {
        "listen": Doc(
            "``HOST:PORT`` of a Prometheus scrape endpoint (``/metrics``); ``null``: none. "
            "``serve --metrics-listen`` overrides it.",
            rule="HOST:PORT, port 0-65535",
            example="127.0.0.1:9464",
        ),
        "otlp_endpoint": Doc(
            "OTLP/gRPC metrics receiver, such as a collector; ``null``: none. "
            "``serve --metrics-otlp`` overrides it.",
            rule="starts with http:// (plaintext) or https:// (TLS)",
            example="http://otel-collector:4317",
        ),
        "otlp_interval_s": Doc("Interval of the OTLP metrics export.", minimum=0, exclusive=True),
        "top_tenants": Doc(
            "Live runs are labelled by tenant for the tenants with the most runs, the rest "
            'summed under ``tenant="(other)"``.',
            unit="tenants",
            minimum=0,
            maximum=MAX_TOP_TENANTS,
        ),
    },
    StoreSettings: {
        "retention_days": Doc(
            "Termination and decision records are kept this long (a ClickHouse TTL); "
            "``null``: forever.",
            minimum=1,
        ),
    },
}

# key name ending -> unit, when the Doc names none
_UNITS = (
    ("_runs_per_s", "runs per second"),
    ("_bytes", "bytes"),
    ("_usd", "USD"),
    ("_ms", "milliseconds"),
    ("_days", "days"),
    ("_s", "seconds"),
)
_PRICE_UNIT = "USD per 1M tokens"
_SCALARS = {"int": "integer", "float": "number", "bool": "boolean", "str": "string"}
_LISTS = {"tuple[str, ...]": "list of strings", "tuple[float, ...]": "list of numbers"}
# Fields that are sections of their own, or no key at all (a cache the book fills itself).
_NOT_KEYS = {(Limits, "loop"), (GuardSettings, "metrics"), (PriceBook, "_rates")}

# (path, dataclass, text): the sections in the order the reference lists them.
_SECTIONS: tuple[tuple[str, type, str], ...] = (
    ("runs", Limits, "The limits of every run; a preset or the decorator may only tighten them."),
    ("runs.loop", LoopSettings, "Loop and stagnation detection of every run."),
    (
        "tenants.<tenant>",
        TenantLimits,
        "Budgets of one tenant, shared by all its runs (fleet-wide with several replicas). "
        "A tenant not listed is unlimited.",
    ),
    (
        "tenants.<tenant>.rolling[]",
        RollingLimit,
        "One rolling limit: ``limit`` of ``metric`` per sliding ``window_s``.",
    ),
    (
        "auth",
        AuthConfig,
        "Bearer tokens of the admin and of each tenant, read from environment variables. "
        "Without this section every caller is an anonymous admin, and the guard refuses to "
        "listen on a non-loopback address (``serve --insecure-bind-any`` overrides that).",
    ),
    (
        "prices",
        PriceBook,
        "A versioned price book, in USD per 1M tokens. Without this section the built-in "
        f"book ``{DEFAULT_PRICE_BOOK.version}`` applies; a ``prices`` section replaces it whole.",
    ),
    ("prices.models.<model>", ModelPrice, "The prices of one model, in " + _PRICE_UNIT + "."),
    ("guard", GuardSettings, "How the guard service runs."),
    (
        "guard.metrics",
        MetricsSettings,
        "Where the guard exports its own metrics; off unless one of them is set.",
    ),
    ("store", StoreSettings, "The store of termination and decision records."),
)


def _type(annotation: str) -> tuple[str, bool]:
    """``"int | None"`` -> ("integer", True)."""
    parts = [p.strip() for p in str(annotation).split("|")]
    nullable = "None" in parts
    parts = [p for p in parts if p != "None"]
    words = [_SCALARS.get(p) or _LISTS.get(p) or p for p in parts]
    return " or ".join(words), nullable


def _unit(cls: type, name: str, doc: Doc) -> str:
    if doc.unit:
        return doc.unit
    if cls is ModelPrice:
        return _PRICE_UNIT
    return next((unit for end, unit in _UNITS if name.endswith(end)), "")


def describe_settings() -> tuple[Section, ...]:
    """Every section of the policy file with its keys, in the file's order."""
    out = []
    for path, cls, text in _SECTIONS:
        keys = []
        docs = _DOCS[cls]
        for f in fields(cls):
            if (cls, f.name) in _NOT_KEYS:
                continue
            doc = docs[f.name]  # a KeyError here: a new field needs an entry in _DOCS
            type_, nullable = _type(str(f.type))
            default = f.default if f.default is not MISSING else REQUIRED
            if f.default_factory is not MISSING:
                default = f.default_factory()
            default = list(default) if isinstance(default, tuple) else default
            doc = replace(doc, unit=_unit(cls, f.name, doc), type=doc.type or type_)
            keys.append(Key(f.name, doc.type, nullable, default, doc))
        out.append(Section(path, cls, text, tuple(keys)))
    return tuple(out)
