"""Keyed (HMAC-SHA256) fingerprints of canonical tool calls, results, states and text.

What is hashed is :func:`~guard.policy._canonical.canonicalize`'s text (see that module for
what two equal-meaning arguments share); the native fast paths (``_speedups.c``) canonicalise
and hash the usual arguments without building that text, and the tests hold them to it.
"""

from __future__ import annotations

import hashlib
import importlib
import secrets
from collections.abc import Callable, Iterable
from json.encoder import encode_basestring
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from guard.errors import InvalidInput
from guard.policy._canonical import (
    _canon,
    _canonical,
    _dump,
    _ignore_set,
    _key,
    _norm,
    _string_cached,
    canonicalize,
)

if TYPE_CHECKING:  # pragma: no cover
    from _hashlib import HASH
    from array import array

__all__ = ["Fingerprinter", "hash64", "native_available"]


@runtime_checkable
class Native(Protocol):
    """The native fast paths' module (``_speedups.c``) as the Python code calls it, and the
    one declaration of its types: a hash state is opaque bytes; ``None`` = outside the fast
    case. The pure-Python reference of each function is here, in ``_loops.py`` and in
    ``_kernels.py``."""

    def state(self, data: bytes, base: bytes | None = None, /) -> bytes: ...
    def mac(self, inner: bytes, outer: bytes, payload: str, /) -> str: ...
    def action(
        self, inner: bytes, outer: bytes, args: object, ignore: tuple[bytes, ...], /
    ) -> str | None: ...
    def result(self, inner: bytes, outer: bytes, value: object, /) -> str | None: ...
    def observe(
        self,
        acts: array[int],
        res: array[int],
        slot: int,
        action: str,
        result: str | None,
        need_a: int,
        need_r: int,
        /,
    ) -> bool | None: ...
    def bind(
        self, budget: type, usage: type, loop_detector: type, forecaster: type, ok: object, /
    ) -> None: ...

    # The record kernels (_kernels.py), which the native span applier calls.
    budget_step: Callable[..., object]
    budget_model_call: Callable[..., object]
    budget_tool_calls: Callable[..., object]
    budget_quiet: Callable[..., object]
    loop_observe: Callable[..., object]
    loop_end_step: Callable[..., object]
    forecast_observe: Callable[..., object]


def hash64(hex_digest: str | None) -> int:
    """The first 64 bits of a hex fingerprint as an int (0 for ``None``), for ring buffers.

    Any other non-empty string maps to a stable 64-bit hash of itself (never 0).
    """
    if not hex_digest:
        return 0
    try:
        v = int(hex_digest[:16], 16)
    except ValueError:
        v = -1
    if v >= 0:  # int() also takes a sign ("-1"), which no 64-bit ring slot can hold
        return v or 1
    # Not hex (a foreign or hand-made id from the wire): hash it rather than fail, so the
    # detector still compares equal inputs as equal.
    digest = hashlib.blake2b(hex_digest.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


_BLOCK = 64  # SHA-256 block size in bytes
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))
_DOMAINS = (b"action", b"result", b"state", b"text")
_NOTHING: frozenset[str] = frozenset()
try:  # the builtin implementation: its copy() is a plain struct copy
    from _sha256 import sha256 as _sha256  # type: ignore[import-not-found]  # CPython-private, no stub
except ImportError:  # pragma: no cover - builds without it
    _sha256 = hashlib.sha256
_BUILT: Native | None
try:  # optional native fast paths (_speedups.c); the Python code here is the reference
    _BUILT = cast(Native, importlib.import_module("guard.policy._speedups"))
except ImportError:  # pragma: no cover - installed without a C compiler
    _BUILT = None
_NATIVE: Native | None = _BUILT  # what new fingerprinters and loop detectors use (see use_native)


def native_available() -> bool:
    """Whether fingerprints use the native fast paths (built when a C compiler was present)."""
    return _NATIVE is not None


def native_module() -> Native | None:
    """The native fast paths new fingerprinters and loop detectors take, or None."""
    return _NATIVE


def use_native(on: bool) -> bool:
    """Use the native fast paths (when built) or the pure-Python reference in the
    fingerprinters and loop detectors made from now on; returns the previous setting. For
    benchmarks and ``OTEL_GUARD_PURE_PYTHON=1`` (read by the guard process, not here)."""
    global _NATIVE
    before = _NATIVE is not None
    _NATIVE = _BUILT if on else None
    return before


