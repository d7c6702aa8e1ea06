"""The router's HTTP front door (docs/runtime.md, "Security"): the checks every
request passes before any work, reading a bounded JSON body, and the one-line error
answer.

The checks, in this order (:meth:`FrontDoor.middleware`, the aiohttp middleware):

- Every route that accepts work (the three POSTs) needs ``Authorization: Bearer
  <STATE_DIR/http-token>``, on loopback too (401 otherwise). The reads stay open on
  loopback (``/metrics``, ``GET /v1/services``: nothing in them runs code or reveals
  the token) when the request names a loopback host (a DNS-rebinding page names its
  own); bound elsewhere they need the token too. ``/healthz`` is always open: it says
  only that this endpoint lives and which instance it is, which clients check before
  they send the token anywhere.
- The dashboard's pages (``/dashboard``, :mod:`deepboot.runtime.http.livedashboard`) need
  its session cookie or the token, on loopback too, and refuse a
  ``Sec-Fetch-Site`` that is not ``same-origin`` or ``none``.
- No cross-site requests: a request whose ``Origin`` is not the endpoint's own is
  refused (403), and a POST whose ``Content-Type`` is not ``application/json`` too
  (415): a web page can make a browser send a ``text/plain`` POST to 127.0.0.1
  without a preflight, never an ``application/json`` one.
- Bounded input: a body over its route's limit (64 KiB for jobs and services, the
  service's ``max_body_bytes`` for a request) is refused (413) before it is parsed,
  and a full queue answers 503 before the body is read; JSON deeper than
  :data:`MAX_JSON_DEPTH` is a 400 (:meth:`FrontDoor.read_json`).
- Every error answer is one short JSON line with the request's id (:func:`error`);
  the log keeps the detail (tracebacks, internal paths).

A handler raises :class:`Refused` to refuse a request; the middleware answers it.
:class:`FrontDoor` is a part the :class:`~deepboot.runtime.http.router.Router` builds and
installs; it knows nothing of the router.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import re
import secrets
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web

log = logging.getLogger("deepboot.router")

SPEC_BODY_BYTES = 64 * 2**10
"""Largest body of POST /v1/jobs and POST /v1/services."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in a body."""
MAX_REQUEST_ID = 128
"""Longest X-Request-Id accepted."""

_SAFE_ID = re.compile(r"[\x21-\x7e]{1,128}")
RID = web.RequestKey("rid", str)
"""Where the front door leaves a request's id for its handler."""


