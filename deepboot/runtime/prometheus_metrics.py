"""The controller's Prometheus metrics (served at ``/metrics`` by the router).

Named in the style of Kueue's borrowing and lending metrics (``kueue_cluster_queue_
borrowing_limit``, ``kueue_admitted_workloads_total``, ...): a ``deepboot_`` prefix,
``_total`` on counters, units in the name, labels for pool, state, service, kind.

==============================================  =========  ===========================
name                                            type       labels
==============================================  =========  ===========================
deepboot_gpus                                   gauge      pool, state
deepboot_borrowed_gpus                          gauge      job (lent GPUs it holds)
deepboot_gpus_lent_total                        counter    (GPU lends to training)
deepboot_gpus_reclaimed_total                   counter    (lent GPUs taken back)
deepboot_gpus_reclaimed_ahead_total             counter    (of those, proactive ones)
deepboot_job_resizes_total                      counter    kind: afe|restart|failure
deepboot_jobs                                   gauge      state
deepboot_service_replicas                       gauge      service, state
deepboot_replica_cold_starts_total              counter    service (full loads)
deepboot_replica_host_starts_total              counter    service (from the node's cache)
deepboot_service_pending_requests               gauge      service (queue length)
deepboot_inference_requests_total               counter    service, code
deepboot_inference_request_duration_seconds     histogram  service (arrival to answer)
deepboot_inference_request_wait_seconds         histogram  service (arrival to replica)
deepboot_requests_within_slo_total              counter    service (wait <= slo_wait_s)
deepboot_requests_over_slo_total                counter    service (the other answers)
deepboot_requests_prewarmed_total               counter    service (served by a replica
                                                           pre-warmed by --slo)
deepboot_service_slo_wait_seconds               gauge      service (its slo_wait_s)
deepboot_service_slo_target                     gauge      service (its slo_target, or
                                                           --slo-target's override)
==============================================  =========  ===========================

The SLO counters count every answered request of a service once, as within or over
its ``slo_wait_s``: within when the router handed it to a ready replica within
``slo_wait_s`` of its arrival, over otherwise, a request that never reached a replica
(queue full, timed out in the queue, its handler failing to load, its client gone)
included (:mod:`deepboot.runtime.slotally` has the whole rule). The wait histogram has the
requests that reached a replica, the duration histogram those answered 200. Both
histograms have one bucket set for every service (a Prometheus histogram's buckets
are fixed per metric, not per label): from 5 ms, below any warm wait, to 60 s, above
the default ``request_timeout_s``.

The GPU, job and resize counters are rebuilt from the event log when a controller
starts, so they always equal the log's counts (a scrape's counters match
``deepboot logs``); the request metrics count this controller's life only.
"""

from __future__ import annotations

from collections import Counter as _Tally
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from deepboot.core.cluster import Pool
from deepboot.core.gpu import GpuState
from deepboot.runtime.slotally import ServiceSlo
from deepboot.runtime.store.jobstore import EventRow, LogKind

