"""`otel-guard report`: every format, the chart, and the three read paths."""

from __future__ import annotations

import csv
import io
import json
import socket
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from guard.cli import main
from guard.cli._report import parse_time, render
from guard.store import Report, open_store, report_from_pb, report_to_pb
from guard.v1 import guard_pb2_grpc

from .conftest import outcome

N = 600


@pytest.fixture
def seeded(tmp_path: Path) -> Path:
    now = time.time()
    with open_store(None, data_dir=tmp_path) as s:
        for i in range(N):
            s.write_run(outcome(i, now=now))
        assert s.flush(20)
    return tmp_path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cli(capsys, *argv: str) -> str:
    assert main(["report", *argv]) == 0
    return capsys.readouterr().out


def test_report_in_every_format_and_chart(seeded: Path, capsys) -> None:
    direct = ["--clickhouse", f"chdb://{seeded}/clickhouse", "--data-dir", str(seeded)]
    data = json.loads(_cli(capsys, *direct, "--format", "json"))
    assert data["total_runs"] == N == sum(r["runs"] for r in data["rows"])
    assert {r["reason"] for r in data["rows"]} == {
        "final_answer", "max_steps", "loop_detected", "cost_budget", "agent_lost",
    }  # fmt: skip
    assert sum(p["runs"] for p in data["series"]) == N
    assert all(r["p95_steps"] >= r["p50_steps"] > 0 for r in data["rows"])
    assert data["meta"]["source"] == "clickhouse"
    assert json.loads(_cli(capsys, *direct, "--json")) == data | {"meta": data["meta"]}

    table = _cli(capsys, *direct)
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["status", "reason", "runs", "share"]
    assert any(line.startswith("terminated") and "max_steps" in line for line in lines)
    assert lines[-1].startswith("total") and f"{N:,}" in lines[-1]
    assert max(len(line) for line in lines) < 140  # fits a terminal

    rows = list(csv.DictReader(io.StringIO(_cli(capsys, *direct, "--format", "csv"))))
    assert sum(int(r["runs"]) for r in rows) == N
    assert set(rows[0]) >= {"status", "reason", "runs", "cost_usd", "p95_elapsed_ms"}

    png = seeded / "report.png"
    _cli(capsys, *direct, "--since", "6h", "--chart", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_filters(seeded: Path, capsys) -> None:
    direct = ["--clickhouse", f"chdb://{seeded}/clickhouse", "--data-dir", str(seeded), "--json"]
    acme = json.loads(_cli(capsys, *direct, "--tenant", "acme"))["total_runs"]
    coder = json.loads(_cli(capsys, *direct, "--tenant", "acme", "--agent", "coder"))["total_runs"]
    assert acme == N // 2 and coder == N // 6
    recent = json.loads(_cli(capsys, *direct, "--since", "1h"))["total_runs"]
    old = json.loads(_cli(capsys, *direct, "--until", "1h"))["total_runs"]
    assert 0 < recent < N and recent + old == N
    assert json.loads(_cli(capsys, *direct, "--since", "2030-01-01T00:00:00"))["total_runs"] == 0
    assert "no finished runs" in _cli(capsys, *direct[:-1], "--tenant", "nobody")
    # 30 days at 1-minute buckets would be 43k buckets: widened to at most 1440 (32 min)
    month = json.loads(_cli(capsys, *direct, "--since", "30d", "--bucket", "1m"))
    assert month["total_runs"] == N
    assert all(p["bucket_start_unix"] % 1920 == 0 for p in month["series"])


def test_falls_back_to_the_embedded_store_when_no_guard_answers(seeded: Path, capsys) -> None:
    out = _cli(
        capsys, "--endpoint", f"127.0.0.1:{_free_port()}", "--data-dir", str(seeded), "--json"
    )
    data = json.loads(out)
    assert data["total_runs"] == N and data["meta"]["source"].startswith("store")


class _Admin(guard_pb2_grpc.GuardAdminServicer):
    """Minimal GuardAdmin.Report: the guard answering from the store it holds open."""

    def __init__(self, store) -> None:
        self.store = store
        self.metadata: list = []

    def Report(self, request, context):
        self.metadata.append(dict(context.invocation_metadata()))
        report = self.store.report(
            since=request.since_unix if request.HasField("since_unix") else None,
            until=request.until_unix if request.HasField("until_unix") else None,
            tenant=request.tenant or None,
            agent=request.agent or None,
            bucket_s=request.bucket_s or 60,
        )
        return report_to_pb(report)


def test_report_through_guard_admin_while_the_guard_holds_the_data_dir(
    seeded: Path, capsys
) -> None:
    store = open_store(None, data_dir=seeded)  # the "guard" holds the embedded dir
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    admin = _Admin(store)
    guard_pb2_grpc.add_GuardAdminServicer_to_server(admin, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        endpoint = ["--endpoint", f"127.0.0.1:{port}", "--data-dir", str(seeded)]
        data = json.loads(_cli(capsys, *endpoint, "--token", "t0k", "--json", "--tenant", "globex"))
        assert data["total_runs"] == N // 2 and data["meta"]["source"] == f"guard 127.0.0.1:{port}"
        assert admin.metadata[-1]["authorization"] == "Bearer t0k"
        assert "total" in _cli(capsys, *endpoint, "--format", "table")
        # the guard gone while it still holds the dir: a clear error, not a crash
        server.stop(0).wait()
        with pytest.raises(SystemExit, match="in use by process"):
            main(["report", "--endpoint", f"127.0.0.1:{_free_port()}", "--data-dir", str(seeded)])
    finally:
        server.stop(0)
        store.close()


def test_pb_round_trip_keeps_unknown_cost_unknown() -> None:
    rep = Report(
        rows=[{"status": "failed", "reason": "agent_lost", "runs": 3, "steps": 9, "tokens": 10,
               "cost_usd": None, "p50_steps": 3.0, "p95_steps": 4.0, "p95_cost_usd": None,
               "p95_elapsed_ms": 120.0}],
        series=[{"bucket_start_unix": 1.7e9, "status": "failed", "reason": "agent_lost", "runs": 3, "cost_usd": None}],
    )  # fmt: skip
    assert report_from_pb(report_to_pb(rep)) == rep
    assert "-" in render(rep, "table").splitlines()[2]


def test_parse_time() -> None:
    now = 1_800_000_000.0
    assert parse_time("30m", now=now) == now - 1800
    assert parse_time("7d", now=now) == now - 7 * 86400
    assert (
        parse_time("2026-11-30T00:00:00Z") == parse_time("2026-11-30T00:00:00") == 1_795_996_800.0
    )
    assert parse_time("1795996800") == 1_795_996_800.0
    assert parse_time(None) is None
    with pytest.raises(ValueError, match="yesterday"):
        parse_time("yesterday")
    assert main(["report", "--since", "yesterday"]) == 2


def test_report_from_a_server_dsn_needs_no_local_data_dir(tmp_path: Path) -> None:
    # A guard holds ./data; `report --clickhouse http://…` must not try to take its lock.
    from guard.errors import StoreError
    from guard.store import read_report

    with open_store(None, data_dir=tmp_path):
        with pytest.raises(StoreError) as exc:
            read_report(f"http://u:pw1@127.0.0.1:{_free_port()}", data_dir=tmp_path)
        assert "cannot reach" in str(exc.value) and "pw1" not in str(exc.value)
        with pytest.raises(SystemExit, match="cannot reach"):
            main(
                [
                    "report",
                    "--clickhouse",
                    f"http://127.0.0.1:{_free_port()}",
                    "--data-dir",
                    str(tmp_path),
                ]
            )
