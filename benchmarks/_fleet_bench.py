"""``bench_ingest.py --load fleet``: the trials, their phases and the medians.

Each trial measures, one after another, on the same pre-serialised fleet load (``_fleet``):

* ``guard``: a fresh ``otel-guard serve`` (no store) with the fleet policy. Its CPU clock is
  read over two separately measured phases on that process, after a warm-up phase:
  ``control`` replays only the control traffic of the load (the same runs registered, admitted,
  acked, heart-beaten and ended, under other run ids, no spans), then ``full`` replays the load
  with its spans. Control-path CPU = the control phase's CPU; span-path CPU = full - control
  (both phases carry exactly the same control messages; see ``_fleet_control``). The guard's
  figure is spans / full-phase CPU; ``guard_span_path`` is spans / span-path CPU;
* ``guard_pure_python`` (``--pure-python``): the same with ``OTEL_GUARD_PURE_PYTHON=1``;
* ``floor``: the decode-only receiver on the same grpcio (parses, acks);
* ``rotel_blackhole``: rotel receiving into its blackhole exporter (the strict peer figure);
* ``rotel_forward``: rotel forwarding over OTLP/gRPC to the floor (compression ``none``, as the
  collector configs of this repo deploy it; rotel's default is gzip: ``--rotel-gzip``).

The floor and rotel get the same Export requests (with the tenants' tokens), no control
streams. Every ratio is taken within one trial; the medians over ``--runs`` trials are reported.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from _fleet import (
    LIVE_PER_TENANT,
    REQUEST_SPANS,
    STEPS_PER_RUN,
    TENANTS,
    auth_metadata,
    build_fleet,
    capture,
    fleet_env,
    fleet_policy,
)
from _fleet_control import HEARTBEAT_EVERY, close_streams, drive_fleet, open_streams
from _measure import drive, measure_load
from _net import start_guard
from _receivers import start_floor, start_rotel

__all__ = ["fleet"]

WARM_REQUESTS = 16
ADMIN = (("authorization", "Bearer bench-admin"),)


def _guard_trial(
    name, cfg: Path, env: dict, load, warm, conc: int, profile: str | None, old: bool
) -> dict:
    """One guard process: warm-up, the control-only phase, the full phase (see the module
    docstring). ``profile``: cProfile the two timed phases into ``profile.0`` (control) and
    ``profile.1`` (full) through ``_profiled_guard``."""
    wrapper = (str(Path(__file__).with_name("_profiled_guard.py")), profile) if profile else ()
    guard, port = start_guard(str(cfg), env=env, wrapper=wrapper)
    address = f"127.0.0.1:{port}"

    def phase(prefix: str, data, export: bool):
        return lambda kept: drive_fleet(
            address, data, kept[1], prefix=prefix, concurrency=conc, export=export
        )

    def measured(label: str, prefix: str, data, export: bool) -> dict:
        async def pre():
            kept = await open_streams(address, old)
            if profile:
                os.kill(guard.pid, signal.SIGUSR1)
                await asyncio.sleep(0.3)  # the guard's loop runs the handler
            return kept

        async def post(kept) -> None:
            if profile:
                os.kill(guard.pid, signal.SIGUSR2)
                await asyncio.sleep(0.3)
            frames[label] = sum(s.frames_in + s.frames_out for s in kept[1])
            await close_streams(kept)

        return measure_load(label, guard.pid, data.spans, phase(prefix, data, export),
                            pre=pre, post=post)  # fmt: skip

    frames: dict[str, int] = {}

    try:
        opened = lambda: open_streams(address, old)  # noqa: E731
        measure_load("warm", guard.pid, warm.spans, phase("w", warm, True), pre=opened,
                     post=close_streams)  # fmt: skip
        ctl = measured("control", "c", load, False)
        full = measured(name, "f", load, True)
        full["guard_counters"] = asyncio.run(_counters(address))
    finally:
        guard.terminate()
        guard.wait(30)
    spans = load.spans
    span_cpu = full["cpu_s"] - ctl["cpu_s"]
    full["control_cpu_s"] = ctl["cpu_s"]
    full["span_path_cpu_s"] = round(span_cpu, 3)
    full["span_path_spans_per_cpu_s"] = round(spans / span_cpu) if span_cpu > 0 else None
    full["cpu_us_per_span"] = round(1e6 * full["cpu_s"] / spans, 3)
    full["span_path_cpu_us_per_span"] = round(1e6 * span_cpu / spans, 3)
    full["control_cpu_us_per_span"] = round(1e6 * ctl["cpu_s"] / spans, 3)
    full["control_cpu_us_per_run"] = round(1e6 * ctl["cpu_s"] / load.runs, 1)
    full["control_share"] = round(ctl["cpu_s"] / full["cpu_s"], 3)
    full["control_frames_per_run"] = round(frames[name] / load.runs, 2)  # both directions
    return full


async def _counters(address: str) -> dict[str, float]:
    """The guard's own counters after the phases (that the load was counted, not refused)."""
    import grpc

    from guard.v1 import guard_pb2 as pb
    from guard.v1 import guard_pb2_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = guard_pb2_grpc.GuardAdminStub(channel)
        resp = await stub.Stats(pb.StatsRequest(), metadata=ADMIN, timeout=10)
    keep = ("spans", "observations", "rejected_spans", "late_spans", "denied", "records_acked")
    return {k: resp.figures[k] for k in keep if k in resp.figures}


