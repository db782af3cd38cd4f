"""Loop and stagnation detection over a bounded window of fingerprints.

Memory is compact on purpose (the guard tracks up to 100k live runs at <= 4 KB each): the
detector keeps the last ``window`` tool calls as two ring buffers of 64-bit ints (the first 64
bits of the action fingerprint and of the result hash) plus a few counters, about 0.6 KB for
the default window of 20.

Patterns, all counted on the *current* call (so the same threshold means the same thing):

``exact_repeat``     the same action with the same result, back to back, ``repeat_threshold``
                     times.
``repeat_in_window`` the same action with the same result ``repeat_threshold`` times within the
                     window, other calls in between.
``cycle``            the recent calls repeat with period 2, 3 or 4 (A-B-A-B, A-B-C-A-B-C...)
                     and the current call is its ``repeat_threshold``-th occurrence in the cycle.
``same_result``      ``repeat_threshold + 2`` calls in a row returned the same result while the
                     actions (arguments) varied: the model keeps rephrasing the same dead end
                     (a refund bot querying orders and the knowledge base with shifting
                     arguments, always getting an empty result).
``no_state_change``  ``no_progress_steps`` steps in a row with actions but an unchanged state
                     hash, or with ``progress=False``.

New-information exemption: a repeat only counts while its result stays the same. When the same
action returns a different result, its count starts again (a changed result is new
information), so read -> edit -> read, polling that sees changes, pagination (``page`` is an
ignored field, but each page returns new rows) and test -> fix -> test with changing test output
are never stopped. Unknown results (``None``) count as "no new information".

Re-reading alongside new work: the same lookup with the same result, repeated while the agent
does new work and its facts grow, is not a loop (the refund policy read again for each new
customer). Two occurrences of a repeated call are *separated* when, between them, the facts grew
(a step ended with a changed state hash or ``progress=True``; the first state seen is only a
baseline) and some call brought new work: an action and a result that each occur once in the
window, judged when the repeat is counted. A repeat counts back only to the last separation.
Both signals are needed, so a frozen state, forged facts around calls that bring nothing new,
or new results without new facts leave the count as it was; without any state or progress
signal nothing changes. Cycles, ``same_result`` and stagnation do not use the exemption: in a
true cycle every call recurs, so by a repeat's third occurrence nothing between two of them is
new (with ``repeat_threshold`` 2 the exemption is off: the first repeat already stops).

Every pattern warns one short of its stop threshold, so the agent gets a chance to change course.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from struct import Struct

from guard.errors import ConfigError
from guard.policy._fingerprint import hash64, native_module
from guard.policy._types import Action, LoopSettings, Reason

__all__ = ["LoopDetector", "LoopVerdict"]


@dataclass(frozen=True, slots=True)
class LoopVerdict:
    """What the detector concluded about the latest call or step."""

    level: Action
    reason: Reason | None = None
    pattern: str | None = None
    count: int = 0
    detail: str = ""


_OK = LoopVerdict(Action.CONTINUE)


def verdict(level: Action, reason: Reason, pattern: str, count: int, what: str) -> LoopVerdict:
    """A WARN or STOP finding: its detail reads ``"<reason>: <what>; stopping|warning"``."""
    verb = "stopping" if level is Action.STOP else "warning"
    return LoopVerdict(level, reason, pattern, count, f"{reason.value}: {what}; {verb}")


_pack = Struct("=Q").pack  # one ring slot as bytes (native order, like array("Q"))
# Among verdicts of the same level, the more specific pattern names the finding.
_PRIORITY = {"exact_repeat": 0, "cycle": 1, "repeat_in_window": 2, "same_result": 3}


_DEFAULT_SETTINGS = LoopSettings()
# id -> the LoopSettings that passed LoopDetector's check. The entry holds the object, so its
# id is not reused while cached; bounded because settings come from code and policy, a few
# per process (like the escalation triggers' cache).
_CHECKED: dict[int, LoopSettings] = {}
_CHECKED_MAX = 1024


class LoopDetector:
    """Per-run loop and stagnation detector. Not thread-safe: one caller per run."""

    __slots__ = (
        "_acts",
        "_base",
        "_gbits",
        "_goff",
        "_n",
        "_native",
        "_res",
        "_stale",
        "_state",
        "hits",
        "settings",
    )

    def __init__(self, settings: LoopSettings | None = None) -> None:
        if settings is None:
            settings = _DEFAULT_SETTINGS
        # Settings objects are checked once each, not once per run: the guard and the SDK
        # build every run's detector from the same few (frozen) LoopSettings of their limits.
        if _CHECKED.get(id(settings)) is not settings:
            for name in ("window", "repeat_threshold", "no_progress_steps"):
                v = getattr(settings, name)
                if isinstance(v, bool) or not isinstance(v, int) or v < 2:
                    raise ConfigError(f"must be an integer >= 2, got {v!r}", path=f"loop.{name}")
            if len(_CHECKED) >= _CHECKED_MAX:
                _CHECKED.clear()
            _CHECKED[id(settings)] = settings
        self.settings = settings
        w = settings.window
        self._acts = array("Q", bytes(8 * w))
        self._res = array("Q", bytes(8 * w))
        # Where the facts grew: bit ``b - _goff`` is set when they grew after call count ``b``.
        # Written per step, never on the per-call path; trimmed to about two windows of bits,
        # since only the last ``window`` calls are ever compared.
        self._gbits = 0
        self._goff = 0
        self._base = -1  # where the first state was seen, until the state first changes
        self._n = 0
        self._state = 0
        self._stale = 0
        self.hits = 0
        self._native = native_module()  # per instance: tests compare it with the reference

    def nbytes(self) -> int:
        """Approximate memory held by this detector (object, both ring buffers, growth mask)."""
        import sys

        return (
            sys.getsizeof(self)
            + sys.getsizeof(self._acts)
            + sys.getsizeof(self._res)
            + sys.getsizeof(self._gbits)
        )

    def _level(self, count: int, threshold: int) -> Action:
        if count >= threshold:
            return Action.STOP
        if count == threshold - 1:
            return Action.WARN
        return Action.CONTINUE

    def observe_action(self, action: str, result: str | None) -> LoopVerdict:
        """Record one tool call (in order) and judge the window including it."""
        settings = self.settings
        w = settings.window
        k = settings.repeat_threshold
        ring_a, ring_r = self._acts, self._res
        i = self._n % w
        # Every pattern needs this action at least k-1 times in the window (repeats, cycles)
        # or this result at least k+1 times (same_result; the native filter asks for k+1 in
        # a row, which same_result counts): below that, nothing can fire.
        native = self._native
        quiet = (
            None
            if native is None
            else native.observe(ring_a, ring_r, i, action, result, k - 1, k + 1)
        )
        if quiet is not None:  # a canonical fingerprint: written and counted natively
            self._n += 1
            if quiet:
                return _OK
            a, r = ring_a[i], ring_r[i]
        else:
            a = hash64(action) or 1
            r = hash64(result) if result else 0
            ring_a[i] = a
            ring_r[i] = r
            self._n += 1
            # Two C-level scans of the rings' bytes (array.count boxes every element: 3x
            # slower). A byte match may also start between two slots, but each such match
            # hides at most one real one, so the byte count is never below the real count:
            # the filter stays exact, and a spurious excess only costs the full check below.
            if ring_a.tobytes().count(_pack(a)) < k - 1 and (
                not r or ring_r.tobytes().count(_pack(r)) < k + 1
            ):
                return _OK
        return self._judge(a, r)

    def judge_last(self) -> LoopVerdict:
        """The full check of the call written last, which the record kernel
        (``_kernels.loop_observe``) found might fire."""
        i = (self._n - 1) % self.settings.window
        return self._judge(self._acts[i], self._res[i])

    def _judge(self, a: int, r: int) -> LoopVerdict:
        """Judge the window, whose newest call (action ``a``, result ``r``) is written."""
        settings = self.settings
        w = settings.window
        k = settings.repeat_threshold
        m = min(self._n, w)
        cut = self._n % w if self._n >= w else m
        # Newest first, by C-level slicing of the ring (oldest..newest, reversed).
        acts = (self._acts[cut:m] + self._acts[:cut])[::-1].tolist()
        res = (self._res[cut:m] + self._res[:cut])[::-1].tolist()
        found: list[tuple[Action, str, int, str]] = []

        # Repeats of this action with this result, until its result last differed or, when
        # the facts grew in the window, until new work separated two of them.
        count, exact, streak, newer = 0, True, True, 0
        # With repeat_threshold 2 the first repeat stops, before a cycle's other calls have
        # recurred: its B in A-B-A would pass for new work. So every repeat counts there.
        grew = self._gbits if k > 2 else 0
        for j in range(m):
            if acts[j] == a:
                if res[j] != r:
                    break  # new information: the count starts again here
                if grew and j and self._grew_between(newer, j) and _new_work(acts, res, newer, j):
                    break  # re-read alongside new work while the facts grew: not a repeat
                count += 1
                newer = j
                exact = exact and streak
            else:
                streak = False
        lvl = self._level(count, k)
        if lvl is not Action.CONTINUE:
            pattern = "exact_repeat" if exact else "repeat_in_window"
            found.append((lvl, pattern, count, f"same call with the same result {count}x"))

        # Cycles of period 2..4 over (action, result) pairs.
        for p in (2, 3, 4):
            if m < 2 * p:
                break
            block = {(acts[j], res[j]) for j in range(p)}
            if len(block) < 2:
                continue
            run = 0
            while run + p < m and acts[run] == acts[run + p] and res[run] == res[run + p]:
                run += 1
            if run < p:
                continue
            occurrences = (run + p - 1) // p + 1
            lvl = self._level(occurrences, k)
            if lvl is not Action.CONTINUE:
                detail = f"cycle of period {p} repeated, call seen {occurrences}x"
                found.append((lvl, "cycle", occurrences, detail))
                break

        # The same (known) result while the actions vary.
        if r:
            same, varied = 0, False
            for j in range(m):
                if res[j] != r:
                    break
                same += 1
                varied = varied or acts[j] != a
            lvl = self._level(same, k + 2) if varied else Action.CONTINUE
            if lvl is not Action.CONTINUE:
                found.append((lvl, "same_result", same, f"same result {same}x in a row"))

        if not found:
            return _OK
        found.sort(key=lambda f: (f[0] is not Action.STOP, _PRIORITY[f[1]]))
        lvl, pattern, count, detail = found[0]
        self.hits += 1
        what = f"{pattern}: {detail} (window={w}, repeat_threshold={k})"
        return verdict(lvl, Reason.LOOP_DETECTED, pattern, count, what)

    def _grown(self, n: int | None = None) -> None:
        """The facts grew at the end of this step (or after call count ``n``): remember where
        (between which calls). Setting a bit twice is harmless."""
        b = (self._n if n is None else n) - self._goff
        if b >= 2 * len(self._acts):  # keep the mask short: growth before the window is moot
            drop = b - len(self._acts)
            self._gbits >>= drop
            self._goff += drop
            b -= drop
        if b >= 0:
            self._gbits |= 1 << b

    def _grew_between(self, newer: int, older: int) -> bool:
        """Whether the facts grew between the calls at newest-first window positions
        ``newer < older``. A call at position ``j`` is call number ``t = n - 1 - j``; growth
        after call count ``b`` lies between them when ``t_old < b <= t_new``."""
        shift = self._n - older - self._goff  # t_old + 1 - _goff
        width = older - newer
        if shift < 0:  # before the kept bits: only the kept part can hold growth
            width += shift
            shift = 0
        return width > 0 and bool((self._gbits >> shift) & ((1 << width) - 1))

    def end_step(
        self, *, state: str | None, progress: bool | None, acted: bool = True
    ) -> LoopVerdict:
        """Record the end of a step and judge stagnation.

        ``progress=True`` or a changed ``state`` resets the count. ``progress=False`` counts a
        stale step; an unchanged state counts one only if the step acted (called tools). With
        neither signal the count is left alone: no information is not evidence of a loop.
        """
        if progress is True:
            self._stale = 0
            if state is not None:
                self._state = hash64(state)
            b = self._n - self._goff  # _grown() inlined: once per step on the SDK's path
            if b < 2 * len(self._acts):
                self._gbits |= 1 << b
            else:
                self._grown()
            return _OK
        if progress is False:
            stale = True  # an explicit "no progress" wins over a changed state
        elif state is not None:
            h = hash64(state)
            if h != self._state:
                # The first state seen only becomes growth (from no facts to some) once the
                # state moves again: a state frozen from the start never grew.
                if not self._state:
                    self._base = self._n
                else:
                    if self._base >= 0:
                        self._grown(self._base)
                        self._base = -1
                    self._grown()
                self._stale = 0
                self._state = h
                return _OK
            stale = acted
        else:
            return _OK
        if state is not None:
            self._state = hash64(state)
        if not stale:
            return _OK
        self._stale += 1
        n = self.settings.no_progress_steps
        lvl = self._level(self._stale, n)
        if lvl is Action.CONTINUE:
            return _OK
        self.hits += 1
        what = f"state unchanged for {self._stale} steps (no_progress_steps={n})"
        return verdict(lvl, Reason.NO_PROGRESS, "no_state_change", self._stale, what)

    @property
    def stale_steps(self) -> int:
        return self._stale

    def reset(self) -> None:
        """Forget everything (e.g. after an operator resumed a run with new instructions)."""
        w = self.settings.window
        self._acts = array("Q", bytes(8 * w))
        self._res = array("Q", bytes(8 * w))
        self._n = self._state = self._stale = self._gbits = self._goff = 0
        self._base = -1


def _new_work(acts: list[int], res: list[int], newer: int, older: int) -> bool:
    """Whether a call between window positions ``newer < older`` (newest first) brought new
    work: its action and its (known) result each occur only once in the window."""
    for i in range(newer + 1, older):
        x = res[i]
        if x and acts.count(acts[i]) == 1 and res.count(x) == 1:
            return True
    return False
