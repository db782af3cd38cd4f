"""The store's fleet-wide record claim (``guard/store/_claims.py``), against a real redis-server.

Each "replica" is a store in its own data dir; the embedded engine holds one directory per
process, so the replicas take turns (or one is a process that is SIGKILLed). One record per
run is checked over the union of their stores.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _wait import wait_until
from redisstate._server import RedisServer

from guard.policy._types import DecidedBy, Outcome, Reason, Status
from guard.store import Store, open_store
from guard.store._claims import RecordClaims

# A replica that accepts records (WAL), says "ready" and is SIGKILLed. mode "wal": its writer
# never formed a batch (nothing claimed, nothing inserted: the acked-then-killed replica);
# mode "claimed": ClickHouse refuses every insert, so the batches are claimed and spooled.
_REPLICA = r"""
import sys, time
sys.path.insert(0, sys.argv[4])
from fleet.test_record_claims import record
from guard.store import Store, open_store
from guard.store._claims import RecordClaims

data_dir, redis_url, mode = sys.argv[1:4]
if mode == "wal":
    s = open_store(None, data_dir=data_dir, redis_url=redis_url, guard_id="y",
                   batch_rows=10**9, flush_interval_s=3600)
else:
    s = open_store(None, data_dir=data_dir, redis_url=redis_url, guard_id="y",
                   batch_rows=10, flush_interval_s=0.01)
    class Down:
        def __getattr__(self, name):
            raise ConnectionError("injected: ClickHouse down")
    s._writer.client = Down()
for i in range(40):
    s.write_run(record(i))
if mode == "claimed":
    deadline = time.monotonic() + 30
    while s.counters()["spooled"] < 40 and time.monotonic() < deadline:
        time.sleep(0.01)
print("ready", s.counters(), flush=True)
time.sleep(60)
"""


def record(i: int, **kw: object) -> Outcome:
    now = time.time()
    fields: dict = {
        "run_id": f"run-{i:04d}",
        "status": Status.TERMINATED,
        "reason": Reason.MAX_STEPS,
        "tenant": "acme",
        "agent": "bot",
        "steps": 30,
        "decided_by": DecidedBy.SDK,
        "started_at": now - 5,
        "ended_at": now,
    }
    fields.update(kw)
    return Outcome(**fields)


def ids_of(store: Store) -> dict[str, int]:
    return dict(store.query("SELECT run_id, count() FROM otel_guard.runs GROUP BY run_id"))


@pytest.fixture
def redis(tmp_path: Path):
    srv = RedisServer(tmp_path)
    srv.start()
    yield srv
    srv.stop()


def _open(d: Path, redis: RedisServer, name: str, **kw: object):
    return open_store(
        None, data_dir=d, redis_url=redis.url, guard_id=name, flush_interval_s=0.02, **kw
    )


def _crashed_replica(d: Path, redis: RedisServer, mode: str) -> dict:
    proc = subprocess.Popen(
        [sys.executable, "-c", _REPLICA, str(d), redis.url, mode, str(Path(__file__).parents[1])],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("ready"), line
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()  # type: ignore[union-attr]
    return eval(line.split(" ", 1)[1])  # the counters dict it printed


def test_a_record_another_replica_claimed_is_dropped(tmp_path: Path, redis: RedisServer) -> None:
    with _open(tmp_path / "y", redis, "y") as y:
        for i in range(30):
            y.write_run(record(i))
        assert y.flush(30)
        assert len(ids_of(y)) == 30
    with _open(tmp_path / "z", redis, "z") as z:
        for i in range(20, 50):  # 20..29 re-sent to z after a failover
            z.write_run(record(i))
        assert z.flush(30)
        assert sorted(ids_of(z)) == [f"run-{i:04d}" for i in range(30, 50)]
        c = z.counters()
        key = z.claims.key("run-0025")  # type: ignore[union-attr]
    assert c["records_claimed_elsewhere"] == 10 and c["records_unclaimed"] == 0
    assert key.startswith("og:rec:{") and key.endswith("}:run-0025")
    claim = redis.command("GET", key)
    assert b"y/" in claim  # the holder is y's data dir (guard id "y" + its own random part)


def test_acked_on_y_resent_to_z_y_replays_its_wal(tmp_path: Path, redis: RedisServer) -> None:
    """Y holds 40 records in its WAL only (acked, not yet batched) and is SIGKILLed; the agents
    re-send them to Z, which stores them; Y restarts and replays its WAL: they are Z's."""
    _crashed_replica(tmp_path / "y", redis, "wal")
    with _open(tmp_path / "z", redis, "z") as z:
        for i in range(40):
            z.write_run(record(i))
        assert z.flush(30)
        on_z = ids_of(z)
    with _open(tmp_path / "y", redis, "y") as y:  # recovery: the WAL goes to the spool
        assert y.flush(30)
        on_y = ids_of(y)
        c = y.counters()
    assert len(on_z) == 40 and on_y == {}, (len(on_z), len(on_y))
    assert c["records_claimed_elsewhere"] == 40


