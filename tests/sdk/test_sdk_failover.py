"""SDK failover between several guards (``endpoint="g1:4317,g2:4317"``), against real guards
(GuardServer on 127.0.0.1:0, each in a thread of its own)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from typing import Any

import pytest
from _sdk_real_guard import guard_in_thread
from _wait import wait_until

import guard
from guard.errors import ConfigError
from guard.sdk._runtime import get_runtime, stats
from guard.testing import capture_spans

pytest.importorskip("guard.server")

POLICY = {"guard": {"agent_grace_s": 30}}


def _listed(port: int) -> dict[str, Any]:
    from guard.cli._client import AdminClient

    with AdminClient(f"127.0.0.1:{port}") as c:
        return {r.run_id: r for r in c.list_runs().runs}


def _dead_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settings(ports: list[int], **kw: Any) -> dict[str, Any]:
    base = dict(
        endpoint=",".join(f"127.0.0.1:{p}" for p in ports),
        tenant="acme",
        admit_timeout_ms=2000,
        heartbeat_interval_ms=100,
        reconnect_min_s=0.05,
        reconnect_max_s=0.2,
        shutdown_ack_timeout_s=10,
    )
    base.update(kw)
    return base


def test_endpoint_lists_are_parsed_and_each_entry_validated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = guard.configure(endpoint=" g1:4317 , g2:4318", disabled=True)
    assert s.targets == ("g1:4317", "g2:4318") and s.target == "g1:4317"
    assert s.span_targets == s.targets and s.spans_follow_control
    s = guard.configure(endpoint=["https://g1:4317", "https://[::1]:4317"], disabled=True)
    assert s.targets == ("g1:4317", "[::1]:4317") and s.secure
    monkeypatch.setenv("OTEL_GUARD_ENDPOINT", "a:1,b:2,c:3")
    s = guard.configure(span_endpoint="col1:4317,col2:4317", disabled=True)
    assert s.targets == ("a:1", "b:2", "c:3")
    assert s.span_targets == ("col1:4317", "col2:4317") and not s.spans_follow_control
    bad = {
        "g1:4317,,g2:4317": "empty entry #2",
        "g1:4317,": "empty entry #2",
        "g1:4317,g2:99999": "'g2:99999': bad port '99999'",
        "g1:4317,g2": "'g2': expected host:port",
        "g1:http": "bad port 'http'",
        "[::1:4317": "expected [ipv6]:port",
        "https://g1:4317,http://g2:4317": "mixes http:// and https://",
    }
    for value, message in bad.items():
        with pytest.raises(ConfigError, match=message.replace("[", r"\[")) as info:
            guard.configure(endpoint=value)
        assert info.value.path == "endpoint", value
    with pytest.raises(ConfigError, match="'c:0': bad port") as info:
        guard.configure(span_endpoint="a:1,c:0")
    assert info.value.path == "span_endpoint"


def _stepper(gate: threading.Event, box: dict[str, Any]) -> Any:
    @guard.run(agent="bot", max_steps=30)
    def loop() -> None:
        box["run"] = guard.current_run()
        for i in range(100):
            if i == 5:
                box["at_gate"].set()
                gate.wait(30)
            with guard.step() as step:
                step.model_call(model="gpt-4.1", input_tokens=10, output_tokens=1)

    def main() -> None:
        try:
            loop()
        except guard.RunStopped as stop:
            box["outcome"] = stop.outcome

    box["at_gate"] = threading.Event()
    t = threading.Thread(target=main)
    t.start()
    return t


def test_a_stopped_guard_hands_its_live_runs_to_the_next_with_their_counters() -> None:
    with contextlib.ExitStack() as stack:
        cms = [guard_in_thread(POLICY), guard_in_thread(POLICY)]
        boxes = [stack.enter_context(cm) for cm in cms]
        ports = [b["port"] for b in boxes]
        with capture_spans(**_settings(ports)):
            gate, box = threading.Event(), {}
            t = _stepper(gate, box)
            assert box["at_gate"].wait(15)
            run_id = box["run"].run_id

            def holder() -> int | None:
                # connected: the guard that holds the run's stream (on a loaded machine the
                # stream may still be connecting while the spans already list the run)
                for i, p in enumerate(ports):
                    r = _listed(p).get(run_id)
                    if r is not None and r.connected and r.usage.steps == 5:
                        return i + 1  # 1-based: 0 is falsy
                return None

            first = wait_until(holder, 15, "the run's stream held, with its 5 steps") - 1
            other = 1 - first
            assert run_id not in _listed(ports[other])
            cms[first].__exit__(None, None, None)  # the guard holding the stream goes away

            def moved() -> Any:
                r = _listed(ports[other]).get(run_id)
                return r if r is not None and r.connected else None

            r = wait_until(moved, 15, "the run re-registered on the other guard")
            assert (r.usage.steps, r.usage.model_calls, r.usage.input_tokens) == (5, 5, 50)
            assert (r.tenant, r.agent) == ("acme", "bot")
            gate.set()
            t.join(30)
            o = box["outcome"]
            assert (o.reason, o.steps) == ("max_steps", 30)  # the limit held across failover
            rt = get_runtime()
            assert rt.control.counters["welcomes"] >= 2
            assert guard.flush(10)
            # the spans followed the stream to the other guard, none given up on
            st = stats()
            assert st["spans_failed"] == 0 and st["spans_exported"] >= 30, st
            assert f"127.0.0.1:{ports[other]}" in rt.span_exporter.targets()
            guard.shutdown()
            assert stats().get("control_records_unacknowledged", 0) == 0
            sink = boxes[other]["sink"]
            rec = wait_until(lambda: [x for x in sink.runs if x.run_id == run_id], 15, "the record")
            assert [(x.reason.value, x.steps) for x in rec] == [("max_steps", 30)]
        cms[other].__exit__(None, None, None)
        stack.pop_all()


def _configure_trying_first(ports: list[int], first: int, **kw: Any) -> None:
    """Configure until this client's random order tries ``first`` first."""
    for _ in range(40):
        guard.configure(**_settings(ports, **kw))
        order = asyncio.run(get_runtime().control.ring.resolve())
        if order[0].target == f"127.0.0.1:{first}":
            return
    pytest.fail(f"port {first} never came first in 40 random orders")


