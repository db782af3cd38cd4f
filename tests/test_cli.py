"""The `otel-guard` command's surface."""

from __future__ import annotations

import subprocess
import sys

import pytest

from guard.cli import COMMANDS, build_parser


def test_every_command_has_help() -> None:
    parser = build_parser()
    for name in COMMANDS:
        with pytest.raises(SystemExit) as exc:
            parser.parse_args([name, "--help"])
        assert exc.value.code == 0


def test_console_entry_point_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "guard.cli", "--help"], capture_output=True, text=True, check=True
    )
    for name in COMMANDS:
        assert name in out.stdout


def test_unknown_command_is_an_error() -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["frobnicate"])
    assert exc.value.code == 2


def test_serve_reads_the_clickhouse_dsn_from_the_environment(monkeypatch):
    """OTEL_GUARD_CLICKHOUSE_DSN is --clickhouse's default (the Helm chart passes the DSN so,
    keeping its password off the command line); the flag still wins."""
    import argparse

    from guard.cli import _serve

    monkeypatch.setenv("OTEL_GUARD_CLICKHOUSE_DSN", "http://u:p@ch:8123/")
    parser = argparse.ArgumentParser()
    _serve.add_arguments(parser)
    assert parser.parse_args([]).clickhouse == "http://u:p@ch:8123/"
    assert parser.parse_args(["--clickhouse", "chdb://x"]).clickhouse == "chdb://x"
