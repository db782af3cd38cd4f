"""LoopDetector checks each LoopSettings object once, not once per run (issue 14 §1).

The check is the same as before (held here to a copy of the old per-run check), an invalid
object is never remembered as checked, and a detector whose settings were already checked
judges exactly like one whose settings were checked just now.
"""

from __future__ import annotations

import pytest
from _hyp import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from guard.errors import ConfigError
from guard.policy import Fingerprinter, LoopDetector, LoopSettings

FP = Fingerprinter(b"test-key")
_FIELDS = ("window", "repeat_threshold", "no_progress_steps")


def _old_check(s: LoopSettings) -> str | None:
    """The check LoopDetector.__init__ ran for every detector before: the first error."""
    for name in _FIELDS:
        v = getattr(s, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 2:
            return str(ConfigError(f"must be an integer >= 2, got {v!r}", path=f"loop.{name}"))
    return None


_value = st.one_of(
    st.integers(min_value=-3, max_value=40),
    st.booleans(),
    st.floats(min_value=0, max_value=30),
    st.none(),
    st.just("5"),
)


@settings(max_examples=examples(300), deadline=None)
@given(st.tuples(_value, _value, _value))
def test_the_check_is_the_old_one_every_time(values: tuple) -> None:
    s = LoopSettings(**dict(zip(_FIELDS, values, strict=True)))
    expected = _old_check(s)
    for _ in range(2):  # the second build of the same object: checked again if invalid
        if expected is None:
            assert LoopDetector(s).settings is s
        else:
            with pytest.raises(ConfigError) as exc:
                LoopDetector(s)
            assert str(exc.value) == expected


_calls = st.lists(
    st.one_of(
        st.tuples(st.sampled_from("abcd"), st.sampled_from(["r1", "r2", None])),
        st.tuples(st.just("end"), st.sampled_from(["s1", "s2", None])),
    ),
    max_size=60,
)


def _verdicts(det: LoopDetector, calls: list) -> list:
    out = []
    for name, x in calls:
        if name == "end":
            v = det.end_step(state=x, progress=None)
        else:
            v = det.observe_action(FP.action(name, {}), None if x is None else FP.result(x))
        out.append((v.level, v.reason, v.detail))
    return out


@settings(max_examples=examples(150), deadline=None)
@given(
    st.integers(min_value=2, max_value=8),
    st.integers(min_value=2, max_value=5),
    st.integers(min_value=2, max_value=6),
    _calls,
)
def test_a_detector_of_checked_settings_judges_as_a_fresh_one(
    window: int, threshold: int, stale: int, calls: list
) -> None:
    kw = {"window": window, "repeat_threshold": threshold, "no_progress_steps": stale}
    shared = LoopSettings(**kw)
    LoopDetector(shared)  # checked (and remembered) here
    cached = LoopDetector(shared)
    fresh = LoopDetector(LoopSettings(**kw))  # an equal object never seen: checked now
    assert _verdicts(cached, calls) == _verdicts(fresh, calls)
    assert cached.settings == fresh.settings


def test_detectors_without_settings_share_the_default_object() -> None:
    """Fails on the old code, which made (and checked) a new LoopSettings per detector."""
    a, b = LoopDetector(), LoopDetector(None)
    assert a.settings is b.settings
    assert a.settings == LoopSettings()
