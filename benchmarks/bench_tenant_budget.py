"""Is a tenant budget exact at both ends? Counts the model calls a local OpenAI-compatible
server actually served under a tenant's rolling cost window, against the calls the budget
pays for. Prints one JSON document (progress goes to stderr).

The workload (``_budget_workload.py``): every call costs exactly $0.01 (1000 prompt and 200
completion tokens of ``bench-model`` at $6 / $20 per million, priced alike in the guard's
policy and the SDK; the server answers after 50 ms), and a tenant has a rolling ``cost_usd``
window of $0.50 per hour: 50 calls. 32 clients, each one thread running its own
``@guard.run`` and calling the server through the real ``openai`` client until the run is
stopped (or 200 calls). Each trial uses a fresh tenant (one guard set per layout).

Layouts: ``1x32`` (one agent process, 32 threads), ``4x8`` (4 processes of 8 threads), both
against one ``otel-guard serve``; ``4x8_2replicas`` (processes 0-1 on replica A, 2-3 on
replica B: two ``serve --redis`` sharing one redis-server). Paths:

* ``plain_max_tokens``: ``guard.instrument("openai")``, requests with ``max_tokens=200``;
* ``plain``: the same without ``max_tokens``;
* ``reserve``: no instrumentation; each call inside ``step.reserve(cost_usd=0.01)`` and
  reported with ``step.model_call``;
* ``unreserved_threads`` (layout ``1x8_one_run``): one run with ``max_cost_usd=0.10`` (10
  calls), 8 threads inside it, each call in a ``guard.step()`` reported after it returns.

Per trial, from the server's log and the clients' records: ``calls_over`` (calls served
minus the calls the limit pays for: positive is overshoot, negative is budget refused while
still unspent); ``unspent_at_first_refusal_usd`` (limit minus the cost of the calls, served in the
end, that had started (asked for their reservation) when the first client saw its run
stopped by the budget: a call reserved but not yet at the server is not money left);
``unspent_at_all_refused_usd`` (limit minus the cost of every call served);
``time_to_first_refusal_ms`` (from the moment the served cost reached the limit, the 50th
call answered, to the first refusal; negative = refused before it; null when the limit was
never reached); call latency p50 / p99 and what it adds to a baseline of the same clients
calling the server without the guard; the stop reasons. Median, min and max over trials.

    .venv/bin/python benchmarks/bench_tenant_budget.py [--trials 5] [--layouts 1x32,4x8]
        [--paths plain,reserve] [--quick]

``--quick``: one trial, layout ``1x32`` only (under a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported
import _budget_workload as W

LIMIT_USD = 0.50
RUN_LIMIT_USD = 0.10  # unreserved_threads: one run's max_cost_usd
# layout -> (agent processes, threads per process, guard replicas)
LAYOUTS = {
    "1x32": (1, 32, 1),
    "4x8": (4, 8, 1),
    "4x8_2replicas": (4, 8, 2),
    "1x8_one_run": (1, 8, 1),
}
TENANT_PATHS = ("plain_max_tokens", "plain", "reserve")
PATHS = (*TENANT_PATHS, "unreserved_threads")


def runs_on(layout: str, path: str) -> bool:
    return (layout == "1x8_one_run") == (path == "unreserved_threads")


def _percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


# -- one fleet of agent processes -------------------------------------------------------------
def run_workers(specs: list[dict], timeout_s: float) -> tuple[float, list[dict]]:
    """Start the agent processes, release them at once; returns the release time and each
    process's ``done`` message."""
    procs = [W.start_worker(s) for s in specs]
    try:
        for p in procs:
            line = p.stdout.readline()
            if json.loads(line or "{}").get("event") != "ready":
                raise RuntimeError(f"agent process not ready (exit {p.poll()}): {line!r}")
        t_go = time.monotonic()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        done = []
        deadline = time.monotonic() + timeout_s
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            msgs = [json.loads(x) for x in out.splitlines() if x.strip().startswith("{")]
            if p.returncode != 0 or not msgs or msgs[-1].get("event") != "done":
                raise RuntimeError(f"agent process exited {p.returncode}: {out[-500:]!r}")
            done.append(msgs[-1])
        return t_go, done
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


