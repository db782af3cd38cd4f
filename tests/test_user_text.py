"""No internal references in anything a user reads.

Users never see the design document, the issue tracker, the commits or the source articles the
design was drawn from, so what they read must say the thing itself instead of citing one of
them ("the stop order", not "DESIGN §3.5"). What a user reads:

- the READMEs, the documentation site (``docs/``, ``mkdocs.yml``), the Helm chart, the
  collector configurations, the dashboards and alert rules, the examples and the protocol
  definition (``proto/``, read by whoever writes a client) — every line of them, comments
  included: examples are read as a whole;
- in ``guard/``, the docstrings and the other string constants of every module (they surface
  in ``help()``, the API docs, log lines, error messages and ``--help``), read with :mod:`ast`
  so that ``#`` comments, which only maintainers read, are left out; and the Markdown files
  that ship inside the package;
- the ``--help`` of ``otel-guard`` and of each of its subcommands, as argparse renders it.

Each hit is reported as ``file:line: [pattern 'match', ...] line``.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# name -> pattern. Each one is an internal reference in any text a user reads.
PATTERNS: dict[str, re.Pattern[str]] = {
    # The internal documents, by the names they go by: "DESIGN §3.5", "DESIGN.md",
    # 'CONTRACTS "Spans"'. Case-sensitive, whole word: "design" or "contracts" as ordinary
    # words, "REDESIGNED" or "DESIGNER" are not references.
    "internal document": re.compile(r"(?<![A-Za-z])(?:DESIGN|CONTRACTS)(?![A-Za-z])"),
    # Section signs: the documents cited are the internal ones. The JSON escape counts too.
    "section sign": re.compile(r"§|\\u00a7", re.IGNORECASE),
    # The tracker: "issue 11", "issues 3 and 4", "Issue #14", "PR 7", "pull request #9". (A
    # sentence like "the guard issues 2 directives" trips it too: say it another way.)
    "issue": re.compile(r"\b(?:issues?|PRs?|pull requests?)\s*#?\d+", re.IGNORECASE),
    # The source articles, numbered with three digits: "seed 000", "seed 003".
    "source article": re.compile(r"\bseeds?\s+\d{3}\b", re.IGNORECASE),
    # A commit: a standalone word of 7 to 40 lowercase hex digits, with a digit and a letter
    # (so neither "deadbeef"-like words nor plain numbers count).
    "commit": re.compile(r"(?<![\w.-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])"),
}

# Hex words that are real values a user reads, not commits. Keep it short and explain each one.
HEX_ALLOWLIST: frozenset[str] = frozenset(
    {
        "0123456789abcdef",  # the hex digits, as a lookup table (guard/store/_claims.py)
    }
)

# Directories (relative to ROOT) scanned as plain text, every line.
TEXT_DIRS = ("helm", "collector", "dashboards", "examples", "proto")
# Files (relative to ROOT) scanned as plain text, every line; they must exist.
TEXT_FILES = ("README.md",)
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "node_modules"}


def find(text: str) -> list[tuple[int, str]]:
    """The lines of ``text`` holding internal references: (0-based line index, what matched),
    one entry per line however many patterns it trips."""
    found: dict[int, list[str]] = {}
    for name, pattern in PATTERNS.items():
        for m in pattern.finditer(text):
            if name == "commit" and m.group() in HEX_ALLOWLIST:
                continue
            found.setdefault(text.count("\n", 0, m.start()), []).append(f"{name} {m.group()!r}")
    return sorted((index, ", ".join(what)) for index, what in found.items())


def _line(text: str, index: int) -> str:
    lines = text.splitlines()
    return lines[index].strip() if index < len(lines) else ""


def _text_files(top: Path) -> Iterator[Path]:
    for path in sorted(top.rglob("*")):
        if path.is_file() and not SKIP_DIRS.intersection(path.relative_to(ROOT).parts):
            yield path


def _read_text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data:
        return None  # binary
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def scan_text_files(paths: Iterable[Path]) -> list[str]:
    hits = []
    for path in paths:
        text = _read_text(path)
        if text is None:
            continue
        for index, what in find(text):
            rel = path.relative_to(ROOT)
            hits.append(f"{rel}:{index + 1}: [{what}] {_line(text, index)}")
    return hits


def scan_python_strings(path: Path) -> list[str]:
    """The docstrings and string constants of one module (f-string parts included)."""
    source = path.read_text(encoding="utf-8")
    hits = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        for index, what in find(node.value):
            # The constant's first line plus the lines before the hit inside it: exact for
            # triple-quoted strings, the literal's own line for one-line literals.
            lineno = min(node.lineno + index, node.end_lineno or node.lineno)
            rel = path.relative_to(ROOT)
            hits.append(f"{rel}:{lineno}: [{what}] {_line(source, lineno - 1)}")
    return hits


def _report(hits: list[str]) -> str:
    return f"{len(hits)} internal reference(s) in user-facing text:\n  " + "\n  ".join(hits)


# --- the patterns themselves ---------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "see DESIGN §3.1",
        "the policy file (DESIGN §3.3b)",
        "DESIGN.md",
        'Protocol (CONTRACTS "Control stream protocol")',
        "(§3.7)",
        "The policy file (DESIGN \\u00a73.3b)",
        "the overshoot bound of issue 11",
        "issue 14",
        "Issue #14",
        "issues 3 and 4",
        "fixed in PR 7",
        "see pull request #9",
        "seed 000 §3.4",
        "(seed 003 defaults)",
        "commit e92fb14",
        "fixed in 3f2a9c1e0b7d",
        "the full sha f11fa8d5e0c4b1a2d3c4e5f60718293a4b5c6d7e",
    ],
)
def test_patterns_catch_internal_references(text: str) -> None:
    assert list(find(text)), text


@pytest.mark.parametrize(
    "text",
    [
        "The design of the policy file is simple; designers REDESIGNED it.",
        "the contracts of the interfaces; CONTRACTSMITH",
        "the stop order: cancel, completed, deadline, max steps",
        "the guard issued 3 directives; practical 5, approx 6",
        "random seed 42, seeded 100 times, --seed 1234",
        "deadbeef, facade, decade, accede",  # hex letters only
        "1234567 and 20240101",  # digits only
        "0x7fffffff and 0xdeadbeef1",  # hex constants written as such
        "sha256:" + "ab12" * 16,  # a 64-digit digest is not a commit
        "the run run_1a2b3c4d_x, a3f9c2e1-7b4d (dashed ids), v1.2.3abcd99",  # part of a longer word
        "ABCDEF1234 (upper case)",
        "http://localhost:4317, port 8123, 3.5 seconds",
    ],
)
def test_patterns_leave_ordinary_text(text: str) -> None:
    assert not list(find(text)), list(find(text))


# --- the text a user reads -----------------------------------------------------------------


def test_readmes_chart_collector_dashboards_and_examples() -> None:
    paths: list[Path] = []
    for name in TEXT_FILES:
        path = ROOT / name
        assert path.is_file(), f"{name} is missing"
        paths.append(path)
    for name in TEXT_DIRS:
        top = ROOT / name
        assert top.is_dir(), f"{name}/ is missing"
        paths.extend(_text_files(top))
    hits = scan_text_files(paths)
    assert not hits, _report(hits)


def test_documentation_site() -> None:
    docs = ROOT / "docs"
    if not docs.is_dir():
        pytest.skip("no docs/ yet")
    paths = list(_text_files(docs))
    if (ROOT / "mkdocs.yml").is_file():
        paths.append(ROOT / "mkdocs.yml")
    hits = scan_text_files(paths)
    assert not hits, _report(hits)


def test_package_docstrings_and_strings() -> None:
    package = ROOT / "guard"
    modules = sorted(p for ext in ("*.py", "*.pyi") for p in package.rglob(ext))
    assert modules
    hits = [hit for path in modules for hit in scan_python_strings(path)]
    hits += scan_text_files(sorted(package.rglob("*.md")))
    assert not hits, _report(hits)


def _parsers(
    parser: argparse.ArgumentParser, name: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_command_line_help(monkeypatch: pytest.MonkeyPatch) -> None:
    from guard.cli import COMMANDS, build_parser

    monkeypatch.setenv("COLUMNS", "100")
    parsers = dict(_parsers(build_parser(), "otel-guard"))
    assert {f"otel-guard {name}" for name in COMMANDS} <= set(parsers)
    hits = []
    for name, parser in parsers.items():
        text = parser.format_help()
        for index, what in find(text):
            hits.append(f"{name} --help:{index + 1}: [{what}] {_line(text, index)}")
    assert not hits, _report(hits)