RESIZE_KINDS = ("afe", "restart", "failure")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """One registry of the metrics above (not the process-global one)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.gpus = _gauge(r, "deepboot_gpus", "GPUs by pool and state", "pool", "state")
        self.borrowed = _gauge(
            r, "deepboot_borrowed_gpus", "Inference-pool GPUs a training job holds", "job"
        )
        self.lent = _counter(r, "deepboot_gpus_lent", "Inference-pool GPUs lent to training jobs")
        self.reclaimed = _counter(r, "deepboot_gpus_reclaimed", "Lent GPUs taken back by inference")
        self.reclaimed_ahead = _counter(
            r,
            "deepboot_gpus_reclaimed_ahead",
            "Lent GPUs the SLO guard took back ahead of demand (--slo)",
        )
        self.resizes = _counter(r, "deepboot_job_resizes", "Training-job resizes by kind", "kind")
        self.jobs = _gauge(r, "deepboot_jobs", "Training jobs by state", "state")
        self._declare_replicas(r)
        self._declare_requests(r)
        for kind in RESIZE_KINDS:
            self.resizes.labels(kind)  # present at 0 from the start
        # The event log's counts, by key ("lent", "reclaimed", "ahead": the proactive
        # reclaims, "resize:<how>", "cold:<service>", "host:<service>"): saved with
        # each flush, restored at start.
        self._counted: _Tally[str] = _Tally()

    def _declare_replicas(self, r: CollectorRegistry) -> None:
        """The metrics of inference replicas: by state, how each started, and the
        requests waiting for one."""
        self.replicas = _gauge(
            r, "deepboot_service_replicas", "Replicas by service and state", "service", "state"
        )
        self.cold_starts = _counter(
            r, "deepboot_replica_cold_starts", "Replicas that loaded their model in full", "service"
        )
        self.host_starts = _counter(
            r,
            "deepboot_replica_host_starts",
            "Replicas restored from their node's model cache",
            "service",
        )
        self.pending = _gauge(
            r, "deepboot_service_pending_requests", "Requests waiting for a replica", "service"
        )

    def _declare_requests(self, r: CollectorRegistry) -> None:
        """The metrics of inference requests: answers, their durations and waits, and
        each service's SLO and its attainment."""
        self.requests = _counter(
            r, "deepboot_inference_requests", "Answered requests by status code", "service", "code"
        )
        self.latency = _histogram(
            r,
            "deepboot_inference_request_duration_seconds",
            "Seconds from a request's arrival to its answer",
        )
        self.wait = _histogram(
            r,
            "deepboot_inference_request_wait_seconds",
            "Seconds from a request's arrival to its hand-off to a ready replica",
        )
        self.within_slo = _counter(
            r,
            "deepboot_requests_within_slo",
            "Requests handed to a replica within slo_wait_s",
            "service",
        )
        self.over_slo = _counter(
            r,
            "deepboot_requests_over_slo",
            "Requests handed to a replica late, or never",
            "service",
        )
        self.prewarmed = _counter(
            r,
            "deepboot_requests_prewarmed",
            "Requests served by a replica pre-warmed ahead of demand (--slo)",
            "service",
        )
        # The SLO itself, so that a board draws each service's own target line rather
        # than a constant.
        self.slo_wait = _gauge(
            r,
            "deepboot_service_slo_wait_seconds",
            "The wait within which a request of the service meets its SLO (slo_wait_s)",
            "service",
        )
        self.slo_target = _gauge(
            r,
            "deepboot_service_slo_target",
            "Fraction of the service's requests that must meet slo_wait_s (slo_target, "
            "or --slo-target's override)",
            "service",
        )

    def replay(self, events: Iterable[EventRow]) -> None:
        """Count the event log's lends, reclaims, resizes, cold and host starts (at the start
        of a store that has no saved counts: an older deepboot's)."""
        for e in events:
            self.count(e.kind, e.detail)

    def counts(self) -> dict[str, int]:
        """Every count so far (for the store: :meth:`restore` takes it back)."""
        return dict(self._counted)

    def restore(self, counts: Mapping[str, int]) -> None:
        """Go on from ``counts`` (an earlier controller's :meth:`counts`), without
        reading the event log (whose oldest entries retention may have dropped)."""
        for key, n in counts.items():
            self._add(key, int(n))

    def count(self, kind: LogKind, detail: Mapping[str, Any]) -> None:
        """Count one event-log entry (the controller calls it for every entry it
        writes, :meth:`replay` for those of earlier controllers)."""
        if kind is LogKind.GPU:
            if detail.get("op") == "lend":
                self._add("lent")
            elif detail.get("op") == "reclaim":
                self._add("reclaimed")
                if detail.get("proactive"):
                    self._add("ahead")
        elif kind is LogKind.RESIZED:
            self._add(f"resize:{detail.get('how')}")
        elif kind is LogKind.REPLICA and detail.get("op") == "ready":
            # A new replica loaded: in full ("cold"; a log from before the model cache
            # has no "start") or from its node's cache ("host").
            # A sleeping server woken ("wake") is a host start too.
            start = "host" if detail.get("start") in ("host", "wake") else "cold"
            self._add(f"{start}:{detail.get('service')}")

    def _add(self, key: str, n: int = 1) -> None:
        what, _, label = key.partition(":")
        if what == "lent":
            self.lent.inc(n)
        elif what == "reclaimed":
            self.reclaimed.inc(n)
        elif what == "ahead":
            self.reclaimed_ahead.inc(n)
        elif what == "resize":
            self.resizes.labels(label).inc(n)
        elif what == "cold":
            self.cold_starts.labels(label).inc(n)
        elif what == "host":
            self.host_starts.labels(label).inc(n)
        else:
            return  # a key this version does not count
        self._counted[key] += n

    def set_world(
        self,
        gpus: Iterable[tuple[Pool, GpuState, str | None, str | None]],
        jobs: Iterable[str],
        services: Mapping[str, ServiceSlo],
    ) -> None:
        """Gauges from the controller's picture: (pool, state, job, service) per GPU,
        each active job's state, and every registered service with its SLO."""
        by_state: _Tally[tuple[str, str]] = _Tally()
        borrowed: _Tally[str] = _Tally()
        replicas: _Tally[tuple[str, str]] = _Tally()
        for pool, state, job, service in gpus:
            by_state[(pool.value, state.name.lower())] += 1
            if state is GpuState.LENT and job:
                borrowed[job] += 1
            if service and state in (GpuState.RUNNING, GpuState.PROTECT, GpuState.SLEEP):
                replicas[(service, state.name.lower())] += 1
        for pool in Pool:
            for state in GpuState:
                self.gpus.labels(pool.value, state.name.lower()).set(
                    by_state[(pool.value, state.name.lower())]
                )
        self.borrowed.clear()
        for job, n in borrowed.items():
            self.borrowed.labels(job).set(n)
        self.replicas.clear()
        self.slo_wait.clear()
        self.slo_target.clear()
        for service, slo in services.items():
            self.slo_wait.labels(service).set(slo.wait_s)
            self.slo_target.labels(service).set(slo.target)
            for state in (GpuState.RUNNING, GpuState.PROTECT, GpuState.SLEEP):
                self.replicas.labels(service, state.name.lower()).set(
                    replicas[(service, state.name.lower())]
                )
        self.jobs.clear()
        for job_state, n in _Tally(jobs).items():
            self.jobs.labels(job_state).set(n)

    def exposition(self) -> bytes:
        """The text exposition format (what ``/metrics`` answers)."""
        return generate_latest(self.registry)


def _counter(r: CollectorRegistry, name: str, doc: str, *labels: str) -> Counter:
    return Counter(name, doc, list(labels), registry=r)


def _gauge(r: CollectorRegistry, name: str, doc: str, *labels: str) -> Gauge:
    return Gauge(name, doc, list(labels), registry=r)


def _histogram(r: CollectorRegistry, name: str, doc: str) -> Histogram:
    """A histogram by service, on the one bucket set of every latency (see the module
    doc)."""
    return Histogram(name, doc, ["service"], buckets=_LATENCY_BUCKETS, registry=r)
