"""Shared by every test directory.

``tests/`` is on ``sys.path`` (pytest's rootdir-relative ``prepend`` import mode puts it there
for this conftest; the line below keeps it so under any import mode), so shared helpers import
by module name: ``from _wait import wait_until, wait_until_async``, the one way a test waits
for an event (see ``tests/_wait.py``), and ``from _hyp import examples`` for hypothesis
example counts (the profiles are loaded here, before any test module is imported).

With ``CI=true`` two things that would pass silently elsewhere stop the run:

- a native extension that did not build (the run stops at its start, with the compiler's
  message: see ``tests/_native_build.py``);
- a skip whose reason is not in :data:`CI_ALLOWED_SKIPS` (the run fails at its end, listing
  each one), so a suite CI must cover cannot skip away.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

import _hyp  # noqa: E402  (loads the hypothesis profile before any test module)

CI = _hyp.CI

# Skips CI accepts, by a phrase of their reason: OpenLIT's releases require openai < 3, which
# the frameworks' extras rule out, so its test runs only where it is installed.
CI_ALLOWED_SKIPS = ("OpenLIT",)

_unexpected_skips: list[str] = []


def pytest_report_header(config: pytest.Config) -> list[str]:
    seed = os.environ.get("PYTHONHASHSEED", "random")
    return [f"hypothesis profile {_hyp.PROFILE!r}, PYTHONHASHSEED={seed}, CI={CI}"]


def pytest_sessionstart(session: pytest.Session) -> None:
    if not CI or hasattr(session.config, "workerinput"):  # the controller checks, once
        return
    import _native_build

    reports = _native_build.missing()
    if reports:
        sys.stderr.write("\n\n".join(reports) + "\n")
        names = ", ".join(r.split(" ", 1)[0] for r in reports)
        pytest.exit(
            f"CI=true: {names} not built (compiler output above); the native suites would skip",
            returncode=3,
        )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        if not any(phrase.lower() in reason.lower() for phrase in CI_ALLOWED_SKIPS):
            _unexpected_skips.append(f"{report.nodeid}: {reason or 'no reason given'}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _unexpected_skips and not hasattr(session.config, "workerinput"):
        listed = "\n  ".join(_unexpected_skips)
        sys.stderr.write(
            f"\nCI=true: {len(_unexpected_skips)} skip(s) CI does not allow:\n  {listed}\n"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
