"""Built-in limit presets per task type.

The step cap must follow the task: an FAQ needs one lookup at most, a customer-service flow
looks up, checks and acts, a code fix edits, tests, reads the error and edits again, research
fans out and cross-checks, and browser automation takes many fine-grained actions, so it caps
actions and total time together. A preset is a *tightening* (``PolicyConfig.effective_limits``
tightens the run defaults with it, field by field), so a preset can never loosen what the
policy file's ``runs`` section allows; loop settings therefore stay at or below the default
:class:`~guard.policy.LoopSettings`. The policy file may override any preset or add new ones.
"""

from __future__ import annotations

from guard.policy._types import Limits, LoopSettings

__all__ = ["PRESETS"]

PRESETS: dict[str, Limits] = {
    # Small cap: no tools or a single lookup; a long FAQ run is a stuck run.
    "faq": Limits(
        max_steps=4,
        max_tool_calls=4,
        max_tokens=20_000,
        deadline_s=30.0,
        reserve_tokens=1_000,
        reserve_s=3.0,
        loop=LoopSettings(window=10, repeat_threshold=2, no_progress_steps=3),
    ),
    # Query, verify, act. Repeating a side-effecting call (a payment) is a serious risk, so
    # the repeat threshold stays at the default 3 and stagnation is judged quickly.
    "customer_service": Limits(
        max_steps=12,
        max_tool_calls=40,
        max_tokens=60_000,
        deadline_s=90.0,
        reserve_tokens=3_000,
        reserve_s=8.0,
        loop=LoopSettings(window=20, repeat_threshold=3, no_progress_steps=6),
    ),
    # Edit -> test -> read error -> edit is progress while the test output changes (the
    # new-information exemption), so the loop settings stay at the defaults.
    "code_fix": Limits(
        max_steps=40,
        max_tool_calls=150,
        max_tokens=400_000,
        deadline_s=900.0,
        reserve_tokens=8_000,
        reserve_s=30.0,
        loop=LoopSettings(),
    ),
    # Search, filter, analyse, cross-check: sized by a worked research budget (400K input
    # tokens over ~14 rounds of B=6000, D=2500), with a reserve to write the report.
    "research": Limits(
        max_steps=30,
        max_tool_calls=120,
        max_tokens=400_000,
        max_cost_usd=2.0,
        deadline_s=600.0,
        reserve_tokens=16_000,
        reserve_s=30.0,
        loop=LoopSettings(),
    ),
    # Many small actions: cap the action count and the total deadline together.
    "browser": Limits(
        max_steps=60,
        max_tool_calls=200,
        max_tokens=300_000,
        deadline_s=300.0,
        reserve_tokens=4_000,
        reserve_s=15.0,
        loop=LoopSettings(),
    ),
}
