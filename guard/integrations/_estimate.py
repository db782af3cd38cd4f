"""Whole-request estimates for the integrations' reservations: the prompt's input tokens,
counted from the request, and the output tokens its reply may take.

The prompt (:func:`prompt_tokens`): every message's text (each content part, tool calls and
their arguments, tool results), the system prompt / ``instructions`` and the ``tools`` /
``functions`` definitions as JSON, plus a few tokens per message and per request. A
non-text part (image, audio, file) counts :data:`NON_TEXT_PART_TOKENS`; its bytes are never
read as text. :func:`request_prompt` reads the openai and anthropic request shapes; the
frameworks' own messages (LangChain messages, Pydantic AI request parts) are read by their
attributes. Only what the request carries is seen (not a ``previous_response_id`` thread).

Counting text: tiktoken when it is installed (the ``tiktoken`` extra), knows the model
(OpenAI's) and its encoding loads; loading may download a BPE file once, and any failure
(offline, no cache) is remembered: the fallback is used for good, never raised to the agent.
Other models use the fallback too (tiktoken would count another tokenizer's tokens).

The fallback, ``ceil(utf8_bytes / CHARS_PER_TOKEN)``, is calibrated on published ratios,
not measured here (tiktoken's files cannot be had offline): ~4 characters per token for
English (OpenAI's cl100k / o200k), ~3.5 for Anthropic's tokenizer, ~3-3.5 for JSON schemas
and code. 3.0 over-estimates all of them; tests/sdk/test_sdk_estimates.py checks a corpus
of chat turns, tool schemas and results stays within len/4 .. len/2. UTF-8 bytes, not
characters: ASCII counts its length, and CJK (~1 token per character, 3 bytes) is not
under-counted.

The output (:func:`output_tokens`): the request's max tokens when set; else the run's
largest reply so far (kept by ``Step.model_call``), else :data:`DEFAULT_OUTPUT_TOKENS`;
capped by the model's known output limit. A full model limit (16k-100k tokens) is never
held for a first call: it would refuse the first call of any modest budget for a reply that
rarely comes near it. Set max tokens on the request for a real bound.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_OUTPUT_TOKENS",
    "MESSAGE_OVERHEAD_TOKENS",
    "NON_TEXT_PART_TOKENS",
    "Prompt",
    "count_text_tokens",
    "model_output_limit",
    "output_tokens",
    "prompt_tokens",
    "request_prompt",
]

log = logging.getLogger("guard.integrations")

CHARS_PER_TOKEN = 3.0  # UTF-8 bytes per token of the fallback (calibration: module docstring)
MESSAGE_OVERHEAD_TOKENS = 4  # role + separators per message (OpenAI documents 3-4)
REQUEST_OVERHEAD_TOKENS = 3  # the reply's priming (OpenAI's "<|start|>assistant<|message|>")
# An image, audio or file part: Claude's largest unresized image is ~1,600 tokens
# (1.15 megapixels / 750), a high-detail gpt-4o image at most ~1,450 (8 tiles x 170 + 85).
NON_TEXT_PART_TOKENS = 1_600
# Anthropic adds a tool-use system prompt of ~260-350 tokens whenever tools are given.
CLAUDE_TOOLS_PREAMBLE_TOKENS = 350
# A request without max tokens, before the run saw any reply: most chat turns and nearly
# every tool-call turn are well under it, and it leaves a first call room in a budget of
# a thousand tokens (a full model limit would not).
DEFAULT_OUTPUT_TOKENS = 512

# Output limits of well-known model families, by longest prefix (tokens; None: unknown).
_OUTPUT_LIMITS = {
    "gpt-3.5-turbo": 4_096,
    "gpt-4": 8_192,
    "gpt-4-turbo": 4_096,
    "gpt-4o": 16_384,
    "chatgpt-4o": 16_384,
    "gpt-4.1": 32_768,
    "gpt-5": 128_000,
    "o1": 100_000,
    "o1-mini": 65_536,
    "o3": 100_000,
    "o4-mini": 100_000,
    "claude-3-haiku": 4_096,
    "claude-3-opus": 4_096,
    "claude-3-sonnet": 4_096,
    "claude-3-5": 8_192,
    "claude-3-7-sonnet": 64_000,
    "claude-sonnet-4": 64_000,
    "claude-haiku-4": 64_000,
    "claude-opus-4": 32_000,
    "claude-opus-4-5": 64_000,
}
_NON_TEXT_TYPES = frozenset(
    {"image", "image_url", "image_file", "input_image", "audio", "input_audio", "file"}
    | {"input_file", "document", "video"}
)
# Ids, cache markers and a thinking block's signature are not prompt text the model reads.
_SKIP_KEYS = frozenset({"id", "call_id", "tool_call_id", "tool_use_id", "cache_control"})
_SKIP_KEYS |= {"signature"}
_MAX_DEPTH = 24  # a walk deeper than this is not a prompt (and never recurses forever)


class Prompt(NamedTuple):
    """What a request sends the model: its messages (a list, or one string), its system
    prompt / instructions, its tool definitions (any of them ``None``)."""

    messages: Any = None
    system: Any = None
    tools: Any = None


def request_prompt(kw: Mapping[str, Any]) -> Prompt:
    """The prompt of an openai (chat completions: ``messages``, ``tools``, ``functions``;
    responses: ``input``, ``instructions``, ``tools``) or anthropic (``system``,
    ``messages``, ``tools``) request's keyword arguments. Reads references only: cheap."""
    messages = kw.get("messages")
    system = kw.get("system")
    tools = [t for t in (kw.get("tools"), kw.get("functions")) if t]
    return Prompt(
        kw.get("input") if messages is None else messages,
        kw.get("instructions") if system is None else system,
        tools or None,
    )