def _steps_until_stopped(max_steps: int) -> Any:
    @guard.run(agent="bot", max_steps=max_steps)
    def loop() -> None:
        while True:
            with guard.step():
                pass

    with pytest.raises(guard.RunStopped) as info:
        loop()
    return info.value.outcome


def test_a_run_started_while_one_guard_is_down_goes_to_the_live_one() -> None:
    with guard_in_thread({"runs": {"max_steps": 3}}) as live:
        ports = [_dead_port(), live["port"], _dead_port()]
        _configure_trying_first(ports, ports[0])
        o = _steps_until_stopped(10)  # the live guard's policy tightens it to 3
        assert (o.reason, o.steps) == ("max_steps", 3)
        assert get_runtime().control.counters["failovers"] >= 1
        guard.shutdown()
        wait_until(lambda: any(r.run_id == o.run_id for r in live["sink"].runs), 15, "the record")


def test_every_guard_down_is_fail_open_and_backs_off_per_cycle() -> None:
    ports = [_dead_port(), _dead_port()]
    # no guard ever answers: neither the RunEnded acks nor the span exports can come, so
    # shutdown does not wait for them (shutdown's own bound: tests/sdk/test_sdk_records.py)
    down = dict(shutdown_ack_timeout_s=0.1, export_timeout_s=0.2)
    with capture_spans(**_settings(ports, admit_timeout_ms=100, reconnect_min_s=0.2, **down)):
        o = _steps_until_stopped(2)
        assert o.reason == "max_steps"  # local limits, no guard
        control = get_runtime().control
        wait_until(lambda: control.counters["reconnects"] >= 2, 15, "two full cycles")
        # within a cycle the next guard is tried at once; between cycles it backs off
        assert control.counters["failovers"] >= control.counters["reconnects"] - 1
        assert control.counters["errors"] <= 2 * (control.counters["reconnects"] + 1)


def test_a_guard_that_accepts_but_never_answers_is_skipped_for_the_next() -> None:
    """A hung guard (the kernel completes the TCP handshake, nobody speaks HTTP/2) would hold
    a connect for grpc's 20 s connect timeout; the SDK gives up on it and tries the next."""
    with socket.socket() as silent, guard_in_thread({"runs": {"max_steps": 3}}) as live:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # never accepted: connects complete, nothing is ever answered
        ports = [silent.getsockname()[1], live["port"]]
        _configure_trying_first(ports, ports[0], admit_timeout_ms=5000)
        o = _steps_until_stopped(10)  # the live guard tightens it to 3
        assert (o.reason, o.steps) == ("max_steps", 3)
        assert get_runtime().control.counters["failovers"] >= 1
        guard.shutdown()


def test_names_resolve_to_every_address_once_in_a_stable_per_process_order() -> None:
    """What can be tested of DNS on loopback: ``localhost`` is resolved by the SDK (to each of
    its addresses; 127.0.0.1, and ::1 where the resolver lists it), an address reached through
    two entries is tried once, the order is one per process and a cycle goes on after the
    address used last. Untested here: a name with several A records of different hosts."""
    from guard.sdk._targets import TargetRing

    seed = b"0123456789abcdef"
    ring = TargetRing("localhost:4317,127.0.0.1:4317,127.0.0.2:4317", seed=seed)
    order = asyncio.run(ring.resolve())
    targets = [a.target for a in order]
    assert len(targets) == len(set(targets)) and "127.0.0.1:4317" in targets
    assert "127.0.0.2:4317" in targets
    local = [a for a in order if a.host == "localhost"]
    assert local and all(a.resolved and a.entry == "localhost:4317" for a in local)
    assert ("grpc.ssl_target_name_override", "localhost") in local[0].channel_options()
    assert [a.target for a in asyncio.run(ring.resolve())] == targets  # stable
    again = TargetRing("127.0.0.2:4317,localhost:4317,127.0.0.1:4317", seed=seed)
    assert sorted(a.target for a in asyncio.run(again.resolve())) == sorted(targets)
    nxt = [a.target for a in asyncio.run(ring.resolve(after=targets[0]))]
    assert nxt == targets[1:] + targets[:1]
    unknown = asyncio.run(TargetRing("no-such-guard.invalid:4317").resolve())
    assert [(a.target, a.resolved) for a in unknown] == [("no-such-guard.invalid:4317", False)]
