"""The model client integrations' test adapters, for the contract suite ``test_providers.py``.

One adapter per client (``openai``, ``anthropic``): how to build its client against the
scripted server, how to make a call of each variant (a variant is the provider's own tuple:
``(api, mode, stream)`` for openai, ``(mode, how)`` for anthropic), and what a reply looks
like. The hand-written loops themselves are the ones of ``test_openai.py`` and
``test_anthropic.py``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import anthropic
import openai
import test_anthropic as anth
import test_openai as oai
from _llm_server import LLMServer

__all__ = ["PROVIDERS", "Anthropic", "OpenAI", "cases"]

Variant = tuple[Any, ...]


class OpenAI:
    """Chat completions and responses; its loop resends the first turn (the tool calls are
    recorded by ``@guard.tool``)."""

    name = "openai"
    error = openai.InternalServerError
    variants, ids = oai.VARIANTS, oai.IDS
    cancels = tuple(("chat", m, False) for m in ("sync", "async"))  # a call held in flight
    streams = (("chat", "sync", True), ("chat", "async", True), ("responses", "sync", True))
    converses = False  # the same request every time
    cut_at = 3  # the stream is cancelled at this chunk
    tokens_at_cut: int | None = None  # a chat stream's usage comes last: none seen by the cut
    cache_write = False  # the server reports cache writes only for Anthropic
    prefix: ClassVar[dict[str, str]] = {"chat": "chatcmpl-", "responses": "resp-"}

    @staticmethod
    def mode(v: Variant) -> str:
        return str(v[1])

    @staticmethod
    def id_prefix(v: Variant) -> str:
        return OpenAI.prefix[v[0]]

    @staticmethod
    def client(llm: LLMServer, mode: str) -> Any:
        return oai._client(llm, mode)

    @staticmethod
    def loop(llm: LLMServer, v: Variant, tools: dict[str, Any], converse: bool, **limits: Any):
        return oai._agent(llm, *v, tools, **limits)  # never sends the conversation back

    loop_tool = oai.lookup
    varying = staticmethod(oai._varying)
    call_kw: ClassVar[dict[str, Any]] = {}

    @staticmethod
    def ask(client: Any, v: Variant) -> Any:
        """One call of variant ``v`` (a coroutine for the async client)."""
        api, mode, _ = v
        read = oai._read_sync if mode == "sync" else oai._read_async
        return read(client, api, v[2])

    @staticmethod
    def text(reply: Any) -> str:
        return str(reply.choices[0].message.content)

    @staticmethod
    def plain(client: Any, **kw: Any) -> Any:
        return client.chat.completions.create(model="gpt-4.1", messages=oai.MSG, **kw)

    @staticmethod
    def reserve_twice(client: Any) -> None:
        """A call that fits the budget's reservation, then one whose max tokens do not."""
        client.chat.completions.create(model="gpt-4.1", messages=oai.MSG, max_tokens=200)
        client.chat.completions.create(
            model="gpt-4.1", messages=oai.MSG, max_completion_tokens=5_000
        )

    @staticmethod
    def read_stream(client: Any, v: Variant, read: Any) -> Any:
        """``read`` a stream of variant ``v`` (a coroutine, for the async client)."""
        api, mode, _ = v

        def make() -> Any:
            if api == "chat":
                return client.chat.completions.create(
                    model="gpt-4.1", messages=oai.MSG, stream=True
                )
            return client.responses.create(model="gpt-4.1", input="x", stream=True)

        if mode == "sync":
            return read(make())

        async def aread() -> None:
            await read(await make())

        return aread()

    @staticmethod
    def raw_sync(client: Any) -> None:
        raw = client.chat.completions.with_raw_response.create(model="gpt-4.1", messages=oai.MSG)
        raw.parse()
        raw.parse()
        with client.responses.with_streaming_response.create(
            model="gpt-4.1", input="x", stream=True
        ) as resp:
            for _ in resp.parse():
                pass

    @staticmethod
    async def raw_async(client: Any) -> None:
        raw = await client.chat.completions.with_raw_response.create(
            model="gpt-4.1", messages=oai.MSG
        )
        assert raw.headers is not None  # the client's own response, passed through
        raw.parse()  # the client's legacy raw response: parse() is not a coroutine here
        raw.parse()  # cached: still one call
        async with client.responses.with_streaming_response.create(
            model="gpt-4.1", input="x", stream=True
        ) as resp:
            async for _ in await resp.parse():
                pass

    conversations = ("chat", "responses")

    @staticmethod
    def conversation(llm: LLMServer, which: Any, tool_fn: Any, **limits: Any) -> Any:
        """The loop that sends the conversation back, with plain tool functions."""
        return oai._conversation_loop(llm, which, tool_fn, **limits)


