"""The router's loop: the per-service queues, the replicas' slots, the crash-loop
back-offs, and the answer to every request.

Requests and replicas (DeepBoot's model, as in the simulator): a request goes to an
active replica of its service with a free slot (``concurrency`` requests in flight).
Otherwise it waits in the service's bounded queue, and, unless a replica already
starting will have a slot for it (so that one slow cold start does not start a
replica per queued request), it is an *arrival* for the controller, whose control
loop runs ATS-I (warm reuse, a FREE GPU, evicting another service's SLEEP replica,
reclaiming a lent GPU) and tells the router which replica starts or wakes
(:meth:`~deepboot.runtime.http.router.Router.start_replica`). A replica that empties
(nothing in flight, nothing queued) is reported idle and stops taking requests until
the controller activates it again, so the controller's PROTECT/SLEEP states are never
contradicted.

Every wait is bounded (docs/reliability.md lists each bound; the constants are
:mod:`deepboot.runtime.http.routerstate`'s):

- in the queue, ``request_timeout_s`` from arrival, retries included (then 503 with
  ``Retry-After``); a full queue answers 503 at once;
- a new replica's actor waits at most ``PLACE_TIMEOUT_S`` for its GPU, and its
  handler at most the service's load timeout to load; then the replica is killed
  (its GPU goes back to the loop as FREE), its waiting requests stay queued, and the
  service backs off (below);
- one call of the handler at most ``handler_timeout_s`` (then 504, and the replica
  is restarted: a call past its deadline may still be running, and its slot must not
  be reused meanwhile); a request's whole time in the system is at most
  ``request_timeout_s + handler_timeout_s``;
- a client that disconnects while its request is queued withdraws it.

Failures: a request whose replica dies in flight is retried on another replica at the
head of the queue, until it has been in flight on ``MAX_DEATHS`` replicas that
died: then it is answered 502 and never retried (a poison request kills at most that
many; with ``concurrency > 1`` every request in flight on a dying replica counts that
death). A replica that dies or times out while loading puts its service in a
crash-loop back-off (``BACKOFF_BASE_S`` doubling per failure in a row, capped at
``BACKOFF_CAP_S``; reset by a replica that loads): no arrival is posted for the
service meanwhile, so no GPU is reclaimed for it. A handler that raises while
loading also fails what waits (502). Every request gets exactly one answer.

:class:`Dispatcher` is a part the :class:`~deepboot.runtime.http.router.Router` builds: it
owns the queues and the replicas' slots; its methods run on the router's loop only,
and tell the controller what happened through the :class:`Inbox`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from deepboot.core.service import ServiceSpec
from deepboot.runtime.http import replica_calls
from deepboot.runtime.http.replica_calls import LoadFailed
from deepboot.runtime.http.routerstate import (
    BACKOFF_BASE_S,
    BACKOFF_CAP_S,
    MAX_DEATHS,
    Answer,
    Handoff,
    Pending,
    Replica,
    ServiceQueue,
)
from deepboot.runtime.messages import (
    Answered,
    Arrival,
    Backoff,
    Died,
    Idle,
    Inbox,
    Ready,
    Served,
    Withdraw,
)
from deepboot.runtime.prometheus_metrics import Metrics
from deepboot.runtime.slotally import wait_header

log = logging.getLogger("deepboot.router")


class Dispatcher:
    """The router's queues, replicas and back-offs, on its loop (see the module
    docstring).

    Args:
        inbox: Where messages to the controller go.
        metrics: The controller's metrics.

    Attributes:
        services: Each registered service's queue and back-off.
        replicas: The live replicas, by GPU.
        ids: The ids of the requests in progress (taken until each is answered).
        loop: The router's loop, once it runs (its timers are set on it).
    """

    def __init__(self, inbox: Inbox, metrics: Metrics) -> None:
        self.inbox, self.metrics = inbox, metrics
        self.services: dict[str, ServiceQueue] = {}
        self.replicas: dict[str, Replica] = {}
        self.ids: set[str] = set()
        self.loop: asyncio.AbstractEventLoop | None = None

    def set_services(self, specs: dict[str, ServiceSpec], cold: dict[str, float]) -> None:
        for name, spec in specs.items():
            q = self.services.get(name)
            if q is None:
                q = self.services[name] = ServiceQueue(spec)
            else:
                q.spec = spec
            if q.cold_s is None:
                q.cold_s = cold.get(name)
            # Present at 0 from the start: a scrape shows every service's SLO counts.
            self.metrics.within_slo.labels(name)
            self.metrics.over_slo.labels(name)

    def restore_backoff(self, service: str, failures: int, seconds_left: float) -> None:
        q = self.services.get(service)
        if q is None or failures <= 0:
            return
        left = max(seconds_left, 0.0)
        q.load_failures, q.backoff_until = failures, time.monotonic() + left
        assert self.loop is not None
        self.loop.call_later(left, self._post_uncovered, service)

    def start_replica(
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
            rep.prewarmed = cold and not task
            self.replicas[gpu] = rep
            asyncio.ensure_future(self._load(rep, cold))
            return
        rep.active = True
        self._pump(service)
        self._maybe_idle(rep)

    def adopt_replica(self, gpu: str, service: str, name: str, handle: Any) -> None:
        spec = self.services[service].spec
        rep = Replica(gpu, service, name, handle, spec.concurrency, time.monotonic(), active=False)
        self.replicas[gpu] = rep
        asyncio.ensure_future(self._load(rep, cold=False))

    def stop_replica(self, gpu: str) -> None:
        rep = self.replicas.pop(gpu, None)
        if rep is not None:
            rep.dead = True

    async def _load(self, rep: Replica, cold: bool) -> None:
        q = self.services[rep.service]
        limit = q.spec.load_timeout(q.cold_s)
        loaded = await replica_calls.load(rep.handle, rep.name, limit, q.spec.is_command)
        if isinstance(loaded, LoadFailed):
            self._load_failed(rep, loaded.error, loaded.broken)
            return
        if rep.dead:
            return
        if loaded.address:  # a command service's server: watched while it lives
            rep.address = loaded.address
            asyncio.ensure_future(self._watch(rep))
        rep.ready = True
        if q.serve_deaths == 0:  # a replica that loads but dies serving ends nothing
            self._reset_backoff(q)
        seconds, start = loaded.seconds, loaded.start
        waited = time.monotonic() - rep.created
        self._pump(rep.service)
        if cold:
            if q.cold_s is None and start == "cold":  # a host start is no cold start
                q.cold_s = seconds
            # After the pump: what it took at once tells a pre-warmed replica that
            # requests joined it from one that is idle (the Idle that follows).
            ready = Ready(rep.gpu, rep.name, waited, seconds, start or "cold", rep.inflight,
                          loaded.wake_failed)  # fmt: skip
            self.inbox.put(ready)
        self._maybe_idle(rep)

    async def _watch(self, rep: Replica) -> None:
        """A command replica's server, watched (the actor's ``watch``): one that exits
        or fails its health path is lost at once, before a request finds it dead."""
        why = await replica_calls.watch(rep.handle)
        if why and not rep.dead:
            log.warning("replica %s: %s", rep.name, why)
            self._replica_lost(rep, why, phase="serve")

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
                self.drop(q, q.queue[0], 502, "the service's handler failed to load")

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
        assert self.loop is not None
        self.loop.call_later(backoff, self._post_uncovered, service)
        return backoff

    def _reset_backoff(self, q: ServiceQueue) -> None:
        q.serve_deaths = 0
        if q.load_failures:
            q.load_failures, q.backoff_until = 0, 0.0
            self.inbox.put(Backoff(q.spec.name, 0, 0.0))

    def free_replica(self, service: str) -> Replica | None:
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
            rep = self.free_replica(service)
            if rep is None:
                break
            p = q.queue.popleft()
            if p.posted:
                self.inbox.put(Withdraw(p.id))
                p.posted = False
            rep.inflight += 1
            p.handed = time.monotonic()  # the end of its wait
            if p.proxy is not None:
                self._hand_off(p, rep)
            else:
                asyncio.ensure_future(self._dispatch(p, rep))
        self.metrics.pending.labels(service).set(len(q.queue))

    def _hand_off(self, p: Pending, rep: Replica) -> None:
        """A proxied request's turn: its handler forwards it to ``rep``'s server
        (:mod:`deepboot.runtime.http.proxy`) and ends with :meth:`proxied_done` or
        :meth:`proxied_died`. Its queue deadline no longer applies."""
        if p.timer is not None:
            p.timer.cancel()
            p.timer = None
        assert p.handoff is not None
        if not p.handoff.done():
            p.handoff.set_result(Handoff(rep))

    def proxied_done(self, p: Pending, rep: Replica, status: int, began: float) -> None:
        """A proxied request ended with ``status`` from ``rep``'s server (or 499 when its
        client went away, 504 past its deadline): its slot is free, it is counted (its
        wait ended at the hand-off) and its id released."""
        rep.inflight -= 1
        self.ids.discard(p.id)
        now = time.monotonic()
        assert p.handed is not None
        self.count(p.service, status, p.handed - p.arrived, now - p.arrived, handed=True)
        if status < 500 and status != 499:
            self.inbox.put(Served(p.service, now - began, time.time()))
            if p.service in self.services:
                self._reset_backoff(self.services[p.service])
        if not p.future.done():  # nothing waits on it: the handler answered itself
            p.future.cancel()
        if not rep.dead:
            self._pump(rep.service)
            self._maybe_idle(rep)

    def proxied_died(self, p: Pending, rep: Replica, error: str) -> None:
        """``rep``'s server could not be reached for ``p`` (no answer began): the
        replica counts as dead, and ``p`` is retried as a request whose replica died
        in flight (:meth:`_died_serving`), with a new hand-off to wait for."""
        rep.inflight -= 1
        assert self.loop is not None
        p.handoff = self.loop.create_future()
        self._died_serving(p, rep, error)
        if not rep.dead:
            self._pump(rep.service)

    def _maybe_idle(self, rep: Replica) -> None:
        q = self.services.get(rep.service)
        if rep.ready and rep.active and not rep.dead and rep.inflight == 0 and not (q and q.queue):
            rep.active = False
            self.inbox.put(Idle(rep.gpu, rep.name))

    def enqueue(self, p: Pending, front: bool = False) -> None:
        """Queue ``p`` (a retry at the head); a request past its queue deadline is
        answered 503 instead."""
        q = self.services[p.service]
        assert self.loop is not None
        p.handed = None  # queued (again, after a death): it waits (again)
        now = time.monotonic()
        if now >= p.queue_deadline:
            self._answer_timeout(q, p)
            return
        if p.timer is None:
            p.timer = self.loop.call_later(p.queue_deadline - now, self._expire, p)
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
        self.drop(q, p, 503, reason, **{"Retry-After": retry})

    def drop(self, q: ServiceQueue, p: Pending, status: int, reason: str, **headers: str) -> None:
        """Take ``p`` out of the queue (withdrawing its arrival) and answer it."""
        with contextlib.suppress(ValueError):
            q.queue.remove(p)
        if p.posted:
            self.inbox.put(Withdraw(p.id))
            p.posted = False
        self.metrics.pending.labels(p.service).set(len(q.queue))
        self.answer(p, status, {"error": reason}, **headers)

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
            call = replica_calls.ray_future(rep.handle.infer.remote(p.body))
            result = await asyncio.wait_for(call, limit)
        except TimeoutError:
            self.answer(p, 504, {"error": f"no answer within {limit:.3g} s"})
            # The call may still be running: the replica goes (the controller kills
            # it and a new one starts), so its slot is never reused meanwhile.
            rep.killed = True
            self._replica_lost(rep, f"request {p.id} ran past {limit:.3g} s", phase="serve")
        except asyncio.CancelledError:
            if replica_calls.we_are_cancelled():
                raise
            self._died_serving(p, rep, "the call was cancelled")
        except Exception as exc:
            if replica_calls.is_task_error(exc):  # the handler raised: the service's error
                log.info("service %s, request %s: the handler raised: %s", p.service, p.id, exc)
                raised = replica_calls.cause_name(exc)
                self.answer(p, 500, {"error": f"the handler raised {raised}"})
            else:  # the replica died with the request in flight
                self._died_serving(p, rep, f"{type(exc).__name__}: {exc}")
        else:
            answer = {"result": result, "replica": rep.gpu, "prewarmed": rep.prewarmed}
            self.answer(p, 200, answer)
            if rep.prewarmed:
                self.metrics.prewarmed.labels(p.service).inc()
            self.inbox.put(Served(p.service, time.monotonic() - began, time.time()))
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
            self.answer(p, 499, {"error": "the client went away"})
        elif p.deaths >= MAX_DEATHS:
            log.warning(
                "request %s of %s: in flight on %d replicas that died; not retried",
                p.id, p.service, p.deaths,
            )  # fmt: skip
            self.answer(p, 502, {"error": f"{p.deaths} replicas died serving it"})
        else:
            log.info("request %s: replica %s died; retrying", p.id, rep.name)
            self.enqueue(p, front=True)

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

    def answer(self, p: Pending, status: int, body: dict[str, Any], **headers: str) -> None:
        if p.future.done():
            return
        if p.timer is not None:
            p.timer.cancel()
        self.ids.discard(p.id)  # an id is in progress until its request is answered
        now = time.monotonic()
        # Never handed to a replica: what it waited is its whole time, to this answer.
        wait = (now if p.handed is None else p.handed) - p.arrived
        body = {"id": p.id, "service": p.service, **body}
        headers = {"X-Request-Id": p.id, "X-Wait-Ms": wait_header(wait), **headers}
        p.future.set_result(Answer(status, body, headers))
        self.count(p.service, status, wait, now - p.arrived, handed=p.handed is not None)

    def count(self, service: str, status: int, wait: float, spent: float, handed: bool) -> None:
        """Count an answered request of ``service`` (answered ``status``, ``wait`` and
        ``spent`` seconds from arrival to hand-off and to answer; ``handed``: it reached
        a replica) in the metrics, and tell the controller (its SLO attainment). Within
        the SLO only when handed to a replica within ``slo_wait_s``: a request that
        never reached one counts as over (:mod:`deepboot.runtime.slotally`)."""
        within = handed and wait <= self.services[service].spec.slo_wait_s
        m = self.metrics
        m.requests.labels(service, str(status)).inc()
        (m.within_slo if within else m.over_slo).labels(service).inc()
        if handed:
            m.wait.labels(service).observe(wait)
        if status == 200:
            m.latency.labels(service).observe(spent)
        self.inbox.put(Answered(service, within, wait, time.time()))
