"""The command-line reference (reference/cli.md), rendered from ``guard.cli.build_parser()``.

Every subcommand the parser has, its description, its usage line and each argument with its
help, default and choices, as argparse itself holds them. The parser is built with the
``OTEL_GUARD_*`` variables unset, so a default read from the environment shows as the
built-in one, not as the value of the machine that built the site.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["option_names", "parser_for_docs", "render_cli_reference", "subcommands"]

_WIDTH = 90  # usage lines wrap here, whatever the terminal that built the site
_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_[]|"})


@contextlib.contextmanager
def _plain_environment() -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.startswith("OTEL_GUARD_")}
    columns = os.environ.get("COLUMNS")
    for k in saved:
        del os.environ[k]
    os.environ["COLUMNS"] = str(_WIDTH)
    try:
        yield
    finally:
        os.environ.update(saved)
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns


def parser_for_docs() -> argparse.ArgumentParser:
    from guard.cli import build_parser

    with _plain_environment():
        return build_parser()


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's name and parser, in the order ``--help`` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices.items())
    return {}


def _arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
        and a.help is not argparse.SUPPRESS
    ]


def option_names(parser: argparse.ArgumentParser) -> list[str]:
    """The documented spelling of each argument: its longest option string, or its dest."""
    return [
        max(a.option_strings, key=len) if a.option_strings else a.dest for a in _arguments(parser)
    ]


def _text(s: str) -> str:
    return html.escape(s, quote=False).translate(_MD_SPECIAL)


def _default(action: argparse.Action) -> str:
    d = action.default
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return "–"
    if d is None or d is argparse.SUPPRESS or isinstance(action, argparse._VersionAction):
        return "–"
    return f"`{d}`"


def _choices(action: argparse.Action) -> str:
    if not action.choices:
        return "–"
    return ", ".join(f"`{c}`" for c in action.choices)


def _invocation(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    spelled = parser._get_formatter()._format_action_invocation(action)
    return f"`{spelled}`"


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help:
        return ""
    return _text(parser._get_formatter()._expand_help(action))


def _table(parser: argparse.ArgumentParser) -> list[str]:
    out = ["| Argument | Default | Choices | Description |", "| --- | --- | --- | --- |"]
    for a in _arguments(parser):
        name = _invocation(parser, a)
        if a.required and a.option_strings:
            name += " (required)"
        out.append(f"| {name} | {_default(a)} | {_choices(a)} | {_help(parser, a)} |")
    return out


def _groups(parser: argparse.ArgumentParser) -> list[str]:
    """The mutually exclusive groups, in words."""
    out = []
    for group in parser._mutually_exclusive_groups:
        names = [f"`{max(a.option_strings, key=len)}`" for a in group._group_actions]
        kind = "Exactly one" if group.required else "At most one"
        out.append(f"{kind} of {', '.join(names)} is given.")
    return out


def _usage(parser: argparse.ArgumentParser) -> str:
    with _plain_environment():
        lines = parser.format_usage().removeprefix("usage: ").rstrip().splitlines()
    cut = len("usage: ")  # continuation lines stay aligned with the first one
    return "\n".join([lines[0], *(line[cut:] for line in lines[1:])])


def _section(name: str, parser: argparse.ArgumentParser, summary: Any) -> list[str]:
    out = [f"## `otel-guard {name}` {{#{name}}}", ""]
    description = parser.description or summary or ""
    if description:
        out += [_text(description[:1].upper() + description[1:]) + ".", ""]
    out += ["```text", _usage(parser), "```", ""]
    groups = _groups(parser)
    if groups:
        out += [" ".join(groups), ""]
    out += _table(parser)
    if parser.epilog:
        out += ["", _text(parser.epilog)]
    return [*out, ""]


def render_cli_reference() -> str:
    parser = parser_for_docs()
    subs = subcommands(parser)
    summaries = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {c.dest: c.help for c in action._choices_actions}
    out = [
        "# Command-line reference",
        "",
        '!!! info "Generated"',
        "    This page is generated from the `otel-guard` command's own argument parser each",
        "    time the site is built, so it lists exactly the subcommands and options of this",
        "    version. `otel-guard COMMAND --help` prints the same.",
        "",
        _text(parser.description or "") + "",
        "",
        "```text",
        _usage(parser),
        "```",
        "",
        "| Command | What |",
        "| --- | --- |",
    ]
    out += [f"| [`{name}`](#{name}) | {_text(summaries.get(name) or '')} |" for name in subs]
    out += ["", "## Global options {#global}", "", *_table(parser), ""]
    out.append(
        "Options that default to an environment variable name it in their description; the "
        "default shown here is the one without it."
    )
    out.append("")
    for name, sub in subs.items():
        out += _section(name, sub, summaries.get(name))
    return "\n".join(out)
