"""Which tool calls of a run's conversation the run has accounted for, and by whom.

A model conversation carries every tool call twice over: the model asks for it (by a call id),
and the request after it carries the result. Several parts of the SDK may see the same call:
a framework integration running the tool, a ``@guard.tool`` inside that tool, and the client
integration reading the conversation back from the next request. Each call must be counted
and fed to loop detection exactly once, and the history that a chat resends on its next turn
(a new run) not at all. :class:`ToolLedger` (``run.tool_ledger``) is where they agree:

* every recorded tool call notes its call id (:meth:`ToolLedger.recorded`); a call recorded
  without one (``@guard.tool`` in a hand-written loop) notes its action fingerprint, which the
  read-back matches to the call id it finds in the next request;
* each model response of the run notes the calls it asks for (:meth:`ToolLedger.ask`): only
  those are the run's own. A result in a request whose call no response of this run asked for
  is history (a chat resends its earlier turns; a resumed graph its calls from before the
  interrupt), never counted again. The response keeps the call's name and arguments, for a
  conversation continued by ``previous_response_id``, which resends only the results;
* the read-back claims each result it counts (:meth:`ToolLedger.claim`), once.

:func:`invoking` marks a framework's execution of one tool call: a ``@guard.tool`` recorded
inside it, in the same run, is that call (it takes the framework's call id), so the framework
does not record it again. The mark is a context variable, so parallel tool calls of one turn
(each in its own task or thread context) never take one another's recordings.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["ToolInvocation", "ToolLedger", "claim_invocation", "invoking"]

_MAX_IDS = 4096  # call ids remembered per run: a long run forgets its oldest
_MAX_ASKED = 256  # calls asked for in responses and not yet answered
_MAX_UNNAMED = 256  # recordings without a call id awaiting their read-back


class ToolLedger:
    """The tool calls one run has accounted for (thread-safe; bounded)."""

    __slots__ = ("_asked", "_ids", "_lock", "_unnamed")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[str, None] = {}  # insertion-ordered: the oldest are pruned first
        self._unnamed: list[tuple[str, str]] = []  # (name, action) recorded without a call id
        self._asked: dict[str, tuple[Any, Any]] = {}

    def recorded(self, call_id: str | None, name: str, action: str) -> None:
        """A tool call of this run was recorded (by anyone)."""
        with self._lock:
            if call_id:
                self._remember(call_id)
            else:
                self._unnamed.append((name, action))
                del self._unnamed[:-_MAX_UNNAMED]

    def claim(self, call_id: str) -> tuple[Any, Any] | None:
        """The read-back found a result of ``call_id``: ``(name, arguments)`` from the
        response that asked for it when it is this run's and not accounted for yet (it is
        from then on), else ``None`` (recorded already, or history from before the run).
        Atomic: two requests carrying the same result count it once."""
        with self._lock:
            if call_id in self._ids or call_id not in self._asked:
                return None
            call = self._asked[call_id]
            self._remember(call_id)
            return call

    def take_unnamed(self, name: str, action: str) -> bool:
        """Match a result read back to a recording without a call id since the last read: the
        same action, else the same tool (its arguments bound under other names), else the
        oldest (a function recorded under its own name)."""
        with self._lock:
            unnamed = self._unnamed
            for i, (_, a) in enumerate(unnamed):
                if a == action:
                    del unnamed[i]
                    return True
            for i, (n, _) in enumerate(unnamed):
                if n == name:
                    del unnamed[i]
                    return True
            if unnamed:  # recorded under another name (a wrapper's own): the oldest
                del unnamed[0]
                return True
            return False

    def read_back(self) -> None:
        """A request was read: recordings it did not match were no calls the model asked for
        (a ``@guard.tool`` the code called on its own), so none waits for the next one."""
        with self._lock:
            self._unnamed.clear()

    def ask(self, call_id: str, name: Any, arguments: Any) -> None:
        """The model asked for the call ``call_id`` in a response (``previous_response_id``
        chains send back only its output)."""
        with self._lock:
            if call_id in self._ids:
                return
            self._asked[call_id] = (name, arguments)
            while len(self._asked) > _MAX_ASKED:
                del self._asked[next(iter(self._asked))]

    def _remember(self, call_id: str) -> None:
        self._asked.pop(call_id, None)
        ids = self._ids
        ids[call_id] = None
        while len(ids) > _MAX_IDS:
            del ids[next(iter(ids))]


class ToolInvocation:
    """A framework executing one admitted tool call of ``run``."""

    __slots__ = ("by_code", "call_id", "run")

    def __init__(self, run: Any, call_id: str | None) -> None:
        self.run, self.call_id = run, call_id
        self.by_code = False  # a @guard.tool inside recorded it


_invocation: contextvars.ContextVar[ToolInvocation | None] = contextvars.ContextVar(
    "otel_guard_tool_invocation", default=None
)


@contextlib.contextmanager
def invoking(run: Any, call_id: str | None) -> Iterator[ToolInvocation]:
    """Around a framework's execution of one tool call of ``run``."""
    inv = ToolInvocation(run, call_id)
    token = _invocation.set(inv)
    try:
        yield inv
    finally:
        with contextlib.suppress(ValueError):  # left in another context (a generator's close)
            _invocation.reset(token)


def claim_invocation(run: Any) -> ToolInvocation | None:
    """For a recording of ``run`` made by code: the framework invocation it belongs to, claimed
    (the first recording inside it is the framework's call; later ones are calls of their own),
    or ``None``."""
    inv = _invocation.get()
    if inv is None or inv.run is not run or inv.by_code:
        return None
    inv.by_code = True
    return inv
