"""`otel-guard report` (placeholder until its issue lands)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    print("otel-guard report arrives in a later issue")
    return 2
