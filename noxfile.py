"""The suite's tiers on each Python that CI tests: ``nox -s tests-3.13`` (or -3.11, -3.12).

A session installs the project with its ``dev`` extra into a fresh virtualenv of that Python
(the native extensions are built for it), then runs the policy, wire, native-differential,
store and SDK tiers, seeded like ``make test``: ``TEST_SEED`` from the environment, or a new
one, printed. Arguments after ``--`` replace the tiers: ``nox -s tests-3.13 -- tests/policy``.

``nox -s compat-latest`` runs the framework integrations' tier (``tests/integrations``) with each
framework upgraded to its newest release, past the extras' upper bounds (see the session).

An interpreter is looked up as ``python3.X`` on PATH, then in pyenv's versions (pyenv's shims
answer only for the versions the shell selected, so they do not count).
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import subprocess

import nox

PYTHONS = ["3.11", "3.12", "3.13"]
TIERS = [
    "tests/policy",
    "tests/store",
    "tests/sdk",
    # the wire: the proto contract, the attribute table, OTLP decoding, records on the wire
    "tests/test_proto_drift.py",
    "tests/test_semconv.py",
    "tests/server/test_decode.py",
    "tests/server/test_decode_aliases.py",
    "tests/server/test_wire_outcome.py",
    # the native paths against their references (the policy's and the store's are above)
    "tests/server/test_native_decode.py",
    "tests/server/test_applier_native.py",
    "tests/server/test_applier_reference.py",
]

# The libraries the integrations adapt (the extras openai, anthropic, openai-agents,
# pydantic-ai and langgraph), as compat-latest upgrades them.
FRAMEWORKS = [
    "openai",
    "anthropic",
    "openai-agents",
    "pydantic-ai-slim",
    "langgraph",
    "langchain-core",
    "langchain-openai",
]

nox.options.sessions = [f"tests-{v}" for v in PYTHONS]
nox.options.default_venv_backend = "venv"


def _runs(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", ""], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _find(version: str) -> str | None:
    """The bin folder of a working ``python<version>``, or None."""
    on_path = shutil.which(f"python{version}")
    if on_path and _runs(on_path):
        return os.path.dirname(on_path)
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    for candidate in sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}")):
        if _runs(candidate):
            return os.path.dirname(candidate)
    return None


def available(version: str) -> bool:
    """Whether ``python<version>`` can be had; puts its folder first on PATH when found."""
    folder = _find(version)
    if folder is None:
        return False
    path = os.environ.get("PATH", "")
    if not path.startswith(folder + os.pathsep):
        os.environ["PATH"] = folder + os.pathsep + path
    return True


for _version in PYTHONS:
    available(_version)


def _install_dev(session: nox.Session) -> None:
    """The project with its ``dev`` extra (every integration's extra and the test tools)."""
    suffix = session.run(
        "python",
        "-c",
        "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))",
        silent=True,
    ).strip()
    # an extension that fails to build for this Python must not leave an older build behind
    for stale in glob.glob(f"guard/**/*{suffix}", recursive=True):
        os.remove(stale)
    session.install("-e", ".[dev]")


def _pytest(session: nox.Session, *args: str) -> None:
    """pytest seeded like ``make test``: TEST_SEED from the environment, or a new one, printed."""
    seed = os.environ.get("TEST_SEED") or str(random.SystemRandom().randrange(2**32))
    session.log(f"test seed {seed} (replay: TEST_SEED={seed} nox -s {session.name})")
    session.run(
        "python",
        "-m",
        "pytest",
        "-n",
        "2",
        "--dist",
        "loadfile",
        f"--randomly-seed={seed}",
        f"--hypothesis-seed={seed}",
        "--durations=15",
        *args,
        env={"PYTHONHASHSEED": seed},
    )


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The policy, wire, native-differential, store and SDK tiers on one Python."""
    _install_dev(session)
    _pytest(session, *(session.posargs or TIERS))


# 3.13: the newest Python CI tests, which a framework's newest release supports first; and not
# the 3.11 of the development .venv, whose in-tree extensions this install would rebuild.
@nox.session(name="compat-latest", python="3.13")
def compat_latest(session: nox.Session) -> None:
    """The framework tier with each framework at its newest release.

    The extras cap each library below a version not tested yet (below the next major, and the
    0.x Agents SDK below its next minor, whose private modules the integration wraps). This
    session installs them, then upgrades every framework to its newest release whatever those
    caps say (pip reports the conflict and goes on), prints what is installed, and runs
    ``tests/integrations`` as the Makefile's framework tier does (``FRAMEWORK_TIMEOUT_S``, 600 s
    per test by default). A failure here is a release the integrations do not support yet.
    Arguments after ``--`` replace the tier:
    ``nox -s compat-latest -- tests/integrations/test_openai_agents.py``.
    """
    _install_dev(session)
    session.install("-U", *FRAMEWORKS)
    versions = session.run(
        "python",
        "-c",
        "import sys; from importlib.metadata import version; "
        "print(', '.join(f'{p} {version(p)}' for p in sys.argv[1:]))",
        *FRAMEWORKS,
        silent=True,
    ).strip()
    session.log(f"frameworks: {versions}")
    # the caps a newest release passes (informational: the tests decide)
    session.run("python", "-m", "pip", "check", success_codes=[0, 1])
    timeout = os.environ.get("FRAMEWORK_TIMEOUT_S", "600")
    _pytest(session, "--timeout", timeout, *(session.posargs or ["tests/integrations"]))
