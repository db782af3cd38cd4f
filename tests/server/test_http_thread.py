"""The OTLP/HTTP receiver runs in a thread and an event loop of its own: a request stuck in
its conversion does not hold the guard's main loop, the ingest itself still runs there, and
stop() drains what is in flight, then ends the thread."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections import Counter

import pytest

from guard.server import MemorySink, ServerThread
from guard.server.otlp import _http as http_module

from .conftest import config, trace_id_of
from .test_otlp_http import _json_request


def _post_json(address: str, body: bytes, out: dict) -> None:
    req = urllib.request.Request(
        f"http://{address}/v1/traces",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            out["status"] = resp.status
    except Exception as exc:  # reported by the test
        out["error"] = exc


@pytest.fixture
def stuck_conversion(monkeypatch):
    """json_to_export held until released; where (which thread) it ran."""
    entered, release = threading.Event(), threading.Event()
    seen: dict[str, str] = {}
    real = http_module.json_to_export

    def held(body: bytes) -> bytes:
        seen["thread"] = threading.current_thread().name
        entered.set()
        release.wait(30)
        return real(body)

    monkeypatch.setattr(http_module, "json_to_export", held)
    yield entered, release, seen
    release.set()


def test_a_stuck_request_does_not_hold_the_main_loop(stuck_conversion):
    entered, release, seen = stuck_conversion
    with ServerThread(config(), sink=MemorySink(), http_listen="127.0.0.1:0") as srv:
        address = srv.server.http.address
        body = json.dumps(_json_request(trace_id_of(1).hex(), "00000000000000ab", "t")).encode()
        out: dict = {}
        client = threading.Thread(target=_post_json, args=(address, body, out), daemon=True)
        client.start()
        assert entered.wait(20), "the request reached its conversion"
        # the control plane's loop is free while the request is stuck in the receiver's
        assert srv.call(lambda: srv.server.registry.stats["spans"], timeout=10) == 0
        assert seen["thread"] == "otel-guard-http"
        release.set()
        client.join(30)
        assert out == {"status": 200}
        # the ingest ran on the main loop, as every registry change must
        assert srv.call(lambda: srv.server.registry.stats["spans"]) == 1
        thread = srv.server.http._thread
        assert thread is not None and thread.is_alive() and thread is not threading.current_thread()
        # refusals are counted on the main loop too (a Counter is not thread-safe)
        counter = _ThreadNoting()
        srv.call(lambda: setattr(srv.server, "export_refusals", counter))
        out = {}
        _post_json(address, b"[1, 2]", out)
        assert isinstance(out["error"], urllib.error.HTTPError) and out["error"].code == 400
        assert srv.call(lambda: dict(counter)) == {"INVALID_ARGUMENT": 1}
        assert counter.threads == {"otel-guard-server"}


class _ThreadNoting(Counter):
    """A Counter noting the threads that change it."""

    def __init__(self) -> None:
        self.threads: set[str] = set()
        super().__init__()
        self.threads.clear()  # Counter.__init__ calls update()

    def __setitem__(self, key: str, value: int) -> None:
        self.threads.add(threading.current_thread().name)
        super().__setitem__(key, value)

    def update(self, *args, **kw) -> None:
        self.threads.add(threading.current_thread().name)
        super().update(*args, **kw)


def test_stop_drains_a_request_in_flight_then_ends_the_thread(stuck_conversion):
    entered, release, _ = stuck_conversion
    srv = ServerThread(config(), sink=MemorySink(), http_listen="127.0.0.1:0").start()
    receiver = srv.server.http
    thread = receiver._thread
    body = json.dumps(_json_request(trace_id_of(2).hex(), "00000000000000ac", "u")).encode()
    out: dict = {}
    client = threading.Thread(target=_post_json, args=(receiver.address, body, out), daemon=True)
    client.start()
    assert entered.wait(20)
    stopper = threading.Thread(target=srv.stop, kwargs={"drain_s": 20.0}, daemon=True)
    stopper.start()
    # the stop waits for the request (within its grace) while the receiver refuses nothing
    stopper.join(0.5)
    assert stopper.is_alive()
    release.set()
    client.join(30)
    stopper.join(30)
    assert out == {"status": 200}
    assert not stopper.is_alive() and not thread.is_alive()
