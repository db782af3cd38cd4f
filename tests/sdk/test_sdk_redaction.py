"""Nothing raw leaves the process: canaries in arguments, results, facts and errors."""

from __future__ import annotations

import asyncio

import pytest

import guard
from guard.sdk._config import reset
from guard.testing import SpanSink, capture_spans

CANARIES = [
    "CANARY-ARG-7f3a",
    "杭州天气-CANARY",
    "CANARY-RESULT-91c2",
    "CANARY-FACT-55d0",
    "CANARY-ERR-0b1e",
    "CANARY-KW-e2e2",
    "CANARY-PAUSE-aa11",
]


async def test_canaries_never_reach_any_span(sink: SpanSink) -> None:
    @guard.tool
    async def lookup(city: str, *, note: str = "") -> dict:
        return {"weather": "CANARY-RESULT-91c2", "city": city}

    @guard.tool
    def broken(token: str) -> None:
        raise ValueError("CANARY-ERR-0b1e " + token)

    @guard.run(agent="bot", max_steps=5)
    async def f() -> None:
        run = guard.current_run()
        async with guard.step() as step:
            step.model_call(model="gpt-4.1", input_tokens=10, output_tokens=2, response_id="resp-1")
            await lookup("杭州天气-CANARY", note="CANARY-KW-e2e2")
            step.tool_call("search", {"q": "CANARY-ARG-7f3a"}, result="CANARY-RESULT-91c2")
            step.progress(facts=["CANARY-FACT-55d0"])
            run.pause("CANARY-PAUSE-aa11")
            run.resume()
        async with guard.step():
            await asyncio.sleep(0)
            broken("CANARY-ARG-7f3a")

    with pytest.raises(ValueError):
        await f()
    dump = sink.dump()
    assert "execute_tool lookup" in dump and "guard.result.hash" in dump
    for canary in CANARIES:
        assert canary not in dump
        assert canary.encode("unicode_escape").decode() not in dump  # nor escaped


def test_fingerprints_ignore_key_order_but_change_with_the_hmac_key() -> None:
    def fingerprints(key: bytes, args: dict) -> str:
        with capture_spans(hmac_key=key) as s:

            @guard.run(agent="a")
            def f() -> None:
                with guard.step() as step:
                    step.tool_call("search", args, result={"n": 1, "m": 2})

            f()
            attrs = s.attributes("execute_tool")[0]
        reset()
        return attrs["guard.action.fingerprint"] + attrs["guard.result.hash"]

    a = fingerprints(b"deployment-key-A", {"q": "refund", "lang": "en", "page": 1})
    b = fingerprints(b"deployment-key-A", {"lang": "en", "q": "refund", "page": 2})
    c = fingerprints(b"deployment-key-B", {"q": "refund", "lang": "en", "page": 1})
    d = fingerprints(b"deployment-key-A", {"q": "refund!", "lang": "de"})
    assert a == b  # key order and the ignored pagination field do not matter
    assert a != c  # another deployment key: unrelated hashes
    assert a[:32] != d[:32]
