"""Which loop traces no hash-only detector can tell from a legitimate one.

What ``guard.instrument()`` gives the detector of a framework run is, per step (one model
turn), the keyed fingerprints of each tool call and of its result: no facts, no progress flags,
no raw content. Such a detector can only compare fingerprints for equality, so it cannot tell
two traces apart when one becomes the other by a one-to-one renaming of the call fingerprints
and of the result fingerprints, and by reordering the calls within a step (a turn's parallel
calls come in any order); a call of a declared poll it can tell from the rest. If a loop
trace's view up to the step where it must be stopped has the same shape as a legitimate
trace's view up to some step, a detector that stops the loop there stops the legitimate trace
too (or misses the loop):

* ``prefix``: the two views are the same from their first step (any online detector);
* ``window``: the loop's view equals a later stretch of the legitimate trace (a detector whose
  verdict depends on the recent steps, not on where the run began: a sliding window, as every
  loop rule here is).

Each pair is reported with the legitimate trace's step where the shapes meet.
"""

from __future__ import annotations

import collections
import itertools
import json
from typing import Any

from guard.policy import Fingerprinter, LoopSettings

__all__ = ["canon", "indistinguishable", "poll_tools"]

# steps of (call fingerprint, result fingerprint, whether the tool is a declared poll)
_View = list[list[tuple[str, str, bool]]]


def canon(args: Any) -> str:
    return json.dumps(args, sort_keys=True, ensure_ascii=False, default=str)


def poll_tools(trace: Any) -> tuple[str, ...]:
    """A ``polling`` trace's poll tools (declared to the SDK in a framework run): those it
    calls again with the same arguments."""
    if "polling" not in trace.tags:
        return ()
    seen: collections.Counter = collections.Counter(
        (c.tool, canon(c.args)) for s in trace.steps for c in s.calls
    )
    return tuple(sorted({tool for (tool, _), n in seen.items() if n > 1}))


def _view(trace: Any, fp: Fingerprinter) -> _View:
    polls = poll_tools(trace)
    return [
        [(fp.action(c.tool, c.args), fp.result(c.result), c.tool in polls) for c in s.calls]
        for s in trace.steps
    ]


def _extend(maps: tuple[dict, dict, dict, dict], a: tuple, b: tuple) -> bool:
    """Map the calls of ``a`` onto those of ``b``, one to one (call and result fingerprints
    each; a declared poll only onto a declared poll), extending ``maps`` in place; False,
    with ``maps`` possibly half-extended, if not."""
    if a[2] != b[2]:
        return False
    for x, y, fwd, back in ((a[0], b[0], maps[0], maps[1]), (a[1], b[1], maps[2], maps[3])):
        if fwd.setdefault(x, y) != y or back.setdefault(y, x) != x:
            return False
    return True


def _same_shape(a: _View, b: _View) -> bool:
    """Whether ``b`` is ``a`` renamed and reordered within its steps (backtracking per step)."""
    if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b, strict=True)):
        return False

    def match(i: int, maps: tuple[dict, dict, dict, dict]) -> bool:
        if i == len(a):
            return True
        for order in itertools.permutations(b[i]):
            trial = tuple(dict(m) for m in maps)
            if all(_extend(trial, x, y) for x, y in zip(a[i], order, strict=True)) and match(
                i + 1, trial
            ):
                return True
        return False

    return match(0, ({}, {}, {}, {}))


def indistinguishable(traces: list, stop_steps: dict[str, int], settings: LoopSettings) -> dict:
    """For each loop trace (``stop_steps``: the step it must be stopped in), the legitimate
    traces whose view has its shape: ``{loop: {"prefix" | "window": [legit@step, ...]}}``."""
    fp = Fingerprinter(b"corpus-key", ignore_fields=settings.ignore_fields)
    views = {t.name: _view(t, fp) for t in traces}
    legit = [t.name for t in traces if t.label == "legit"]
    found: dict[str, dict[str, list[str]]] = {}
    for loop, stop in stop_steps.items():
        head = views[loop][: stop + 1]
        for name in legit:
            view = views[name]
            for end in range(len(head) - 1, len(view)):
                if _same_shape(head, view[end - len(head) + 1 : end + 1]):
                    kind = "prefix" if end == len(head) - 1 else "window"
                    found.setdefault(loop, {}).setdefault(kind, []).append(f"{name}@{end}")
                    break
    return found