class Refused(Exception):
    """An HTTP request refused before any work: its status and one-line reason."""

    def __init__(self, status: int, reason: str, **headers: str) -> None:
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, headers


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and "localhost"."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(host_header: str) -> str:
    """The host part of a Host header ("127.0.0.1:8470", "[::1]:80", "localhost")."""
    if host_header.startswith("["):
        return host_header[1:].partition("]")[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def json_depth(value: Any) -> int:
    """How deeply arrays and objects nest in ``value`` (0 for a scalar); iterative,
    so any depth the parser accepted is measured without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, depth)
        stack.extend((x, depth + 1) for x in item)
    return deepest


class DashboardGate(Protocol):
    """What the front door asks of the dashboard
    (:class:`~deepboot.runtime.http.livedashboard.Dashboard`) about a request."""

    def covers(self, path: str) -> bool:
        """``path`` is one of the dashboard's pages (its cookie opens it)."""
        ...

    def cross_site(self, request: web.Request) -> bool:
        """``request`` came from another site (refused)."""
        ...

    def allowed(self, request: web.Request) -> bool:
        """``request`` carries a live session of the dashboard."""
        ...


class FrontDoor:
    """The front door's checks and body reader (see the module docstring): the
    router's middleware (:meth:`middleware`) and the one body reader its handlers use
    (:meth:`read_json`).

    Args:
        host: Where the endpoint listens.
        port: Its port (0 until it listens: the router sets the one it got).
        token: The bearer token.
        dashboard: The dashboard, whose pages need its session cookie or the token,
            on loopback too, and refuse cross-site requests (None: not served).

    Attributes:
        open_reads: Whether the reads are open without the token (a loopback endpoint).
    """

    def __init__(
        self, host: str, port: int, token: str, dashboard: DashboardGate | None = None
    ) -> None:
        self.host, self.port, self.dashboard = host, port, dashboard
        self._token_bytes = token.encode("utf-8", "surrogateescape")
        self.open_reads = is_loopback(host)

    @property
    def url(self) -> str:
        """The endpoint's URL: its own origin (see :meth:`_origin_ok`)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def _request_id(self, request: web.Request) -> str:
        rid = request.headers.get("X-Request-Id")
        if rid is None:
            return f"req-{secrets.token_hex(8)}"  # never one a client chose before
        if not _SAFE_ID.fullmatch(rid):
            raise Refused(400, f"X-Request-Id: 1-{MAX_REQUEST_ID} printable characters")
        return rid

    def _origin_ok(self, request: web.Request) -> bool:
        origin = request.headers.get("Origin")
        if origin is None:
            return True
        own = {self.url}
        if is_loopback(_host_name(request.host)):  # what a client of this machine names
            own.add(f"http://{request.host}")
        return origin in own

    def _token_ok(self, request: web.Request) -> bool:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        # Header bytes outside ASCII arrive surrogate-escaped: compare bytes, never fail.
        raw = given.strip().encode("utf-8", "surrogateescape")
        return scheme.lower() == "bearer" and hmac.compare_digest(raw, self._token_bytes)

    def _needs_token(self, request: web.Request) -> bool:
        if request.method != "GET":
            return True  # every route that accepts work
        if request.path == "/healthz":
            return False
        if request.path.startswith("/v1/") and request.path != "/v1/services":
            return True  # a service's own routes (the proxy): they run its server's code
        # Reads are open on a loopback endpoint, asked for by a loopback name (a page
        # that rebinds its own DNS name to 127.0.0.1 sends that name).
        return not (self.open_reads and is_loopback(_host_name(request.host)))

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        """Every request passes here before its handler (see the module docstring)."""
        rid = ""
        try:
            rid = request[RID] = self._request_id(request)
            if not self._origin_ok(request):
                raise Refused(
                    403, "cross-origin requests are refused (Origin is not this endpoint)"
                )
            dash = self.dashboard
            if dash is not None and dash.covers(request.path):
                if dash.cross_site(request):
                    raise Refused(403, "cross-site requests are refused (Sec-Fetch-Site)")
                if not (dash.allowed(request) or self._token_ok(request)):
                    raise Refused(
                        401,
                        "log in with the one-time link 'deepboot dashboard' prints, or send "
                        "the bearer token",
                    )
            elif self._needs_token(request) and not self._token_ok(request):
                raise Refused(
                    401,
                    "missing or wrong bearer token (STATE_DIR/http-token)",
                    **{"WWW-Authenticate": 'Bearer realm="deepboot"'},
                )
            if request.method == "POST" and request.content_type != "application/json":
                raise Refused(415, "the body must be sent as Content-Type: application/json")
            response: web.StreamResponse = await handler(request)
            return response
        except Refused as exc:
            return error(exc.status, exc.reason, rid, **exc.headers)
        except web.HTTPException as exc:  # aiohttp's own (404, 405, ...)
            return error(exc.status, exc.reason, rid)
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception:
            log.exception("request %s to %s failed", rid, request.path)
            return error(500, "internal error (the controller's log has the detail)", rid)

    async def read_bytes(self, request: web.Request, limit: int) -> bytes:
        """The body, read only up to ``limit`` bytes.

        Raises:
            Refused: 413 over the limit (by its Content-Length, or once read past it).
        """
        too_big = f"the body is over {limit} bytes"
        if request.content_length is not None and request.content_length > limit:
            raise Refused(413, too_big)
        data = bytearray()
        async for chunk in request.content.iter_chunked(64 * 2**10):
            data += chunk
            if len(data) > limit:
                raise Refused(413, too_big)
        return bytes(data)

    async def read_json(self, request: web.Request, limit: int) -> Any:
        """The body as JSON, read only up to ``limit`` bytes.

        Raises:
            Refused: 413 over the limit (by its Content-Length, or once read past it);
                400 not JSON, or nested deeper than :data:`MAX_JSON_DEPTH`.
        """
        data = await self.read_bytes(request, limit)
        try:
            value = json.loads(bytes(data)) if data else None
        except RecursionError:
            raise Refused(400, f"the body is nested too deeply (> {MAX_JSON_DEPTH})") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise Refused(400, f"the body is not JSON ({str(exc)[:80]})") from None
        if json_depth(value) > MAX_JSON_DEPTH:
            raise Refused(400, f"the body is nested too deeply (> {MAX_JSON_DEPTH})")
        return value


def error(status: int, reason: str, rid: str, **headers: str) -> web.Response:
    """One short JSON line: the reason and the request's id."""
    body: dict[str, Any] = {"error": reason, "id": rid}
    if rid:
        headers["X-Request-Id"] = rid
    return web.json_response(body, status=status, headers=headers)
