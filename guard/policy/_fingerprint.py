"""Canonicalisation of tool arguments and keyed (HMAC-SHA256) fingerprints.

Two calls that mean the same thing must hash the same, so the loop detector sees a repeat even
when the model reshuffles its arguments. :func:`canonicalize` folds, in order:

* mappings: key order, key case and surrounding whitespace; keys named in ``ignore_fields``
  (case-insensitive, at any depth) are dropped, e.g. ``page``/``offset``/``cursor``;
* numbers: ``1``, ``1.0`` and ``"1"`` are the same value; ``True`` stays distinct from ``1``;
* dates: ISO-like date strings (``2026-11-30``, ``2026/11/30``, with or without a time) become
  epoch seconds (naive times are read as UTC);
* strings: Unicode NFKC, case folding, whitespace collapsed;
* *short* strings (at most :data:`SHORT_MAX_CHARS` characters and :data:`SHORT_MAX_TOKENS`
  tokens) lose their token order: tokens are split on whitespace and punctuation and sorted.
  CJK text has no spaces, so a run of CJK characters is split into single characters and
  those are sorted as well: "天气 杭州", "杭州 天气" and "杭州天气" all canonicalise to the
  same string. The price is that anagrams such as "上海"/"海上" collide too; for a loop
  detector that only matters when the *results* also repeat (the new-information exemption
  protects the rest), and long strings (prose, code) keep their order;
* sequences keep their order (order is usually meaningful); sets are sorted.

The output is compact JSON with sorted keys, so it is stable across processes and versions.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import secrets
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = ["SHORT_MAX_CHARS", "SHORT_MAX_TOKENS", "Fingerprinter", "canonicalize", "hash64"]

SHORT_MAX_CHARS = 64
SHORT_MAX_TOKENS = 8

_WS = re.compile(r"\s+")
_NUM = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_DATE = re.compile(
    r"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}([ tT]\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?)?(z|[+-]\d{2}:?\d{2})?"
)
# Token splitter for short strings: runs of word characters that are not CJK, or single CJK
# characters (ideographs, kana, hangul syllables).
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN = re.compile(rf"[+-]?\d+(?:\.\d+)?(?![^\W{_CJK}])|[{_CJK}]|[^\W{_CJK}]+")
_SPECIAL = {"nan": "nan", "inf": "inf", "+inf": "inf", "-inf": "-inf"}


def _number(x: float) -> int | float | str:
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if float(x).is_integer() and abs(x) < 2**63:
        return int(x)
    return float(x)


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


def _string(s: str) -> Any:
    s = _WS.sub(" ", unicodedata.normalize("NFKC", s)).strip().casefold()
    if _NUM.fullmatch(s):
        return _number(float(s))
    if s in _SPECIAL:
        return _SPECIAL[s]
    d = _date(s)
    if d is not None:
        return d
    if len(s) <= SHORT_MAX_CHARS:
        words = s.split(" ")
        if len(words) <= SHORT_MAX_TOKENS:
            tokens = _TOKEN.findall(s)
            if tokens:
                joined = " ".join(sorted(tokens))
                # "0:" -> "0" must canonicalise like "0", so the output is a fixed point.
                return _number(float(joined)) if _NUM.fullmatch(joined) else joined
    return s


def _canon(value: Any, ignore: frozenset[str]) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return _number(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return "bytes:" + bytes(value).hex()
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            key = _WS.sub(" ", unicodedata.normalize("NFKC", str(k))).strip().casefold()
            if key in ignore:
                continue
            cv = _canon(v, ignore)
            if key in out:
                # Keys that differ only in case/whitespace collide: keep one deterministically,
                # so the result does not depend on the mapping's insertion order.
                cv = min(out[key], cv, key=_dump)
            out[key] = cv
        return out
    if is_dataclass(value) and not isinstance(value, type):
        return _canon(asdict(value), ignore)
    if isinstance(value, set | frozenset):
        items = [_canon(v, ignore) for v in value]
        return sorted(items, key=_dump)
    if isinstance(value, list | tuple) or (
        isinstance(value, Iterable) and not isinstance(value, str | bytes)
    ):
        return [_canon(v, ignore) for v in value]
    return _string(str(value))


def _dump(x: Any) -> str:
    return json.dumps(x, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonicalize(value: Any, *, ignore_fields: Iterable[str] = ()) -> str:
    """A stable string for ``value`` that equal-meaning arguments share (see module doc)."""
    ignore = frozenset(f.strip().casefold() for f in ignore_fields)
    return _dump(_canon(value, ignore))


def hash64(hex_digest: str | None) -> int:
    """The first 64 bits of a hex fingerprint as an int (0 for ``None``), for ring buffers.

    Any other non-empty string maps to a stable 64-bit hash of itself (never 0).
    """
    if not hex_digest:
        return 0
    try:
        return int(hex_digest[:16], 16) or 1
    except ValueError:
        # Not hex (a foreign or hand-made id from the wire): hash it rather than fail, so the
        # detector still compares equal inputs as equal.
        digest = hashlib.blake2b(hex_digest.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") or 1


class Fingerprinter:
    """Keyed fingerprints: HMAC-SHA256 truncated to 128 bits (32 hex chars).

    Keyed per deployment so that a reader of the stored hashes cannot brute-force short
    arguments such as "杭州天气". ``key=None`` draws a random per-process key (fingerprints
    then only compare within the process, which is enough for local loop detection).
    """

    __slots__ = ("_ignore", "_key")

    def __init__(
        self,
        key: bytes | str | None = None,
        *,
        ignore_fields: Iterable[str] = ("page", "offset", "cursor", "request_id", "timestamp"),
    ) -> None:
        if key is None:
            key = secrets.token_bytes(32)
        self._key = key.encode() if isinstance(key, str) else bytes(key)
        self._ignore = tuple(ignore_fields)

    def _mac(self, domain: bytes, payload: str) -> str:
        digest = hmac.new(self._key, domain + b"\x00" + payload.encode(), hashlib.sha256)
        return digest.hexdigest()[:32]

    def action(self, tool: str, args: Any) -> str:
        """Fingerprint of one tool call: tool name plus canonical arguments."""
        name = unicodedata.normalize("NFKC", str(tool)).strip().casefold()
        return self._mac(b"action", name + "\x00" + canonicalize(args, ignore_fields=self._ignore))

    def result(self, value: Any) -> str:
        """Fingerprint of a tool result (canonical, nothing ignored)."""
        return self._mac(b"result", canonicalize(value))

    def state(self, facts: Iterable[Any]) -> str:
        """Order-insensitive fingerprint of a fact set (duplicates collapse)."""
        items = sorted({canonicalize(f) for f in facts})
        return self._mac(b"state", "\x1e".join(items))

    def text(self, s: str) -> str:
        """Fingerprint of free text (NFKC, whitespace collapsed, case folded; order kept)."""
        norm = _WS.sub(" ", unicodedata.normalize("NFKC", s)).strip().casefold()
        return self._mac(b"text", norm)
