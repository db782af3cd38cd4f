"""HTTP/1.1 message framing of one OTLP/HTTP connection, tracked ahead of aiohttp's parser.

The parser hands a chunked body over as it arrives and does not say what a chunk announced:
a chunk of 2^63 bytes would be waited for until the body timeout, and 100k one-byte chunks
would each cost a wake-up. :class:`Framing` sees every byte before the parser does, follows
request heads (``Content-Length``, ``Transfer-Encoding``) and chunk-size lines, and names the
first chunk beyond the limits (chunk count, announced bytes over ``max_body_bytes``) or a
malformed chunk-size line, with the offset in the data where the parser must stop.

It tracks framing only; the parser stays the judge of everything else (a request it refuses
ends the connection, so whatever the tracker believes afterwards does not matter).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Framing", "Verdict"]

_MAX_LINE = 8192 + 2  # a chunk-size or trailer line (the parser's field bound, plus CRLF)
_HEX = frozenset(b"0123456789abcdefABCDEF")

_HEAD, _BODY, _SIZE, _DATA, _DATA_END, _TRAILER, _OFF = range(7)

Verdict = tuple[int, int, str]  # (bytes of this data the parser may have, HTTP status, reason)


class Framing:
    """The framing state of one connection. ``limits()`` gives (max_body_bytes, max_chunks),
    read at each chunk so that a change applies at once."""

    __slots__ = ("_chunks", "_cl", "_left", "_limits", "_line", "_state", "_te", "_total")

    def __init__(self, limits: Callable[[], tuple[int, int]]) -> None:
        self._limits = limits
        self._state = _HEAD
        self._line = b""  # the partial line of the current state
        self._left = 0  # bytes of the current body (Content-Length) or chunk still to come
        self._chunks = self._total = 0
        self._te: bytes | None = None
        self._cl: bytes | None = None

    def feed(self, data: bytes) -> Verdict | None:
        """Follow ``data``; ``None`` if all of it may go to the parser, else a verdict."""
        i, n = 0, len(data)
        while i < n:
            state = self._state
            if state == _OFF:
                return None
            if state in (_BODY, _DATA):
                step = min(self._left, n - i)
                i += step
                self._left -= step
                if not self._left:
                    self._state = _HEAD if state == _BODY else _DATA_END
                continue
            j = data.find(b"\n", i)
            if j < 0:
                self._line += data[i:]
                if len(self._line) > _MAX_LINE:
                    if state in (_HEAD, _TRAILER):
                        self._state = _OFF  # the parser's own line bounds refuse it
                        return None
                    return (i, 400, "chunked body: chunk-size line too long")
                return None
            start, line = i, self._line + data[i:j]
            self._line = b""
            i = j + 1
            verdict = self._line_done(line.rstrip(b"\r"), start)
            if verdict is not None:
                return verdict
        return None

    def _line_done(self, line: bytes, start: int) -> Verdict | None:
        state = self._state
        if state == _HEAD:
            self._head_line(line)
        elif state == _SIZE:
            return self._size_line(line, start)
        elif state == _DATA_END:
            if line:
                return (start, 400, "chunked body: chunk data not followed by CRLF")
            self._state = _SIZE
        elif state == _TRAILER and not line:
            self._state = _HEAD
        return None

    def _head_line(self, line: bytes) -> None:
        if self._te is None:  # no request line yet: blank lines before one are allowed
            if line:
                self._te = self._cl = b""  # the request line: a head has begun
            return
        if not line:
            self._body_starts()
            return
        name, sep, value = line.partition(b":")
        if not sep:
            return
        name = name.strip().lower()
        if name == b"transfer-encoding":
            self._te = self._te + b"," + value.strip() if self._te else value.strip()
        elif name == b"content-length":
            self._cl = value.strip()

    def _body_starts(self) -> None:
        te, cl = self._te or b"", self._cl or b""
        self._te = self._cl = None
        self._chunks = self._total = 0
        if te:
            last = te.rsplit(b",", 1)[-1].strip().lower()
            self._state = _SIZE if last == b"chunked" else _OFF  # the parser refuses others
        elif cl:
            if not cl.isdigit():
                self._state = _OFF
                return
            self._left = int(cl)
            self._state = _BODY if self._left else _HEAD
        else:
            self._state = _HEAD

    def _size_line(self, line: bytes, start: int) -> Verdict | None:
        digits = line.split(b";", 1)[0].strip(b" \t")
        if not digits or not _HEX.issuperset(digits):
            return (start, 400, f"chunked body: bad chunk-size line {line[:40]!r}")
        size = int(digits, 16)
        if not size:
            self._state = _TRAILER
            return None
        max_body, max_chunks = self._limits()
        self._chunks += 1
        self._total += size
        if self._chunks > max_chunks:
            return (start, 413, f"chunked body of more than {max_chunks} chunks")
        if self._total > max_body:
            return (
                start,
                413,
                f"chunked body announces {self._total} bytes, over max_body_bytes {max_body}",
            )
        self._left = size
        self._state = _DATA
        return None
