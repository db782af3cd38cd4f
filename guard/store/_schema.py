"""Versioned, idempotent schema migrations for database ``otel_guard`` (see guard/store/README.md).

Each migration is a list of ``IF NOT EXISTS`` statements, so a migration interrupted half-way
(or run by two guards at once against one server) can simply run again. Applied versions are
recorded in ``schema_migrations``. Retention is not a migration: it is a parameter of the
deployment, reconciled at every start with ``ALTER TABLE … MODIFY TTL``.
"""

from __future__ import annotations

import re
from typing import Any

from guard.errors import ConfigError

__all__ = [
    "DEAD_LETTER_COLUMNS",
    "DECISION_COLUMNS",
    "DEDUP_WINDOW",
    "MIGRATIONS",
    "RUN_COLUMNS",
    "migrate",
]

# How many recent insert blocks each table remembers for insert_deduplication_token. Plain
# (non-replicated) MergeTree deduplicates only when this is > 0 (the default is 0). The MV
# target needs it too: since ClickHouse 24.x a deduplicated source block is still pushed to
# the view and it is the *target* table that drops it. 10k blocks ≈ 3 h of 1 insert/s.
DEDUP_WINDOW = 10_000

RUN_COLUMNS: tuple[str, ...] = (
    "run_id", "parent_run_id", "tenant", "agent", "status", "reason", "message",
    "started_at", "ended_at", "elapsed_ms", "deadline_ms", "steps", "model_calls",
    "tool_calls", "tool_attempts", "input_tokens", "output_tokens", "reasoning_tokens",
    "cached_tokens", "cost_usd", "last_tool", "last_action_hash", "loop_hits",
    "partial_result", "recoverable", "price_book_version", "decided_by", "trace_id",
)  # fmt: skip

DECISION_COLUMNS: tuple[str, ...] = (
    "decided_at", "run_id", "tenant", "agent", "action", "reason", "detail", "utilisation",
    "metric", "command_id", "decided_by", "delivery_latency_ms", "guard_id",
)  # fmt: skip

DEAD_LETTER_COLUMNS: tuple[str, ...] = ("dead_at", "table", "token", "error", "row")

_DEDUP = f"non_replicated_deduplication_window = {DEDUP_WINDOW}"

_RUNS = """
CREATE TABLE IF NOT EXISTS {db}.runs (
    run_id             String,
    parent_run_id      Nullable(String),
    tenant             LowCardinality(String),
    agent              LowCardinality(String),
    status             LowCardinality(String),
    reason             LowCardinality(String),
    message            String CODEC(ZSTD(3)),
    started_at         DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    ended_at           DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    elapsed_ms         UInt64 CODEC(T64, ZSTD(1)),
    deadline_ms        Nullable(UInt64),
    steps              UInt32 CODEC(T64, ZSTD(1)),
    model_calls        UInt32 CODEC(T64, ZSTD(1)),
    tool_calls         UInt32 CODEC(T64, ZSTD(1)),
    tool_attempts      UInt32 CODEC(T64, ZSTD(1)),
    input_tokens       UInt64 CODEC(T64, ZSTD(1)),
    output_tokens      UInt64 CODEC(T64, ZSTD(1)),
    reasoning_tokens   UInt64 CODEC(T64, ZSTD(1)),
    cached_tokens      UInt64 CODEC(T64, ZSTD(1)),
    cost_usd           Nullable(Float64) CODEC(Gorilla, ZSTD(1)),
    last_tool          LowCardinality(Nullable(String)),
    last_action_hash   Nullable(String) CODEC(ZSTD(1)),
    loop_hits          UInt32 CODEC(T64, ZSTD(1)),
    partial_result     Bool,
    recoverable        Bool,
    price_book_version LowCardinality(String),
    decided_by         LowCardinality(String),
    trace_id           String CODEC(ZSTD(1)),
    inserted_at        DateTime64(3, 'UTC') DEFAULT now64(3),
    INDEX idx_run_id run_id TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_trace_id trace_id TYPE bloom_filter(0.01) GRANULARITY 1
)
ENGINE = ReplacingMergeTree(inserted_at)
PARTITION BY toYYYYMMDD(ended_at)
ORDER BY (tenant, agent, run_id)
SETTINGS {dedup}, ttl_only_drop_parts = 1
"""

_DECISIONS = """
CREATE TABLE IF NOT EXISTS {db}.decisions (
    decided_at          DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    run_id              String CODEC(ZSTD(1)),
    tenant              LowCardinality(String),
    agent               LowCardinality(String),
    action              LowCardinality(String),
    reason              LowCardinality(String),
    detail              String CODEC(ZSTD(3)),
    utilisation         Nullable(Float64),
    metric              LowCardinality(Nullable(String)),
    command_id          UInt64 CODEC(T64, ZSTD(1)),
    decided_by          LowCardinality(String),
    delivery_latency_ms Nullable(Float64),
    guard_id            LowCardinality(String),
    INDEX idx_run_id run_id TYPE bloom_filter(0.001) GRANULARITY 1
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(decided_at)
ORDER BY (tenant, action, reason, decided_at)
SETTINGS {dedup}, ttl_only_drop_parts = 1
"""

