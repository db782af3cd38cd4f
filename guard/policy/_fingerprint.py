"""Canonicalisation of tool arguments and keyed (HMAC-SHA256) fingerprints.

Two calls that mean the same thing must hash the same, so the loop detector sees a repeat even
when the model reshuffles its arguments. :func:`canonicalize` folds, in order:

* mappings: key order, key case and surrounding whitespace; keys named in ``ignore_fields``
  (case-insensitive, at any depth) are dropped, e.g. ``page``/``offset``/``cursor``;
* numbers: ``1``, ``1.0``, ``"1"`` and ``"001"`` are the same value (integers stay exact however
  large); ``True`` stays distinct from ``1``;
* dates: ISO-like date strings (``2026-11-30``, ``2026/11/30``, with or without a time) become
  epoch seconds (naive times are read as UTC);
* strings: Unicode NFKC, case folding, whitespace collapsed;
* *short text* (at most :data:`SHORT_MAX_CHARS` characters and :data:`SHORT_MAX_TOKENS`
  tokens, containing a space or CJK) loses its token order: tokens are split on whitespace and
  punctuation and sorted. Strings without spaces or CJK (identifiers, paths, URLs) keep theirs.
  CJK text has no spaces, so a run of CJK characters is split into single characters and
  those are sorted as well: "天气 杭州", "杭州 天气" and "杭州天气" all canonicalise to the
  same string. The price is that anagrams such as "上海"/"海上" collide too; for a loop
  detector that only matters when the *results* also repeat (the new-information exemption
  protects the rest), and long strings (prose, code) keep their order;
* sequences keep their order (order is usually meaningful); sets are sorted.

The output is compact JSON with sorted keys, so it is stable across processes and versions.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import secrets
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime
from json.encoder import c_make_encoder, encode_basestring
from typing import Any

from guard.errors import InvalidInput

__all__ = [
    "SHORT_MAX_CHARS",
    "SHORT_MAX_TOKENS",
    "Fingerprinter",
    "canonicalize",
    "hash64",
    "native_available",
]

SHORT_MAX_CHARS = 64
SHORT_MAX_TOKENS = 8

_WS = re.compile(r"\s+")
_INT = re.compile(r"[+-]?\d+")
_NUM = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_DATE = re.compile(
    r"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}([ tT]\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?)?(z|[+-]\d{2}:?\d{2})?"
)
# Token splitter for short strings: runs of word characters that are not CJK, or single CJK
# characters (ideographs, kana, hangul syllables).
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN = re.compile(rf"[+-]?\d+(?:\.\d+)?(?![^\W{_CJK}])|[{_CJK}]|[^\W{_CJK}]+")
_HAS_CJK = re.compile(f"[{_CJK}]")
_SPECIAL = {"nan": "nan", "inf": "inf", "+inf": "inf", "-inf": "-inf"}


def _number(x: float) -> int | float | str:
    if isinstance(x, int):
        return int(x)  # exact, however large
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if x.is_integer() and abs(x) < 2**63:
        return int(x)
    return float(x)


def _numeric(s: str) -> int | float | str:
    """A numeric string: integers exactly ("007" -> 7), the rest through float."""
    if _INT.fullmatch(s):
        return int(s)
    return _number(float(s))


def _date(s: str) -> int | float | None:
    if not _DATE.fullmatch(s):
        return None
    text = re.sub(r"^(\d{4})[/.](\d{1,2})[/.](\d{1,2})", r"\1-\2-\3", s)
    text = re.sub(r"^(\d{4})-(\d)(?=-)", r"\1-0\2", text)
    text = re.sub(r"^(\d{4}-\d{2})-(\d)(?!\d)", r"\1-0\2", text)
    text = text.replace("z", "+00:00")
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return _number(dt.timestamp())


def _norm(s: str) -> str:
    """NFKC (skipped for ASCII, which it cannot change), whitespace collapsed, case folded."""
    if s.isascii():
        # Printable ASCII has no whitespace but the space: with no double space there is
        # nothing to collapse, and strip() can only remove spaces (the regex is the slow part).
        if s.isprintable() and "  " not in s:
            return s.strip(" ").casefold()
    else:
        s = unicodedata.normalize("NFKC", s)
    return _WS.sub(" ", s).strip().casefold()


def _maybe_number(s: str) -> bool:
    """Cheap pre-check for ``_NUM.fullmatch`` (whose backtracking is slow on text): a number
    starts with a sign, a dot or a digit (``isdigit`` is a superset of the regex's ``\\d``)
    and, in a normalised string, has no space."""
    c = s[:1]
    return (c in "+-." or c.isdigit()) and " " not in s


def _tokens(s: str) -> list[str]:
    """``_TOKEN.findall(s)``. Fast path: ASCII words of letters and digits separated by single
    spaces, where every word is exactly one token (a number or a word-character run)."""
    if s.isascii() and s.replace(" ", "").isalnum():
        return s.split(" ")
    return _TOKEN.findall(s)


@functools.lru_cache(maxsize=4096)
def _string_cached(s: str) -> Any:
    # Fast path, the usual argument: printable ASCII without double spaces that starts with a
    # letter. _norm() is then strip + casefold; a letter first rules out numbers, "+inf" and
    # dates; "nan" and "inf" canonicalise to themselves; without a space it is not short text.
    # What is left is the short-text rule, as in _string_full().
    if s.isascii() and s.isprintable() and "  " not in s:
        t = s.strip(" ").casefold()
        if t[:1].isalpha():
            if " " not in t:
                return t
            if len(t) <= SHORT_MAX_CHARS and t.count(" ") < SHORT_MAX_TOKENS:
                tokens = t.split(" ") if t.replace(" ", "").isalnum() else _TOKEN.findall(t)
                if tokens:
                    joined = " ".join(sorted(tokens))
                    c = joined[:1]
                    if (c in "+-." or c.isdigit()) and " " not in joined and _NUM.fullmatch(joined):
                        return _numeric(joined)
                    return joined
            return t
    return _string_full(s)


def _string_full(s: str) -> Any:
    s = _norm(s)
    if _maybe_number(s) and _NUM.fullmatch(s):
        return _numeric(s)
    if s in _SPECIAL:
        return _SPECIAL[s]
    if s[:4].isdigit():
        d = _date(s)
        if d is not None:
            return d
    # Only text-like strings (with spaces, or CJK) lose their token order: identifiers, paths,
    # URLs and e-mail addresses ("src/a.py" vs "a/src.py") keep theirs.
    if (
        len(s) <= SHORT_MAX_CHARS
        and s.count(" ") < SHORT_MAX_TOKENS
        and (" " in s or (not s.isascii() and _HAS_CJK.search(s) is not None))
    ):
        tokens = _tokens(s)
        if tokens:
            joined = " ".join(sorted(tokens))
            # "0:" -> "0" must canonicalise like "0", so the output is a fixed point.
            return _numeric(joined) if _maybe_number(joined) and _NUM.fullmatch(joined) else joined
    return s


def _string(s: str) -> Any:
    # Arguments repeat (that is the point of a loop detector): memoise the short ones. The cache
    # is bounded in entries and in the length of what it holds.
    return _string_cached(s) if len(s) <= 256 else _string_cached.__wrapped__(s)


_key = functools.lru_cache(maxsize=1024)(_norm)


def _canon(value: Any, ignore: frozenset[str]) -> Any:
    t = type(value)
    if t is str:
        return _string(value)
    if value is None or t is bool:
        return value
    if t is int or t is float:
        return _number(value)
    if t is dict or isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            key = _key(k if type(k) is str else str(k))
            if key in ignore:
                continue
            # The common case (a short string value) inlined: this runs on every tool call.
            cv = _string_cached(v) if type(v) is str and len(v) <= 256 else _canon(v, ignore)
            if key in out:
                # Keys that differ only in case/whitespace collide: keep one deterministically,
                # so the result does not depend on the mapping's insertion order.
                cv = min(out[key], cv, key=_dump)
            out[key] = cv
        return out
    if t is list or t is tuple:
        return [_canon(v, ignore) for v in value]
    if isinstance(value, str):
        return _string(str(value))
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int | float):
        return _number(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return "bytes:" + bytes(value).hex()
    if is_dataclass(value) and not isinstance(value, type):
        return _canon(asdict(value), ignore)
    if isinstance(value, set | frozenset):
        items = [_canon(v, ignore) for v in value]
        return sorted(items, key=_dump)
    if isinstance(value, Iterable):
        return [_canon(v, ignore) for v in value]
    return _string(str(value))


# One encoder for every call: json.dumps with non-default options builds a new one each time.
_encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_dump = _encoder.encode
if c_make_encoder is not None:
    # JSONEncoder.encode() builds a C encoder (and a circular-reference dict) on every call;
    # build it once. The same C function produces the same text; no circular check is needed
    # because _canon() output is a fresh tree (cyclic input fails earlier, in _canon()).
    _c_encode = c_make_encoder(
        None,
        _encoder.default,
        encode_basestring,
        None,
        _encoder.key_separator,
        _encoder.item_separator,
        True,
        False,
        True,
    )

    def _dump(value: Any, _enc: Any = _c_encode, _join: Any = "".join) -> str:
        return _join(_enc(value, 0))


def _ignore_set(fields: Iterable[str]) -> frozenset[str]:
    return frozenset(_norm(f) for f in fields)


def canonicalize(value: Any, *, ignore_fields: Iterable[str] = ()) -> str:
    """A stable string for ``value`` that equal-meaning arguments share (see module doc)."""
    return _canonical(value, _ignore_set(ignore_fields) if ignore_fields else frozenset())


def _canonical(value: Any, ignore: frozenset[str]) -> str:
    try:
        return _dump(_canon(value, ignore))
    except RecursionError:
        # Self-referencing or absurdly deep arguments: a clear error, not a crash.
        raise InvalidInput("cannot canonicalise: value is cyclic or nested too deeply") from None


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
    from _sha256 import sha256 as _sha256
except ImportError:  # pragma: no cover - builds without it
    _sha256 = hashlib.sha256
try:  # optional native fast paths (_speedups.c); the Python code here is the reference
    from guard.policy import _speedups as _NATIVE
except ImportError:  # pragma: no cover - installed without a C compiler
    _NATIVE = None


def native_available() -> bool:
    """Whether fingerprints use the native fast paths (built when a C compiler was present)."""
    return _NATIVE is not None


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
        o = self._outer.copy()
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
