"""One agent process of the demo fleet: ``python -m guard.demo._agents --endpoint ... --plan ...``.

The process configures the SDK once, as an application would (``guard.configure``), then runs
its plan: waves of scenarios, one wave after the other, the scenarios of a wave concurrently as
asyncio tasks. It reports on stdout, one JSON object per line, what the agent itself observed:
``start`` when a run begins (with its run id), ``outcome`` when it ends (the ``Outcome`` the
decorated function returned or raised in ``RunStopped``), ``error`` for anything unexpected,
and ``done`` last. The orchestrator reads these lines; nothing else crosses the process line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

import guard
from guard.demo._scenarios import SCENARIOS

__all__ = ["main"]


def _emit(event: str, **fields: Any) -> None:
    fields["event"] = event
    fields["t"] = time.time()
    sys.stdout.write(json.dumps(fields, default=str) + "\n")
    sys.stdout.flush()


def _outcome_dict(outcome: Any) -> dict[str, Any]:
    if outcome is None:
        return {}
    if hasattr(outcome, "to_dict"):
        return outcome.to_dict()
    return dict(outcome)


async def _run_item(item: dict[str, Any], gate: asyncio.Semaphore, process: str) -> None:
    scenario = SCENARIOS[item["kind"]]
    n = int(item.get("n", 0))
    await asyncio.sleep(float(item.get("delay_s", 0.0)))
    holder: dict[str, Any] = {}

    async def body() -> str:
        run = guard.current_run()
        holder["run"] = run
        _emit(
            "start",
            process=process,
            kind=scenario.kind,
            agent=scenario.agent,
            n=n,
            run_id=run.run_id,
        )
        return await scenario.fn(n, **item.get("params", {}))

    limits = {**scenario.limits, **item.get("limits", {})}
    agent = item.get("agent", scenario.agent)
    run_fn = guard.run(agent=agent, **limits)(body)
    async with gate:
        try:
            await run_fn()
            run = holder.get("run")
            outcome = _outcome_dict(getattr(run, "outcome", None))
            if not outcome:  # the SDK sets run.outcome when a run returns: say so if not
                _emit("error", process=process, kind=scenario.kind, n=n,
                      error="run returned but run.outcome is not set")  # fmt: skip
                return
        except guard.RunStopped as stopped:
            outcome = _outcome_dict(stopped.outcome)
        except Exception as exc:  # a demo agent must never take the fleet down
            _emit("error", process=process, kind=scenario.kind, n=n, error=repr(exc))
            return
    _emit(
        "outcome", process=process, kind=scenario.kind, expect=scenario.expect, n=n, outcome=outcome
    )


async def _main_async(args: argparse.Namespace) -> int:
    plan: list[list[dict[str, Any]]] = json.loads(args.plan)
    # Six agent processes and the guard share two cores in `make demo`: allow a run's start
    # a full second for the guard's admit or deny (default 200 ms) so a busy machine cannot
    # turn the staged deny into a run that started under local limits.
    guard.configure(endpoint=args.endpoint, tenant=args.tenant, admit_timeout_ms=1000)
    gate = asyncio.Semaphore(args.concurrency)
    _emit("ready", process=args.name, tenant=args.tenant, pid=os.getpid())
    for wave in plan:
        await asyncio.gather(*(_run_item(item, gate, args.name) for item in wave))
    # Shut the SDK down as an application does at exit: it flushes the spans, sends every
    # RunEnded and waits for the guard to read them before closing the control stream.
    guard.shutdown()
    _emit("done", process=args.name)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m guard.demo._agents")
    parser.add_argument("--endpoint", default=None, help="guard HOST:PORT (none = local-only)")
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--name", required=True, help="process label shown by the demo")
    parser.add_argument("--plan", required=True, help="JSON: list of waves of scenario items")
    parser.add_argument("--concurrency", type=int, default=6)
    args = parser.parse_args(argv)
    return asyncio.run(_main_async(args))


if __name__ == "__main__":
    sys.exit(main())
