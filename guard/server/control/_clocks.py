"""The agents' clocks as the guard sees them: the skew of each agent session.

An agent's Hello carries its wall clock (``Hello.agent_time_unix``); the guard compares it
with its own receive time when the Hello arrives. The difference (agent minus guard, in
seconds; the stream's one-way latency is in it, well under a second) is kept on the session
(``AgentSession.clock_skew_s``, ``None`` when the agent did not say), reported in
``GuardAdmin.Stats`` (:func:`skew_figures`) and the metrics, and logged once per session
beyond :data:`SKEW_WARN_S`. Timestamps the agent sends are then put on the guard's clock
where they matter (``_record_in.mend_started``, ``_record_in.mend_clock``): a skewed agent
is guarded and its records are kept, never refused for its clock.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from typing import Any

__all__ = ["SKEW_NOTABLE_S", "SKEW_WARN_S", "note_hello_clock", "skew_figures"]

log = logging.getLogger("guard.server")

SKEW_NOTABLE_S = 60.0  # beyond this an agent's clock is counted as skewed, and corrected for
SKEW_WARN_S = 300.0  # beyond this, one WARNING line per session


def note_hello_clock(registry: Any, session: Any, hello: Any, now: float | None = None) -> None:
    """Record the skew of ``session``'s agent clock from its Hello (nothing when the Hello
    carries no finite ``agent_time_unix``): the session attribute, the registry's counters
    (``sessions_clock_skewed``: sessions beyond :data:`SKEW_NOTABLE_S` since start;
    ``clock_skew_max_abs_s``: the largest seen since start), and one WARNING line beyond
    :data:`SKEW_WARN_S` naming the agent process and the skew."""
    agent_time = hello.agent_time_unix
    if not agent_time or not math.isfinite(agent_time):
        session.clock_skew_s = None
        return
    skew = agent_time - (time.time() if now is None else now)
    session.clock_skew_s = skew
    stats = registry.stats
    size = abs(skew)
    if size > stats.get("clock_skew_max_abs_s", 0.0):
        stats["clock_skew_max_abs_s"] = size
    if size <= SKEW_NOTABLE_S:
        return
    stats["sessions_clock_skewed"] = stats.get("sessions_clock_skewed", 0) + 1
    if size > SKEW_WARN_S:
        log.warning(
            "guard: agent process %.80r (host %.80r, pid %d, tenant %.80r) has a wall clock "
            "%+.0f s off the guard's; its out-of-bounds timestamps are replaced by the "
            "guard's receive time",
            hello.process_id,
            hello.host,
            hello.pid,
            session.tenant or hello.tenant,
            skew,
        )


def skew_figures(sessions: Iterable[Any]) -> dict[str, float]:
    """Over the attached sessions: the largest absolute clock skew (s) and how many are
    beyond :data:`SKEW_NOTABLE_S` (``GuardAdmin.Stats``, the metrics' gauges)."""
    worst, skewed = 0.0, 0
    for session in list(sessions):
        skew = getattr(session, "clock_skew_s", None)
        if skew is None:
            continue
        size = abs(skew)
        worst = max(worst, size)
        skewed += size > SKEW_NOTABLE_S
    return {"clock_skew_live_max_abs_s": worst, "sessions_clock_skewed_live": float(skewed)}
