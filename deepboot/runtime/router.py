"""The router: the controller's HTTP endpoint, and the requests waiting for replicas.

It runs in the controller process, in its own thread with its own asyncio loop
(aiohttp: an asyncio HTTP server and client in one well-kept library, already a
dependency of ``ray[default]``, so the runtime adds nothing to install).

Endpoints (all on ``--http-host``, 127.0.0.1 by default)::

    POST /v1/<service>/infer   a request (JSON body; header X-Request-Id, else one is made)
    POST /v1/services          register a service (JSON ServiceSpec)
    POST /v1/jobs              submit a training job (JSON JobSpec, absolute entry)
    GET  /v1/services          services, their replicas, queues and back-offs (JSON)
    GET  /metrics              Prometheus metrics
    GET  /healthz              liveness, and the endpoint's instance id (http.json's)

The front door (docs/runtime.md, "Security"), checked before any work:

- Every route that accepts work (the three POSTs) needs ``Authorization: Bearer
  <STATE_DIR/http-token>``, on loopback too (401 otherwise). The reads stay open on
  loopback (``/metrics``, ``GET /v1/services``: nothing in them runs code or reveals
  the token) when the request names a loopback host (a DNS-rebinding page names its
  own); bound elsewhere they need the token too. ``/healthz`` is always open: it says
  only that this endpoint lives and which instance it is, which clients check before
  they send the token anywhere.
- No cross-site requests: a request whose ``Origin`` is not the endpoint's own is
  refused (403), and a POST whose ``Content-Type`` is not ``application/json`` too
  (415): a web page can make a browser send a ``text/plain`` POST to 127.0.0.1
  without a preflight, never an ``application/json`` one.
- Bounded input: a body over its route's limit (64 KiB for jobs and services, the
  service's ``max_body_bytes`` for a request) is refused (413) before it is parsed,
  and a full queue answers 503 before the body is read; JSON deeper than
  :data:`MAX_JSON_DEPTH` is a 400.
- Every error answer is one short JSON line with the request's id; the log keeps the
  detail (tracebacks, internal paths).

Requests and replicas (DeepBoot's model, as in the simulator): a request goes to an
active replica of its service with a free slot (``concurrency`` requests in flight).
Otherwise it waits in the service's bounded queue, and, unless a replica already
starting will have a slot for it (so that one slow cold start does not start a
replica per queued request), it is an *arrival* for the controller, whose control
loop runs ATS-I (warm reuse, a FREE GPU, evicting another service's SLEEP replica,
reclaiming a lent GPU) and tells the router which replica starts or wakes
(:meth:`Router.start_replica`). A replica that empties (nothing in flight, nothing
queued) is reported idle and stops taking requests until the controller activates it
again, so the controller's PROTECT/SLEEP states are never contradicted.

Every wait is bounded (docs/reliability.md lists each bound):

- in the queue, ``request_timeout_s`` from arrival, retries included (then 503 with
  ``Retry-After``); a full queue answers 503 at once;
- a new replica's actor waits at most :data:`PLACE_TIMEOUT_S` for its GPU, and its
  handler at most the service's load timeout to load; then the replica is killed
  (its GPU goes back to the loop as FREE), its waiting requests stay queued, and the
  service backs off (below);
- one call of the handler at most ``handler_timeout_s`` (then 504, and the replica
  is restarted: a call past its deadline may still be running, and its slot must not
  be reused meanwhile); a request's whole time in the system is at most
  ``request_timeout_s + handler_timeout_s``;
- a client that disconnects while its request is queued withdraws it.

Failures: a request whose replica dies in flight is retried on another replica at the
head of the queue, until it has been in flight on :data:`MAX_DEATHS` replicas that
died: then it is answered 502 and never retried (a poison request kills at most that
many; with ``concurrency > 1`` every request in flight on a dying replica counts that
death). A replica that dies or times out while loading puts its service in a
crash-loop back-off (:data:`BACKOFF_BASE_S` doubling per failure in a row, capped at
:data:`BACKOFF_CAP_S`; reset by a replica that loads): no arrival is posted for the
service meanwhile, so no GPU is reclaimed for it. A handler that raises while
loading also fails what waits (502). Every request gets exactly one answer.

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
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from deepboot.core.errors import ConfigError, InputError
from deepboot.core.service import ServiceSpec, valid_name
from deepboot.runtime.endpoint import CHALLENGE_RE, healthz_proof
from deepboot.runtime.messages import (
    Arrival,
    Backoff,
    Died,
    Idle,
    Inbox,
    Ready,
    Received,
    Served,
    Withdraw,
)
from deepboot.runtime.metrics import Metrics

log = logging.getLogger("deepboot.router")

MAX_DEATHS = 2
"""Replica deaths a request may be in flight for before it is answered 502."""
PLACE_TIMEOUT_S = 300.0
"""Most seconds a new replica's actor may wait for its GPU (the lent worker or the
previous replica to leave) before it counts as failing to load."""
BACKOFF_BASE_S = 1.0
"""A service's first crash-loop back-off; it doubles with each failure in a row ..."""
BACKOFF_CAP_S = 60.0
"""... up to this."""
SPEC_BODY_BYTES = 64 * 2**10
"""Largest body of POST /v1/jobs and POST /v1/services."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in a body."""
MAX_REQUEST_ID = 128
"""Longest X-Request-Id accepted."""

