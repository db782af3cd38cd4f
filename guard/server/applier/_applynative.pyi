# The native span applier (guard/server/applier/_applynative.c).
from collections.abc import Callable
from typing import Any

def configure(*args: object) -> None: ...
def flush(touched: dict[Any, Any], spent: dict[str, Any], /) -> None: ...
def conclude(
    touched: dict[Any, Any], now: float, decide: Callable[[Any, Any], None], /
) -> None: ...
def apply(
    observations: Any,
    start: int,
    touched: dict[Any, Any],
    spent: dict[str, Any],
    runs: Any,
    scope: Any,
    /,
) -> int: ...
