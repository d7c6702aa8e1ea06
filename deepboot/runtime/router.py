"""The router: the controller's HTTP endpoint, and the requests waiting for replicas.

It runs in the controller process, in its own thread with its own asyncio loop
(aiohttp: an asyncio HTTP server and client in one well-kept library, already a
dependency of ``ray[default]``, so the runtime adds nothing to install).

Endpoints (all on ``--http-host``, 127.0.0.1 by default)::

    POST /v1/<service>/infer   a request (JSON body; header X-Request-Id, else one is made)
    GET  /v1/services          services, their replicas and queues (JSON)
    POST /v1/services          register a service (JSON ServiceSpec)
    POST /v1/jobs              submit a training job (JSON JobSpec, absolute entry)
    GET  /metrics              Prometheus metrics
    GET  /healthz              liveness

When the endpoint is bound to anything but loopback, every endpoint requires
``Authorization: Bearer <STATE_DIR/http-token>``; a request without it gets 401.

Requests and replicas (DeepBoot's model, as in the simulator): a request goes to an
active replica of its service with a free slot (``concurrency`` requests in flight).
Otherwise it waits in the service's bounded queue, and, unless a replica already
starting will have a slot for it (so that one slow cold start does not start a
replica per queued request), it is an *arrival* for the controller, whose control
loop runs ATS-I (warm reuse, a FREE GPU, evicting another service's SLEEP replica,
reclaiming a lent GPU) and tells the router which replica starts or wakes
(:meth:`Router.start_replica`). A replica that empties (nothing in flight, nothing
queued) is reported idle and stops taking requests until the
controller activates it again, so the controller's PROTECT/SLEEP states are never
contradicted. A full queue answers 503 with ``Retry-After``; so does a request that
waited ``request_timeout_s``. A request whose replica dies is put back at the head of
the queue (retried on another replica), up to three times. Every request gets exactly
one answer.

Threads: the controller calls the public methods (``start_replica`` ...) from its own
thread; they only schedule work on the router's loop. The router tells the
controller what happened through an :class:`Inbox` of messages.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import ipaddress
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from deepboot.core.errors import ConfigError, InputError
from deepboot.core.service import ServiceSpec
from deepboot.runtime.messages import Arrival, Died, Idle, Inbox, Ready, Withdraw
from deepboot.runtime.metrics import Metrics

log = logging.getLogger("deepboot.router")

MAX_ATTEMPTS = 3
"""Replicas a request may be sent to before it is answered 502."""


# -- the router's own state (touched only on its loop) --------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(eq=False)
class Pending:
    id: str
    service: str
    body: Any
    future: asyncio.Future[Answer]
    arrived: float
    posted: bool = False
    attempts: int = 0


@dataclass(eq=False)
class Replica:
    gpu: str
    service: str
    name: str
    handle: Any
    slots: int
    created: float
    ready: bool = False
    active: bool = True
    dead: bool = False
    inflight: int = 0


@dataclass
class ServiceQueue:
    spec: ServiceSpec
    queue: collections.deque[Pending] = field(default_factory=collections.deque)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and "localhost"."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _ray_future(ref: Any) -> asyncio.Future[Any]:
    return asyncio.wrap_future(ref.future())


class Router:
    """See the module docstring.

    Args:
        inbox: Where messages to the controller go.
        metrics: The controller's metrics (request counters, histograms, queues).
        host: Address to bind (127.0.0.1 by default; anything else turns auth on).
        port: Port (0: any free one).
        token: The bearer token (required when ``auth``).
        auth: Require the token on every endpoint.
        submit: Called (in the router's thread) with a JSON job spec; raises
            ConfigError/InputError for a bad one.
        register: Called with a JSON service spec, likewise.
    """

    def __init__(
        self,
        inbox: Inbox,
        metrics: Metrics,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str = "",
        auth: bool = False,
        submit: Callable[[dict[str, Any]], str] | None = None,
        register: Callable[[dict[str, Any]], str] | None = None,
    ) -> None:
        if auth and not token:
            raise ConfigError("the HTTP endpoint needs a token when auth is on")
        self.inbox = inbox
        self.metrics = metrics
        self.host, self.port = host, port
        self.token, self.auth = token, auth
        self._submit, self._register = submit, register
        self.services: dict[str, ServiceQueue] = {}
        self.replicas: dict[str, Replica] = {}
        self._ids: set[str] = set()
        self._counter = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

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

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def write_address(self, path: Path) -> None:
        """Record where the endpoint listens (``http.json``) for the CLI and clients."""
        tmp = path.with_suffix(".tmp")
        info = {
            "url": self.url,
            "host": self.host,
            "port": self.port,
            "auth": self.auth,
            "pid": os.getpid(),
        }
        tmp.write_text(json.dumps(info, indent=2))
        os.replace(tmp, path)

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def _down() -> None:
            if self._runner is not None:
                await self._runner.cleanup()
            loop.stop()

        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(_down()))
        if self._thread is not None:
            self._thread.join(10)

    def _serve(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
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
        app = web.Application(middlewares=[self._auth_mw], client_max_size=16 * 2**20)
        app.router.add_post("/v1/{service}/infer", self._infer)
        app.router.add_get("/v1/services", self._list_services)
        app.router.add_post("/v1/services", self._post_service)
        app.router.add_post("/v1/jobs", self._post_job)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._health)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        # SO_REUSEADDR (asyncio's default on Unix): a restarted controller takes its
        # old port back despite connections of the killed one in TIME_WAIT.
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the router's loop (from any thread)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn, *args)

    # -- what the controller tells the router (scheduled with :meth:`call`) -----------------

    def set_services(self, specs: dict[str, ServiceSpec]) -> None:
        self.call(self._set_services, dict(specs))

    def start_replica(
        self, gpu: str, service: str, name: str, handle: Any, cold: bool, task: str = ""
    ) -> None:
        """The controller placed arrival ``task`` of ``service`` on ``gpu``: a new replica
        (``cold``; ``handle`` is its new actor) or a warm reuse of the one there."""
        self.call(self._start_replica, gpu, service, name, handle, cold, task)

    def adopt_replica(self, gpu: str, service: str, name: str, handle: Any) -> None:
        """A live replica a restarted controller kept (idle: PROTECT or SLEEP)."""
        self.call(self._adopt_replica, gpu, service, name, handle)

    def stop_replica(self, gpu: str) -> None:
        """The replica on ``gpu`` is evicted (the controller kills its actor)."""
        self.call(self._stop_replica, gpu)

    # -- on the router's loop ------------------------------------------------------------------

    def _set_services(self, specs: dict[str, ServiceSpec]) -> None:
        for name, spec in specs.items():
            q = self.services.get(name)
            if q is None:
                self.services[name] = ServiceQueue(spec)
            else:
                q.spec = spec

    def _start_replica(
        self, gpu: str, service: str, name: str, handle: Any, cold: bool, task: str
    ) -> None:
        q = self.services[service]
        for p in q.queue:
            if p.id == task:
                p.posted = False  # that arrival is spent; a lost replica posts it again
                break
        rep = self.replicas.get(gpu)
        if cold or rep is None or rep.name != name:
            spec = self.services[service].spec
            rep = Replica(gpu, service, name, handle, spec.concurrency, time.monotonic())
            self.replicas[gpu] = rep
            asyncio.ensure_future(self._load(rep, cold))
            return
        rep.active = True
        self._pump(service)
        self._maybe_idle(rep)

    def _adopt_replica(self, gpu: str, service: str, name: str, handle: Any) -> None:
        spec = self.services[service].spec
        rep = Replica(gpu, service, name, handle, spec.concurrency, time.monotonic(), active=False)
        self.replicas[gpu] = rep
        asyncio.ensure_future(self._load(rep, cold=False))

    def _stop_replica(self, gpu: str) -> None:
        rep = self.replicas.pop(gpu, None)
        if rep is not None:
            rep.dead = True

    async def _load(self, rep: Replica, cold: bool) -> None:
        try:
            seconds = await _ray_future(rep.handle.load.remote())
        except Exception as exc:  # the actor died, or the handler failed to build
            self._replica_lost(rep, f"{type(exc).__name__}: {exc}", broken=_is_task_error(exc))
            return
        if rep.dead:
            return
        rep.ready = True
        if cold:
            self.inbox.put(Ready(rep.gpu, rep.name, time.monotonic() - rep.created, float(seconds)))
        self._pump(rep.service)
        self._maybe_idle(rep)

    def _free_replica(self, service: str) -> Replica | None:
        best: Replica | None = None
        for rep in self.replicas.values():
            if (
                rep.service == service
                and rep.ready
                and rep.active
                and not rep.dead
                and rep.inflight < rep.slots
                and (best is None or rep.inflight < best.inflight)
            ):
                best = rep
        return best

    def _pump(self, service: str) -> None:
        """Hand queued requests of ``service`` to free slots, oldest first."""
        q = self.services.get(service)
        if q is None:
            return
        while q.queue:
            rep = self._free_replica(service)
            if rep is None:
                break
            p = q.queue.popleft()
            if p.posted:
                self.inbox.put(Withdraw(p.id))
                p.posted = False
            rep.inflight += 1
            asyncio.ensure_future(self._dispatch(p, rep))
        self.metrics.pending.labels(service).set(len(q.queue))

    def _maybe_idle(self, rep: Replica) -> None:
        q = self.services.get(rep.service)
        if rep.ready and rep.active and not rep.dead and rep.inflight == 0 and not (q and q.queue):
            rep.active = False
            self.inbox.put(Idle(rep.gpu, rep.name))

    def _enqueue(self, p: Pending, front: bool = False) -> None:
        q = self.services[p.service]
        (q.queue.appendleft if front else q.queue.append)(p)
        self._pump(p.service)
        self._post_uncovered(p.service)
        self.metrics.pending.labels(p.service).set(len(q.queue))

    def _post_uncovered(self, service: str) -> None:
        """Post an arrival for each queued request no starting replica will take."""
        q = self.services[service]
        spare = sum(
            max(rep.slots - rep.inflight, 0)
            for rep in self.replicas.values()
            if rep.service == service and rep.active and not rep.dead
        )
        for i, p in enumerate(q.queue):
            if i >= spare and not p.posted:
                p.posted = True
                self.inbox.put(Arrival(p.id, p.service))

    async def _dispatch(self, p: Pending, rep: Replica) -> None:
        spec = self.services[p.service].spec
        p.attempts += 1
        try:
            result = await asyncio.wait_for(
                _ray_future(rep.handle.infer.remote(p.body)), timeout=spec.request_timeout_s
            )
        except TimeoutError:
            self._answer(p, 504, {"error": f"no answer within {spec.request_timeout_s:g} s"})
        except Exception as exc:
            if _is_task_error(exc):  # the handler raised: the service's own error
                self._answer(p, 500, {"error": str(exc).strip().splitlines()[-1][:2000]})
            else:  # the replica died with the request in flight: retry elsewhere
                self._replica_lost(rep, f"{type(exc).__name__}: {exc}", broken=False)
                if p.attempts >= MAX_ATTEMPTS:
                    self._answer(p, 502, {"error": f"{p.attempts} replicas failed"})
                else:
                    log.info("request %s: replica %s died; retrying", p.id, rep.name)
                    self._enqueue(p, front=True)
                return
        else:
            self._answer(p, 200, {"result": result, "replica": rep.gpu})
        finally:
            rep.inflight -= 1
        if not rep.dead:
            self._pump(rep.service)
            self._maybe_idle(rep)

    def _replica_lost(self, rep: Replica, error: str, broken: bool) -> None:
        if rep.dead:
            return
        rep.dead = True
        if self.replicas.get(rep.gpu) is rep:
            del self.replicas[rep.gpu]
        self.inbox.put(Died(rep.gpu, rep.name, error))
        q = self.services.get(rep.service)
        if q is None:
            return
        if broken:
            # The handler cannot load: fail what waits rather than start replica after
            # replica for it.
            while q.queue:
                p = q.queue.popleft()
                if p.posted:
                    self.inbox.put(Withdraw(p.id))
                self._answer(p, 502, {"error": f"replica failed to start: {error[-2000:]}"})
            self.metrics.pending.labels(rep.service).set(0)
            return
        # Its queued requests may have counted on it: ask again for those uncovered.
        self._post_uncovered(rep.service)

    def _answer(self, p: Pending, status: int, body: dict[str, Any], **headers: str) -> None:
        if p.future.done():
            return
        spent = time.monotonic() - p.arrived
        body = {"id": p.id, "service": p.service, **body}
        p.future.set_result(Answer(status, body, {"X-Request-Id": p.id, **headers}))
        self.metrics.requests.labels(p.service, str(status)).inc()
        if status == 200:
            self.metrics.latency.labels(p.service).observe(spent)

    # -- HTTP handlers ---------------------------------------------------------------------------

    @web.middleware
    async def _auth_mw(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        if self.auth:
            given = request.headers.get("Authorization", "")
            scheme, _, token = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.strip().encode(), self.token.encode()
            ):
                return web.json_response(
                    {"error": "missing or wrong bearer token"},
                    status=401,
                    headers={"WWW-Authenticate": 'Bearer realm="deepboot"'},
                )
        response: web.StreamResponse = await handler(request)
        return response

    async def _infer(self, request: web.Request) -> web.Response:
        service = request.match_info["service"]
        q = self.services.get(service)
        rid = request.headers.get("X-Request-Id") or f"req-{next(self._counter)}"
        if q is None:
            return web.json_response(
                {"id": rid, "error": f"no service named {service!r}"}, status=404
            )
        if rid in self._ids:
            return web.json_response(
                {"id": rid, "error": "a request with this id is in progress"}, status=409
            )
        try:
            body = await request.json() if request.can_read_body else None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return web.json_response({"id": rid, "error": f"body is not JSON: {exc}"}, status=400)
        spec = q.spec
        loop = asyncio.get_running_loop()
        p = Pending(rid, service, body, loop.create_future(), time.monotonic())
        retry_after = str(max(1, round(spec.request_timeout_s / 4)))
        if self._free_replica(service) is None and len(q.queue) >= spec.queue_bound:
            self.metrics.requests.labels(service, "503").inc()
            return web.json_response(
                {"id": rid, "service": service, "error": "queue full"},
                status=503,
                headers={"Retry-After": retry_after, "X-Request-Id": rid},
            )
        self._ids.add(rid)
        try:
            self._enqueue(p)
            try:
                answer = await asyncio.wait_for(asyncio.shield(p.future), spec.request_timeout_s)
            except TimeoutError:
                if p in q.queue:  # never reached a replica
                    q.queue.remove(p)
                    if p.posted:
                        self.inbox.put(Withdraw(p.id))
                    self.metrics.pending.labels(service).set(len(q.queue))
                    self._answer(
                        p,
                        503,
                        {"error": f"no replica within {spec.request_timeout_s:g} s"},
                        **{"Retry-After": retry_after},
                    )
                answer = await p.future  # in flight: the dispatch answers it
            except asyncio.CancelledError:  # the client went away
                if p in q.queue:
                    q.queue.remove(p)
                    if p.posted:
                        self.inbox.put(Withdraw(p.id))
                raise
        finally:
            self._ids.discard(rid)
        return web.json_response(answer.body, status=answer.status, headers=answer.headers)

    async def _list_services(self, request: web.Request) -> web.Response:
        out = []
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
            out.append({"service": name, "queued": len(q.queue), "replicas": reps})
        return web.json_response(out)

    async def _post(
        self, request: web.Request, fn: Callable[[dict[str, Any]], str] | None
    ) -> web.Response:
        if fn is None:
            return web.json_response({"error": "not available"}, status=404)
        try:
            raw = await request.json()
            if not isinstance(raw, dict):
                raise ValueError("the body must be a JSON object")
            name = await asyncio.get_running_loop().run_in_executor(None, fn, raw)
        except (ValueError, TypeError, KeyError, ConfigError, InputError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
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
        return web.json_response({"ok": True})


def _is_task_error(exc: BaseException) -> bool:
    """True when ``exc`` is the user's code raising (not the actor dying)."""
    with contextlib.suppress(ImportError):
        import ray

        if isinstance(exc, ray.exceptions.RayTaskError) and not isinstance(
            exc, ray.exceptions.RayActorError
        ):
            return True
    return False
