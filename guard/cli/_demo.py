"""`otel-guard demo`: the showcase, on embedded defaults with nothing to configure.

Starts a guard on a free loopback port with the embedded ClickHouse, runs a fleet of simulated
agents in several processes and tenants (healthy runs and every runaway pattern), shows live
progress, cancels one tenant mid-demo, and ends with the stop-reason distribution read back
from ClickHouse. Exits 1 when a staged stop reason did not occur or ClickHouse disagrees with
what the agents observed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="print a machine-readable summary on stdout (live progress goes to stderr)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer healthy runs and no pauses between acts (about 10 s; used by the tests)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the embedded ClickHouse, the chart and the agent logs go "
        "(default: a fresh temporary directory, kept so you can explore it afterwards)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="give up on the fleet after this long (default 120 quick, 300 full)",
    )


def run(args: argparse.Namespace) -> int:
    from guard.demo import DemoOptions, run_demo

    live_stream = sys.stderr if args.json else sys.stdout
    summary = run_demo(
        DemoOptions(
            quick=args.quick, data_dir=args.data_dir, out=live_stream, timeout_s=args.timeout
        )
    )
    if args.json:
        json.dump(summary, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    return 0 if summary["ok"] else 1
