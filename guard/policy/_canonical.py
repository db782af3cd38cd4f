"""Canonicalisation of tool arguments: the text that :mod:`guard.policy._fingerprint` hashes.

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
import json
import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime
from json.encoder import (  # type: ignore[attr-defined]  # the C accelerator, not in typeshed
    c_make_encoder,
    encode_basestring,
)
from typing import Any

from guard.errors import InvalidInput

__all__ = ["SHORT_MAX_CHARS", "SHORT_MAX_TOKENS", "canonicalize"]

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


def _date(s: str) -> int | float | str | None:
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
_dump: Callable[[Any], str] = _encoder.encode
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

    def _c_dump(
        value: Any, _enc: Any = _c_encode, _join: Callable[[Iterable[str]], str] = "".join
    ) -> str:
        return _join(_enc(value, 0))

    _dump = _c_dump


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
