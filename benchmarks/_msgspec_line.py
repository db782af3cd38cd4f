"""The WAL line of a ``runs`` row written with msgspec instead of ``_rowsnative``.

The candidate a well-kept library offers for the native line: ``msgspec.convert`` checks the
28 fields against their column types and ranges (what ``_rows._py_line`` checks before it
formats), and ``msgspec.json`` encodes them. Its text differs from the store's (timestamps
rounded rather than printed with three decimals, enums as their values), so it is measured
here only, never written. ``encode_only`` skips the checks: a lower bound no safe writer
reaches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import msgspec

from guard.store._rows import _RUN_FIELDS

__all__ = ["lines"]

_M = msgspec.Meta
_U32 = Annotated[int, _M(ge=0, le=2**32 - 1)]
_U64 = Annotated[int, _M(ge=0)]  # msgspec bounds stop at int64; the store's at 2**64 - 1
_TS = Annotated[float, _M(ge=1.0, le=10413791999.999)]  # the top of DateTime64(3)
_OPT = str | None
# RUN_COLUMNS order, as guard/store/_rows.py's _py_line unpacks them
_ROW = tuple[
    str, _OPT, str, str, str, str, str, _TS, _TS, _U64, _U64 | None, _U32, _U32, _U32, _U32,
    _U64, _U64, _U64, _U64, float | None, _OPT, _OPT, _U32, bool, bool, str, str, str,
]  # fmt: skip


def lines() -> dict[str, Callable[[Any], bytes]]:
    """``{"msgspec": checked line, "msgspec_encode_only": unchecked}`` of one Outcome."""
    encode = msgspec.json.Encoder().encode

    def plain(o: Any) -> tuple[Any, ...]:
        return tuple(getattr(v, "value", v) for v in _RUN_FIELDS(o))

    def checked(o: Any) -> bytes:
        return encode(msgspec.convert(plain(o), _ROW, strict=True))

    def encode_only(o: Any) -> bytes:
        return encode(plain(o))

    return {"msgspec": checked, "msgspec_encode_only": encode_only}
