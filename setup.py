"""The build's one switch that pyproject.toml cannot hold: ``OTEL_GUARD_REQUIRE_NATIVE=1``.

The four C extensions (``[[tool.setuptools.ext-modules]]``) are optional, so that an sdist
installs without a C compiler and runs the pure-Python paths. A binary wheel must carry all of
them: with ``OTEL_GUARD_REQUIRE_NATIVE=1`` (``make wheel``, cibuildwheel) an extension that does
not compile fails the build instead of being skipped with a warning.
"""

from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_ext import build_ext


class BuildExt(build_ext):
    """``build_ext`` that makes every extension mandatory when the switch is set."""

    def run(self) -> None:
        if os.environ.get("OTEL_GUARD_REQUIRE_NATIVE", "") == "1":
            for ext in self.extensions:
                ext.optional = False  # setuptools skips an optional one that fails
        super().run()


setup(cmdclass={"build_ext": BuildExt})
