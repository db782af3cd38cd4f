"""Turn a grafana-clickhouse-datasource query into the SQL the plugin would send to ClickHouse.

The order follows the plugin: ``$__conditionalAll`` first (front end, ``applyConditionalAll``),
then Grafana's template variables (``templateSrv.replace``), then the back-end macros
(``pkg/macros/macros.go``: ``$__timeFilter``, ``$__timeInterval``, ``$__interval_s`` …).
Whatever is left that still looks like a macro or a variable is an error: it would reach
ClickHouse verbatim in Grafana too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

__all__ = ["ALL", "TimeRange", "UnexpandedError", "Variable", "expand"]

ALL = "$__all"


class UnexpandedError(ValueError):
    """The query still holds a macro or variable after expansion."""


@dataclass(frozen=True)
class TimeRange:
    from_s: int  # Unix seconds (the plugin formats with second or millisecond precision)
    to_s: int
    interval_s: int = 60  # Grafana's $__interval for the panel


@dataclass
class Variable:
    """A dashboard variable's current value: ``[ALL]`` or a list of selected values.

    ``options`` are what "All" expands to where a query uses the variable outside
    ``$__conditionalAll`` (Grafana substitutes every option when no allValue is set).
    """

    name: str
    value: list[str]
    options: list[str] = field(default_factory=list)

    @property
    def is_all(self) -> bool:
        return not self.value or self.value == [ALL] or self.value == [""]

    def values(self) -> list[str]:
        return list(self.options) if self.is_all else list(self.value)


def _args_at(sql: str, open_paren: int) -> tuple[list[str], int]:
    """Split the comma-separated arguments of the call whose '(' is at ``open_paren``.

    Returns the stripped arguments and the index just after the matching ')'. Quotes and
    nested parentheses are respected.
    """
    depth, quote, args, start = 0, "", [], open_paren + 1
    for i in range(open_paren, len(sql)):
        ch = sql[i]
        if quote:
            if ch == quote and sql[i - 1] != "\\":
                quote = ""
            continue
        if ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                args.append(sql[start:i].strip())
                return args, i + 1
        elif ch == "," and depth == 1:
            args.append(sql[start:i].strip())
            start = i + 1
    raise UnexpandedError(f"unbalanced parentheses after position {open_paren}")


def _conditional_all(sql: str, variables: dict[str, Variable]) -> str:
    macro = "$__conditionalAll("
    while (at := sql.rfind(macro)) != -1:
        args, end = _args_at(sql, at + len(macro) - 1)
        if len(args) != 2:
            raise UnexpandedError(f"$__conditionalAll needs 2 arguments, got {args}")
        var = variables.get(args[1].lstrip("$").strip("{}"))
        phrase = "1=1" if var is None or var.is_all else args[0]
        sql = sql[:at] + phrase + sql[end:]
    return sql


def _quote(v: str) -> str:
    return "'" + v.replace("'", "\\'") + "'"


def _format(var: Variable, fmt: str | None) -> str:
    values = var.values()
    if fmt == "singlequote":
        return ",".join(_quote(v) for v in values)
    if fmt == "doublequote":
        return ",".join('"' + v.replace('"', '\\"') + '"' for v in values)
    if fmt in (None, "csv", "raw"):
        return ",".join(values)
    if fmt == "sqlstring":
        return ",".join("'" + v.replace("'", "''") + "'" for v in values)
    raise UnexpandedError(f"variable format {fmt!r} of ${{{var.name}}} is not modelled here")


_VAR_RE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\[\[(\w+)(?::(\w+))?\]\]|\$(?!__)(\w+)")


def _template(sql: str, variables: dict[str, Variable]) -> str:
    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(3) or m.group(5)
        fmt = m.group(2) or m.group(4)
        var = variables.get(name)
        if var is None:
            return m.group(0)  # left for the leftover check
        return _format(var, fmt)

    return _VAR_RE.sub(sub, sql)


def _dt(s: int) -> str:
    return f"toDateTime({s})"


def _dt64(s: int) -> str:
    return f"fromUnixTimestamp64Milli({s * 1000})"


def _date(s: int) -> str:
    return "toDate('" + datetime.fromtimestamp(s, UTC).strftime("%Y-%m-%d") + "')"


def _macros(tr: TimeRange) -> dict[str, Callable[[Sequence[str]], str]]:
    def one(args: Sequence[str], name: str) -> str:
        if len(args) != 1 or not args[0]:
            raise UnexpandedError(f"$__{name} expects 1 argument, got {list(args)}")
        return args[0]

    def between(col: str, lo: str, hi: str) -> str:
        return f"{col} >= {lo} AND {col} <= {hi}"

    def dt_filter(a: Sequence[str]) -> str:
        if len(a) != 2:
            raise UnexpandedError(f"$__dateTimeFilter expects 2 arguments, got {list(a)}")
        d = between(a[0], _date(tr.from_s), _date(tr.to_s))
        t = between(a[1], _dt(tr.from_s), _dt(tr.to_s))
        return f"({d}) AND ({t})"

    interval = max(int(tr.interval_s), 1)
    return {
        "fromTime": lambda a: _dt(tr.from_s),
        "toTime": lambda a: _dt(tr.to_s),
        "fromTime_ms": lambda a: _dt64(tr.from_s),
        "toTime_ms": lambda a: _dt64(tr.to_s),
        "timeFilter": lambda a: between(one(a, "timeFilter"), _dt(tr.from_s), _dt(tr.to_s)),
        "timeFilter_ms": lambda a: between(
            one(a, "timeFilter_ms"), _dt64(tr.from_s), _dt64(tr.to_s)
        ),
        "dateFilter": lambda a: between(one(a, "dateFilter"), _date(tr.from_s), _date(tr.to_s)),
        "dateTimeFilter": dt_filter,
        "dt": dt_filter,
        "timeInterval": lambda a: (
            f"toStartOfInterval(toDateTime({one(a, 'timeInterval')}), INTERVAL {interval} second)"
        ),
        "timeInterval_ms": lambda a: (
            f"toStartOfInterval(toDateTime64({one(a, 'timeInterval_ms')}, 3), "
            f"INTERVAL {interval * 1000} millisecond)"
        ),
        "interval_s": lambda a: str(interval),
    }


_MACRO_RE = re.compile(r"\$__(\w+)")


def _backend_macros(sql: str, tr: TimeRange) -> str:
    table = _macros(tr)
    out, pos = [], 0
    for m in _MACRO_RE.finditer(sql):
        if m.start() < pos:
            continue
        name = m.group(1)
        if name not in table:
            raise UnexpandedError(f"unknown macro $__{name}")
        args: list[str] = []
        end = m.end()
        if end < len(sql) and sql[end] == "(":
            args, end = _args_at(sql, end)
        out.append(sql[pos : m.start()])
        out.append(table[name](args))
        pos = end
    out.append(sql[pos:])
    return "".join(out)


def expand(raw_sql: str, variables: Sequence[Variable], time_range: TimeRange) -> str:
    """The SQL the plugin sends for ``raw_sql`` with these variable values and time range."""
    by_name = {v.name: v for v in variables}
    sql = _conditional_all(raw_sql, by_name)
    sql = _template(sql, by_name)
    sql = _backend_macros(sql, time_range)
    leftover = re.search(r"\$\{?\w+|\[\[\w+", sql)
    if leftover:
        raise UnexpandedError(f"unexpanded {leftover.group(0)!r} in: {sql}")
    return sql
