"""HTTP/1.1 on an asyncio stream, as ``deepboot load``'s pool
(:mod:`deepboot.runtime.client.provenhttp`) speaks it: a request written
(:func:`write_request`) and its answer read (:func:`read_answer`), with every bound
an answer may not cross. No connection handling, no token policy: the caller says
what goes on which stream.

The contract:

* **A request** is a request line, headers (Host, Content-Length when there is a
  body or the method is neither GET nor HEAD, the caller's, then the token's
  ``Authorization`` when one is given) and the body. The caller's headers must be
  well-formed and not any of those the writer sets (:func:`check_caller_headers`).
* **An answer** is a status line and headers, bounded (:data:`MAX_LINE` bytes a
  line, :data:`MAX_HEADERS` lines, :data:`MAX_HEAD` bytes in all), informational
  (1xx) answers skipped, and a body framed by Content-Length, chunked transfer
  coding, or the connection's close, of at most ``max_body`` bytes. Header names
  come back lower-case, repeated ones joined with ", ".
* **Whether the connection may carry another request**: HTTP/1.1 without
  ``Connection: close`` (or 1.0 with ``keep-alive``), and a body not framed by the
  close.
* Anything else (not HTTP/1.x, over a bound, a 101 switch) is a
  :class:`ProtocolError`; a connection closed before the first byte of an answer is
  a ``ConnectionResetError``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass

MAX_LINE = 8 << 10
"""Most bytes of a status or header line (the CRLF included)."""
MAX_HEADERS = 100
"""Most header lines of an answer."""
MAX_HEAD = 64 << 10
"""Most bytes of an answer's status line and headers together."""

_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: ([^\r\n]*))?\r?\n")
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"[^\r\n\x00]*")


@dataclass(frozen=True, slots=True)
class Response:
    """An answer: its status, headers (lower-case names; repeated ones joined with
    ", ") and body."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes


class ProtocolError(Exception):
    """An answer that is not well-formed HTTP/1.x, or over a bound."""


def check_caller_headers(headers: Mapping[str, str]) -> None:
    """Raise ValueError when one of ``headers`` is one the writer sets (Authorization,
    Host, Content-Length, Transfer-Encoding), has a bad name, or a CR, LF or NUL in
    its value."""
    for name, value in headers.items():
        if name.lower() in ("authorization", "host", "content-length", "transfer-encoding"):
            raise ValueError(f"header {name!r} is the pool's to set")
        if not _TOKEN.fullmatch(name.encode("latin-1", "replace")) or not (
            _HEADER_VALUE.fullmatch(value)
        ):
            raise ValueError(f"header {name!r}: a bad name, or a CR, LF or NUL in its value")


def write_request(
    writer: asyncio.StreamWriter,
    host: str,
    method: str,
    target: str,
    headers: Mapping[str, str],
    body: bytes,
    token: str | None,
) -> None:
    """Write ``method target`` to ``host`` with ``headers`` and ``body``, and the
    token's ``Authorization`` header unless ``token`` is None (not drained)."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body or method not in ("GET", "HEAD"):
        lines.append(f"Content-Length: {len(body)}")
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")
    writer.write(head + body)


async def _readline(reader: asyncio.StreamReader, first: bool = False) -> bytes:
    """One line (LF-terminated, CRLF allowed), at most :data:`MAX_LINE` bytes."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if first and not exc.partial:
            raise ConnectionResetError("the connection closed before an answer") from None
        raise ProtocolError("the connection closed in the middle of an answer") from None
    except asyncio.LimitOverrunError:
        raise ProtocolError(f"a line of the answer is over {MAX_LINE} bytes") from None
    if len(line) > MAX_LINE:
        raise ProtocolError(f"a line of the answer is over {MAX_LINE} bytes")
    return line


async def _read_head(
    reader: asyncio.StreamReader,
) -> tuple[int, int, str, dict[str, str]]:
    """(minor HTTP version, status, reason, headers) of one answer head."""
    first = await _readline(reader, first=True)
    m = _STATUS_LINE.fullmatch(first)
    if m is None:
        raise ProtocolError(f"not an HTTP status line: {first[:40]!r}")
    size = len(first)
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        line = await _readline(reader)
        size += len(line)
        if size > MAX_HEAD:
            raise ProtocolError(f"the answer's head is over {MAX_HEAD} bytes")
        if line in (b"\r\n", b"\n"):
            reason = (m.group(3) or b"").decode("latin-1")
            return int(m.group(1)), int(m.group(2)), reason, headers
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):  # obs-fold and junk included
            raise ProtocolError(f"not an HTTP header line: {line[:40]!r}")
        key = name.decode("ascii").lower()
        text = value.strip(b" \t\r\n").decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    raise ProtocolError(f"the answer has over {MAX_HEADERS} header lines")


async def read_answer(
    reader: asyncio.StreamReader, method: str, max_body: int
) -> tuple[Response, bool]:
    """The answer to a ``method`` request, and whether the connection may carry another."""
    while True:
        minor, status, reason, headers = await _read_head(reader)
        if status == 101:
            raise ProtocolError("the endpoint switched protocols (101)")
        if status >= 200:
            break
        # 1xx: informational, another head follows
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    keep = "close" not in tokens and (minor == 1 or "keep-alive" in tokens)
    if method == "HEAD" or status in (204, 304):
        return Response(status, reason, headers, b""), keep
    coding = headers.get("transfer-encoding")
    if coding is not None:
        if coding.split(",")[-1].strip().lower() == "chunked":
            body = await _read_chunked(reader, max_body)
        else:
            body, keep = await _read_to_close(reader, max_body), False
    elif "content-length" in headers:
        values = {v.strip() for v in headers["content-length"].split(",")}
        if len(values) != 1 or not next(iter(values)).isdigit():
            raise ProtocolError(f"a bad Content-Length: {headers['content-length'][:40]!r}")
        length = int(next(iter(values)))
        if length > max_body:
            raise ProtocolError(f"an answer's body over {max_body} bytes ({length})")
        body = await _read_exactly(reader, length)
    else:
        body, keep = await _read_to_close(reader, max_body), False
    return Response(status, reason, headers, body), keep


async def _read_exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError:
        raise ProtocolError("the connection closed in the middle of an answer") from None


async def _read_chunked(reader: asyncio.StreamReader, max_body: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        line = (await _readline(reader)).split(b";", 1)[0].strip()
        if not line or not all(c in b"0123456789abcdefABCDEF" for c in line) or len(line) > 16:
            raise ProtocolError(f"a bad chunk size: {line[:40]!r}")
        n = int(line, 16)
        if n == 0:
            break
        size += n
        if size > max_body:
            raise ProtocolError(f"an answer's body over {max_body} bytes")
        parts.append(await _read_exactly(reader, n))
        if await _readline(reader) not in (b"\r\n", b"\n"):
            raise ProtocolError("a chunk not followed by CRLF")
    for _ in range(MAX_HEADERS + 1):  # trailers, up to the empty line
        if await _readline(reader) in (b"\r\n", b"\n"):
            return b"".join(parts)
    raise ProtocolError(f"over {MAX_HEADERS} trailer lines")


async def _read_to_close(reader: asyncio.StreamReader, max_body: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while data := await reader.read(64 << 10):
        size += len(data)
        if size > max_body:
            raise ProtocolError(f"an answer's body over {max_body} bytes")
        parts.append(data)
    return b"".join(parts)