_SAFE_ID = re.compile(r"[\x21-\x7e]{1,128}")
_RID = web.RequestKey("rid", str)
"""Where the front door leaves a request's id for its handler."""


# -- the router's own state (touched only on its loop) --------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(eq=False)
class Pending:
    """A request in the system. ``queue_deadline``: when it must have left the queue;
    ``deadline``: when it must be answered (``request_timeout_s`` and
    ``request_timeout_s + handler_timeout_s`` after arrival)."""

    id: str
    service: str
    body: Any
    future: asyncio.Future[Answer]
    arrived: float
    queue_deadline: float
    deadline: float
    posted: bool = False
    deaths: int = 0
    timer: asyncio.TimerHandle | None = None
    abandoned: bool = False  # its client went away while it ran: never retried


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
    killed: bool = False  # the router restarted it (a call past its deadline)


@dataclass
class ServiceQueue:
    """A service's queue, its measured cold start (seconds of ``load``) and its
    crash-loop back-off (failures in a row; no arrival posted before
    ``backoff_until``, a monotonic time)."""

    spec: ServiceSpec
    queue: collections.deque[Pending] = field(default_factory=collections.deque)
    cold_s: float | None = None
    load_failures: int = 0
    backoff_until: float = 0.0
    reading: int = 0  # requests admitted whose body is being read (hold a queue place)
    serve_deaths: int = 0  # replicas that died serving since the last 200

    def backing_off(self, now: float) -> bool:
        return now < self.backoff_until


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


