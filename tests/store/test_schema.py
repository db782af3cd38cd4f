"""Migrations, retention and DSNs on the real embedded engine."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from guard.errors import ConfigError, StoreError
from guard.store import open_store, parse_dsn
from guard.store._dsn import connect
from guard.store._schema import MIGRATIONS, migrate

from .conftest import outcome

TABLES = (
    "dead_letter",
    "decisions",
    "runs",
    "schema_migrations",
    "stop_reasons_1m",
    "stop_reasons_1m_mv",
)


def _schema(store) -> list[tuple]:
    return store.query(
        "SELECT name, engine, create_table_query FROM system.tables "
        "WHERE database = 'otel_guard' ORDER BY name"
    )


def test_migrations_twice_without_effect(tmp_path: Path) -> None:
    with open_store(None, data_dir=tmp_path) as s:
        first = _schema(s)
        versions = s.query(
            "SELECT version, name, applied_at FROM otel_guard.schema_migrations FINAL ORDER BY version"
        )
    assert [row[0] for row in first] == list(TABLES)
    assert [v[0] for v in versions] == [m[0] for m in MIGRATIONS]
    with open_store(None, data_dir=tmp_path) as s:  # second start: migrate runs again
        assert _schema(s) == first
        again = s.query(
            "SELECT version, name, applied_at FROM otel_guard.schema_migrations ORDER BY version"
        )
        assert again == versions  # no new rows, not even duplicates before a merge
        s.close()
    # and directly on one client, twice in a row
    client = connect(parse_dsn(None, data_dir=tmp_path))
    try:
        assert migrate(client, "otel_guard", retention_days=90) == []
        assert migrate(client, "otel_guard", retention_days=90) == []
    finally:
        client.close()


def test_fresh_database_applies_every_version(tmp_path: Path) -> None:
    client = connect(parse_dsn(f"chdb://{tmp_path}/ch?database=og_test", data_dir=tmp_path))
    try:
        assert migrate(client, "og_test", retention_days=None) == [1, 2, 3, 4]
        assert migrate(client, "og_test", retention_days=None) == []
    finally:
        client.close()


def _ttl(store, table: str) -> str:
    sql = store.query(
        "SELECT create_table_query FROM system.tables WHERE database = 'otel_guard' AND name = {t:String}",
        {"t": table},
    )[0][0]
    return sql[sql.find(" TTL ") :].split(" SETTINGS ")[0] if " TTL " in sql else ""


def test_retention_is_configurable(tmp_path: Path) -> None:
    with open_store(None, data_dir=tmp_path, retention_days=30) as s:
        assert "toIntervalDay(30)" in _ttl(s, "runs")
        assert "toIntervalDay(30)" in _ttl(s, "decisions")
        assert "toIntervalDay(30)" in _ttl(s, "stop_reasons_1m")
    with open_store(None, data_dir=tmp_path, retention_days=7) as s:
        assert "toIntervalDay(7)" in _ttl(s, "runs")
    with open_store(None, data_dir=tmp_path, retention_days=None) as s:
        assert _ttl(s, "runs") == ""
    with pytest.raises(ConfigError, match="retention_days"):
        open_store(None, data_dir=tmp_path, retention_days=0)


def test_parse_dsn_forms(tmp_path: Path) -> None:
    d = parse_dsn(None, data_dir=tmp_path)
    assert (
        d.embedded and d.path == (tmp_path / "clickhouse").resolve() and d.database == "otel_guard"
    )
    rel = parse_dsn("chdb://relative/dir?database=og2", data_dir=tmp_path)
    assert rel.path == Path("relative/dir").resolve() and rel.database == "og2"
    h = parse_dsn("https://alice:s%40cret@ch.example.com/?database=guard_prod", data_dir=tmp_path)
    assert (h.scheme, h.host, h.port, h.username, h.password, h.database) == (
        "https", "ch.example.com", 8443, "alice", "s@cret", "guard_prod",
    )  # fmt: skip
    p = parse_dsn("http://ch:8123/analytics", data_dir=tmp_path)
    assert (p.port, p.username, p.password, p.database) == (8123, "default", "", "analytics")
    assert "s@cret" not in h.redacted() and "s@cret" not in repr(h)
    for bad in (
        "mysql://x",
        "chdb://",
        "chdb://:memory:",
        "http://",
        "ch.example.com",
        "http://h/x-y;drop",
    ):
        with pytest.raises(ConfigError):
            parse_dsn(bad, data_dir=tmp_path)


def test_a_server_down_at_start_spools_and_report_errors_without_the_password(
    tmp_path: Path,
) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dsn = f"http://bob:hunter2@127.0.0.1:{port}/?database=og"
    # the guard must start during a ClickHouse outage: records spool until it is back
    with open_store(dsn, data_dir=tmp_path, flush_interval_s=0.05) as s:
        for i in range(20):
            s.write_run(outcome(i))
        assert not s.flush(0.5)
        assert s.counters()["spooled"] == 20 and s.counters()["dropped"] == 0
        with pytest.raises(StoreError) as exc:
            s.report()
        assert "hunter2" not in str(exc.value) and f"127.0.0.1:{port}" in str(exc.value)
    assert (tmp_path / "store" / "spool.log").stat().st_size > 0  # kept for the next start


def test_data_dir_is_locked_per_process(tmp_path: Path) -> None:
    with open_store(None, data_dir=tmp_path), pytest.raises(StoreError, match="in use by process"):
        open_store(None, data_dir=tmp_path)
    open_store(None, data_dir=tmp_path).close()  # released on close


def test_ttl_expires_rows_past_retention(tmp_path: Path) -> None:
    old = time.time() - 40 * 86400
    with open_store(None, data_dir=tmp_path, retention_days=30, flush_interval_s=0.05) as s:
        s.write_run(outcome(1, now=old, started_at=old - 5, ended_at=old))
        s.write_run(outcome(2))
        assert s.flush(10)
        s.query("OPTIMIZE TABLE otel_guard.runs FINAL")
        s.query("OPTIMIZE TABLE otel_guard.stop_reasons_1m FINAL")
        assert s.query("SELECT run_id FROM otel_guard.runs") == [("run-000002",)]
        assert s.report().total_runs == 1


def test_a_store_of_the_previous_schema_migrates_and_its_runs_stay_exactly_once(
    tmp_path: Path,
) -> None:
    from guard.store._rows import encode_row, run_row
    from guard.store._schema import RUN_COLUMNS

    client = connect(parse_dsn(None, data_dir=tmp_path))
    try:  # a store as the previous release left it: migrations 1-3, runs already written
        assert migrate(client, "otel_guard", retention_days=90, upto=3) == [1, 2, 3]
        rows = " ".join(encode_row(run_row(outcome(i))) for i in range(20))
        client.raw_insert(
            "otel_guard.runs",
            list(RUN_COLUMNS),
            insert_block=rows.encode(),
            fmt="JSONCompactEachRow",
        )
    finally:
        client.close()
    with open_store(None, data_dir=tmp_path, flush_interval_s=0.05) as s:
        names = {r[0] for r in _schema(s)}
        assert "dead_letter" in names
        versions = s.query("SELECT version FROM otel_guard.schema_migrations ORDER BY version")
        assert [v[0] for v in versions] == [1, 2, 3, 4]
        for i in range(10, 30):  # 10 repeats of runs the old release wrote, 10 new ones
            s.write_run(outcome(i, tenant="other"))
        assert s.flush(10)
        assert s.query("SELECT count(), uniqExact(run_id) FROM otel_guard.runs") == [(30, 30)]
        assert int(s.query("SELECT sum(runs) FROM otel_guard.stop_reasons_1m")[0][0]) == 30
        assert s.counters()["deduplicated"] == 10
