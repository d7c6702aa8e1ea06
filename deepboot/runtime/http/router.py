"""The router: the controller's HTTP endpoint, and the requests waiting for replicas.

It runs in the controller process, in its own thread with its own asyncio loop
(aiohttp: an asyncio HTTP server and client in one well-kept library, already a
dependency of ``ray[default]``, so the runtime adds nothing to install).

Endpoints (all on ``--http-host``, 127.0.0.1 by default)::

    POST /v1/<service>/infer   a request to a handler service (JSON body; header
                               X-Request-Id, else one is made); every answer once queued,
                               and a full queue's 503, carries X-Wait-Ms: its wait
                               (:mod:`deepboot.runtime.slotally`)
    ANY  /v1/<service>/<rest>  a request to a command service, forwarded to a replica's
                               server as /<rest>, its answer streamed back
                               (:mod:`deepboot.runtime.http.proxy`)
    POST /v1/services          register a service (JSON ServiceSpec)
    POST /v1/jobs              submit a training job (JSON JobSpec, absolute entry)
    GET  /v1/services          services, their replicas, queues and back-offs (JSON)
    GET  /metrics              Prometheus metrics
    GET  /healthz              liveness, and the endpoint's instance id (http.json's)

Its parts, each in a module of its own:

- :mod:`deepboot.runtime.http.frontdoor`: the checks every HTTP request passes before any
  work (the bearer token, the origin, the content type, bounded input) and the
  one-line error answers (docs/runtime.md, "Security");
- :mod:`deepboot.runtime.http.dispatch`: on the router's loop, the per-service queues,
  the replicas' slots, the crash-loop back-offs, the bound on every wait, and the
  answer to every request; their records are :mod:`deepboot.runtime.http.routerstate`'s;
- :mod:`deepboot.runtime.http.connbounds`: the connections' bounds (header-read and idle
  timeouts, connections open at once) and aiohttp's own errors (a request its parser
  refuses) as one JSON line, logged once per peer per interval;
- :mod:`deepboot.runtime.http.infer`: a request's way from its connection to its
  queue and back (admission, the bounded body, the wait for its answer);
- here, :class:`Router`: its life cycle (the thread, the loop, ``http.json``), what
  the controller tells it, and the HTTP handlers.

Threads: the controller calls the public methods (``start_replica`` ...) from its own
thread; they only schedule work on the router's loop. The router tells the
controller what happened through an :class:`Inbox` of messages.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from deepboot.core.errors import ConfigError, InputError
from deepboot.core.service import ServiceSpec
from deepboot.runtime.client.endpoint import CHALLENGE_RE, healthz_proof
from deepboot.runtime.http.connbounds import (
    HEADER_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    MAX_CONNECTIONS,
    ConnectionBounds,
    serve,
    track_requests,
)
from deepboot.runtime.http.dispatch import Dispatcher
from deepboot.runtime.http.frontdoor import SPEC_BODY_BYTES, FrontDoor, Refused
from deepboot.runtime.http.infer import InferHandler
from deepboot.runtime.http.proxy import ProxyHandler
from deepboot.runtime.http.routerstate import Replica, ServiceQueue
from deepboot.runtime.messages import Inbox
from deepboot.runtime.prometheus_metrics import Metrics

if TYPE_CHECKING:
    from deepboot.runtime.http.livedashboard import Dashboard
    from deepboot.runtime.store.statedir import StateDir

log = logging.getLogger("deepboot.router")

DRAIN_S = 10.0
"""How long :meth:`Router.stop` lets the handlers still running answer before it
cancels them (aiohttp's own default, 60 s, outlasted the stop's wait)."""
STOP_SLACK_S = 5.0
"""What :meth:`Router.stop` waits for its thread beyond the drain."""


class Router:
    """See the module docstring.

    Args:
        inbox: Where messages to the controller go.
        metrics: The controller's metrics (request counters, histograms, queues).
        host: Address to bind (127.0.0.1 by default).
        port: Port (0: any free one).
        token: The bearer token every route that accepts work requires (and, off
            loopback, every route but ``/healthz``).
        submit: Called (in a worker thread) with a JSON job spec; raises
            ConfigError/InputError for a bad one.
        register: Called with a JSON service spec, likewise.
        instance: The id ``/healthz`` echoes (random when empty).
        stall_s: ``/healthz`` answers 503 once the controller's loop has not beaten
            (:meth:`beat`) for this many seconds.
        state: The controller's state directory: the dashboard
            (:mod:`deepboot.runtime.http.livedashboard`) is served when given.
        header_timeout_s: Seconds a connection has to send a request's head, from its
            start or the request's first byte (:mod:`deepboot.runtime.http.connbounds`).
        idle_timeout_s: Seconds a kept-alive connection may wait for its next request.
        max_connections: Connections open at once; more are answered 503 and closed.

    Raises:
        ConfigError: no token.
    """

    def __init__(
        self,
        inbox: Inbox,
        metrics: Metrics,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str = "",
        submit: Callable[[dict[str, Any]], str] | None = None,
        register: Callable[[dict[str, Any]], str] | None = None,
        instance: str = "",
        stall_s: float = 120.0,
        state: StateDir | None = None,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        drain_s: float = DRAIN_S,
    ) -> None:
        if not token:
            raise ConfigError("the HTTP endpoint needs a bearer token")
        self.inbox = inbox
        self.metrics = metrics
        self.host, self.port = host, port
        self.token = token
        self.instance = instance or secrets.token_hex(16)
        self._submit, self._register = submit, register
        self.dispatcher = Dispatcher(inbox, metrics)
        self.drain_s = drain_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self.bounds = ConnectionBounds(header_timeout_s, idle_timeout_s, max_connections)
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self.stall_s = stall_s
        self._beat = time.monotonic()
        self.dashboard: Dashboard | None = None
        if state is not None:
            from deepboot.runtime.http.livedashboard import Dashboard

            self.dashboard = Dashboard(state, port, self._live)
        self.front_door = FrontDoor(host, port, token, self.dashboard)
        self.infer = InferHandler(self.dispatcher, self.front_door, inbox)
        self.proxy = ProxyHandler(self.dispatcher, self.front_door, inbox, self.infer)

    @property
    def url(self) -> str:
        """The endpoint's URL (its own origin)."""
        return self.front_door.url

    @property
    def services(self) -> dict[str, ServiceQueue]:
        """Each registered service's queue and back-off (the dispatcher's)."""
        return self.dispatcher.services

    @property
    def replicas(self) -> dict[str, Replica]:
        """The live replicas, by GPU (the dispatcher's)."""
        return self.dispatcher.replicas

    def beat(self) -> None:
        """The controller's loop completed a turn (``/healthz`` reports its age)."""
        self._beat = time.monotonic()

    # -- life cycle (controller thread) ----------------------------------------------------

    def start(self) -> None:
        """Serve in a background thread; returns once listening (``self.port`` is set)."""
        self._thread = threading.Thread(target=self._serve, name="deepboot-router", daemon=True)
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            raise self._error
        if not self._started.is_set():
            raise RuntimeError("the HTTP endpoint did not start within 30 s")

    def write_address(self, path: Path) -> None:
        """Record where the endpoint listens (``http.json``, mode 0600) for the CLI and
        clients: ``url``, ``host``, ``port``, ``auth`` (always true), ``instance``
        (what ``/healthz`` echoes: a client checks it before sending the token), ``pid``."""
        tmp = path.with_suffix(".tmp")
        info = {
            "url": self.url,
            "host": self.host,
            "port": self.port,
            "auth": True,
            "instance": self.instance,
            "pid": os.getpid(),
        }
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(info, indent=2))
        os.replace(tmp, path)

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def _down() -> None:
            if self._listener is not None:
                self._listener.close()  # no new connections; cleanup closes the rest
            if self._runner is not None:
                await self._runner.cleanup()
            await self.proxy.close()
            # Whatever still runs past the drain (a handler aiohttp cancelled, a
            # replica's call) ends here, not destroyed pending when the loop closes.
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            if rest:
                await asyncio.wait(rest, timeout=STOP_SLACK_S / 2)
            loop.stop()

        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(_down()))
        if self._thread is not None:
            # The handlers still running get drain_s to answer, then are cancelled.
            self._thread.join(self.drain_s + STOP_SLACK_S)

    def _serve(self) -> None:
        loop = self._loop = self.dispatcher.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._listen())
        except BaseException as exc:  # the caller re-raises it
            self._error = exc
            self._started.set()
            return
        self._started.set()
        loop.run_forever()
        loop.close()

    async def _listen(self) -> None:
        # client_max_size bounds aiohttp's own readers; each route reads its body
        # through the front door's read_json with its own, smaller, limit.
        # track_requests comes first: a request that reaches it has its head (the
        # header-read timeout stops).
        app = web.Application(
            middlewares=[track_requests, self.front_door.middleware], client_max_size=2**20
        )
        app.router.add_get("/v1/services", self._list_services)
        app.router.add_post("/v1/services", self._post_service)
        app.router.add_post("/v1/jobs", self._post_job)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._health)
        if self.dashboard is not None:
            self.dashboard.add_routes(app)
        # Last: a service's routes, after every route of the endpoint's own (a handler
        # service's POST .../infer, or anything, forwarded, to a command service's).
        app.router.add_route("*", "/v1/{service}/{tail:.*}", self.proxy.handle)
        # handler_cancellation: a client that disconnects cancels its handler, so a
        # request still queued is withdrawn (aiohttp's default lets it run on).
        self._runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,
            shutdown_timeout=self.drain_s,
        )
        await self._runner.setup()
        # The connections' bounds, and aiohttp's own errors as one JSON line
        # (deepboot.runtime.http.connbounds).
        self._listener = await serve(self._runner, self.host, self.port, self.bounds)
        self.port = self.front_door.port = self._listener.sockets[0].getsockname()[1]
        if self.dashboard is not None:
            self.dashboard.port = self.port  # names its cookie

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the router's loop (from any thread)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn, *args)

    # -- what the controller tells the router (scheduled with :meth:`call`) -----------------

    def set_services(
        self, specs: Mapping[str, ServiceSpec], cold: Mapping[str, float] | None = None
    ) -> None:
        """The registered services (and the cold starts measured so far, seconds)."""
        self.call(self.dispatcher.set_services, dict(specs), dict(cold or {}))

    def restore_backoff(self, service: str, failures: int, seconds_left: float) -> None:
        """A restarted controller's record of ``service``'s crash-loop back-off (after
        :meth:`set_services`): ``failures`` in a row, ``seconds_left`` of it to run."""
        self.call(self.dispatcher.restore_backoff, service, failures, seconds_left)

    def start_replica(
        self, gpu: str, service: str, name: str, handle: Any, cold: bool, task: str = ""
    ) -> None:
        """The controller placed arrival ``task`` of ``service`` on ``gpu``: a new replica
        (``cold``; ``handle`` is its new actor) or a warm reuse of the one there. A new
        replica with no ``task`` is pre-warmed (``WarmReplica``): the service's
        requests queue on it while it loads, as on any replica starting."""
        self.call(self.dispatcher.start_replica, gpu, service, name, handle, cold, task)

    def adopt_replica(self, gpu: str, service: str, name: str, handle: Any) -> None:
        """A live replica a restarted controller kept (idle: PROTECT or SLEEP)."""
        self.call(self.dispatcher.adopt_replica, gpu, service, name, handle)

    def stop_replica(self, gpu: str) -> None:
        """The replica on ``gpu`` is evicted (the controller kills its actor)."""
        self.call(self.dispatcher.stop_replica, gpu)

    # -- HTTP handlers ---------------------------------------------------------------------------

    def _live(self) -> dict[str, dict[str, int]]:
        """Each service's requests queued and in flight now (on the loop)."""
        inflight: dict[str, int] = {}
        for r in self.replicas.values():
            if not r.dead:
                inflight[r.service] = inflight.get(r.service, 0) + r.inflight
        return {
            name: {"queued": len(q.queue), "in_flight": inflight.get(name, 0)}
            for name, q in self.services.items()
        }

    async def _list_services(self, request: web.Request) -> web.Response:
        out = []
        now = time.monotonic()
        for name, q in sorted(self.services.items()):
            reps = [
                {
                    "gpu": r.gpu,
                    "replica": r.name,
                    "ready": r.ready,
                    "active": r.active,
                    "inflight": r.inflight,
                }
                for r in self.replicas.values()
                if r.service == name and not r.dead
            ]
            out.append(
                {
                    "service": name,
                    "queued": len(q.queue),
                    "replicas": reps,
                    "load_failures": q.load_failures,
                    "backoff_s": round(max(q.backoff_until - now, 0.0), 3),
                }
            )
        return web.json_response(out)

    async def _post(
        self, request: web.Request, fn: Callable[[dict[str, Any]], str] | None
    ) -> web.Response:
        if fn is None:
            raise Refused(404, "not available")
        raw = await self.front_door.read_json(request, SPEC_BODY_BYTES)
        if not isinstance(raw, dict):
            raise Refused(400, "the body must be a JSON object")
        try:
            name = await asyncio.get_running_loop().run_in_executor(None, fn, raw)
        except (ValueError, TypeError, KeyError, ConfigError, InputError) as exc:
            # A spec's error names the key and what to fix; one line of it.
            raise Refused(400, str(exc).strip().splitlines()[0][:300]) from None
        return web.json_response({"name": name}, status=201)

    async def _post_job(self, request: web.Request) -> web.Response:
        return await self._post(request, self._submit)

    async def _post_service(self, request: web.Request) -> web.Response:
        return await self._post(request, self._register)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.exposition(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def _health(self, request: web.Request) -> web.Response:
        """Liveness (503 once the controller's loop stalls: no turn for ``stall_s``)
        and the instance id; with ``?challenge=C`` (hex) also the proof that this
        endpoint holds the token (:func:`~deepboot.runtime.client.endpoint.healthz_proof`)."""
        age = time.monotonic() - self._beat
        ok = age <= self.stall_s
        answer: dict[str, Any] = {"ok": ok, "instance": self.instance, "loop_age_s": round(age, 3)}
        if not ok:
            answer["error"] = f"the controller's loop has not turned for {age:.0f} s"
        challenge = request.query.get("challenge")
        if challenge is not None:
            if not CHALLENGE_RE.fullmatch(challenge):
                raise Refused(400, "challenge: 32-128 lowercase hex digits")
            answer["proof"] = healthz_proof(self.token, challenge)
        return web.json_response(answer, status=200 if ok else 503)
