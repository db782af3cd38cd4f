"""The poll rule: telling a tool that waits for a change from a loop.

A *poll* is a tool the developer declared as one (``@guard.tool(poll=True)``,
``guard.instrument(polls=[...])`` or the policy's ``loop.poll_tools``): a job status, a build
state, a queue depth, checked until it changes. Its repeated identical calls are the point of
it, so the loop detector's repeat, cycle and same-result patterns never see them (the SDK does
not feed a poll call to :class:`~guard.policy.LoopDetector`, and sends no action fingerprint on
its span, so the guard's detector does not see it either). This rule judges them instead:

``poll_unchanged``  the same poll (the same action fingerprint: tool and canonical arguments)
                    answered the same result ``max_unchanged_polls`` times in a row (its own
                    calls in a row: other calls in between do not matter). A changed result is
                    new information and starts the count again, so "pending" x4 then "done"
                    never fires. It warns one short of the threshold, like every pattern, and
                    stops with reason ``loop_detected``. ``max_unchanged_polls: null`` turns it
                    off (``max_tool_calls``, ``max_steps`` and the deadline still bound a poll).

Unknown results (``None``) compare equal to each other, as in the loop detector: no result is
no new information. A step whose calls were all polls is neither progress nor stale
(:mod:`guard.policy._novelty`). Memory is bounded: the last :data:`MAX_TRACKED_POLLS` distinct
polls of a run (two 64-bit ints and a count each); a poll pushed out starts again at one.

Pure: no I/O and no clock. Not thread-safe: one caller per run (the SDK holds the run's lock).
"""

from __future__ import annotations

from guard.errors import ConfigError
from guard.policy._fingerprint import hash64
from guard.policy._loops import LoopVerdict, verdict
from guard.policy._types import Action, LoopSettings, Reason

__all__ = [
    "MAX_TRACKED_POLLS",
    "POLL_PATTERN",
    "PollWatch",
    "check_max_unchanged_polls",
    "check_poll_tools",
]

POLL_PATTERN = "poll_unchanged"
# Distinct polls remembered per run: far more jobs than an agent waits on at once.
MAX_TRACKED_POLLS = 32
_OK = LoopVerdict(Action.CONTINUE)


def check_max_unchanged_polls(v: object, path: str = "loop.max_unchanged_polls") -> int | None:
    """``max_unchanged_polls`` validated: an integer >= 2, or ``None`` (the rule is off)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 2:
        raise ConfigError(f"must be an integer >= 2 or null, got {v!r}", path=path)
    return v


def check_poll_tools(v: object, path: str = "loop.poll_tools") -> tuple[str, ...]:
    """``poll_tools`` validated: a tuple of non-empty tool names (a bare string is an error,
    not the set of its characters)."""
    if not isinstance(v, tuple) or not all(isinstance(n, str) and n.strip() for n in v):
        raise ConfigError(f"must be a tuple of non-empty tool names, got {v!r}", path=path)
    return v


class PollWatch:
    """Per-run state of the poll rule: each recent poll's last result and its unchanged count."""

    __slots__ = ("_last", "hits", "max_unchanged_polls")

    def __init__(self, settings: LoopSettings | None = None) -> None:
        s = settings if settings is not None else LoopSettings()
        self.max_unchanged_polls = check_max_unchanged_polls(s.max_unchanged_polls)
        check_poll_tools(s.poll_tools)
        # action (64 bits) -> (result (64 bits, 0 unknown), calls in a row with that result);
        # insertion order is recency (an updated poll moves to the end), so the oldest goes.
        self._last: dict[int, tuple[int, int]] = {}
        self.hits = 0

    def adopt(self, settings: LoopSettings) -> None:
        """New settings (a late admit tightened them): the counts so far are kept."""
        self.max_unchanged_polls = check_max_unchanged_polls(settings.max_unchanged_polls)
        check_poll_tools(settings.poll_tools)

    def observe(self, action: str, result: str | None) -> LoopVerdict:
        """Record one poll call (in order) and judge it."""
        a, r = hash64(action) or 1, hash64(result)
        last = self._last
        prev = last.pop(a, None)
        count = prev[1] + 1 if prev is not None and prev[0] == r else 1
        last[a] = (r, count)
        if len(last) > MAX_TRACKED_POLLS:
            del last[next(iter(last))]
        n = self.max_unchanged_polls
        if n is None or count < n - 1:
            return _OK
        self.hits += 1
        level = Action.STOP if count >= n else Action.WARN
        what = (
            f"{POLL_PATTERN}: same poll with the same result {count}x in a row "
            f"(max_unchanged_polls={n})"
        )
        return verdict(level, Reason.LOOP_DETECTED, POLL_PATTERN, count, what)

    def unchanged(self, action: str) -> int:
        """How many times in a row ``action`` (a poll's fingerprint) answered its last result."""
        prev = self._last.get(hash64(action) or 1)
        return 0 if prev is None else prev[1]

    def reset(self) -> None:
        """Forget every poll (e.g. after an operator resumed a run with new instructions)."""
        self._last.clear()
