"""The ClickHouse store: termination records, the decision log and stop-reason distributions.

``open_store(dsn, data_dir=...)`` returns a :class:`Store` (a :class:`RecordSink`). See
``guard/store/README.md`` for the schema and the writer's durability guarantees.
"""

from __future__ import annotations

from guard.store._dsn import DEFAULT_DATABASE, Dsn, parse_dsn
from guard.store._records import DecisionRecord, RecordSink
from guard.store._reporting import Report, report_from_pb, report_to_pb
from guard.store._store import RecordNotDurable, Store, open_store, read_report

__all__ = [
    "DEFAULT_DATABASE",
    "DecisionRecord",
    "Dsn",
    "RecordNotDurable",
    "RecordSink",
    "Report",
    "Store",
    "open_store",
    "parse_dsn",
    "read_report",
    "report_from_pb",
    "report_to_pb",
]
