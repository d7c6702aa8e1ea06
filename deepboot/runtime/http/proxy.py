"""``/v1/<service>/<rest>``: a request to a command service, forwarded to one of its
replicas' servers as ``/<rest>`` and its answer passed back as it comes.

So an OpenAI client's base URL is ``http://HOST:PORT/v1/<service>/v1`` and its API
key deepboot's token. In order:

- the front door's checks ran first (the token, on loopback too, for every method;
  the Origin; a POST's ``Content-Type: application/json``);
- the service's queue takes the request as it takes a handler service's (a full
  queue answers 503 at once; the body, at most ``max_body_bytes``, is read with a
  queue place held, within ``request_timeout_s``), and the dispatcher hands it to a
  replica with a free slot (``concurrency`` requests in flight per replica): the
  SLO's wait ends there, as for a handler service;
- the request goes to the replica's server with its method, path, query, body and
  headers, less the hop-by-hop ones (RFC 9110 §7.6.1 and those ``Connection``
  names), ``Host`` and ``Authorization`` (deepboot's token: never passed on);
- the answer's status and headers (less the hop-by-hop ones) go back, and then its
  body chunk by chunk as the server writes it (server-sent events, chunked bodies):
  nothing waits for the whole answer;
- a client that goes away cancels its handler, which closes the connection to the
  server (vLLM and TGI abort a request whose client left); a server that cannot be
  reached before it answers counts as the replica's death (the request is retried
  on another, as a handler service's is); one that fails mid-answer ends the
  answer there;
- the whole exchange is bounded: from arrival, ``request_timeout_s`` in the queue,
  and ``handler_timeout_s`` for the server's answer to end (504 if it has not
  begun; cut if it has).

A handler service's ``POST /v1/<service>/infer`` is :mod:`deepboot.runtime.http.infer`'s,
unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
from aiohttp import web

from deepboot.runtime.http.dispatch import Dispatcher
from deepboot.runtime.http.frontdoor import RID, FrontDoor, Refused
from deepboot.runtime.http.infer import InferHandler
from deepboot.runtime.http.routerstate import Answer, Handoff, Pending, ProxyRequest, Replica
from deepboot.runtime.messages import Inbox, Received
from deepboot.runtime.slotally import wait_header

log = logging.getLogger("deepboot.router")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
"""Headers that describe one connection, never forwarded (RFC 9110 §7.6.1)."""

NOT_FORWARDED = HOP_BY_HOP | {"host", "authorization", "content-length"}
"""Request headers the server never sees: ``Host`` (its own is set), deepboot's
token, and the length (set from the body read)."""

CONNECT_TIMEOUT_S = 5.0
"""Longest wait to connect to a replica's server (loopback: a refusal is at once)."""


def forwarded(headers: Any, drop: frozenset[str]) -> list[tuple[str, str]]:
    """``headers`` without ``drop`` and without those their ``Connection`` names."""
    named = {t.strip().lower() for v in headers.getall("Connection", []) for t in v.split(",")}
    return [(k, v) for k, v in headers.items() if k.lower() not in drop and k.lower() not in named]


