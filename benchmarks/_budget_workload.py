"""The workload of ``bench_tenant_budget.py``: a local OpenAI-compatible server (the ground
truth of what was spent), the agent processes (the real SDK and the real ``openai`` client),
and the guards they talk to (one ``otel-guard serve``, or two replicas sharing a redis-server).

Every model call costs exactly :data:`PRICE` ($0.01): the server answers each
``POST /v1/chat/completions`` after :data:`DELAY_S` with 1000 prompt and 200 completion
tokens, and ``bench-model`` is priced at $6 / $20 per million input / output tokens, both in
the guard's policy (``prices:``) and in the SDK (``guard.configure(price_book=...)``).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from _net import free_port, wait_port

HERE = Path(__file__).resolve().parent
MODEL = "bench-model"
PRICE = 0.01  # 1000 * $6/M + 200 * $20/M
INPUT_TOKENS, OUTPUT_TOKENS = 1000, 200
DELAY_S = 0.05
TAG_HEADER = "x-bench-tag"  # which trial a request belongs to (warm-up calls excluded)

_SYSTEM = (
    "You are a support assistant for an online store that sells household goods. Answer "
    "customers politely and precisely. Always check the order history before you promise a "
    "delivery date, never invent tracking numbers, and say so plainly when you do not know "
    "something. Keep answers short: three or four sentences unless the customer asks for "
    "details. When a refund is due, explain the steps and how long each one usually takes. "
)
_USER = (
    "Hello, I ordered a set of kitchen knives and a cutting board three weeks ago and only the "
    "cutting board arrived. The tracking page says the parcel was delivered, but the box had "
    "nothing else inside and the packing slip lists both items. I have already checked with my "
    "neighbours and the building's front desk. Could you tell me whether the knives were sent "
    "separately, and if not, whether you can send them again or refund them? I would prefer a "
    "replacement because they were a gift for my sister's birthday next weekend. "
)


def messages() -> list[dict[str, str]]:
    """About 1000 tokens of English (~3800 characters) in a system and a user message."""
    return [
        {"role": "system", "content": _SYSTEM * 4},
        {"role": "user", "content": _USER * 4 + "Thank you for your help."},
    ]


def price_book() -> Any:
    from guard.policy import ModelPrice, PriceBook

    return PriceBook("bench", {MODEL: ModelPrice(input=6.0, output=20.0)})


def policy(tenants: list[str], limit_usd: float) -> str:
    lines = ["tenants:"]
    for t in tenants:
        lines += [
            f"  {t}:",
            f"    rolling: [{{metric: cost_usd, limit: {limit_usd}, window_s: 3600}}]",
        ]
    lines += [
        "prices:",
        '  version: "bench"',
        f"  models: {{{MODEL}: {{input: 6.0, output: 20.0}}}}",
    ]
    return "\n".join(lines) + "\n"


# -- the model server ---------------------------------------------------------------------
class LLMServer:
    """A threaded HTTP server answering chat completions; ``log`` holds one
    ``[tag, arrived, answered]`` per request (``time.monotonic()``, system-wide on Linux)."""

    def __init__(self, delay_s: float = DELAY_S) -> None:
        self.delay_s = delay_s
        self.log: list[list[Any]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the openai client expects

            def setup(self) -> None:
                super().setup()
                # headers and body are two writes: without this, Nagle's algorithm holds the
                # body until the client's delayed ACK (~40 ms a call)
                self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": {"message": "not found"}})
                    return
                entry = [self.headers.get(TAG_HEADER, ""), time.monotonic(), None]
                with server.lock:
                    server.log.append(entry)
                    n = len(server.log)
                time.sleep(server.delay_s)
                model = json.loads(body or b"{}").get("model", MODEL)
                self._send(200, _completion(n, model))
                entry[2] = time.monotonic()

            def _send(self, status: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256  # 32 clients connect at once

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> LLMServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def calls(self, tag: str) -> list[tuple[float, float | None]]:
        """(arrived, answered) of every request of ``tag``, in arrival order."""
        with self.lock:
            return [(a, b) for t, a, b in self.log if t == tag]


def _completion(n: int, model: str) -> dict:
    return {
        "id": f"chatcmpl-bench-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "The knives were sent separately."},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": INPUT_TOKENS,
            "completion_tokens": OUTPUT_TOKENS,
            "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS,
        },
    }


# -- guards ---------------------------------------------------------------------------------
@contextlib.contextmanager
def guards(policy_text: str, replicas: int):
    """One ``otel-guard serve`` (``replicas`` 1) or that many sharing one real redis-server
    (``--redis``); yields their endpoints. Their logs go to a temp file, printed on failure."""
    with tempfile.TemporaryDirectory(prefix="bench-tenant-budget-") as tmp:
        cfg = Path(tmp) / "guard.yaml"
        cfg.write_text(policy_text)
        redis = None
        procs: list[subprocess.Popen] = []
        log = open(Path(tmp) / "guards.log", "w+b")  # noqa: SIM115 (closed below)
        try:
            extra: list[str] = []
            if replicas > 1:
                sys.path.insert(0, str(HERE.parent))
                from tests.redisstate._server import RedisServer

                redis = RedisServer(Path(tmp))
                redis.start()
                extra = ["--redis", redis.url]
            endpoints = []
            for i in range(replicas):
                port = free_port()
                cmd = [sys.executable, "-m", "guard.cli", "serve", "--listen", f"127.0.0.1:{port}"]
                cmd += ["--no-store", "--config", str(cfg), "--log-level", "WARNING", *extra]
                if replicas > 1:
                    cmd += ["--guard-id", f"bench-replica-{i}"]
                env = {**os.environ, "OTEL_GUARD_DISABLED": "0"}
                env.pop("OTEL_GUARD_REDIS_URL", None)
                procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env))
                wait_port(port, procs[-1])
                endpoints.append(f"127.0.0.1:{port}")
            yield endpoints
        except BaseException:
            log.flush()
            log.seek(0)
            sys.stderr.write(log.read().decode(errors="replace")[-4000:])
            raise
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
            if redis is not None:
                redis.stop()
            log.close()


# -- agent processes ------------------------------------------------------------------------
def start_worker(spec: dict) -> subprocess.Popen:
    script = HERE / "bench_tenant_budget.py"
    return subprocess.Popen(
        [sys.executable, str(script), "--worker", json.dumps(spec)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _emit(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


def _one_call(path: str, client: Any, msgs: list) -> None:
    """One model call of ``path`` (inside a guarded run unless ``baseline``)."""
    if path == "plain_max_tokens":
        client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=OUTPUT_TOKENS)
    elif path in ("plain", "baseline"):
        client.chat.completions.create(model=MODEL, messages=msgs)
    else:
        import guard

        with guard.step() as step:
            res = step.reserve(cost_usd=PRICE) if path == "reserve" else contextlib.nullcontext()
            with res:
                resp = client.chat.completions.create(model=MODEL, messages=msgs)
                step.model_call(
                    model=MODEL,
                    input_tokens=resp.usage.prompt_tokens,
                    output_tokens=resp.usage.completion_tokens,
                    cost_usd=PRICE,
                )


def _calls(path: str, client: Any, msgs: list, cap: int, rec: dict) -> None:
    """The guarded run of one client: call until stopped, or ``cap`` calls."""
    import guard

    for _ in range(cap):
        t0 = time.monotonic()
        try:
            _one_call(path, client, msgs)
        except guard.RunStopped:
            rec["stop_t"] = time.monotonic()  # the refusal, as the client sees it
            raise
        rec["lat_ms"].append((time.monotonic() - t0) * 1e3)
        rec["started"].append(t0)
    rec["reason"] = "cap"


def _client(agent: Any, path: str, client: Any, msgs: list, cap: int, rec: dict) -> None:
    import guard

    try:
        agent(path, client, msgs, cap, rec)
    except guard.RunStopped as stop:
        _stopped(rec, stop)
    except Exception as e:  # an HTTP error would be a benchmark bug: recorded, not hidden
        rec.update(reason="error", detail=repr(e)[:300], stop_t=time.monotonic())


def _stopped(rec: dict, stop: Any) -> None:
    o = stop.outcome
    rec.setdefault("stop_t", time.monotonic())  # a deny at the run's start
    rec.update(reason=str(o.reason), decided_by=str(o.decided_by), detail=o.message)


def worker_main(spec: dict) -> int:
    """An agent process: ``spec["threads"]`` clients; prints ``ready``, waits for a line on
    stdin, runs, prints ``done`` with every client's record and the SDK's counters."""
    import openai

    import guard

    path, threads, cap = spec["path"], spec["threads"], spec["cap"]
    headers = {TAG_HEADER: spec["tag"]}
    clients = [
        openai.OpenAI(
            base_url=spec["base_url"], api_key="x", max_retries=0, default_headers=headers
        )
        for _ in range(threads)
    ]
    msgs = messages()
    # the first call builds the client's lazy modules and response models: not a trial call
    clients[0].chat.completions.create(
        model=MODEL, messages=msgs, extra_headers={TAG_HEADER: "warmup"}
    )
    if path != "baseline":
        guard.configure(
            endpoint=spec["endpoint"],
            tenant=spec["tenant"],
            price_book=price_book(),
            admit_timeout_ms=spec["admit_timeout_ms"],
        )
        if path.startswith("plain"):
            guard.instrument("openai")

        @guard.run(agent="warmup", tenant="bench-warmup", max_steps=5)
        def warm() -> None:  # connects the control stream before the trial
            with guard.step():
                pass

        warm()
    recs = [{"lat_ms": [], "started": []} for _ in range(threads)]
    if path == "baseline":
        targets = [
            lambda i=i: _baseline(clients[i], msgs, spec["calls"], recs[i]) for i in range(threads)
        ]
    elif path == "unreserved_threads":
        targets = []
    else:
        agent = guard.run(
            agent=f"bench-{path}", tenant=spec["tenant"], max_steps=2 * cap + 10, deadline_s=120
        )(_calls)
        targets = [
            lambda i=i: _client(agent, path, clients[i], msgs, cap, recs[i]) for i in range(threads)
        ]
    _emit(event="ready")
    sys.stdin.readline()
    if path == "unreserved_threads":
        _one_run(clients, msgs, cap, recs, spec["run_limit_usd"])
    else:
        ts = [threading.Thread(target=t) for t in targets]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    stats: dict = {}
    if path != "baseline":
        guard.flush(5.0)
        stats = {k: v for k, v in guard.stats().items() if k.startswith("control_allowance")}
        guard.shutdown()
    _emit(event="done", clients=recs, stats=stats)
    return 0


def _baseline(client: Any, msgs: list, calls: int, rec: dict) -> None:
    for _ in range(calls):
        t0 = time.monotonic()
        _one_call("baseline", client, msgs)
        rec["lat_ms"].append((time.monotonic() - t0) * 1e3)
    rec["reason"] = "done"


def _one_run(clients: list, msgs: list, cap: int, recs: list, limit_usd: float) -> None:
    """One run (``max_cost_usd``), one thread per client inside it, each calling until stopped."""
    import guard

    @guard.run(agent="bench-unreserved-threads", max_cost_usd=limit_usd, max_steps=10 * cap)
    def agent() -> None:
        ts = [
            threading.Thread(
                target=contextvars.copy_context().run,
                args=(_threaded_calls, c, msgs, cap, r),
            )
            for c, r in zip(clients, recs, strict=True)
        ]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    with contextlib.suppress(guard.RunStopped):
        agent()


def _threaded_calls(client: Any, msgs: list, cap: int, rec: dict) -> None:
    import guard

    try:
        for _ in range(cap):
            t0 = time.monotonic()
            _one_call("unreserved_threads", client, msgs)
            rec["lat_ms"].append((time.monotonic() - t0) * 1e3)
            rec["started"].append(t0)
        rec["reason"] = "cap"
    except guard.RunStopped as stop:
        rec["stop_t"] = time.monotonic()
        _stopped(rec, stop)
    except Exception as e:
        rec.update(reason="error", detail=repr(e)[:300], stop_t=time.monotonic())
