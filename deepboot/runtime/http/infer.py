"""``POST /v1/<service>/infer``: a request's way from the HTTP connection to its queue
and back, on the router's loop.

In order: the service and the request id are checked; a full queue answers 503 before
the body is read (a full queue costs a client nothing to learn); the body is read
with a queue place held and within the service's ``request_timeout_s``; the request
is queued with the :class:`~deepboot.runtime.http.dispatch.Dispatcher`, which answers
every request by its deadline; a client that goes away while queued withdraws it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web

from deepboot.core.service import valid_name
from deepboot.runtime.http.dispatch import Dispatcher
from deepboot.runtime.http.frontdoor import RID, FrontDoor, Refused, error
from deepboot.runtime.http.routerstate import Answer, Pending, ServiceQueue
from deepboot.runtime.messages import Inbox, Received
from deepboot.runtime.slotally import wait_header

log = logging.getLogger("deepboot.router")


class InferHandler:
    """The inference route, a part the :class:`~deepboot.runtime.http.router.Router`
    builds.

    Args:
        dispatcher: The queues and replicas; it answers every queued request.
        front_door: Reads a bounded JSON body.
        inbox: Where messages to the controller go (every request counts in the load).
    """

    def __init__(self, dispatcher: Dispatcher, front_door: FrontDoor, inbox: Inbox) -> None:
        self.dispatcher, self.front_door, self.inbox = dispatcher, front_door, inbox

    async def handle(self, request: web.Request) -> web.Response:
        """Answer one inference request (aiohttp's handler)."""
        service, rid = request.match_info["service"], request[RID]
        q = self.admit_queue(service)
        full = self.full(q, rid)
        if full is not None:
            return full
        body = await self.read_body(request, q, rid)
        p = self.pending(q, rid, body)
        self.inbox.put(Received(service, time.time()))  # every request counts in the load
        self.dispatcher.enqueue(p)  # from here on, answering the request releases its id
        answer = await self._answer(q, p)
        return web.json_response(answer.body, status=answer.status, headers=answer.headers)

    def admit_queue(self, service: str) -> ServiceQueue:
        """The queue of ``service``.

        Raises:
            Refused: no such service (404).
        """
        q = self.dispatcher.services.get(service) if valid_name(service) else None
        if q is None:
            raise Refused(404, "no such service")
        return q

    def pending(self, q: ServiceQueue, rid: str, body: Any) -> Pending:
        """A request of ``q``'s service arriving now, with its deadlines."""
        now = time.monotonic()
        spec = q.spec
        return Pending(
            rid, spec.name, body, asyncio.get_running_loop().create_future(), now,
            now + spec.request_timeout_s,
            now + spec.request_timeout_s + spec.handler_deadline_s,
        )  # fmt: skip

    def full(self, q: ServiceQueue, rid: str) -> web.Response | None:
        """The full queue's 503 (answered at once, never handed to a replica: over the
        SLO, waited 0), or None when the request may queue.

        Raises:
            Refused: the id is in progress (409).
        """
        service = q.spec.name
        if rid in self.dispatcher.ids:
            raise Refused(409, "a request with this id is in progress")
        spec = q.spec
        if (
            self.dispatcher.free_replica(service) is None
            and len(q.queue) + q.reading >= spec.queue_bound
        ):
            self.dispatcher.count(service, 503, 0.0, 0.0, handed=False)
            retry = str(max(1, round(spec.request_timeout_s / 4)))
            headers = {"Retry-After": retry, "X-Wait-Ms": wait_header(0.0)}
            return error(503, "queue full", rid, **headers)
        return None

    async def read_body(
        self, request: web.Request, q: ServiceQueue, rid: str, raw: bool = False
    ) -> Any:
        """The request's JSON body (``raw``: its bytes, as they came), read with a queue
        place held (so that slow uploads cannot overfill the queue) and within
        ``request_timeout_s``; the id is taken from here until the request is
        answered.

        Raises:
            Refused: the body did not arrive in time (408), or the front door's.
        """
        spec = q.spec
        self.dispatcher.ids.add(rid)
        try:
            q.reading += 1
            try:
                read = self.front_door.read_bytes if raw else self.front_door.read_json
                return await asyncio.wait_for(
                    read(request, spec.max_body_bytes), spec.request_timeout_s
                )
            except TimeoutError:
                reason = f"the body did not arrive within {spec.request_timeout_s:g} s"
                raise Refused(408, reason) from None
            finally:
                q.reading -= 1
        except BaseException:
            self.dispatcher.ids.discard(rid)
            raise

    async def _answer(self, q: ServiceQueue, p: Pending) -> Answer:
        """Wait for ``p``'s answer. The router answers every request by its deadline;
        the extra second is a backstop, never the bound. A client that goes away
        (aiohttp's handler cancellation) withdraws a queued request; one in flight
        runs to its end but is never retried."""
        try:
            return await asyncio.wait_for(
                asyncio.shield(p.future), p.deadline - time.monotonic() + 1.0
            )
        except TimeoutError:
            log.error("request %s: no answer by its deadline (a router bug)", p.id)
            self.dispatcher.drop(q, p, 504, "no answer in time")
            return p.future.result()
        except asyncio.CancelledError:
            if p in q.queue:
                log.info("request %s: the client went away while queued; withdrawn", p.id)
                self.dispatcher.drop(q, p, 499, "the client went away")
            else:
                p.abandoned = True
            raise
