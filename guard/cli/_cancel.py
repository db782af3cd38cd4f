"""`otel-guard cancel --run ID | --tenant T | --agent A | --all [--reason TEXT]`.

Fleet-wide cancel through GuardAdmin: every matching live run, in every connected agent
process, gets a cancel with reason ``operator_cancel`` (the text goes into the detail).
"""

from __future__ import annotations

import argparse
import json
import sys

from guard.cli._client import add_client_arguments

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--run", metavar="ID", help="cancel one run")
    target.add_argument("--tenant", metavar="T", help="cancel every live run of a tenant")
    target.add_argument("--agent", metavar="A", help="cancel every live run of an agent")
    target.add_argument("--all", action="store_true", help="cancel every live run (admin)")
    parser.add_argument("--reason", default="", help="free text recorded as the detail")
    add_client_arguments(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    from guard.cli._client import client_from_args
    from guard.errors import GuardError

    try:
        with client_from_args(args) as client:
            ids = client.cancel(
                run_id=args.run,
                tenant=args.tenant,
                agent=args.agent,
                all=args.all,
                reason=args.reason,
            )
            partial = client.partial
    except GuardError as exc:
        print(f"otel-guard cancel: {exc}", file=sys.stderr)
        return 1
    if partial:
        print(f"otel-guard cancel: partial answer ({partial})", file=sys.stderr)
    if args.json:
        print(json.dumps({"cancelled": ids, "count": len(ids), "partial": partial}))
    else:
        print(f"cancelled {len(ids)} run(s)")
        for run_id in ids:
            print(f"  {run_id}")
    return 0
