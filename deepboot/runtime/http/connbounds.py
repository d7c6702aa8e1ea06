"""The endpoint's connections, bounded (issue 42): a header-read and an idle timeout,
a bound on connections open at once, and aiohttp's own errors (a request its parser
refuses) answered in the front door's one-line JSON and logged once per peer per
interval, in one line.

aiohttp has no header-read timeout and no connection bound, and answers its parser's
errors itself (``text/plain``, echoing the input) after logging each with a traceback
at ERROR. Everything here hangs on one subclass of its request handler (the asyncio
protocol of one connection), :class:`BoundedHandler`, which :func:`serve` makes for
each connection with the public constructor arguments of ``web.RequestHandler``
(those ``web.AppRunner`` passes on); it overrides ``handle_error`` and
``log_exception`` (names without an underscore, but not documented) and extends the
asyncio protocol methods. Nothing else of aiohttp's private parts is used;
``tests/runtime/test_http_bounds.py`` fails if aiohttp changes under it.

The bounds (defaults in docs/reliability.md, "The runtime's bounds"):

- header-read: a request's head (its line and headers) must be complete within
  :data:`HEADER_TIMEOUT_S` of the connection's start, or of the first byte of a later
  request on the same connection; else 408 (one JSON line) and the connection closes;
- idle: a kept-alive connection with no request for :data:`IDLE_TIMEOUT_S` is closed
  (aiohttp's ``keepalive_timeout``, which also closes one that sent no complete head
  that long after its start or its previous answer);
- connections: beyond :data:`MAX_CONNECTIONS` open at once, a new one is answered 503
  (one JSON line) and closed at once;
- aiohttp's own limits, stated: a request line or header of at most
  :data:`MAX_LINE_BYTES`, at most :data:`MAX_HEADERS` headers.

Where no JSON answer is possible: a request refused after its answer began (aiohttp
drops the connection), and a connection the client resets before it reads the answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import (
    BadHttpMethod,
    BadStatusLine,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    PayloadEncodingError,
)

from deepboot.runtime.http.frontdoor import error
from deepboot.runtime.logbounds import PeerLimiter

log = logging.getLogger("deepboot.router")

HEADER_TIMEOUT_S = 20.0
"""Seconds for a request's head to arrive (from the connection's start or the
request's first byte)."""
IDLE_TIMEOUT_S = 60.0
"""Seconds a kept-alive connection may wait for its next request."""
MAX_CONNECTIONS = 1024
"""Connections open at once (the controller's file limit is far higher)."""
MAX_LINE_BYTES = 8190
"""Longest request line, and longest header (aiohttp's default, stated)."""
MAX_HEADERS = 128
"""Most headers in one request (aiohttp's default, stated)."""
PEER_LOG_INTERVAL_S = 60.0
"""A peer's refused requests are logged once per this many seconds..."""
PEER_LOG_LINES = 10
"""...and all peers' together in at most this many lines per interval."""

_PRINTABLE = re.compile(r"[\x20-\x7e]{1,100}")


@dataclass
class ConnectionBounds:
    """The bounds of :func:`serve` (the module docstring)."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    idle_timeout_s: float = IDLE_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS


@dataclass
class ConnectionState:
    """What one server's connections share (on its loop only): :func:`new_state`."""

    bounds: ConnectionBounds
    refused: PeerLimiter
    failed: PeerLimiter
    full: PeerLimiter
    open: int = 0
    turned_away: int = 0


def raw_answer(status: int, reason: str) -> bytes:
    """A whole HTTP answer, one JSON line, for a connection no request was read from."""
    body = json.dumps({"error": reason, "id": ""}).encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def parser_reason(exc: BaseException) -> str:
    """One line on what was wrong with a request aiohttp's parser refused, never
    echoing the request (aiohttp's own message quotes it on its later lines)."""
    if isinstance(exc, LineTooLong):
        return f"a request line or header is longer than {MAX_LINE_BYTES} bytes"
    if isinstance(exc, BadHttpMethod):
        return "not an HTTP request (TLS to a plain HTTP endpoint?)"
    if isinstance(exc, BadStatusLine):
        return "a malformed request line"
    if isinstance(exc, InvalidURLError):
        return "a malformed URL"
    if isinstance(exc, InvalidHeader):
        return "a malformed header"
    if isinstance(exc, PayloadEncodingError):
        return "a malformed body (its length or chunks)"
    first = str(getattr(exc, "message", "") or "").split("\n", 1)[0].strip().rstrip(":")
    if _PRINTABLE.fullmatch(first) and "b'" not in first and 'b"' not in first:
        return first  # llhttp's reason, or one of aiohttp's own fixed sentences
    return "a malformed HTTP request"


