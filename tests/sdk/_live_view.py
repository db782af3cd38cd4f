"""The guard's live view of one run (``GuardAdmin.ListRuns``): what it counted from the spans."""

from __future__ import annotations

from _wait import wait_until

import guard
from guard.cli._client import AdminClient

__all__ = ["live_view"]


def live_view(address: str, run_id: str, model_calls: int) -> dict[str, int]:
    """Call inside the run, after its calls: the guard's usage of it once it counted
    ``model_calls`` model calls (bounded wait), read again after a second flush, when a second
    count of any of them would have arrived too."""

    def read() -> dict[str, int]:
        with AdminClient(address) as c:
            for r in c.list_runs().runs:
                if r.run_id == run_id:
                    u = r.usage
                    tokens = u.input_tokens + u.output_tokens
                    return {"model_calls": u.model_calls, "tokens": tokens}
        return {"model_calls": 0, "tokens": 0}

    guard.flush(10)
    wait_until(lambda: read()["model_calls"] >= model_calls, 10, f"{model_calls} model calls")
    guard.flush(10)  # a barrier, not a sleep: whatever else the SDK had to send is counted now
    return read()