class ProxyHandler:
    """The proxy route, a part the :class:`~deepboot.runtime.http.router.Router` builds.

    Args:
        dispatcher: The queues and replicas.
        front_door: Reads a bounded body.
        inbox: Where messages to the controller go.
        infer: A handler service's ``POST /v1/<service>/infer``.
    """

    def __init__(
        self, dispatcher: Dispatcher, front_door: FrontDoor, inbox: Inbox, infer: InferHandler
    ) -> None:
        self.dispatcher, self.front_door, self.inbox, self.infer = (
            dispatcher,
            front_door,
            inbox,
            infer,
        )
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0),
                auto_decompress=False,  # bytes pass through as the server encoded them
                cookie_jar=aiohttp.DummyCookieJar(),  # no client state shared between users
            )
        return self._session

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Any method on ``/v1/{service}/{tail}`` (aiohttp's handler)."""
        service, tail = request.match_info["service"], request.match_info["tail"]
        q = self.infer.admit_queue(service)
        if not q.spec.is_command:
            if tail == "infer" and request.method == "POST":
                return await self.infer.handle(request)
            raise Refused(404, "a handler service answers POST /v1/<service>/infer only")
        rid = request[RID]
        full = self.infer.full(q, rid)
        if full is not None:
            return full
        body = await self.infer.read_body(request, q, rid, raw=True)
        assert isinstance(body, bytes)
        path_qs = "/" + tail + (f"?{request.query_string}" if request.query_string else "")
        headers = forwarded(request.headers, NOT_FORWARDED)
        if not any(k.lower() == "x-request-id" for k, _ in headers):
            headers.append(("X-Request-Id", rid))
        proxy = ProxyRequest(request.method, path_qs, tuple(headers), body)
        loop = asyncio.get_running_loop()
        p = self.infer.pending(q, rid, None)
        p.proxy, p.handoff = proxy, loop.create_future()
        self.inbox.put(Received(service, time.time()))  # every request counts in the load
        self.dispatcher.enqueue(p)  # from here on, answering the request releases its id
        while True:
            turn = await self._turn(p)
            if isinstance(turn, Answer):
                return web.json_response(turn.body, status=turn.status, headers=turn.headers)
            response = await self._forward(request, p, turn.replica)
            if response is not None:
                return response
            # The server could not be reached: retried on another replica (a new
            # hand-off), or answered (502 after too many deaths, 499).

    async def _turn(self, p: Pending) -> Answer | Handoff:
        """Wait for ``p``'s hand-off to a replica, or its answer (the dispatcher
        answers a request still queued by its deadline). A client that goes away
        while queued withdraws it, as :class:`InferHandler` does."""
        assert p.handoff is not None
        handoff = p.handoff
        try:
            either: set[asyncio.Future[Any]] = {p.future, handoff}
            done, _ = await asyncio.wait(
                either,
                timeout=p.deadline - time.monotonic() + 1.0,
                return_when=asyncio.FIRST_COMPLETED,
            )
        except asyncio.CancelledError:
            q = self.dispatcher.services.get(p.service)
            if q is not None and p in q.queue:
                log.info("request %s: the client went away while queued; withdrawn", p.id)
                self.dispatcher.drop(q, p, 499, "the client went away")
            else:
                p.abandoned = True
            raise
        if handoff in done and not p.future.done():
            return handoff.result()
        if p.future.done():
            return p.future.result()
        log.error("request %s: no answer by its deadline (a router bug)", p.id)
        q = self.dispatcher.services[p.service]
        self.dispatcher.drop(q, p, 504, "no answer in time")
        return p.future.result()

    async def _forward(
        self, request: web.Request, p: Pending, rep: Replica
    ) -> web.StreamResponse | None:
        """Forward ``p`` to ``rep``'s server and stream its answer back; None when the
        server could not be reached (the dispatcher retries ``p``)."""
        assert p.proxy is not None and p.handed is not None
        spec = self.dispatcher.services[p.service].spec
        began = time.monotonic()
        deadline = min(p.deadline, began + spec.handler_deadline_s)
        status = 499  # the client went away, unless an answer says otherwise
        extra = {"X-Request-Id": p.id, "X-Wait-Ms": wait_header(p.handed - p.arrived)}
        response: web.StreamResponse | None = None
        retried = False
        try:
            async with asyncio.timeout(deadline - time.monotonic()):
                try:
                    upstream = await self._client().request(
                        p.proxy.method,
                        f"http://{rep.address}{p.proxy.path_qs}",
                        headers=list(p.proxy.headers),
                        data=p.proxy.body or None,
                        allow_redirects=False,
                        timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
                    )
                except (aiohttp.ClientConnectionError, OSError) as exc:
                    retried = True
                    self.dispatcher.proxied_died(p, rep, f"{type(exc).__name__}: {exc}")
                    return None
                async with upstream:
                    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                    for k, v in forwarded(upstream.headers, HOP_BY_HOP):
                        response.headers.add(k, v)
                    response.headers.update(extra)
                    status = upstream.status
                    await response.prepare(request)
                    try:
                        async for chunk in upstream.content.iter_any():
                            await response.write(chunk)  # as it comes: never the whole
                    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
                        log.warning("request %s: %s ended its answer early: %s",
                                    p.id, rep.name, exc)  # fmt: skip
                        status = 502
                        return response  # cut: the client sees a short body
                    await response.write_eof()
                    return response
        except TimeoutError:
            status = 504
            if response is None or not response.prepared:
                reason = f"no answer within {spec.handler_deadline_s:g} s"
                return web.json_response({"error": reason, "id": p.id}, status=504, headers=extra)
            log.warning("request %s: cut at its deadline", p.id)
            return response
        finally:
            if not retried:
                self.dispatcher.proxied_done(p, rep, status, began)