def _ray_future(ref: Any) -> asyncio.Future[Any]:
    return asyncio.wrap_future(ref.future())


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
    ) -> None:
        if not token:
            raise ConfigError("the HTTP endpoint needs a bearer token")
        self.inbox = inbox
        self.metrics = metrics
        self.host, self.port = host, port
        self.token = token
        self._token_bytes = token.encode("utf-8", "surrogateescape")
        self.open_reads = is_loopback(host)
        self.instance = instance or secrets.token_hex(16)
        self._submit, self._register = submit, register
        self.services: dict[str, ServiceQueue] = {}
        self.replicas: dict[str, Replica] = {}
        self._ids: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self.stall_s = stall_s
        self._beat = time.monotonic()

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

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

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
        # client_max_size bounds aiohttp's own readers; each route reads its body
        # through _read_json with its own, smaller, limit.
        app = web.Application(middlewares=[self._front_door], client_max_size=2**20)
        app.router.add_post("/v1/{service}/infer", self._infer)
        app.router.add_get("/v1/services", self._list_services)
        app.router.add_post("/v1/services", self._post_service)
        app.router.add_post("/v1/jobs", self._post_job)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._health)
        # handler_cancellation: a client that disconnects cancels its handler, so a
        # request still queued is withdrawn (aiohttp's default lets it run on).
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, handler_cancellation=True
        )
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

    def set_services(
        self, specs: dict[str, ServiceSpec], cold: dict[str, float] | None = None
    ) -> None:
        """The registered services (and the cold starts measured so far, seconds)."""
        self.call(self._set_services, dict(specs), dict(cold or {}))

    def restore_backoff(self, service: str, failures: int, seconds_left: float) -> None:
        """A restarted controller's record of ``service``'s crash-loop back-off (after
        :meth:`set_services`): ``failures`` in a row, ``seconds_left`` of it to run."""
        self.call(self._restore_backoff, service, failures, seconds_left)

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

    def _set_services(self, specs: dict[str, ServiceSpec], cold: dict[str, float]) -> None:
        for name, spec in specs.items():
            q = self.services.get(name)
            if q is None:
                q = self.services[name] = ServiceQueue(spec)
            else:
                q.spec = spec
            if q.cold_s is None:
                q.cold_s = cold.get(name)

    def _restore_backoff(self, service: str, failures: int, seconds_left: float) -> None:
        q = self.services.get(service)
        if q is None or failures <= 0:
            return
        left = max(seconds_left, 0.0)
        q.load_failures, q.backoff_until = failures, time.monotonic() + left
        assert self._loop is not None
        self._loop.call_later(left, self._post_uncovered, service)

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
            rep = Replica(gpu, service, name, handle, q.spec.concurrency, time.monotonic())
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
        q = self.services[rep.service]
        limit = q.spec.load_timeout(q.cold_s)
        stage = f"did not get its GPU within {PLACE_TIMEOUT_S:g} s"
        try:
            # Two bounds: Ray starts the actor once its GPU is released (a lent
            # worker's shrink, an evicted replica), then the handler loads.
            await asyncio.wait_for(_ray_future(rep.handle.pid.remote()), PLACE_TIMEOUT_S)
            stage = f"did not load within {limit:g} s"
            seconds = await asyncio.wait_for(_ray_future(rep.handle.load.remote()), limit)
        except TimeoutError:
            self._load_failed(rep, f"replica {rep.name} {stage}", broken=False)
            return
        except asyncio.CancelledError:
            if _we_are_cancelled():
                raise
            self._load_failed(rep, f"replica {rep.name}: its load was cancelled", broken=False)
            return
        except Exception as exc:  # the actor died, or the handler failed to build
            self._load_failed(rep, f"{type(exc).__name__}: {exc}", broken=_is_task_error(exc))
            return
        if rep.dead:
            return
        rep.ready = True
        if q.serve_deaths == 0:  # a replica that loads but dies serving ends nothing
            self._reset_backoff(q)
        if cold:
            if q.cold_s is None:
                q.cold_s = float(seconds)
            self.inbox.put(Ready(rep.gpu, rep.name, time.monotonic() - rep.created, float(seconds)))
        self._pump(rep.service)
        self._maybe_idle(rep)

    def _load_failed(self, rep: Replica, error: str, broken: bool) -> None:
        """``rep`` died or timed out loading: it goes, and its service backs off."""
        if rep.dead:
            return
        q = self.services[rep.service]
        backoff = self._back_off(q, f"replica {rep.name} failed to load: {error}")
        self._replica_lost(rep, error, phase="load", backoff=backoff)
        if broken:
            # The handler cannot load: fail what waits rather than let it wait for
            # the next attempt (the log has the handler's error).
            while q.queue:
                self._drop(q, q.queue[0], 502, "the service's handler failed to load")

    def _back_off(self, q: ServiceQueue, why: str) -> float:
        """One more failure in a row for ``q``'s service: no arrival is posted for it
        (so no GPU is reclaimed) for the back-off; returns its seconds. Its posted
        arrivals are withdrawn first, so that the controller, which reads messages in
        order, hears of the withdrawals before the death that frees a GPU."""
        q.load_failures += 1
        backoff = min(BACKOFF_BASE_S * 2.0 ** (q.load_failures - 1), BACKOFF_CAP_S)
        q.backoff_until = time.monotonic() + backoff
        service = q.spec.name
        log.warning(
            "service %s backs off %g s (%d failures in a row): %s",
            service, backoff, q.load_failures, why,
        )  # fmt: skip
        for p in q.queue:
            if p.posted:
                self.inbox.put(Withdraw(p.id))
                p.posted = False
        self.inbox.put(Backoff(service, q.load_failures, backoff))
        assert self._loop is not None
        self._loop.call_later(backoff, self._post_uncovered, service)
        return backoff

    def _reset_backoff(self, q: ServiceQueue) -> None:
        q.serve_deaths = 0
        if q.load_failures:
            q.load_failures, q.backoff_until = 0, 0.0
            self.inbox.put(Backoff(q.spec.name, 0, 0.0))

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
        """Queue ``p`` (a retry at the head); a request past its queue deadline is
        answered 503 instead."""
        q = self.services[p.service]
        assert self._loop is not None
        now = time.monotonic()
        if now >= p.queue_deadline:
            self._answer_timeout(q, p)
            return
        if p.timer is None:
            p.timer = self._loop.call_later(p.queue_deadline - now, self._expire, p)
        (q.queue.appendleft if front else q.queue.append)(p)
        self._pump(p.service)
        self._post_uncovered(p.service)
        self.metrics.pending.labels(p.service).set(len(q.queue))

    def _expire(self, p: Pending) -> None:
        """``p``'s queue deadline: still queued, it is answered 503."""
        q = self.services.get(p.service)
        if q is not None and p in q.queue:
            self._answer_timeout(q, p)

    def _answer_timeout(self, q: ServiceQueue, p: Pending) -> None:
        retry = str(max(1, round(q.spec.request_timeout_s / 4)))
        reason = f"no replica within {q.spec.request_timeout_s:g} s"
        self._drop(q, p, 503, reason, **{"Retry-After": retry})

    def _drop(self, q: ServiceQueue, p: Pending, status: int, reason: str, **headers: str) -> None:
        """Take ``p`` out of the queue (withdrawing its arrival) and answer it."""
        with contextlib.suppress(ValueError):
            q.queue.remove(p)
        if p.posted:
            self.inbox.put(Withdraw(p.id))
            p.posted = False
        self.metrics.pending.labels(p.service).set(len(q.queue))
        self._answer(p, status, {"error": reason}, **headers)

    def _post_uncovered(self, service: str) -> None:
        """Post an arrival for each queued request no starting replica will take
        (none while the service backs off)."""
        q = self.services[service]
        if q.backing_off(time.monotonic()):
            return
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
        q = self.services[p.service]
        limit = max(min(q.spec.handler_deadline_s, p.deadline - time.monotonic()), 0.001)
        began = time.monotonic()
        try:
            result = await asyncio.wait_for(_ray_future(rep.handle.infer.remote(p.body)), limit)
        except TimeoutError:
            self._answer(p, 504, {"error": f"no answer within {limit:.3g} s"})
            # The call may still be running: the replica goes (the controller kills
            # it and a new one starts), so its slot is never reused meanwhile.
            rep.killed = True
            self._replica_lost(rep, f"request {p.id} ran past {limit:.3g} s", phase="serve")
        except asyncio.CancelledError:
            if _we_are_cancelled():
                raise
            self._died_serving(p, rep, "the call was cancelled")
        except Exception as exc:
            if _is_task_error(exc):  # the handler raised: the service's own error
                log.info("service %s, request %s: the handler raised: %s", p.service, p.id, exc)
                self._answer(p, 500, {"error": f"the handler raised {_cause_name(exc)}"})
            else:  # the replica died with the request in flight
                self._died_serving(p, rep, f"{type(exc).__name__}: {exc}")
        else:
            self._answer(p, 200, {"result": result, "replica": rep.gpu})
            self.inbox.put(Served(p.service, time.monotonic() - began))
            self._reset_backoff(q)
        finally:
            rep.inflight -= 1
        if not rep.dead:
            self._pump(rep.service)
            self._maybe_idle(rep)

    def _died_serving(self, p: Pending, rep: Replica, error: str) -> None:
        """``rep`` died with ``p`` in flight: ``p`` is retried at the head of the queue,
        unless it was in flight on :data:`MAX_DEATHS` replicas that died (502), or
        its client went away. A replica the router restarted itself (a call past its
        deadline) counts against no request; deaths in a row back the service off."""
        q = self.services[p.service]
        if not rep.killed:
            p.deaths += 1
        if not rep.dead:
            backoff = 0.0
            if not rep.killed:
                q.serve_deaths += 1
                if q.serve_deaths >= MAX_DEATHS:
                    backoff = self._back_off(q, f"{q.serve_deaths} replicas died serving")
            self._replica_lost(rep, error, phase="serve", backoff=backoff)
        if p.abandoned:
            self._answer(p, 499, {"error": "the client went away"})
        elif p.deaths >= MAX_DEATHS:
            log.warning(
                "request %s of %s: in flight on %d replicas that died; not retried",
                p.id, p.service, p.deaths,
            )  # fmt: skip
            self._answer(p, 502, {"error": f"{p.deaths} replicas died serving it"})
        else:
            log.info("request %s: replica %s died; retrying", p.id, rep.name)
            self._enqueue(p, front=True)

    def _replica_lost(self, rep: Replica, error: str, phase: str, backoff: float = 0.0) -> None:
        if rep.dead:
            return
        rep.dead = True
        if self.replicas.get(rep.gpu) is rep:
            del self.replicas[rep.gpu]
        self.inbox.put(Died(rep.gpu, rep.name, error, phase, backoff))
        if rep.service in self.services:
            # Its queued requests may have counted on it: ask again for those uncovered.
            self._post_uncovered(rep.service)

    def _answer(self, p: Pending, status: int, body: dict[str, Any], **headers: str) -> None:
        if p.future.done():
            return
        if p.timer is not None:
            p.timer.cancel()
        self._ids.discard(p.id)  # an id is in progress until its request is answered
        spent = time.monotonic() - p.arrived
        body = {"id": p.id, "service": p.service, **body}
        p.future.set_result(Answer(status, body, {"X-Request-Id": p.id, **headers}))
        self.metrics.requests.labels(p.service, str(status)).inc()
        if status == 200:
            self.metrics.latency.labels(p.service).observe(spent)

    # -- the front door --------------------------------------------------------------------------

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
        # Reads are open on a loopback endpoint, asked for by a loopback name (a page
        # that rebinds its own DNS name to 127.0.0.1 sends that name).
        return not (self.open_reads and is_loopback(_host_name(request.host)))

    @web.middleware
    async def _front_door(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        rid = ""
        try:
            rid = request[_RID] = self._request_id(request)
            if not self._origin_ok(request):
                raise Refused(
                    403, "cross-origin requests are refused (Origin is not this endpoint)"
                )
            if self._needs_token(request) and not self._token_ok(request):
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
            return _error(exc.status, exc.reason, rid, **exc.headers)
        except web.HTTPException as exc:  # aiohttp's own (404, 405, ...)
            return _error(exc.status, exc.reason, rid)
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception:
            log.exception("request %s to %s failed", rid, request.path)
            return _error(500, "internal error (the controller's log has the detail)", rid)

    async def _read_json(self, request: web.Request, limit: int) -> Any:
        """The body as JSON, read only up to ``limit`` bytes.

        Raises:
            Refused: 413 over the limit (by its Content-Length, or once read past it);
                400 not JSON, or nested deeper than :data:`MAX_JSON_DEPTH`.
        """
        too_big = f"the body is over {limit} bytes"
        if request.content_length is not None and request.content_length > limit:
            raise Refused(413, too_big)
        data = bytearray()
        async for chunk in request.content.iter_chunked(64 * 2**10):
            data += chunk
            if len(data) > limit:
                raise Refused(413, too_big)
        try:
            value = json.loads(bytes(data)) if data else None
        except RecursionError:
            raise Refused(400, f"the body is nested too deeply (> {MAX_JSON_DEPTH})") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise Refused(400, f"the body is not JSON ({str(exc)[:80]})") from None
        if json_depth(value) > MAX_JSON_DEPTH:
            raise Refused(400, f"the body is nested too deeply (> {MAX_JSON_DEPTH})")
        return value

    # -- HTTP handlers ---------------------------------------------------------------------------

    async def _infer(self, request: web.Request) -> web.Response:
        service = request.match_info["service"]
        rid = request[_RID]
        q = self.services.get(service) if valid_name(service) else None
        if q is None:
            raise Refused(404, "no such service")
        if rid in self._ids:
            raise Refused(409, "a request with this id is in progress")
        spec = q.spec
        if self._free_replica(service) is None and len(q.queue) + q.reading >= spec.queue_bound:
            # Before the body is read: a full queue costs a client nothing to learn.
            self.metrics.requests.labels(service, "503").inc()
            retry = str(max(1, round(spec.request_timeout_s / 4)))
            return _error(503, "queue full", rid, **{"Retry-After": retry})
        self._ids.add(rid)
        try:
            # The body is read with a queue place held (so that slow uploads cannot
            # overfill the queue) and within request_timeout_s.
            q.reading += 1
            try:
                body = await asyncio.wait_for(
                    self._read_json(request, spec.max_body_bytes), spec.request_timeout_s
                )
            except TimeoutError:
                reason = f"the body did not arrive within {spec.request_timeout_s:g} s"
                raise Refused(408, reason) from None
            finally:
                q.reading -= 1
        except BaseException:
            self._ids.discard(rid)
            raise
        now = time.monotonic()
        p = Pending(
            rid, service, body, asyncio.get_running_loop().create_future(), now,
            now + spec.request_timeout_s,
            now + spec.request_timeout_s + spec.handler_deadline_s,
        )  # fmt: skip
        self.inbox.put(Received(service))  # every request counts in the load
        self._enqueue(p)  # from here on, answering the request releases its id
        try:
            # The router answers every request by its deadline; the extra second
            # is a backstop, never the bound.
            answer = await asyncio.wait_for(
                asyncio.shield(p.future), p.deadline - time.monotonic() + 1.0
            )
        except TimeoutError:
            log.error("request %s: no answer by its deadline (a router bug)", rid)
            self._drop(q, p, 504, "no answer in time")
            answer = p.future.result()
        except asyncio.CancelledError:  # the client went away (handler_cancellation)
            if p in q.queue:
                log.info("request %s: the client went away while queued; withdrawn", rid)
                self._drop(q, p, 499, "the client went away")
            else:  # in flight: it runs to its end, but is never retried
                p.abandoned = True
            raise
        return web.json_response(answer.body, status=answer.status, headers=answer.headers)

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
        raw = await self._read_json(request, SPEC_BODY_BYTES)
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
        endpoint holds the token (:func:`~deepboot.runtime.endpoint.healthz_proof`)."""
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


def _error(status: int, reason: str, rid: str, **headers: str) -> web.Response:
    """One short JSON line: the reason and the request's id."""
    body: dict[str, Any] = {"error": reason, "id": rid}
    if rid:
        headers["X-Request-Id"] = rid
    return web.json_response(body, status=status, headers=headers)


def _we_are_cancelled() -> bool:
    """True when the running task itself is being cancelled (not an awaited future)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _cause_name(exc: BaseException) -> str:
    """The class name of the user's exception inside a Ray task error."""
    cause = getattr(exc, "cause", None)
    return type(cause).__name__ if isinstance(cause, BaseException) else "an exception"


def _is_task_error(exc: BaseException) -> bool:
    """True when ``exc`` is the user's code raising (not the actor dying)."""
    with contextlib.suppress(ImportError):
        import ray

        if isinstance(exc, ray.exceptions.RayTaskError) and not isinstance(
            exc, ray.exceptions.RayActorError
        ):
            return True
    return False
