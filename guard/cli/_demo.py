"""`otel-guard demo` (placeholder until issue 6 lands)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable summary")


def run(args: argparse.Namespace) -> int:
    print("demo arrives in a later issue")
    return 0
