"""Live terminal output for the demo: event lines plus one status line.

On a TTY the status line is redrawn in place (ANSI) under the scrolling event lines, with
colours. Anywhere else (a pipe, CI logs, ``--json`` mode writing to stderr) it degrades to plain
lines and prints the status only every couple of seconds, when it changed.
"""

from __future__ import annotations

import shutil
import time
from typing import Any, TextIO

__all__ = ["Live", "fmt_usd"]

_COLOURS = {"green": "32", "red": "31", "yellow": "33", "cyan": "36", "dim": "2", "bold": "1"}
_STATUS_STYLE = {
    "completed": ("✓", "green"),
    "degraded": ("~", "yellow"),
    "terminated": ("■", "red"),
    "failed": ("✗", "red"),
    "cancelled": ("⊘", "yellow"),
}

# Reasons whose directives are about a budget, so "NN% of <metric>" means something.
_BUDGET_REASONS = {
    "max_steps",
    "max_tool_calls",
    "deadline",
    "token_budget",
    "cost_budget",
    "tenant_budget",
}


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def fmt_usd(value: float | None) -> str:
    if value is None:
        return "   n/a"
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


class Live:
    """Writes the demo's progress to ``stream``."""

    def __init__(self, stream: TextIO, *, t0: float, tty: bool | None = None) -> None:
        self.stream = stream
        self.t0 = t0
        self.tty = stream.isatty() if tty is None else tty
        self._status = ""
        self._status_printed_at = 0.0
        self._status_last = ""

    # ------------------------------------------------------------------------------ style

    def style(self, text: str, colour: str) -> str:
        if not self.tty:
            return text
        return f"\x1b[{_COLOURS[colour]}m{text}\x1b[0m"

    def _clock(self) -> str:
        return f"{time.time() - self.t0:6.1f}s"

    # ---------------------------------------------------------------------------- output

    def line(self, text: str = "", *, stamp: bool = True) -> None:
        """Print one event line (above the status line on a TTY)."""
        prefix = f"{self.style(self._clock(), 'dim')}  " if stamp else ""
        if self.tty and self._status:
            self.stream.write("\r\x1b[K")
        self.stream.write(prefix + text + "\n")
        if self.tty and self._status:
            self.stream.write(self._status)
        self.stream.flush()

    def status(self, text: str) -> None:
        """Update the status line (in place on a TTY, else at most every 2 s when changed)."""
        if self.tty:
            # A wrapped status line cannot be redrawn in place: keep it to the terminal width.
            width = shutil.get_terminal_size((120, 24)).columns
            plain = f"{self._clock()}  {text}"
            if len(plain) >= width:
                plain = plain[: max(width - 2, 10)] + "…"
            self._status = self.style(plain, "cyan")
            self.stream.write("\r\x1b[K" + self._status)
            self.stream.flush()
            return
        now = time.time()
        if text != self._status_last and now - self._status_printed_at >= 2.0:
            self._status_last = text
            self._status_printed_at = now
            self.stream.write(f"{self._clock()}  · {text}\n")
            self.stream.flush()

    def end_status(self) -> None:
        if self.tty and self._status:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
        self._status = ""

    # ------------------------------------------------------------------------- formatters

    def outcome(self, process: str, outcome: dict[str, Any]) -> None:
        status = str(outcome.get("status", "?"))
        reason = str(outcome.get("reason", "?"))
        symbol, colour = _STATUS_STYLE.get(status, ("?", "yellow"))
        who = f"{outcome.get('tenant', '?')}/{outcome.get('agent', '?')}"
        steps = outcome.get("steps", 0)
        tokens = int(outcome.get("input_tokens", 0)) + int(outcome.get("output_tokens", 0))
        by = outcome.get("decided_by", "sdk")
        text = (
            f"{self.style(symbol, colour)} {who:<30} {self.style(f'{status:<10}', colour)} "
            f"{reason:<16} {steps:>3} steps {tokens:>7,} tok {fmt_usd(outcome.get('cost_usd'))}"
            f"  by {by}"
        )
        if status != "completed" and outcome.get("message"):
            text += self.style(f"  {_clip(str(outcome['message']), 72)}", "dim")
        self.line(text)

    def decision(self, record: Any) -> None:
        action = str(getattr(record, "action", "?"))
        colour = {"warn": "yellow", "wrap_up": "yellow"}.get(action, "red")
        who = f"{getattr(record, 'tenant', '?')}/{getattr(record, 'agent', '?')}"
        util = getattr(record, "utilisation", None)
        util_s = ""
        if util is not None and record.metric and record.reason in _BUDGET_REASONS:
            util_s = f" {util:.0%} of {record.metric}"
        latency = getattr(record, "delivery_latency_ms", None)
        lat_s = f" (delivered in {latency:.1f} ms)" if latency is not None else ""
        by = getattr(record, "decided_by", "guard")
        self.line(
            f"{self.style('⚑', colour)} {by} {self.style(f'{action:<8}', colour)} {who:<28} "
            f"{getattr(record, 'reason', '?')}{util_s}{lat_s}"
            + self.style(f"  {_clip(str(getattr(record, 'detail', '')), 72)}", "dim")
        )
