"""One ``runs`` row per run across replicas: a fleet-wide claim of each run record in Redis.

The store's exactly-once check (``_writer`` in memory, ``_dedup`` against ClickHouse) holds
within one guard. Across replicas it does not: replica Y acknowledges a record (WAL) and dies
before the agent saw the ack, the agent re-sends it to Z, Z writes it, Y restarts and replays
its WAL: two rows. So before a batch of run records is inserted, the writer claims each run id
(``SET <prefix>:rec:{g}:<run_id> <holder> NX EX <ttl_s>``, else ``GET`` it: a small Lua script,
one pipeline of calls per batch, so one round trip) and drops the ids another holder has
(counted ``records_claimed_elsewhere``; never an error). The key is the run id alone, as the
store's own check is: a repeat naming another tenant (or none: a record derived from spans
that never carried one) is the same run. ``{g}``, one of 16 hash tags, keeps each script
call's keys in one Redis Cluster slot.

**The holder is the data dir, not the process**: ``{data_dir}/store/holder`` holds a random id
made once (prefixed by the guard id, for the operator's eye). A restarted replica replays its
WAL under the same holder, so it keeps the records it claimed before the crash; two replicas
never share one. Crash between the claim and the insert: the replay re-claims (same holder)
and inserts; ClickHouse's own check covers "inserted but not marked done".

**TTL** (``claim_ttl_s``, default 1 h): a claim must outlive the window in which the same record
can reach another replica: an agent re-sends an unacknowledged record on its next connect
(seconds after a failover), and a killed replica replays its WAL at its restart (minutes).
A claim that expired before a replay is simply taken again; only a record that was *inserted*
and then re-sent after its claim expired can double. Memory: about 175 B per claim with
32-character run ids (``benchmarks/bench_record_claims.py``, Redis 6.2), so about 0.17 MB per
1,000 records stored within one TTL.

**Redis unreachable: fail open.** The batch is inserted unclaimed (logged once per outage,
counted ``records_unclaimed``), so records keep flowing. What that can double: a record this
replica stores during the outage and another replica also stores (a re-send after a failover
during the outage, or the other replica storing it unclaimed too). When Redis is back, the
ids stored unclaimed are claimed after the fact (the last 100k), which closes the window for
later re-sends and counts the ones another replica already holds (``records_claim_conflicts``:
rows the fleet stored twice). A Redis restarted empty forgets the claims: a record re-sent
after that to another replica, of a run already stored, doubles.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
import uuid
import zlib
from collections import deque
from pathlib import Path
from typing import Any

from guard.errors import ConfigError

__all__ = ["DEFAULT_CLAIM_TTL_S", "RecordClaims", "holder_id"]

log = logging.getLogger("guard.store")

DEFAULT_CLAIM_TTL_S = 3600.0
_PIPELINE = 1000  # run ids per script call (bounded replies, bounded time inside Redis)
# Per key: SET NX EX; if it was there, its holder ('' = ours: its TTL is renewed). One call
# claims a chunk of ids atomically, so a claim expiring between a SET and a GET cannot
# happen, and costs a fifth of the Python time of one SET per id in a pipeline (measured).
_CLAIM_LUA = """
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('SET', key, ARGV[1], 'NX', 'EX', ARGV[2]) then
    out[i] = ''
  else
    local holder = redis.call('GET', key)
    if holder == ARGV[1] or not holder then
      redis.call('SET', key, ARGV[1], 'EX', ARGV[2])
      out[i] = ''
    else
      out[i] = holder
    end
  end