class Fingerprinter:
    """Keyed fingerprints: HMAC-SHA256 truncated to 128 bits (32 hex chars).

    Keyed per deployment so that a reader of the stored hashes cannot brute-force short
    arguments such as "杭州天气". ``key=None`` draws a random per-process key (fingerprints
    then only compare within the process, which is enough for local loop detection).
    """

    __slots__ = ("_ignore", "_ignore_ascii", "_inner", "_native", "_outer", "_tools")

    def __init__(
        self,
        key: bytes | str | None = None,
        *,
        ignore_fields: Iterable[str] = ("page", "offset", "cursor", "request_id", "timestamp"),
    ) -> None:
        if key is None:
            key = secrets.token_bytes(32)
        if not isinstance(key, str | bytes | bytearray) or not key:
            raise InvalidInput(f"fingerprint key must be non-empty bytes or str, got {type(key)}")
        raw = key.encode() if isinstance(key, str) else bytes(key)
        # HMAC-SHA256 (RFC 2104) with the keyed inner and outer states computed once, and the
        # inner state of each domain already fed its "<domain>\0" prefix: a fingerprint then
        # costs two state copies and two small updates (hmac.HMAC.copy() and the one-shot
        # hmac.digest() are both slower here). Equal to hmac.new(raw, domain + b"\0" + payload,
        # sha256) byte for byte; the tests check it. States are _sha256 objects, or the native
        # module's opaque bytes when it is built (chosen once, per instance).
        if len(raw) > _BLOCK:
            raw = hashlib.sha256(raw).digest()
        raw = raw.ljust(_BLOCK, b"\0")
        self._native = _NATIVE
        inner = self._state(raw.translate(_IPAD))
        self._outer = self._state(raw.translate(_OPAD))
        self._inner: dict[bytes, Any] = {d: self._state(d + b"\x00", inner) for d in _DOMAINS}
        self._ignore = _ignore_set(ignore_fields)
        # The native path compares normalised ASCII keys as bytes (a non-ASCII entry can
        # never equal a normalised ASCII key).
        self._ignore_ascii = tuple(f.encode() for f in self._ignore if f.isascii())
        self._tools: dict[str, Any] = {}

    def _state(self, data: bytes, base: Any = None) -> Any:
        """A hash state that has absorbed ``data`` (after ``base``'s input, when given)."""
        if self._native is not None:
            return self._native.state(data, base)
        h = _sha256() if base is None else base.copy()
        h.update(data)
        return h

    def _hmac(self, inner: Any, payload: str) -> str:
        """The HMAC of ``payload`` (UTF-8) from a keyed inner state, as 32 hex chars."""
        if self._native is not None:
            return self._native.mac(inner, self._outer, payload)
        h = inner.copy()
        h.update(payload.encode())
        o: HASH = self._outer.copy()
        o.update(h.digest())
        return o.hexdigest()[:32]

    def _mac(self, domain: bytes, payload: str) -> str:
        return self._hmac(self._inner[domain], payload)  # domains are the four above

    def action(self, tool: str, args: Any) -> str:
        """Fingerprint of one tool call: tool name plus canonical arguments."""
        inner = self._tools.get(tool)
        if inner is None:
            # The inner state with "action\0<tool>\0" already fed, kept per tool name.
            inner = self._state((_norm(str(tool)) + "\x00").encode(), self._inner[b"action"])
            if len(self._tools) < 1024:  # tool names are few; bound it anyway
                self._tools[tool] = inner
        ignore = self._ignore
        if self._native is not None:  # the usual arguments, canonicalised and hashed natively
            fp = self._native.action(inner, self._outer, args, self._ignore_ascii)
            if fp is not None:
                return fp
        try:
            if type(args) is dict:  # _canon()'s mapping branch, inline (the usual arguments)
                out: dict[str, Any] = {}
                for k, v in args.items():
                    key = _key(k if type(k) is str else str(k))
                    if key in ignore:
                        continue
                    cv = (
                        _string_cached(v) if type(v) is str and len(v) <= 256 else _canon(v, ignore)
                    )
                    if key in out:
                        cv = min(out[key], cv, key=_dump)
                    out[key] = cv
                canon = _dump(out)
            else:
                canon = _dump(_canon(args, ignore))
        except RecursionError:
            canon = _canonical(args, ignore)  # raises the clear InvalidInput
        return self._hmac(inner, canon)

    def result(self, value: Any) -> str:
        """Fingerprint of a tool result (canonical, nothing ignored)."""
        inner = self._inner[b"result"]
        if self._native is not None:  # ints, None, bools and the usual strings
            h = self._native.result(inner, self._outer, value)
            if h is not None:
                return h
        t = type(value)
        if t is int:
            canon = int.__repr__(value)  # what the JSON encoder writes
        elif t is str and len(value) <= 256:  # _canon() of a short string, as JSON
            cv = _string_cached(value)
            canon = _dump(cv) if type(cv) is not str else encode_basestring(cv)
        else:
            try:
                canon = _dump(_canon(value, _NOTHING))
            except RecursionError:
                canon = _canonical(value, _NOTHING)  # raises the clear InvalidInput
        return self._hmac(inner, canon)

    def state(self, facts: Iterable[Any]) -> str:
        """Order-insensitive fingerprint of a fact set (duplicates collapse)."""
        items = sorted({canonicalize(f) for f in facts})
        return self._mac(b"state", "\x1e".join(items))

    def text(self, s: str) -> str:
        """Fingerprint of free text (NFKC, whitespace collapsed, case folded; order kept)."""
        return self._mac(b"text", _norm(s))