class BoundedHandler(web.RequestHandler):
    """aiohttp's handler of one connection, with the bounds (the module docstring)."""

    def __init__(
        self,
        manager: web.Server,
        shared: ConnectionState,
        *,
        loop: asyncio.AbstractEventLoop,
        **kw: Any,
    ) -> None:
        super().__init__(manager, loop=loop, **kw)
        self._event_loop = loop
        self._shared = shared
        self._admitted = False
        self._in_request = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._peer = "?"

    # -- the asyncio protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        shared = self._shared
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if shared.open >= shared.bounds.max_connections:
            shared.turned_away += 1
            shared.full.log(
                logging.WARNING,
                "*",
                "%d connections open, the most allowed: new ones are answered 503 and "
                "closed (%d so far)",
                shared.open,
                shared.turned_away,
            )
            reason = f"too many connections ({shared.open} open); try again later"
            assert isinstance(transport, asyncio.Transport)
            transport.write(raw_answer(503, reason))
            transport.close()
            return
        shared.open += 1
        self._admitted = True
        super().connection_made(transport)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._admitted and not self._in_request and self._head_timer is None:
            self._arm_head_timer()  # the first byte of a later request
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._shared.open -= 1
        self._cancel_head_timer()
        super().connection_lost(exc)

    # -- the header-read timeout -------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._head_timer = self._event_loop.call_later(
            self._shared.bounds.header_timeout_s, self._head_timed_out
        )

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_request or self.transport is None:
            return
        timeout = self._shared.bounds.header_timeout_s
        self.transport.write(raw_answer(408, f"no complete request head within {timeout:g} s"))
        self.force_close()

    def request_started(self) -> None:
        """A request's head is complete (:func:`track_requests`)."""
        self._in_request = True
        self._cancel_head_timer()

    def request_ended(self) -> None:
        self._in_request = False

    # -- aiohttp's errors ----------------------------------------------------------------

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer to a request its parser refused (400), or to a handler's
        exception that escaped the front door (500, or 504 on a timeout): one JSON line,
        logged once per peer per interval (a refused request in one line, without
        traceback; a handler's failure with it)."""
        peer = request.remote or self._peer
        if isinstance(exc, HttpProcessingError):
            detail = parser_reason(exc)
            reason = f"bad request: {detail}"
            self._shared.refused.log(
                logging.WARNING,
                peer,
                "a request from %s refused by the HTTP parser (%d): %s",
                peer,
                status,
                detail,
            )
        else:
            reason = (
                "no answer in time"
                if status == 504
                else "internal error (the controller's log has the detail)"
            )
            self._shared.failed.log(
                logging.ERROR, peer, "request from %s failed (%d)", peer, status, exc_info=exc
            )
        if request.writer.output_size > 0:  # as aiohttp: the answer had begun
            raise ConnectionError("the answer had begun; the connection is dropped")
        resp = error(status, reason, "")
        resp.force_close()
        return resp

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp's other errors of a connection (with their traceback), once per peer
        per interval."""
        msg, rest = (str(args[0]), args[1:]) if args else ("aiohttp: an error", ())
        self._shared.failed.log(
            logging.ERROR, self._peer, "aiohttp: " + msg, *rest, exc_info=kw.get("exc_info", True)
        )


@web.middleware
async def track_requests(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The first middleware: a request's head is complete while it runs (the
    header-read timeout stops)."""
    proto = request.protocol
    if isinstance(proto, BoundedHandler):
        proto.request_started()
    try:
        return await handler(request)
    finally:
        if isinstance(proto, BoundedHandler):
            proto.request_ended()


def new_state(bounds: ConnectionBounds) -> ConnectionState:
    """The shared state of one server's connections."""
    return ConnectionState(
        bounds,
        refused=PeerLimiter(log, PEER_LOG_INTERVAL_S, PEER_LOG_LINES),
        failed=PeerLimiter(log, PEER_LOG_INTERVAL_S, PEER_LOG_LINES),
        full=PeerLimiter(log, PEER_LOG_INTERVAL_S, 1),
    )


def handler_kwargs(bounds: ConnectionBounds) -> dict[str, Any]:
    """The public arguments of ``web.RequestHandler`` that :func:`serve` gives."""
    return {
        "keepalive_timeout": bounds.idle_timeout_s,
        "max_line_size": MAX_LINE_BYTES,
        "max_field_size": MAX_LINE_BYTES,
        "max_headers": MAX_HEADERS,
        "access_log": None,
    }


async def serve(
    runner: web.AppRunner, host: str, port: int, bounds: ConnectionBounds
) -> asyncio.Server:
    """Listen on ``host:port`` for ``runner``'s application (set up), each connection
    a :class:`BoundedHandler`. The caller closes the server before
    ``runner.cleanup()`` (which closes the connections)."""
    server = runner.server
    assert server is not None, "runner.setup() first"
    loop = asyncio.get_running_loop()
    shared = new_state(bounds)
    kwargs = handler_kwargs(bounds)

    def connection() -> BoundedHandler:
        return BoundedHandler(server, shared, loop=loop, **kwargs)

    # SO_REUSEADDR (asyncio's default on Unix): a restarted controller takes its old
    # port back despite connections of the killed one in TIME_WAIT.
    return await loop.create_server(connection, host, port, backlog=128)
