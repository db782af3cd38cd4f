"""MkDocs hook: the pages generated from the code, added to the build as virtual files.

``reference/policy.md`` is rendered from the policy engine's settings objects and
``reference/cli.md`` from the ``otel-guard`` argument parser, at every build (``mkdocs serve``
watches ``guard/`` too), so neither can drift from the code. Nothing is written to ``docs/``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cli_ref
import policy_ref

GENERATED: dict[str, Callable[[], str]] = {
    "reference/policy.md": policy_ref.render_policy_reference,
    "reference/cli.md": cli_ref.render_cli_reference,
}


def on_files(files: Files, config: Any) -> Files:
    for uri, render in GENERATED.items():
        stale = files.get_file_from_path(uri)
        if stale is not None:  # a file of that name in docs/ would be taken for the page
            raise RuntimeError(f"docs/{uri} is generated at build time: remove the file")
        files.append(File.generated(config, uri, content=render()))
    return files
