"""A minimal HTTP/1.1 client over asyncio streams whose connections carry the bearer
token only once they have proved, each on itself, that their peer holds it
(``deepboot load``; issue 42, finding 2).

Why: a controller can die mid-run, and another process bind its freed port at once.
Proving the endpoint once at the start, or again only after an error, still lets a
later new TCP connection reach that process (with every keep-alive connection idle
when the controller died, no error is ever seen). A TCP connection, though, belongs
to the process that accepted it: one that binds the port later can never own it. So
the token travels only on a connection that has proved itself, and aiohttp cannot be
told to prove each new connection through its public API: hence this client.

The contract (:class:`ProvenPool`):

* **Where.** Each new connection goes where ``locate()`` says *when it opens* (a
  :class:`Target`: a base URL and the instance id it must echo, or None when unknown);
  ``deepboot load`` re-reads STATE_DIR/http.json there, so a restarted controller
  (same token, new instance or port) is followed, after proof.
* **Proof.** With a token, a new connection first carries ``GET
  {prefix}/healthz?challenge=C`` (C: 32 fresh random hex digits; no token,
  keep-alive), and its full answer must be a 200 whose JSON echoes the target's
  instance (when known) and whose ``proof`` is
  :func:`~deepboot.runtime.client.endpointproof.healthz_proof` of the token and C. Only then do
  requests go on it, each with ``Authorization: Bearer <token>``, which only the pool
  adds: a caller cannot put the token on a request. An answer that is not that
  (another instance, a wrong or missing proof, not HTTP, not JSON, another status)
  raises :class:`ProofFailed`, and nothing more is sent on that connection. A
  connection refused or reset, closed before answering, or silent is no proof either
  way: its OSError (or TimeoutError) is raised, as for any request.
* **Reuse.** A connection is kept for the next request while its answers allow
  (HTTP/1.1 without ``Connection: close``, a body framed by Content-Length or
  chunked); one that closes, errs, times out or answers out of turn is closed and
  never reopened silently: the next request opens (and proves) a fresh one. At most
  ``limit`` connections are open at once; a request beyond waits for one.
* **Requests and answers** are HTTP/1.1 as :mod:`deepboot.runtime.client.http1wire`
  writes and reads them (its bounds, :data:`MAX_LINE`, :data:`MAX_HEADERS` and
  :data:`MAX_HEAD`, and its :class:`Response` and :class:`ProtocolError` are
  importable from here too), an answer's body of at most ``max_body`` bytes.
  Each request is bounded by its timeout as a whole: waiting for a connection,
  connecting, proving, sending and reading.
* **Without a token** nothing can be proved and no token is sent: connections are
  used unproven (``deepboot load --url`` without ``--token-file``).
* **No proxy, no redirect** (a 3xx is an answer like any other), no TLS unless the
  URL says ``https`` (then the system's default verification).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import ssl
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from deepboot.core.errors import DeepbootError
from deepboot.runtime.client.endpointproof import EndpointError, proof_failure, refused_error
from deepboot.runtime.client.http1wire import (
    MAX_HEAD,
    MAX_HEADERS,
    MAX_LINE,
    ProtocolError,
    Response,
    check_caller_headers,
    read_answer,
    write_request,
)

__all__ = [
    "MAX_BODY",
    "MAX_HEAD",
    "MAX_HEADERS",
    "MAX_LINE",
    "MAX_PROOF_BODY",
    "NoEndpoint",
    "ProofFailed",
    "ProtocolError",
    "ProvenPool",
    "Response",
    "Target",
]

MAX_BODY = 16 << 20
"""Most bytes of an answer's body (``ProvenPool``'s default)."""
MAX_PROOF_BODY = 1 << 20
"""Most bytes of the answer to ``GET /healthz``."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where a new connection goes.

    Attributes:
        url: The endpoint's base URL, ``http(s)://HOST[:PORT][/PREFIX]``.
        instance: The instance id its ``/healthz`` must echo; None: not checked.
        source: Where the URL came from, for error messages ("http.json", "--url").
    """

    url: str
    instance: str | None = None
    source: str = "http.json"


class NoEndpoint(ConnectionError):
    """``locate()`` found no endpoint to connect to (e.g. no http.json)."""


class ProofFailed(EndpointError):
    """A new connection's peer answered ``GET /healthz?challenge=C`` without proving
    that it holds the token (nothing else was sent on that connection).

    Attributes:
        url: The target's URL.
        reason: What it answered, in words.
    """

    def __init__(self, url: str, reason: str, source: str = "http.json") -> None:
        what = f"{reason} when a new connection opened"
        outcome = "the bearer token was not sent on that connection"
        super().__init__(str(refused_error(url, what, source, outcome)))
        self.url = url
        self.reason = reason


class _Conn:
    """One connection: its streams, and whether it proved itself."""

    __slots__ = ("reader", "writer", "host", "prefix", "proven")

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, prefix: str
    ) -> None:
        self.reader, self.writer = reader, writer
        self.host, self.prefix = host, prefix
        self.proven = False

    def open_and_idle(self) -> bool:
        """Neither closed by either side nor errored (an idle connection's peer that
        closed it shows as end of file)."""
        return (
            not self.writer.is_closing()
            and not self.reader.at_eof()
            and self.reader.exception() is None
        )

    def close(self) -> None:
        self.writer.close()


class ProvenPool:
    """Connections to ``locate()``'s target, each proved before it carries the token
    (see the module doc).

    Args:
        locate: Where a new connection goes (called as each opens); may raise a
            :class:`~deepboot.core.errors.DeepbootError` (no endpoint: the request
            fails with :class:`NoEndpoint`).
        token: The bearer token, or None (then nothing is proved, no token sent).
        limit: Most connections open at once.
        max_body: Most bytes of an answer's body.
    """

    def __init__(
        self,
        locate: Callable[[], Target],
        token: str | None,
        limit: int,
        max_body: int = MAX_BODY,
    ) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self._locate = locate
        self._token = token
        self._limit = limit
        self._max_body = max_body
        self._idle: list[_Conn] = []
        self._open = 0  # connections open or opening, idle included
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False
        self.opened = 0
        """Connections opened so far (each proved, with a token)."""

    @property
    def proves(self) -> bool:
        """Whether connections prove themselves (there is a token)."""
        return self._token is not None

    async def request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        timeout: float,
    ) -> Response:
        """Send ``method path`` (``path``: from the target's prefix on, e.g.
        ``/v1/svc/infer``) on a proven connection and read the answer, all within
        ``timeout`` seconds.

        Raises:
            ProofFailed: a new connection's peer did not prove it holds the token.
            TimeoutError: no answer within ``timeout``.
            NoEndpoint, OSError: no connection (refused, reset, closed before or
                while answering; no endpoint recorded).
            ProtocolError: an answer that is not HTTP, or over a bound.
            ValueError: a header carries the token, or a CR or LF.
        """
        check_caller_headers(headers)
        async with asyncio.timeout(timeout):
            conn = await self._acquire()
            reusable = False
            try:
                if conn is None:
                    conn = await self._connect()
                answer, reusable = await self._exchange(conn, method, path, headers, body)
                return answer
            finally:
                self._release(conn, reusable)

    async def close(self) -> None:
        """Close every idle connection; busy ones close as their requests end."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            self._open -= 1
            conn.close()
        for conn in idle:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.writer.wait_closed(), 1.0)

    # -- the pool ----------------------------------------------------------------------

    async def _acquire(self) -> _Conn | None:
        """An idle connection that is still open, or None: a slot to open a new one."""
        while True:
            while self._idle:
                conn = self._idle.pop()  # the most recent: the likeliest still open
                if conn.open_and_idle():
                    return conn
                self._open -= 1
                conn.close()
            if self._open < self._limit:
                self._open += 1
                return None
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # it was this one's turn: pass it on
                raise
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def _release(self, conn: _Conn | None, reusable: bool) -> None:
        if conn is not None and reusable and not self._closed and conn.open_and_idle():
            self._idle.append(conn)
        else:
            self._open -= 1
            if conn is not None:
                conn.close()
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    # -- one connection ------------------------------------------------------------------

    async def _connect(self) -> _Conn:
        """A new connection to where ``locate()`` says now, proved when there is a token."""
        try:
            target = self._locate()
        except DeepbootError as exc:
            raise NoEndpoint(" ".join(str(exc).split())) from None
        parts = urlsplit(target.url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        context = ssl.create_default_context() if parts.scheme == "https" else None
        reader, writer = await asyncio.open_connection(
            host, port, ssl=context, limit=MAX_HEAD, server_hostname=host if context else None
        )
        conn = _Conn(reader, writer, parts.netloc.rpartition("@")[2], parts.path.rstrip("/"))
        self.opened += 1
        if self._token is None:
            return conn
        try:
            await self._prove(conn, target, self._token)
        except BaseException:
            conn.close()
            raise
        return conn

    async def _prove(self, conn: _Conn, target: Target, token: str) -> None:
        challenge = secrets.token_hex(16)
        target_path = f"{conn.prefix}/healthz?challenge={challenge}"
        write_request(conn.writer, conn.host, "GET", target_path, {}, b"", None)
        await conn.writer.drain()
        try:
            answer, keep = await read_answer(conn.reader, "GET", MAX_PROOF_BODY)
        except ProtocolError as exc:
            raise ProofFailed(
                target.url, f"does not answer HTTP ({_one_line(str(exc))})", target.source
            ) from None
        why = proof_failure(
            answer.status, answer.body, token, challenge, target.instance, target.source
        )
        if why:
            raise ProofFailed(target.url, why, target.source)
        if not keep:
            raise ConnectionResetError(
                "the endpoint closed the connection on which it proved itself (one that "
                "closes each connection after one answer is never sent the token)"
            )
        conn.proven = True

    async def _exchange(
        self, conn: _Conn, method: str, path: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[Response, bool]:
        """Send one request on ``conn`` and read its answer: (it, whether ``conn`` may
        carry another)."""
        # The one place the token is put on a request: a proven connection's.
        token = self._token if conn.proven else None
        write_request(conn.writer, conn.host, method, conn.prefix + path, headers, body, token)
        await conn.writer.drain()
        return await read_answer(conn.reader, method, self._max_body)


def _one_line(text: str) -> str:
    return " ".join(text.split())