# -- counting text -----------------------------------------------------------------------------
_UNSEEN = object()
_encodings: dict[str, Any] = {}  # model -> tiktoken encoding, or None (the fallback counts)
_tiktoken_broken = False  # tiktoken failed once (not installed, no BPE file): never again


def _bare(model: str) -> str:
    """``openai/gpt-4o`` -> ``gpt-4o``: a router's provider prefix is not the model's name."""
    return model.rsplit("/", 1)[-1].rsplit(":", 1)[-1]


def _encoding(model: str | None) -> Any:
    global _tiktoken_broken
    if _tiktoken_broken or not model:
        return None
    enc = _encodings.get(model, _UNSEEN)
    if enc is not _UNSEEN:
        return enc
    enc = None
    try:
        import tiktoken
        from tiktoken.model import encoding_name_for_model

        try:
            name = encoding_name_for_model(_bare(model))
        except KeyError:
            name = None  # not an OpenAI model: tiktoken would count another tokenizer's tokens
        if name is not None:
            enc = tiktoken.get_encoding(name)  # may download the BPE file once
    except Exception:  # ImportError, no network, a broken cache: the fallback, for good
        _tiktoken_broken = True
        log.info("otel-guard: tiktoken unavailable; prompts are estimated from their length")
        return None
    if len(_encodings) < 256:  # model names come from code: a handful
        _encodings[model] = enc
    return enc


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def count_text_tokens(text: str, model: str | None = None) -> int:
    """The tokens of ``text`` for ``model``: tiktoken's exact count when it can (see the
    module), else the conservative ``ceil(utf8_bytes / CHARS_PER_TOKEN)``."""
    if not text:
        return 0
    enc = _encoding(model)
    if enc is not None:
        try:
            return len(enc.encode(text, disallowed_special=()))  # "<|endoftext|>" is text here
        except Exception:
            pass  # the fallback below: an estimate never fails the call
    return math.ceil(_utf8_len(text) / CHARS_PER_TOKEN)


# -- walking a prompt --------------------------------------------------------------------------
class _Tally:
    __slots__ = ("messages", "non_text", "texts")

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.messages = 0
        self.non_text = 0


def _json(obj: Any) -> str:
    """A tool schema or a structured tool result as the JSON the provider sends."""

    def plain(o: Any) -> Any:
        schema = getattr(o, "parameters_json_schema", None)
        if schema is not None:  # a Pydantic AI ToolDefinition: what the provider is sent
            return {"name": o.name, "description": o.description, "parameters": schema}
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            fields = dataclasses.fields(o)
            return {f.name: v for f in fields if (v := getattr(o, f.name)) is not None}
        dump = getattr(o, "model_dump", None)  # a pydantic model
        return dump(mode="json") if callable(dump) else str(o)

    return json.dumps(obj, default=plain, ensure_ascii=False)


def _walk(obj: Any, t: _Tally, depth: int) -> None:
    """Add the prompt text in ``obj`` (a message, a part, a content list) to ``t``."""
    if obj is None or isinstance(obj, bool) or depth > _MAX_DEPTH:
        return
    if isinstance(obj, str):
        t.texts.append(obj)
    elif isinstance(obj, int | float):
        t.texts.append(str(obj))
    elif isinstance(obj, bytes | bytearray | memoryview):
        t.non_text += 1
    elif isinstance(obj, Mapping):
        if obj.get("type") in _NON_TEXT_TYPES:
            t.non_text += 1
            return
        for k, v in obj.items():
            if k not in _SKIP_KEYS:
                _walk(v, t, depth + 1)
    elif isinstance(obj, list | tuple):
        for v in obj:
            _walk(v, t, depth + 1)
    else:
        _walk_object(obj, t, depth)


