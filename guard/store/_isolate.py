"""Bad rows never block good ones: bisect a batch ClickHouse refuses as data, quarantine the rest.

A ClickHouse error is either *data* ("this row is bad": a parse or type error, an overflow, a
value out of range) or anything else (the server is down, busy, or misconfigured). Only data
errors are isolated: the batch is split in halves, each half is inserted with a token derived
from the batch's (``{token}.0`` / ``{token}.1``), recursively, down to single rows. The split
is a pure function of the batch, so a crash in the middle repeats the same inserts and the
halves already committed are dropped by insert deduplication. Any other error propagates and
the caller spools and retries the whole batch, as before.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "DATA_ERRORS",
    "bisect_insert",
    "error_code",
    "is_data_error",
    "keep_on_disk",
    "split_rows",
]

# ClickHouse error codes that mean "this data is bad", not "the server is unavailable".
DATA_ERRORS = frozenset(
    {
        6,  # CANNOT_PARSE_TEXT
        25,  # CANNOT_PARSE_ESCAPE_SEQUENCE
        26,  # CANNOT_PARSE_QUOTED_STRING
        27,  # CANNOT_PARSE_INPUT_ASSERTION_FAILED
        32,  # ATTEMPT_TO_READ_AFTER_EOF
        33,  # CANNOT_READ_ALL_DATA
        38,  # CANNOT_PARSE_DATE
        41,  # CANNOT_PARSE_DATETIME
        43,  # ILLEGAL_TYPE_OF_ARGUMENT
        53,  # TYPE_MISMATCH
        69,  # ARGUMENT_OUT_OF_BOUND
        70,  # CANNOT_CONVERT_TYPE
        72,  # CANNOT_PARSE_NUMBER
        117,  # INCORRECT_DATA
        128,  # TOO_LARGE_ARRAY_SIZE
        131,  # TOO_LARGE_STRING_SIZE
        190,  # SIZES_OF_ARRAYS_DONT_MATCH
        321,  # VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
        349,  # CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
        407,  # DECIMAL_OVERFLOW
    }
)
_CODE_RE = re.compile(r"Code: (\d+)")

Insert = Callable[[str, list[str]], None]  # (token, rows) -> None, raises on refusal


def error_code(ex: BaseException) -> int | None:
    m = _CODE_RE.search(str(ex))
    return int(m.group(1)) if m else None


def is_data_error(ex: BaseException) -> bool:
    return error_code(ex) in DATA_ERRORS


def bisect_insert(insert: Insert, token: str, rows: list[str]) -> list[tuple[str, str]]:
    """Insert ``rows``; returns the (row, error) pairs ClickHouse refused as bad data.

    Raises whatever non-data error the insert raises (the caller retries the whole batch).
    """
    bad: list[tuple[str, str]] = []
    stack = [(token, rows)]
    while stack:
        tok, part = stack.pop()
        try:
            insert(tok, part)
        except Exception as ex:
            if not is_data_error(ex):
                raise
            if len(part) == 1:
                bad.append((part[0], " ".join(str(ex).split())))
                continue
            mid = len(part) // 2
            stack.append((f"{tok}.1", part[mid:]))  # popped second: rows stay in order
            stack.append((f"{tok}.0", part[:mid]))
    return bad


_DECODER = json.JSONDecoder()


def split_rows(blob: str) -> tuple[list[str], list[str]]:
    """A spooled blob (row JSON joined by spaces) -> (row texts, their first values as str).

    The first value of a ``runs`` row is its run id. Raises ValueError on a corrupt blob.
    """
    rows: list[str] = []
    keys: list[str] = []
    i, n = 0, len(blob)
    while True:
        while i < n and blob[i] == " ":
            i += 1
        if i >= n:
            return rows, keys
        value, j = _DECODER.raw_decode(blob, i)
        if not isinstance(value, list):
            raise ValueError(f"spooled row at char {i} is not a JSON array")
        rows.append(blob[i:j])
        keys.append(str(value[0]) if value else "")
        i = j


def keep_on_disk(path: Path, table: str, token: str, bad: list[tuple[str, str]]) -> None:
    """Append (row, error) pairs that even ``dead_letter`` refused to ``path``, fsynced:
    the last resort, so a record is never lost."""
    with open(path, "ab") as f:
        for row, err in bad:
            f.write((json.dumps([table, token, err, row]) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())