_Q = "quantiles(0.5, 0.95, 0.99)"
_STOP_REASONS = f"""
CREATE TABLE IF NOT EXISTS {{db}}.stop_reasons_1m (
    minute          DateTime('UTC'),
    tenant          LowCardinality(String),
    agent           LowCardinality(String),
    status          LowCardinality(String),
    reason          LowCardinality(String),
    runs            SimpleAggregateFunction(sum, UInt64),
    steps_sum       SimpleAggregateFunction(sum, UInt64),
    tool_calls_sum  SimpleAggregateFunction(sum, UInt64),
    input_tokens_sum  SimpleAggregateFunction(sum, UInt64),
    output_tokens_sum SimpleAggregateFunction(sum, UInt64),
    cost_usd_sum    SimpleAggregateFunction(sum, Float64),
    priced_runs     SimpleAggregateFunction(sum, UInt64),
    loop_hits_sum   SimpleAggregateFunction(sum, UInt64),
    steps_q         AggregateFunction({_Q}, UInt32),
    cost_usd_q      AggregateFunction({_Q}, Nullable(Float64)),
    elapsed_ms_q    AggregateFunction({_Q}, UInt64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (minute, tenant, agent, status, reason)
SETTINGS {{dedup}}, ttl_only_drop_parts = 1
"""

# Aliases differ from the source column names on purpose: `sum(steps) AS steps` makes the
# analyzer see an aggregate inside an aggregate (ILLEGAL_AGGREGATION).
_STOP_REASONS_MV = f"""
CREATE MATERIALIZED VIEW IF NOT EXISTS {{db}}.stop_reasons_1m_mv TO {{db}}.stop_reasons_1m AS
SELECT
    toStartOfMinute(ended_at) AS minute, tenant, agent, status, reason,
    count() AS runs,
    sum(toUInt64(steps)) AS steps_sum,
    sum(toUInt64(tool_calls)) AS tool_calls_sum,
    sum(input_tokens) AS input_tokens_sum,
    sum(output_tokens) AS output_tokens_sum,
    sum(ifNull(cost_usd, 0)) AS cost_usd_sum,
    countIf(cost_usd IS NOT NULL) AS priced_runs,
    sum(toUInt64(loop_hits)) AS loop_hits_sum,
    {_Q.replace("quantiles", "quantilesState")}(steps) AS steps_q,
    {_Q.replace("quantiles", "quantilesState")}(cost_usd) AS cost_usd_q,
    {_Q.replace("quantiles", "quantilesState")}(elapsed_ms) AS elapsed_ms_q
FROM {{db}}.runs
GROUP BY minute, tenant, agent, status, reason
"""

# Records ClickHouse refused as bad data (or that could not be turned into a row at all):
# the raw row text, the table it was meant for, the batch token and the error. Kept out of
# `runs` so that one bad record never blocks the ones behind it (see guard/store/README.md).
_DEAD_LETTER = """
CREATE TABLE IF NOT EXISTS {db}.dead_letter (
    dead_at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    `table` LowCardinality(String),
    token   String CODEC(ZSTD(1)),
    error   String CODEC(ZSTD(3)),
    row     String CODEC(ZSTD(3))
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(dead_at)
ORDER BY (`table`, dead_at)
SETTINGS {dedup}, ttl_only_drop_parts = 1
"""

# (version, name, statements). Append only: never edit an applied migration.
MIGRATIONS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (1, "runs", (_RUNS,)),
    (2, "decisions", (_DECISIONS,)),
    (3, "stop_reasons_1m", (_STOP_REASONS, _STOP_REASONS_MV)),
    (4, "dead_letter", (_DEAD_LETTER,)),
)

# The column each table's retention TTL counts from.
_TTL_COLUMNS = {
    "runs": "toDateTime(ended_at)",
    "decisions": "toDateTime(decided_at)",
    "stop_reasons_1m": "minute",
    "dead_letter": "toDateTime(dead_at)",
}


def migrate(
    client: Any, database: str, *, retention_days: int | None, upto: int | None = None
) -> list[int]:
    """Apply pending migrations and reconcile the retention TTL. Returns versions applied now.

    ``upto`` stops after that version (tests build a store of an older schema with it).
    """
    if retention_days is not None and (int(retention_days) != retention_days or retention_days < 1):
        raise ConfigError(
            f"must be a whole number of days >= 1, got {retention_days}",
            path="store.retention_days",
        )
    client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    client.command(
        f"CREATE TABLE IF NOT EXISTS {database}.schema_migrations ("
        " version UInt32, name String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3))"
        " ENGINE = ReplacingMergeTree ORDER BY version"
    )
    done = {
        row[0]
        for row in client.query(f"SELECT version FROM {database}.schema_migrations").result_rows
    }
    applied: list[int] = []
    for version, name, statements in MIGRATIONS:
        if version in done or (upto is not None and version > upto):
            continue
        for sql in statements:
            client.command(sql.format(db=database, dedup=_DEDUP))
        client.insert(
            f"{database}.schema_migrations", [[version, name]], column_names=["version", "name"]
        )
        applied.append(version)
    _reconcile_ttl(client, database, retention_days)
    return applied


def _reconcile_ttl(client: Any, database: str, retention_days: int | None) -> None:
    rows = client.query(
        "SELECT name, create_table_query FROM system.tables WHERE database = {db:String}",
        parameters={"db": database},
    ).result_rows
    current = {name: _ttl_days(sql) for name, sql in rows}
    for table, column in _TTL_COLUMNS.items():
        if current.get(table, "missing") == retention_days or table not in current:
            continue
        # materialize_ttl_after_modify=0: don't rewrite every part now; expired parts are
        # dropped whole by the next merge (ttl_only_drop_parts=1).
        if retention_days is None:
            client.command(f"ALTER TABLE {database}.{table} REMOVE TTL")
        else:
            client.command(
                f"ALTER TABLE {database}.{table} MODIFY TTL {column} + INTERVAL {int(retention_days)} DAY",
                settings={"materialize_ttl_after_modify": 0},
            )


_TTL_RE = re.compile(r"\bTTL\b.*?toIntervalDay\((\d+)\)", re.S)


def _ttl_days(create_sql: str) -> int | None:
    m = _TTL_RE.search(create_sql)
    return int(m.group(1)) if m else None
