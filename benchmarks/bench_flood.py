"""Span-ingest flood at several times the guard's capacity, with canary tenants running.

A real guard (``otel-guard serve``, its own process, OTLP/gRPC and OTLP/HTTP receivers, auth
on with one bearer token per tenant, ``max_tracked_runs`` 5000). In one run:

1. **idle baseline**: canary agents of tenants B and C (real SDK processes, ``--role
   canary``, a rolling $0.10 cost window each, $0.001 per call) make paced paid calls
   (``step.reserve`` timed: the wait for the guard's allowance answer) while
   ``GuardAdmin.Cancel`` with the tenant's token cancels their live runs one by one (timed
   from the Cancel call to the run's ``on_cancel`` in the agent). No load.
2. **capacity**: tenant A's flooder processes (``--role flood``, one per transport, each
   with its own control stream) send pre-serialized 512-span Export bodies in a closed loop
   (``--capacity-inflight`` in flight each): gRPC alone, HTTP alone, both at once. The
   guard's capacity is the best accepted spans/s of the three.
3. **flood**: the flooders send open loop at ``--multiple`` x capacity, mixing spans of
   never-registered run ids (more of them than ``max_tracked_runs``), of the runs they
   registered on their control streams and of repeated span-only ids; the canaries do what
   they did in the baseline and spend the rest of their windows (then they are refused).
   What was offered, sent, skipped (too many waiting) and accepted is reported per
   transport, and the multiple reached, honestly: the flooders share the CPUs.
4. **after**: the flooders close their span connections; a settle, then the same readings,
   and the canaries try a few more paid calls (a window that kept count refuses them all).

Also read: tenant B's span-only runs (sent first) through ``GuardAdmin.ListRuns`` with B's
token after each phase (every one still tracked, counts intact); the guard's event-loop lag
and every refusal / shed counter from ``GuardAdmin.Stats`` (admin token) during and after
the flood; the guard process's RSS and open fds (psutil) after the capacity phase, at their
peak during the flood, and after the settle. ``canaries``: per tenant, the paid calls made
against the calls its window pays for (``calls_over``), and the guard's view of the window.
``acceptance``: the goals (control p99 <= 50 ms under the flood, <= 1 call over the window,
no span-only run of B forgotten, RSS back within 50 MB). Prints one JSON document (latencies
in ms); progress goes to stderr. ``--quick``: short phases (well under a minute).

    .venv/bin/python benchmarks/bench_flood.py [--duration-s 20] [--multiple 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported
import _flood_canary as C
import _flood_load as L
from _flood_guard import CANARIES, LIMIT_USD, TOKEN, Child, Guard, Sampler, shed_keys

LIMIT_CALLS = round(LIMIT_USD / C.PRICE)  # the paid calls a canary window pays for
SEED_RUNS, SEED_SPANS = 40, 3  # tenant B's span-only runs, spans each
LAG_KEYS = ("loop_lag_max_ms", "loop_lag_recent_max_ms", "loop_lag_p99_ms", "loop_busy_p99_ms")


def _log(msg: str) -> None:
    print(f"[flood] {msg}", file=sys.stderr, flush=True)


def seed_span_only(g: Guard) -> None:
    ids = [f"b-quiet-{i}" for i in range(SEED_RUNS) for _ in range(SEED_SPANS)]
    body = L.span_request(ids, salt=7)
    export = g.channel.unary_unary(L.EXPORT)
    export(body, metadata=L.md(TOKEN["b"]), timeout=30)


def canary_phase(canaries: dict[str, Child], name: str, secs: float, pool: int, rate: dict):
    for t, ch in canaries.items():
        ch.send(f"phase {name} {secs} {pool} {rate[t]}")
    for ch in canaries.values():
        assert ch.recv()["event"] == "pool_ready"


def collect(canaries: dict[str, Child]) -> dict[str, dict]:
    return {t: ch.recv() for t, ch in canaries.items()}


def transport_sum(outs: list[dict], key: str = "spans_accepted") -> dict[str, float]:
    by: dict[str, float] = {}
    for o in outs:
        by[o["transport"]] = by.get(o["transport"], 0) + o[key] / o["secs"]
    return by


def measure_capacity(flooders: list[Child], ns: argparse.Namespace) -> dict[str, dict]:
    """Closed loop: the gRPC flooders alone, the HTTP ones alone, then all of them at once;
    spans/s accepted by each (the guard's capacity is the best of the three)."""
    out = {}
    for label in ("grpc", "http", "both"):
        chosen = [f for f in flooders if label in ("both", f.transport)]
        for f in chosen:
            f.send(f"capacity {ns.capacity_warm_s} {ns.capacity_s} {ns.capacity_inflight}")
        outs = [f.recv() for f in chosen]
        rate = sum(o["spans_accepted"] / o["secs"] for o in outs)
        out[label] = {"spans_per_s": round(rate), "detail": outs}
    return out


def run(ns: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-flood-") as tmp:
        g = Guard(tmp, ns.max_tracked_runs)
        children: list[Child] = []
        try:
            return _report(ns, _measure(ns, g, children))
        except BaseException:
            sys.stderr.write(g.tail())
            raise
        finally:
            for ch in children:
                ch.close()
            g.stop()


def _measure(ns: argparse.Namespace, g: Guard, children: list[Child]) -> SimpleNamespace:
    """Every phase, in order; the raw readings."""
    nflood = 2 * ns.flooders
    new_ids = -(-int(1.5 * ns.max_tracked_runs) // nflood)
    flooders = []
    for i in range(nflood):
        tr = "grpc" if i % 2 == 0 else "http"
        args = ["--role", "flood", "--transport", tr, "--tag", f"{tr[0]}{i}", "--new-ids"]
        args += [
            str(new_ids),
            "--address",
            g.address,
            "--http-url",
            g.http_url,
            "--token",
            TOKEN["a"],
        ]
        flooders.append(Child(*args))
    canaries = {
        t: Child(
            "--role",
            "canary",
            "--tenant",
            t,
            "--token",
            TOKEN[t],
            "--address",
            g.address,
            "--admit-timeout-ms",
            str(ns.admit_timeout_ms),
        )
        for t in CANARIES
    }
    children += flooders + list(canaries.values())
    ready = [f.recv() for f in flooders] + [c.recv() for c in canaries.values()]
    _log(f"children ready: {ready}")
    seed_span_only(g)
    seeded = g.runs_of("b", "b-quiet-")

    canary_phase(canaries, "idle", ns.idle_s, ns.idle_pool, dict.fromkeys(CANARIES, ns.idle_rate))
    idle_sampler = Sampler(g)
    for ch in canaries.values():
        ch.send("go")
    idle = collect(canaries)
    idle_sampler.finish()
    evict_idle = g.runs_of("b", "b-quiet-")
    _log("idle phase done")

    cap_runs = measure_capacity(flooders, ns)
    capacity = max(r["spans_per_s"] for r in cap_runs.values())
    _log(
        f"capacity {capacity:.0f} spans/s ({ {k: v['spans_per_s'] for k, v in cap_runs.items()} })"
    )
    time.sleep(2.0)
    stats_before = g.stats()
    res_before = g.resources()
    evict_before = g.runs_of("b", "b-quiet-")

    canary_s = max(2.0, ns.duration_s - 2.0)
    left = {t: LIMIT_CALLS - sum(c["kind"] == "call" for c in idle[t]["calls"]) for t in CANARIES}
    rate = {t: max(1.0, left[t] / (0.6 * canary_s)) for t in CANARIES}
    canary_phase(canaries, "flood", canary_s, ns.flood_pool, rate)
    evict_pool = g.runs_of("b", "b-quiet-")  # the canaries' pooled runs registered
    target_sps = ns.multiple * capacity
    rps = target_sps / L.BATCH / nflood
    sampler = Sampler(g, 0.25)
    g.profile(True)
    for f in flooders:
        f.send(f"flood {rps} {ns.duration_s}")
    time.sleep(1.0)
    for ch in canaries.values():
        ch.send("go")
    flood = collect(canaries)
    flood_outs = [f.recv() for f in flooders]
    g.profile(False)
    sampler.finish()
    stats_end = g.stats()
    for f in flooders:  # their span connections closed; their control streams stay
        f.send("rest")
        f.recv()
    _log("flood done; settling")
    after_sampler = Sampler(g)
    time.sleep(ns.settle_s)
    after_sampler.finish()
    stats_after = g.stats()
    res_after = g.resources()
    evict_after = g.runs_of("b", "b-quiet-")
    budgets = {t: g.budget(t) for t in CANARIES}
    # after: the canaries try again; a window that kept count pays for none of these
    canary_phase(canaries, "after", ns.late_s, 0, dict.fromkeys(CANARIES, ns.late_rate))
    for ch in canaries.values():
        ch.send("go")
    late = collect(canaries)
    budgets_late = {t: g.budget(t) for t in CANARIES}
    for f in flooders:
        f.send("quit")
    for ch in canaries.values():
        ch.send("quit")
    sdk = {t: ch.recv()["stats"] for t, ch in canaries.items()}
    return SimpleNamespace(
        cap_runs=cap_runs,
        capacity=capacity,
        stats_before=stats_before,
        res_before=res_before,
        evict_before=evict_before,
        evict_idle=evict_idle,
        evict_pool=evict_pool,
        after_sampler=after_sampler,
        seeded=seeded,
        idle=idle,
        idle_sampler=idle_sampler,
        canary_s=canary_s,
        rate=rate,
        target_sps=target_sps,
        flood=flood,
        flood_outs=flood_outs,
        sampler=sampler,
        stats_end=stats_end,
        stats_after=stats_after,
        res_after=res_after,
        evict_after=evict_after,
        budgets=budgets,
        late=late,
        budgets_late=budgets_late,
        sdk=sdk,
    )


def _report(ns: argparse.Namespace, m: SimpleNamespace) -> dict[str, Any]:
    """The JSON document from the readings."""
    offered = sum(o["spans_offered"] / o["secs"] for o in m.flood_outs)
    accepted = sum(o["spans_accepted"] / o["secs"] for o in m.flood_outs)
    ctl_idle, ctl_flood = C.control_figures(m.idle), C.control_figures(m.flood)
    phases = (("idle", m.idle), ("flood", m.flood), ("after", m.late))
    canary_out = {
        t: C.summary(t, phases, m.budgets_late[t], m.sdk[t], LIMIT_USD)
        | {
            "guard_window_after_flood": m.budgets[t],
            "flood_phase_rate_calls_per_s": round(m.rate[t], 2),
            "calls_made_by_phase": {
                ph: sum(c["kind"] == "call" for c in r[t]["calls"]) for ph, r in phases
            },
        }
        for t in CANARIES
    }
    intact = [r for r, v in m.evict_before.items() if m.evict_after.get(r) == v]
    peak_rss = max([r["rss_mb"] for r in m.sampler.res] + [m.res_after["rss_mb"]])
    peak_fds = max([r["fds"] for r in m.sampler.res] + [m.res_after["fds"]])
    achieved = offered / m.capacity if m.capacity else None
    out = {
        "benchmark": "flood",
        "machine": {"cpus": os.cpu_count()},
        "settings": {
            "duration_s": ns.duration_s,
            "multiple_asked": ns.multiple,
            "max_tracked_runs": ns.max_tracked_runs,
            "flooder_processes": {"grpc": ns.flooders, "http": ns.flooders},
            "spans_per_request": L.BATCH,
            "open_loop_max_inflight_per_process": L.OPEN_LOOP_INFLIGHT,
            "grpc_connections_per_flooder": L.GRPC_CHANNELS,
            "admit_timeout_ms": ns.admit_timeout_ms,
            "idle_s": ns.idle_s,
            "canary_flood_s": m.canary_s,
            "canary_after_s": ns.late_s,
        },
        "capacity": {
            "spans_per_s": round(m.capacity),
            "basis": "the best of the three closed-loop runs below",
            "by_run": {k: v["spans_per_s"] for k, v in m.cap_runs.items()},
            "closed_loop_inflight_per_process": ns.capacity_inflight,
            "secs_each": ns.capacity_s,
            "warm_up_s_not_counted": ns.capacity_warm_s,
            "detail": {k: v["detail"] for k, v in m.cap_runs.items()},
        },
        "flood": {
            "target_spans_per_s": round(m.target_sps),
            "offered_spans_per_s": round(offered),
            "accepted_spans_per_s": round(accepted),
            "offered_multiple_of_capacity": round(achieved, 2) if achieved else None,
            "accepted_ratio_to_capacity": round(accepted / m.capacity, 3) if m.capacity else None,
            "multiple_reached": bool(achieved and achieved >= ns.multiple * 0.95),
            "note": None
            if achieved and achieved >= ns.multiple * 0.95
            else f"this machine offered only {achieved and round(achieved, 2)}x capacity "
            f"(asked {ns.multiple}x): flooders share its CPUs with the guard",
            "offered_by_transport": {
                k: round(v) for k, v in transport_sum(m.flood_outs, "spans_offered").items()
            },
            "accepted_by_transport": {k: round(v) for k, v in transport_sum(m.flood_outs).items()},
            "detail": m.flood_outs,
        },
        "control": {
            "idle": ctl_idle,
            "flood": ctl_flood,
            "p99_ratio_flood_vs_idle": {
                k: round(ctl_flood[k]["p99"] / ctl_idle[k]["p99"], 2)
                if ctl_flood[k]["p99"] and ctl_idle[k]["p99"]
                else None
                for k in ("allowance_ms", "cancel_ms")
            },
        },
        "loop_lag_ms": {
            "idle": m.idle_sampler.lag(),
            "flood": m.sampler.lag(),
            "end_of_flood": {k: round(m.stats_end.get(k, 0), 2) for k in LAG_KEYS},
            "after_settle_window": {k: round(m.stats_after.get(k, 0), 2) for k in LAG_KEYS},
            "after": m.after_sampler.lag(),
            "note": "recent_* and p99 cover the monitor's last 2048 ticks (about 20 s, longer "
            "when the loop lags); mean_ms_this_phase is from its tick count over the phase",
        },
        "shed": {
            "before_flood": shed_keys(m.stats_before),
            "after_flood": shed_keys(m.stats_after),
            "delta": {
                k: v - m.stats_before.get(k, 0.0) for k, v in shed_keys(m.stats_after).items()
            },
            "client_outcomes": C.merge([o["outcomes"] for o in m.flood_outs]),
            "skipped_client_side_inflight_full": sum(
                o["skipped_inflight_full"] for o in m.flood_outs
            ),
        },
        "canaries": canary_out,
        "eviction": {
            "tenant": "b",
            "seeded_runs": SEED_RUNS,
            "tracked_after_seed": len(m.seeded),
            "tracked_after_idle_phase": len(m.evict_idle),
            "tracked_before_flood": len(m.evict_before),
            "tracked_once_canary_pools_registered": len(m.evict_pool),
            "tracked_after_flood": len(m.evict_after),
            "counts_intact_after_flood": len(intact),
            "runs_tracked_total_after": m.stats_after.get("runs_tracked"),
            "runs_span_only_total_after": m.stats_after.get("runs_span_only"),
        },
        "resources": {
            "rss_mb": {
                "before": m.res_before["rss_mb"],
                "peak": peak_rss,
                "after": m.res_after["rss_mb"],
                "after_minus_before": round(m.res_after["rss_mb"] - m.res_before["rss_mb"], 1),
            },
            "fds": {
                "before": m.res_before["fds"],
                "peak": peak_fds,
                "after": m.res_after["fds"],
                "after_minus_before": m.res_after["fds"] - m.res_before["fds"],
            },
            "settle_s": ns.settle_s,
            # the guard's own view after the settle: allocator trims so far, span queue bytes
            "guard_memory_trims": m.stats_after.get("memory_trims"),
            "guard_span_queue_bytes": m.stats_after.get("span_queue_bytes"),
        },
    }
    p99s = [ctl_flood[k]["p99"] for k in ("allowance_ms", "cancel_ms")]
    out["acceptance"] = {
        "control_p99_le_50ms": all(p is not None and p <= 50 for p in p99s),
        "canary_overspend_le_1_call": all(c["calls_over"] <= 1 for c in canary_out.values()),
        "no_eviction": len(m.evict_before) == SEED_RUNS and len(intact) == SEED_RUNS,
        "rss_within_50mb": m.res_after["rss_mb"] - m.res_before["rss_mb"] <= 50,
        "offered_multiple_reached": out["flood"]["multiple_reached"],
    }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=20.0, help="flood length")
    ap.add_argument("--multiple", type=float, default=5.0, help="offered load / capacity")
    ap.add_argument("--quick", action="store_true", help="short phases (about 30 s in all)")
    ap.add_argument("--max-tracked-runs", type=int, default=5000)
    ap.add_argument("--flooders", type=int, default=1, help="processes per transport")
    ap.add_argument("--capacity-inflight", type=int, default=32, help="per flooder process")
    ap.add_argument("--admit-timeout-ms", type=float, default=200.0, help="the SDK's")
    ap.add_argument("--role", choices=["flood", "canary"], help=argparse.SUPPRESS)
    for hidden in ("--transport", "--tag", "--address", "--http-url", "--token", "--tenant"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--new-ids", type=int, help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.role == "flood":
        return L.flood_main(ns)
    if ns.role == "canary":
        return C.canary_main(ns)
    ns.capacity_warm_s, ns.capacity_s, ns.idle_s, ns.settle_s = 1.0, 3.0, 6.0, 6.0
    ns.idle_rate, ns.idle_pool, ns.flood_pool = 5.0, 30, 60
    ns.late_s, ns.late_rate = 3.0, 4.0
    if ns.quick:
        ns.duration_s = min(ns.duration_s, 8.0)
        ns.capacity_warm_s, ns.capacity_s, ns.idle_s, ns.settle_s = 0.5, 1.5, 3.0, 3.0
        ns.idle_rate, ns.idle_pool, ns.flood_pool = 8.0, 15, 30
    print(json.dumps(run(ns), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
