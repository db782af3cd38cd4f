"""The native extensions the suite must test, and why one is missing.

Every extension is optional in the build (an install without a C compiler falls back to the
pure-Python paths), so a compiler error is only a warning in pip's output, and the native
differential suites skip. In CI that would pass while testing none of the native code:
:func:`missing` names each extension that does not import, with the compiler's own message,
and the suite's ``conftest`` stops the run on it when ``CI=true``.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

__all__ = ["extensions", "missing"]

ROOT = Path(__file__).resolve().parent.parent


def extensions() -> list[tuple[str, list[str]]]:
    """``(module name, sources)`` of each native extension, as ``pyproject.toml`` declares."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [(e["name"], list(e["sources"])) for e in project["tool"]["setuptools"]["ext-modules"]]


def missing() -> list[str]:
    """One report per extension that does not import: its name, the import error, and the
    output of compiling it again with setuptools (the compiler's message)."""
    reports = []
    for name, sources in extensions():
        try:
            importlib.import_module(name)
        except ImportError as exc:
            reports.append(f"{name} is not built ({exc}).\n{_compile(name, sources)}")
    return reports


def _compile(name: str, sources: list[str]) -> str:
    """Build ``name`` alone, the way setuptools builds it, into a scratch folder."""
    script = (
        "import sys; from setuptools import Extension, setup; "
        "setup(name='probe', ext_modules=[Extension(sys.argv[2], sys.argv[3:])], "
        "script_args=['-q', 'build_ext', '-b', sys.argv[1], '-t', sys.argv[1]])"
    )
    with tempfile.TemporaryDirectory() as tmp:
        try:
            out = subprocess.run(
                [sys.executable, "-c", script, tmp, name, *(str(ROOT / f) for f in sources)],
                cwd=tmp,  # away from pyproject.toml, whose reading only adds warnings
                capture_output=True,
                text=True,
                timeout=300,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"building it again failed to run: {exc}"
    text = (out.stdout + out.stderr).strip() or "(the compiler printed nothing)"
    verdict = "it builds now (stale install?)" if out.returncode == 0 else "the build says:"
    return f"{verdict}\n{text}"
