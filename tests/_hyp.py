"""The suite's hypothesis profiles, loaded before any test module is imported.

- ``dev`` (the default): what a contributor runs; failures print their ``@reproduce_failure``
  blob.
- ``ci`` (``CI=true``): the same example counts, and shrinking stops after
  ``CI_SHRINK_S`` seconds, so one failing property cannot eat the suite's time budget. The
  seed comes from ``--hypothesis-seed``, which ``make test`` passes and prints.
- ``exhaustive`` (``make test-exhaustive``): ten times the examples of every property (ten
  times its ``full`` count, where it names one: see :func:`examples`).

Tests give their example counts through :func:`examples`, so a profile scales them all (an
explicit ``max_examples=`` in ``@settings`` would override any profile). A property that is
cheap to state but dear to run (thousands of generated records) names a second, larger count
for ``exhaustive`` (``examples(1000, full=4000)``): every ``make test`` runs the first, from
a fresh seed each time, and ``make test-exhaustive`` ten times the second.
"""

from __future__ import annotations

import os

from hypothesis import settings

__all__ = ["CI", "CI_SHRINK_S", "PROFILE", "examples"]

CI_SHRINK_S = 60
_SCALE = {"dev": 1, "ci": 1, "exhaustive": 10}

settings.register_profile("dev", print_blob=True)
settings.register_profile("ci", print_blob=True)
settings.register_profile("exhaustive", print_blob=True)

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")  # the suite's one reading of it
PROFILE = os.environ.get("OTEL_GUARD_HYPOTHESIS_PROFILE") or ("ci" if CI else "dev")
if PROFILE not in _SCALE:
    raise SystemExit(
        f"OTEL_GUARD_HYPOTHESIS_PROFILE={PROFILE!r}: expected one of {', '.join(_SCALE)}"
    )
settings.load_profile(PROFILE)

if PROFILE == "ci":
    # Hypothesis has no public setting for the shrinker's time budget; its engine reads this
    # module constant (300 s) each time it starts shrinking. Without it, one rare failure in
    # CI spent 158 s shrinking. A failure still prints its blob, shrunk or not.
    from hypothesis.internal.conjecture import engine as _engine

    if hasattr(_engine, "MAX_SHRINKING_SECONDS"):
        _engine.MAX_SHRINKING_SECONDS = CI_SHRINK_S


def examples(n: int, *, full: int | None = None) -> int:
    """``n`` examples, scaled by the loaded profile; under ``exhaustive`` the scale applies to
    ``full`` instead, where given (at least ``n``)."""
    if full is not None and full < n:
        raise ValueError(f"examples({n}, full={full}): full must be at least n")
    base = full if full is not None and _SCALE[PROFILE] > 1 else n
    return base * _SCALE[PROFILE]