def test_a_restarted_replica_keeps_what_it_claimed(tmp_path: Path, redis: RedisServer) -> None:
    """Y claimed 40 records, could not insert them (ClickHouse down) and was SIGKILLed. Its
    replay after the restart keeps them (same holder: the data dir), and Z drops its copies."""
    before = _crashed_replica(tmp_path / "y", redis, "claimed")
    assert before["spooled"] == 40 and before["records_unclaimed"] == 0
    with _open(tmp_path / "y", redis, "y") as y:
        assert y.flush(30)
        on_y = ids_of(y)
        c = y.counters()
    assert len(on_y) == 40 and c["records_claimed_elsewhere"] == 0
    with _open(tmp_path / "z", redis, "z") as z:
        for i in range(40):
            z.write_run(record(i))
        assert z.flush(30)
        assert ids_of(z) == {}
        assert z.counters()["records_claimed_elsewhere"] == 40


def test_redis_down_stores_unclaimed_and_claims_when_back(
    tmp_path: Path, redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with _open(tmp_path / "z", redis, "z") as z:  # z claims and stores 0..4
        for i in range(5):
            z.write_run(record(i))
        assert z.flush(30)
    redis.stop()
    caplog.set_level(logging.WARNING, logger="guard.store")
    with _open(tmp_path / "y", redis, "y") as y:
        for i in range(10):  # 0..4 are z's too: stored twice by the fleet, fail-open
            y.write_run(record(i))
            assert y.flush(30)  # ten batches, one outage
        assert len(ids_of(y)) == 10
        assert y.counters()["records_unclaimed"] == 10
        down = [r for r in caplog.records if "unreachable for record claims" in r.getMessage()]
        assert len(down) == 1  # logged once per outage, not once per batch
        # Redis back. A stopped test server comes back empty; one of z's claims is put back,
        # as a Redis that was only unreachable would still hold it.
        redis.start()
        redis.command("SET", y.claims.key("run-0000"), "z/other")  # type: ignore[union-attr]
        wait_until(  # the writer's next cycles
            lambda: y.counters()["records_claim_conflicts"] >= 1,
            20,
            lambda: f"a claim conflict found; counters {y.counters()}",
        )
        assert y.counters()["records_claim_conflicts"] == 1
        assert [r for r in caplog.records if "reachable again" in r.getMessage()]
    # what y stored unclaimed is claimed now: a later re-send to z is dropped there
    with _open(tmp_path / "z", redis, "z") as z:
        for i in range(5, 10):
            z.write_run(record(i))
        assert z.flush(30)
        assert z.counters()["records_claimed_elsewhere"] == 5


def test_a_claim_survives_a_redis_that_lost_its_scripts(redis: RedisServer) -> None:
    mine, other = RecordClaims(redis.url, "a/1"), RecordClaims(redis.url, "b/2")
    try:
        assert mine.claim(["r1", "r2"]) == set()
        redis.command("SCRIPT", "FLUSH")  # as after a restart or a failover of Redis
        assert mine.claim(["r2", "r3"]) == set()  # r2 is its own: kept, TTL renewed
        assert other.claim(["r1", "r3", "r4"]) == {"r1", "r3"}
        assert mine.stats["errors"] == 0 and mine.healthy
    finally:
        mine.close()
        other.close()


def test_without_redis_the_store_claims_nothing(tmp_path: Path) -> None:
    with open_store(None, data_dir=tmp_path / "a", flush_interval_s=0.02) as s:
        s.write_run(record(1))
        assert s.flush(30)
        assert s.claims is None and s.counters()["records_unclaimed"] == 0
    assert not (tmp_path / "a" / "store" / "holder").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--record-claim-ttl-s", "60"], "--record-claim-ttl-s needs --redis"),
        (["--redis", "redis://127.0.0.1:1/0", "--record-claim-ttl-s", "0"], "claim_ttl_s"),
    ],
)
def test_serve_refuses_a_bad_claim_setting(tmp_path: Path, args: list[str], message: str) -> None:
    serve = [sys.executable, "-m", "guard.cli", "serve", "--listen", "127.0.0.1:0"]
    out = subprocess.run(
        [*serve, "--data-dir", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and message in out.stderr, out.stderr[-2000:]
