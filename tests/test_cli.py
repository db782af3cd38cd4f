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
