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

The slowest files run first (:data:`SLOW_FILES`), so that under ``-n 2 --dist loadfile`` both
workers finish together: only the order of the files changes, never what runs.
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

# Seconds a file takes (its tests' setup, call and teardown: --durations, one tier of make test
# on two cores with a third process keeping one of them busy), for every file over ~4 s. With
# --dist loadfile a file is one unit of work, handed to whichever worker has run out, in
# collection order: the longest go first and the short ones fill in at the end, so the two
# workers finish within a few seconds of each other. (xdist's own order, most tests first, puts
# a one-test file of half a minute last, and one worker then runs it alone.) A file not listed
# keeps pytest-randomly's place for it, after these; an outdated figure costs only time.
SLOW_FILES = {
    # core tier
    "tests/fleet/test_fleet_faults.py": 38,
    "tests/store/test_exactly_once.py": 32,
    "tests/server/test_faults.py": 28,
    "tests/sdk/test_foreign_instrumentations.py": 26,
    "tests/fleet/test_soak_replica_kill.py": 24,
    "tests/test_imports.py": 18,
    "tests/server/test_full_disk_fleet.py": 18,
    "tests/policy/test_policy_fingerprint_native.py": 12,
    "tests/replicas/test_replicas.py": 12,
    "tests/store/test_crash.py": 12,
    "tests/fleet/test_record_claims.py": 11,
    "tests/replicas/test_replicas_lost.py": 11,
    "tests/deploy/test_deploy_helm.py": 9,
    "tests/server/test_native_decode.py": 9,
    "tests/redisstate/test_races.py": 9,
    "tests/e2e/test_demo.py": 9,
    "tests/policy/test_policy_kernels.py": 8,
    "tests/store/test_rows.py": 8,
    "tests/store/test_report.py": 7,
    "tests/server/test_applier_reference.py": 7,
    "tests/server/test_control_memory.py": 7,
    "tests/redisstate/test_replicas.py": 7,
    "tests/store/test_writer.py": 6,
    "tests/server/test_applier_native.py": 6,
    "tests/redisstate/test_overshoot.py": 6,
    "tests/policy/test_policy_escalation.py": 6,
    "tests/store/test_dead_letter.py": 5,
    "tests/sdk/test_sdk_control_clocks.py": 5,
    "tests/native/test_hostile_objects.py": 5,
    "tests/deploy/test_deploy_collector_e2e.py": 5,
    "tests/redisstate/test_equivalence.py": 5,
    "tests/server/test_native_decode_varints.py": 5,
    "tests/store/test_schema.py": 4,
    "tests/server/test_otlp_http.py": 4,
    "tests/server/test_fuzz.py": 4,
    "tests/store/test_rows_native.py": 4,
    "tests/policy/test_policy_fingerprint.py": 4,
    "tests/replicas/test_budget_failover.py": 4,
    # framework tier
    "tests/integrations/test_openai_reporters.py": 20,
    "tests/integrations/test_langgraph.py": 16,
    "tests/integrations/test_openai_agents.py": 16,
    "tests/integrations/test_anthropic.py": 10,
    "tests/integrations/test_providers.py": 7,
    "tests/integrations/test_pydantic_ai.py": 5,
    "tests/integrations/test_langchain_anthropic.py": 4,
    "tests/integrations/test_openai_agents_apps.py": 4,
}


def pytest_report_header(config: pytest.Config) -> list[str]:
    seed = os.environ.get("PYTHONHASHSEED", "random")
    return [f"hypothesis profile {_hyp.PROFILE!r}, PYTHONHASHSEED={seed}, CI={CI}"]


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # xdist: keep the order set below
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slowest files first (a stable sort: after pytest-randomly's shuffle, which runs
    before this hook, the order within a file and among the other files is still its own)."""
    items.sort(key=lambda item: -SLOW_FILES.get(item.nodeid.split("::", 1)[0], 0))


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