def _specs(
    layout: str,
    path: str,
    server: W.LLMServer,
    endpoints: list[str],
    tag: str,
    ns: argparse.Namespace,
) -> list[dict]:
    procs, threads, _ = LAYOUTS[layout]
    return [
        {
            "path": path,
            "threads": threads,
            "cap": ns.cap,
            "calls": ns.baseline_calls,
            "tag": tag,
            "tenant": tag,
            "base_url": server.base_url,
            "endpoint": endpoints[i * len(endpoints) // procs] if endpoints else None,
            "admit_timeout_ms": ns.admit_timeout_ms,
            "run_limit_usd": RUN_LIMIT_USD,
        }
        for i in range(procs)
    ]


def baseline(layout: str, server: W.LLMServer, ns: argparse.Namespace) -> dict:
    tag = f"{layout}-baseline"
    _, done = run_workers(_specs(layout, "baseline", server, [], tag, ns), 120)
    lat = [x for d in done for c in d["clients"] for x in c["lat_ms"]]
    return {
        "calls": len(lat),
        "p50": _r(_percentile(lat, 0.5)),
        "p99": _r(_percentile(lat, 0.99)),
    }


def trial(
    layout: str,
    path: str,
    tenant: str,
    server: W.LLMServer,
    endpoints: list[str],
    base: dict,
    ns: argparse.Namespace,
) -> dict:
    limit = RUN_LIMIT_USD if path == "unreserved_threads" else LIMIT_USD
    refusal = "cost_budget" if path == "unreserved_threads" else "tenant_budget"
    limit_calls = round(limit / W.PRICE)
    t_go, done = run_workers(_specs(layout, path, server, endpoints, tenant, ns), 300)
    t_end = time.monotonic()
    clients = [c for d in done for c in d["clients"]]
    served = server.calls(tenant)
    refused_at = [c["stop_t"] for c in clients if c.get("reason") == refusal]
    first = min(refused_at) if refused_at else None
    answered = sorted(b for _, b in served if b is not None)
    exhausted = answered[limit_calls - 1] if len(answered) >= limit_calls else None
    lat = [x for c in clients for x in c["lat_ms"]]
    p50, p99 = _percentile(lat, 0.5), _percentile(lat, 0.99)
    stats: Counter = Counter()
    for d in done:
        stats.update(d["stats"])
    details: dict[str, list[str]] = {}
    for c in clients:
        seen = details.setdefault(c.get("reason", "?"), [])
        if c.get("detail") and c["detail"] not in seen and len(seen) < 2:
            seen.append(c["detail"])
    return {
        "tenant": tenant,
        "calls_served": len(served),
        "calls_over": len(served) - limit_calls,
        "unspent_at_first_refusal_usd": None
        if first is None
        else _r(
            (limit_calls - sum(1 for c in clients for t in c["started"] if t < first)) * W.PRICE, 6
        ),
        "unspent_at_all_refused_usd": _r((limit_calls - len(served)) * W.PRICE, 6),
        "time_to_first_refusal_ms": None
        if first is None or exhausted is None
        else _r((first - exhausted) * 1e3, 1),
        "first_refusal_after_go_ms": None if first is None else _r((first - t_go) * 1e3, 1),
        "all_refused": len(refused_at) == len(clients),
        "latency_p50_ms": _r(p50),
        "latency_p99_ms": _r(p99),
        "added_p50_ms": _r(None if p50 is None else p50 - base["p50"]),
        "added_p99_ms": _r(None if p99 is None else p99 - base["p99"]),
        "stop_reasons": dict(Counter(c.get("reason", "?") for c in clients)),
        "stop_details": details,
        "sdk_counters": dict(stats),
        "wall_s": _r(t_end - t_go, 2),
    }


# -- aggregation --------------------------------------------------------------------------------
def agg(values: list) -> dict:
    xs = [v for v in values if v is not None]
    out = {
        "median": _r(statistics.median(xs), 6) if xs else None,
        "max": max(xs) if xs else None,
        "min": min(xs) if xs else None,
        "trials": values,
    }
    return out


def summarize(path: str, trials: list[dict]) -> dict:
    col = {k: [t[k] for t in trials] for k in trials[0]}
    reasons: Counter = Counter()
    counters: Counter = Counter()
    details: dict[str, list[str]] = {}
    for t in trials:
        reasons.update(t["stop_reasons"])
        counters.update(t["sdk_counters"])
        for r, ds in t["stop_details"].items():
            seen = details.setdefault(r, [])
            seen += [d for d in ds if d not in seen][: max(0, 2 - len(seen))]
    return {
        "refusal_reason": "cost_budget" if path == "unreserved_threads" else "tenant_budget",
        "limit_usd": RUN_LIMIT_USD if path == "unreserved_threads" else LIMIT_USD,
        "tenants": col["tenant"],
        **{
            k: agg(col[k])
            for k in (
                "calls_served",
                "calls_over",
                "unspent_at_first_refusal_usd",
                "unspent_at_all_refused_usd",
                "time_to_first_refusal_ms",
                "first_refusal_after_go_ms",
            )
        },
        "call_latency_ms": {
            "p50": agg(col["latency_p50_ms"]),
            "p99": agg(col["latency_p99_ms"]),
            "added_p50": agg(col["added_p50_ms"]),
            "added_p99": agg(col["added_p99_ms"]),
        },
        "all_refused_trials": sum(col["all_refused"]),
        "stop_reasons": dict(reasons),
        "stop_details": details,
        "sdk_counters": dict(counters),
        "wall_s": agg(col["wall_s"]),
    }


def estimate_accuracy() -> dict:
    """What the integration reserves for this workload's request (the same counting code the
    integration runs), against what each call costs. Every call of the workload is the same
    request and the same usage, so the share of calls that cost more than their estimate is
    the share of these cases with a ratio below 1."""
    from guard.integrations._estimate import (
        DEFAULT_OUTPUT_TOKENS,
        prompt_tokens,
        request_prompt,
    )

    inp = prompt_tokens(W.MODEL, request_prompt({"messages": W.messages()}))

    def cost(i: int, o: int) -> float:
        return (i * 6.0 + o * 20.0) / 1e6

    cases = {
        "with_max_tokens": cost(inp, W.OUTPUT_TOKENS),
        "without_first_call": cost(inp, DEFAULT_OUTPUT_TOKENS),
        "without_later_calls": cost(inp, W.OUTPUT_TOKENS),  # the run's largest reply
    }
    ratios = {k: round(v / W.PRICE, 4) for k, v in cases.items()}
    return {
        "prompt_tokens_estimated": inp,
        "prompt_tokens_reported": W.INPUT_TOKENS,
        "estimate_over_actual": ratios,
        "share_of_calls_over_estimate": sum(r < 1.0 for r in ratios.values()) / len(ratios),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated")
    ap.add_argument("--paths", default=",".join(PATHS), help="comma-separated")
    ap.add_argument("--quick", action="store_true", help="1 trial, layout 1x32 only")
    ap.add_argument("--cap", type=int, default=200, help="safety cap: calls per client")
    ap.add_argument("--baseline-calls", type=int, default=10, help="per client, no guard")
    ap.add_argument("--admit-timeout-ms", type=float, default=2000.0)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.worker:
        return W.worker_main(json.loads(ns.worker))
    if ns.quick:
        ns.trials, ns.layouts = 1, "1x32"
    layouts = [x for x in ns.layouts.split(",") if x]
    paths = [x for x in ns.paths.split(",") if x]
    bad = [x for x in layouts if x not in LAYOUTS] + [x for x in paths if x not in PATHS]
    if bad:
        ap.error(f"unknown layout or path: {', '.join(bad)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so every finally runs
    plan = {lay: [p for p in paths if runs_on(lay, p)] for lay in layouts}
    plan = {lay: ps for lay, ps in plan.items() if ps}
    results: dict = {}
    baselines: dict = {}
    with W.LLMServer() as server:
        for layout, ps in plan.items():
            replicas = LAYOUTS[layout][2]
            tenants = {(p, i): f"{layout}-{p}-t{i}" for p in ps for i in range(ns.trials)}
            with W.guards(W.policy(list(tenants.values()), LIMIT_USD), replicas) as endpoints:
                baselines[layout] = base = baseline(layout, server, ns)
                print(f"[{layout}] baseline {base}", file=sys.stderr, flush=True)
                per: dict[str, list[dict]] = {p: [] for p in ps}
                for i in range(ns.trials):  # interleaved, so drift hits every path alike
                    for p in ps:
                        t = trial(layout, p, tenants[(p, i)], server, endpoints, base, ns)
                        per[p].append(t)
                        keys = (
                            "calls_over",
                            "unspent_at_first_refusal_usd",
                            "time_to_first_refusal_ms",
                            "stop_reasons",
                            "wall_s",
                        )
                        short = {k: t[k] for k in keys}
                        print(f"[{layout}] {p} trial {i}: {short}", file=sys.stderr, flush=True)
                results[layout] = {p: summarize(p, ts) for p, ts in per.items()}
    out = {
        "benchmark": "tenant_budget",
        "workload": {
            "model": W.MODEL,
            "prices_usd_per_million": {"input": 6.0, "output": 20.0},
            "usage_per_call": {
                "prompt_tokens": W.INPUT_TOKENS,
                "completion_tokens": W.OUTPUT_TOKENS,
            },
            "price_per_call_usd": W.PRICE,
            "server_delay_ms": W.DELAY_S * 1e3,
            "tenant_window": {"metric": "cost_usd", "limit": LIMIT_USD, "window_s": 3600},
            "limit_calls": round(LIMIT_USD / W.PRICE),
            "unreserved_threads_run_limit_usd": RUN_LIMIT_USD,
            "prompt_chars": sum(len(m["content"]) for m in W.messages()),
            "clients": {k: v[0] * v[1] for k, v in LAYOUTS.items()},
            "layouts": {
                k: {"processes": a, "threads": b, "guards": c} for k, (a, b, c) in LAYOUTS.items()
            },
            "cap_calls_per_client": ns.cap,
            "trials": ns.trials,
            "admit_timeout_ms": ns.admit_timeout_ms,
            "cores": os.cpu_count(),
        },
        "estimate_accuracy": estimate_accuracy(),
        "results": results,
        "baseline_latency_ms": baselines,
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
