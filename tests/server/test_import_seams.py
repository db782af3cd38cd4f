"""``import guard.server`` stays light: it never loads the store or ClickHouse (records live in
``guard.records``, next to ``Outcome``), and ``guard.store`` still exports them."""

from __future__ import annotations

import json
import subprocess
import sys


def test_import_guard_server_does_not_load_the_store() -> None:
    code = (
        "import json, sys; import guard.server; "
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m == 'guard.store' or m.startswith(('guard.store.', 'clickhouse_connect', 'chdb')))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_store_still_exports_the_records() -> None:
    import guard.records
    import guard.store

    assert guard.store.DecisionRecord is guard.records.DecisionRecord
    assert guard.store.RecordSink is guard.records.RecordSink