def _plain(name: str, pid: int, port: int, load, conc: int) -> dict:
    address, n = f"127.0.0.1:{port}", len(load.payloads)
    md = [auth_metadata(t) for t in load.tenants]  # as the guard gets them (ignored here)
    return measure_load(
        name,
        pid,
        load.spans,
        lambda kept: drive(address, load.payloads, n, conc, md, warm=0),
        warm=lambda kept: drive(address, load.payloads, 4, conc, md, warm=0),
    )


def _ratio(a: Any, b: Any) -> float | None:
    return round(a / b, 3) if a and b else None


def fleet(args: Any) -> dict:
    conc = args.concurrency
    procs: list[subprocess.Popen] = []
    trials: list[dict] = []
    env = fleet_env()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = Path(tmp) / "guard.yaml"
            cfg.write_text(fleet_policy())
            capturer, port = start_guard(str(cfg), env=env)
            procs.append(capturer)
            bodies = capture(f"127.0.0.1:{port}", tmp, STEPS_PER_RUN)
            capturer.terminate()
            capturer.wait(30)
            load = build_fleet(bodies, args.requests, "f")
            warm = build_fleet(bodies, WARM_REQUESTS, "w")
            floor, fport = start_floor(procs)
            rotels: dict[str, Any] = {}
            if not args.no_rotel:
                rotels["rotel_blackhole"] = start_rotel(procs, None)
                rotels["rotel_forward"] = start_rotel(
                    procs, f"http://127.0.0.1:{fport}", gzip=args.rotel_gzip
                )
            pure_env = dict(env, OTEL_GUARD_PURE_PYTHON="1")
            for trial in range(args.runs):
                prof = f"{args.profile}.{trial}" if args.profile else None
                old = args.old_agents
                res = [_guard_trial("guard", cfg, env, load, warm, conc, prof, old)]
                if args.pure_python:
                    name = "guard_pure_python"
                    res.append(_guard_trial(name, cfg, pure_env, load, warm, conc, None, old))
                res.append(_plain("floor", floor.pid, fport, load, conc))
                for name, r in rotels.items():
                    res.append(
                        {**r, "receiver": name}
                        if isinstance(r, dict)
                        else _plain(name, r[0].pid, r[1], load, conc)
                    )
                trials.append({r["receiver"]: r for r in res})
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return _summary(args, load, trials)


def _summary(args: Any, load, trials: list[dict]) -> dict:
    def med(values: list) -> float | None:
        vals = [v for v in values if v is not None]
        return round(statistics.median(vals), 3) if vals else None

    def rate(t: dict, name: str, key: str = "spans_per_s_per_core") -> float | None:
        return t.get(name, {}).get(key)

    ratios: dict[str, list] = {}
    for t in trials:
        g, gs = rate(t, "guard"), rate(t, "guard", "span_path_spans_per_cpu_s")
        for base in ("floor", "rotel_blackhole", "rotel_forward"):
            ratios.setdefault(f"guard_vs_{base}", []).append(_ratio(g, rate(t, base)))
            ratios.setdefault(f"span_path_vs_{base}", []).append(_ratio(gs, rate(t, base)))
            if "guard_pure_python" in t:
                ratios.setdefault(f"pure_python_vs_{base}", []).append(
                    _ratio(rate(t, "guard_pure_python"), rate(t, base))
                )
        if "guard_pure_python" in t:
            ratios.setdefault("pure_python_vs_guard", []).append(
                _ratio(rate(t, "guard_pure_python"), g)
            )
    names = list(trials[0]) if trials else []
    rates = {n: med([rate(t, n) for t in trials]) for n in names}
    rates["guard_span_path"] = med([rate(t, "guard", "span_path_spans_per_cpu_s") for t in trials])
    per_span = {
        k: med([t["guard"][k] for t in trials])
        for k in (
            "cpu_us_per_span",
            "span_path_cpu_us_per_span",
            "control_cpu_us_per_span",
            "control_cpu_us_per_run",
            "control_share",
            "control_frames_per_run",
        )
    }
    return {
        "benchmark": "ingest",
        "load": "fleet",
        "cores": os.cpu_count(),
        "trials": len(trials),
        "shape": {
            "tenants": TENANTS,
            "live_runs": TENANTS * LIVE_PER_TENANT,
            "runs": load.runs,
            "requests": len(load.payloads),
            "request_spans": REQUEST_SPANS,
            "spans": load.spans,
            "spans_per_run": load.template_spans,
            "steps_per_run": STEPS_PER_RUN,
            "span_names": load.span_names,
            "heartbeat_every_requests": HEARTBEAT_EVERY,
            "in_flight": args.concurrency,
            "rotel_forward_compression": "gzip" if args.rotel_gzip else "none",
            "agents": "old (no batches, Admit acked)" if args.old_agents else "batching",
        },
        "median_spans_per_cpu_s": rates,
        "median_ratios": {k: med(v) for k, v in ratios.items()},
        "median_guard_cpu": per_span,
        "goals": {"guard_vs_rotel_blackhole": 1.0, "guard_vs_floor": 0.5},
        "per_trial": trials,
    }