class Anthropic:
    """Messages: ``create``, ``create(stream=True)`` and the ``messages.stream`` helper; its
    loop sends the conversation back (the tool calls are read from it)."""

    name = "anthropic"
    error = anthropic.InternalServerError
    variants, ids = anth.VARIANTS, anth.IDS
    cancels = anth.VARIANTS
    streams = tuple((m, h) for m in ("sync", "async") for h in ("stream", "helper"))
    converses = True
    cut_at = 1
    tokens_at_cut: int | None = 50  # message_start's usage, seen before the cut
    cache_write = True

    @staticmethod
    def mode(v: Variant) -> str:
        return str(v[0])

    @staticmethod
    def id_prefix(v: Variant) -> str:
        return "msg_"

    @staticmethod
    def client(llm: LLMServer, mode: str) -> Any:
        return anth._client(llm, mode)

    @staticmethod
    def loop(llm: LLMServer, v: Variant, tools: dict[str, Any], converse: bool, **limits: Any):
        return anth._agent(llm, *v, tools, converse, **limits)

    loop_tool = staticmethod(lambda q: "no results")
    varying = staticmethod(anth._varying)
    call_kw: ClassVar[dict[str, Any]] = {
        "max_tokens": 100
    }  # the request's max_tokens: reserved, and covered each time

    @staticmethod
    def ask(client: Any, v: Variant) -> Any:
        mode, how = v
        return (anth._ask_sync if mode == "sync" else anth._ask_async)(client, how, [anth.ASK])

    @staticmethod
    def text(reply: Any) -> str:
        return str(reply.content[0].text)

    @staticmethod
    def plain(client: Any, **kw: Any) -> Any:
        return client.messages.create(model=anth.MODEL, messages=[anth.ASK], max_tokens=16, **kw)

    @staticmethod
    def reserve_twice(client: Any) -> None:
        client.messages.create(model=anth.MODEL, messages=[anth.ASK], max_tokens=200)
        with client.messages.stream(model=anth.MODEL, messages=[anth.ASK], max_tokens=5_000) as s:
            s.until_done()

    @staticmethod
    def read_stream(client: Any, v: Variant, read: Any) -> Any:
        """``read`` the events of ``create(stream=True)``, or of the helper's stream (which
        come off the guarded raw stream)."""
        mode, how = v
        kw = {"model": anth.MODEL, "messages": [anth.ASK], "max_tokens": 64}
        if mode == "sync":
            if how == "stream":
                return read(client.messages.create(**kw, stream=True))
            with client.messages.stream(**kw) as s:
                return read(s)

        async def aread() -> None:
            if how == "stream":
                await read(await client.messages.create(**kw, stream=True))
            else:
                async with client.messages.stream(**kw) as s:
                    await read(s)

        return aread()

    @staticmethod
    def raw_sync(client: Any) -> None:
        kw = {"model": anth.MODEL, "messages": [anth.ASK], "max_tokens": 64}
        raw = client.messages.with_raw_response.create(**kw)
        raw.parse()
        raw.parse()
        with client.messages.with_streaming_response.create(**kw, stream=True) as resp:
            for _ in resp.parse():
                pass

    @staticmethod
    async def raw_async(client: Any) -> None:
        kw = {"model": anth.MODEL, "messages": [anth.ASK], "max_tokens": 64}
        raw = await client.messages.with_raw_response.create(**kw)
        assert raw.headers is not None  # the client's own response, passed through
        await raw.parse()  # the async client's parse() is a coroutine (no legacy type here)
        await raw.parse()  # cached: still one call
        async with client.messages.with_streaming_response.create(**kw, stream=True) as resp:
            async for _ in await resp.parse():
                pass

    conversations = ("messages",)

    @staticmethod
    def conversation(llm: LLMServer, which: Any, tool_fn: Any, **limits: Any) -> Any:
        return anth._agent(llm, "sync", "create", {"lookup": tool_fn}, True, **limits)


PROVIDERS: tuple[Any, ...] = (OpenAI, Anthropic)


def cases(attr: str) -> list[Any]:
    """``(provider, variant)`` parameters over the variants each provider lists as ``attr``."""
    import pytest

    def label(v: Any) -> str:
        parts = v if isinstance(v, tuple) else (v,)
        return "-".join(("stream" if x else "") if isinstance(x, bool) else str(x) for x in parts)

    return [
        pytest.param(p, v, id=f"{p.name}-{label(v).strip('-')}")
        for p in PROVIDERS
        for v in getattr(p, attr)
    ]