def _walk_object(obj: Any, t: _Tally, depth: int) -> None:
    """A framework's message or part, read by its attributes: LangChain messages (``content``,
    ``tool_calls``), Pydantic AI parts (``content``, ``tool_name``, ``args``) and requests
    (``parts``, ``instructions``)."""
    attrs = [getattr(obj, a, None) for a in ("content", "parts", "args")]
    if all(a is None for a in attrs):
        if getattr(obj, "url", None) is not None or getattr(obj, "data", None) is not None:
            t.non_text += 1  # a Pydantic AI ImageUrl / BinaryContent / DocumentUrl ...
        else:
            t.texts.append(_json(obj))  # e.g. a tool result's structured value
        return
    for a in (*attrs, getattr(obj, "instructions", None), getattr(obj, "tool_name", None)):
        if isinstance(a, str | list | tuple | Mapping):
            _walk(a, t, depth + 1)
        elif a is not None:
            t.texts.append(_json(a))
    # A LangChain AIMessage's tool calls (dicts); a Pydantic AI response's are its parts.
    calls = getattr(obj, "tool_calls", None) if attrs[1] is None else None
    if isinstance(calls, list):
        _walk(calls, t, depth + 1)


def _messages(messages: Any, t: _Tally) -> None:
    """Each message of the list: its text and its overhead (a Pydantic AI request: per part,
    as each becomes a message on the wire). A string is one user message."""
    to_messages = getattr(messages, "to_messages", None)  # a LangChain PromptValue
    if callable(to_messages):
        messages = to_messages()
    if isinstance(messages, str | Mapping) or not isinstance(messages, list | tuple):
        messages = [messages]
    for m in messages:
        parts = getattr(m, "parts", None)
        t.messages += len(parts) if isinstance(parts, list | tuple) and parts else 1
        _walk(m, t, 0)


def prompt_tokens(model: str | None, prompt: Prompt) -> int:
    """The input tokens of a request's ``prompt`` for ``model`` (an estimate that leans
    high without tiktoken; see the module)."""
    t = _Tally()
    if prompt.messages is not None:
        _messages(prompt.messages, t)
    if prompt.system is not None:
        t.messages += 1
        _walk(prompt.system, t, 0)
    tokens = REQUEST_OVERHEAD_TOKENS
    if prompt.tools:
        t.texts.append(_json(prompt.tools))
        if model and _bare(model).startswith("claude"):
            tokens += CLAUDE_TOOLS_PREAMBLE_TOKENS
    enc = _encoding(model)
    if enc is not None:
        text = "\n".join(t.texts)  # one encode for the whole prompt
        tokens += count_text_tokens(text, model)
    else:  # per piece: the sum of ceils, a little higher
        tokens += sum(math.ceil(_utf8_len(s) / CHARS_PER_TOKEN) for s in t.texts)
    return tokens + t.messages * MESSAGE_OVERHEAD_TOKENS + t.non_text * NON_TEXT_PART_TOKENS


# -- the output --------------------------------------------------------------------------------
def model_output_limit(model: str | None) -> int | None:
    """The most output tokens ``model`` can produce, for well-known families (longest
    prefix); ``None`` when unknown."""
    if not model:
        return None
    name = _bare(model)
    best = None
    for prefix in _OUTPUT_LIMITS:
        if name.startswith(prefix) and (best is None or len(prefix) > len(best)):
            best = prefix
    return None if best is None else _OUTPUT_LIMITS[best]


def output_tokens(run: Any, model: str | None, max_tokens: int | None) -> int:
    """The output tokens to hold for a request: its ``max_tokens`` when set, else the run's
    largest reply so far (else :data:`DEFAULT_OUTPUT_TOKENS`) capped by the model's limit."""
    if max_tokens is not None and max_tokens > 0:
        return max_tokens
    seen = getattr(run, "max_output_tokens_seen", 0)  # Run.max_output_tokens_seen
    guess = seen if type(seen) is int and seen > 0 else DEFAULT_OUTPUT_TOKENS
    limit = model_output_limit(model)
    return guess if limit is None else min(guess, limit)