end
return out
"""


def _group(run_id: str) -> str:
    return "0123456789abcdef"[zlib.crc32(run_id.encode("utf-8", "surrogatepass")) & 15]


_UNCLAIMED_MAX = 100_000  # ids stored while Redis was down, claimed after the fact


def holder_id(store_dir: Path, guard_id: str | None) -> str:
    """This data dir's claim holder: made once, kept across restarts (the WAL's owner)."""
    path = store_dir / "holder"
    try:
        found = path.read_text().strip()
    except FileNotFoundError:
        found = ""
    if found:
        return found
    made = f"{(guard_id or socket.gethostname())[:100]}/{uuid.uuid4().hex[:12]}"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(made + "\n")
    tmp.replace(path)
    return made


class RecordClaims:
    """Claims of run records, shared by the replicas through Redis (sync redis-py: the
    store's writer is a thread). Every method is called from that one thread."""

    def __init__(
        self,
        url: str,
        holder: str,
        *,
        ttl_s: float = DEFAULT_CLAIM_TTL_S,
        prefix: str = "og",
        timeout_ms: float = 500.0,
        retry_after_s: float = 1.0,
    ) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        if not 1 <= ttl_s <= 30 * 86400:
            raise ConfigError(
                f"claim_ttl_s must be 1 s to 30 days, got {ttl_s!r}", path="claim_ttl_s"
            )
        self._redis = redis.Redis.from_url(
            url,
            socket_timeout=timeout_ms / 1000.0,
            socket_connect_timeout=timeout_ms / 1000.0,
            retry=Retry(NoBackoff(), 0),  # no hidden retries: the writer fails open instead
            decode_responses=True,
        )
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._noscript = redis.exceptions.NoScriptError
        self._sha: str | None = None
        self.holder = holder
        self.ttl_s = int(ttl_s)
        self._prefix = f"{prefix}:rec:"
        self.retry_after_s = retry_after_s
        self._down_since: float | None = None
        self._retry_at = 0.0
        self._unclaimed: deque[str] = deque(maxlen=_UNCLAIMED_MAX)
        self.stats = {"round_trips": 0, "errors": 0}

    @property
    def healthy(self) -> bool:
        return self._down_since is None

    def key(self, run_id: str) -> str:
        """``<prefix>:rec:{<g>}:<run_id>``: the hash tag ``{g}`` (one of 16, from the run id)
        keeps each script call's keys in one Redis Cluster slot."""
        return f"{self._prefix}{{{_group(run_id)}}}:{run_id}"

    def claim(self, ids: list[str]) -> set[str] | None:
        """Claim ``ids`` (distinct). Returns those another holder has, or None when Redis
        cannot be asked (fail open: the caller stores them, and they are claimed later)."""
        if not ids:
            return set()
        if time.monotonic() < self._retry_at:
            self.stored_unclaimed(ids)
            return None
        try:
            elsewhere = self._claim(ids)
        except self._errors as ex:
            self._failed(ex)
            self.stored_unclaimed(ids)
            return None
        self._up()
        return elsewhere

    def stored_unclaimed(self, ids: list[str]) -> None:
        self._unclaimed.extend(ids)

    def backfill(self) -> int:
        """Claim what was stored while Redis was down. Returns the ids another holder has
        too (stored twice by the fleet); 0 when there is nothing to do or Redis is down."""
        if not self._unclaimed or time.monotonic() < self._retry_at:
            return 0
        ids = list(dict.fromkeys(self._unclaimed))
        try:
            both = self._claim(ids)
        except self._errors as ex:
            self._failed(ex)
            return 0
        self._unclaimed.clear()
        self._up()
        if both:
            log.error(
                "store: %d run records were stored by this replica and another while Redis "
                "was unreachable (counted twice in the fleet), e.g. %s",
                len(both),
                sorted(both)[:3],
            )
        return len(both)

    def _claim(self, ids: list[str]) -> set[str]:
        """One pipeline of script calls (one per key slot group and chunk): one round trip."""
        calls: list[list[str]] = []
        by_group: dict[str, list[str]] = {}
        for run_id in ids:
            by_group.setdefault(_group(run_id), []).append(run_id)
        for group in by_group.values():
            for i in range(0, len(group), _PIPELINE):
                calls.append(group[i : i + _PIPELINE])
        try:
            replies = self._execute(calls)
        except self._noscript:  # a restarted (empty) Redis: load the script, call again
            self._sha = None
            replies = self._execute(calls)
        return {
            run_id
            for chunk, reply in zip(calls, replies, strict=True)
            for run_id, holder in zip(chunk, reply, strict=True)
            if holder
        }

    def _execute(self, calls: list[list[str]]) -> list[Any]:
        if self._sha is None:
            self._sha = self._redis.script_load(_CLAIM_LUA)
            self.stats["round_trips"] += 1
        pipe = self._redis.pipeline(transaction=False)
        for chunk in calls:
            pipe.evalsha(self._sha, len(chunk), *map(self.key, chunk), self.holder, self.ttl_s)
        self.stats["round_trips"] += 1
        return pipe.execute()

    def _failed(self, ex: BaseException) -> None:
        self.stats["errors"] += 1
        self._retry_at = time.monotonic() + self.retry_after_s
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning(
                "store: Redis unreachable for record claims (%s: %s); storing run records "
                "unclaimed until it is back (a record re-sent to another replica meanwhile "
                "may be stored twice)",
                type(ex).__name__,
                str(ex)[:200],
            )

    def _up(self) -> None:
        if self._down_since is not None:
            log.warning(
                "store: Redis reachable again for record claims after %.1fs",
                time.monotonic() - self._down_since,
            )
            self._down_since = None

    def close(self) -> None:
        with contextlib.suppress(*self._errors):  # closing is best effort
            self._redis.close()
