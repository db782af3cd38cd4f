"""The ``otel-guard`` command.

Each subcommand lives in its own module ``guard/cli/_<name>.py`` exposing
``add_arguments(parser)`` and ``run(args) -> int``. Modules keep heavy imports (grpc servers,
ClickHouse) inside ``run`` so that ``otel-guard --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from guard._version import __version__

__all__ = ["build_parser", "main"]

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("guard.cli._serve", "run the guard service (OTLP, GuardControl, GuardAdmin, health)"),
    "demo": ("guard.cli._demo", "showcase: a guard, a runaway fleet, and the stop reasons"),
    "report": ("guard.cli._report", "stop-reason distribution and cost by outcome"),
    "cancel": ("guard.cli._cancel", "cancel runs fleet-wide through GuardAdmin"),
    "runs": ("guard.cli._runs", "list live runs with their budget use"),
    "health": ("guard.cli._health", "check a guard's gRPC health (exit 0 when SERVING)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="otel-guard",
        description="OpenTelemetry-native guard for LLM agents: budgets, loops, fleet cancel.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._module.run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
