"""An in-memory :class:`~deepboot.runtime.actors.handles.Actors`: obedient workers, for driving
the controller's generations, polls and recovery in-process (no Ray, no processes).

Each fake worker, when asked for a report, has formed the newest generation offered
to it (a member: RUNNING in it; a stop or a generation without it: DEPARTED). A job's
progress is shared by its workers (as all-reduced state is): :meth:`FakeActors.advance`
moves every job with a live member one step on, and its members report DONE once it
reaches ``work[job]``. A test kills one with :meth:`FakeActors.die` (its reports are
then None, as a dead Ray actor's) and reads what the controller did from ``created``,
``offers`` and ``killed``.

Model caches are real :class:`~deepboot.runtime.actors.modelcache.ModelCache` objects (their
``put`` the identity); a fake replica exports ``export_bytes`` bytes of weights (0:
its handler has no ``export_weights``), or raises if its name is in ``export_fails``.

Standbys (``--standby-replicas``) are listed with the replicas (their "GPU" is their
node until promoted); one in ``importing`` is not ready yet, and promoting one in
``promote_fails`` raises.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from deepboot.elastic.protocol import Generation, WorkerConfig, WorkerReport, WorkerStatus
from deepboot.runtime.actors.handles import ActorName
from deepboot.runtime.actors.modelcache import ModelCache


@dataclass
class FakeWorker:
    job: str
    gpu: str
    offered: list[Generation]
    alive: bool = True
    departed: bool = False  # it saw a stop or a generation without it: its code ended

    @property
    def member(self) -> bool:
        """In its newest generation (not told to leave, not departed)."""
        gen = self.offered[-1]
        return self.alive and not self.departed and not gen.stop and self.gpu in gen.members


@dataclass
class FakeActors:
    """See the module docstring. ``clock``: when ``created_at`` says things happened."""

    workers: dict[str, FakeWorker] = field(default_factory=dict)
    replicas: dict[str, str] = field(default_factory=dict)  # name -> gpu
    created: list[tuple[str, str, int]] = field(default_factory=list)  # name, gpu, gen
    created_at: list[tuple[str, float]] = field(default_factory=list)  # job, time
    killed: list[str] = field(default_factory=list)
    reruns: list[str] = field(default_factory=list)  # workers started for finished work
    deaf: set[str] = field(default_factory=set)  # workers that ignore every offer
    silent: set[str] = field(default_factory=set)  # never scheduled: never answer
    broken: dict[str, int] = field(default_factory=dict)  # name -> generation it gave up
    progress: dict[str, int] = field(default_factory=dict)
    work: dict[str, int] = field(default_factory=dict)
    clock: Callable[[], float] = lambda: 0.0
    nodes: set[int] | None = None  # the live nodes (None: the cluster cannot tell)
    caches: dict[int, ModelCache] = field(default_factory=dict)
    models: dict[str, str] = field(default_factory=dict)  # replica name -> its model
    export_bytes: int = 0
    export_fails: set[str] = field(default_factory=set)
    exported: list[str] = field(default_factory=list)  # replicas asked to export
    standbys: list[tuple[str, int]] = field(default_factory=list)  # created: name, node
    promoted: list[tuple[str, str]] = field(default_factory=list)  # name, gpu
    importing: set[str] = field(default_factory=set)
    promote_fails: set[str] = field(default_factory=set)

    def create(self, name: str, config: WorkerConfig, gpu: str, first: Generation) -> None:
        assert name not in self.workers, f"{name} created twice"
        parsed = ActorName.parse(name)
        assert parsed is not None
        if self.progress.get(parsed.job, 0) >= self.work.get(parsed.job, 1 << 30):
            self.reruns.append(name)
        self.workers[name] = FakeWorker(parsed.job, gpu, [first])
        self.created.append((name, gpu, first.number))
        self.created_at.append((parsed.job, self.clock()))

    def create_replica(
        self,
        name: str,
        spec: dict[str, Any],
        gpu: str,
        log_path: str,
        more_gpus: tuple[str, ...] = (),
    ) -> Any:
        self.replicas[name] = gpu
        self.models[name] = spec["model"]
        return name

    def create_standby(self, name: str, node: int, log_path: str) -> None:
        assert name not in self.replicas, f"{name} created twice"
        self.replicas[name] = str(node)
        self.standbys.append((name, node))

    def standby_ready(self, name: str) -> bool:
        return name not in self.importing

    def promote(
        self, name: str, spec: dict[str, Any], gpu: str, log_path: str, timeout: float
    ) -> Any:
        if name in self.promote_fails or name not in self.replicas:
            raise TimeoutError(f"{name} did not take its service within {timeout} s")
        assert "." not in self.replicas[name], f"{name} promoted twice"
        self.replicas[name] = gpu
        self.models[name] = spec["model"]
        self.promoted.append((name, gpu))
        return name

    def ensure_cache(self, node: int, capacity_gb: float, timeout: float) -> dict[str, Any] | None:
        if self.nodes is not None and node not in self.nodes:
            return None
        cache = self.caches.get(node)
        if cache is None:
            cache = self.caches[node] = ModelCache(node, capacity_gb, put=lambda v: v)
        return cache.configure(capacity_gb)

    def cache_view(self, node: int, timeout: float) -> dict[str, Any] | None:
        cache = self.caches.get(node)
        return None if cache is None else cache.view()

    def export_replica(self, name: str, node: int, timeout: float) -> dict[str, Any] | None:
        self.exported.append(name)
        if name in self.export_fails:
            raise TimeoutError(f"{name} did not export within {timeout} s")
        if not self.export_bytes:
            return None
        return self.caches[node].keep(self.models[name], b"w" * self.export_bytes)

    def sleep_replica(self, name: str, timeout: float) -> dict[str, Any]:
        # The fake runs no command services' servers.
        return {"ok": False, "seconds": 0.0, "error": "the fake has no servers"}

    def handle(self, name: str) -> Any:
        return name

    def offer(self, name: str, gen: Generation) -> None:
        w = self.workers.get(name)
        if w is not None and w.alive and not w.departed and name not in self.deaf:
            w.offered.append(gen)

    def offers(self, name: str) -> list[int]:
        """The generation numbers offered to ``name``, in order."""
        return [g.number for g in self.workers[name].offered]

    def reports(self, names: list[str]) -> dict[str, WorkerReport | None]:
        out: dict[str, WorkerReport | None] = {}
        for name in names:
            if name in self.silent:
                continue  # not answered yet, as an actor Ray has not scheduled
            w = self.workers.get(name)
            if w is None or not w.alive:
                out[name] = None
                continue
            gen = w.offered[-1]
            step = self.progress.get(w.job, 10)
            if self.broken.get(name, 0) >= gen.number:
                out[name] = WorkerReport(
                    w.gpu, WorkerStatus.WAITING, gen.number - 1, step, 0.5, broken=gen.number
                )
                continue
            status = WorkerStatus.DEPARTED
            if w.member:
                done = step >= self.work.get(w.job, 1 << 30)
                status = WorkerStatus.DONE if done else WorkerStatus.RUNNING
            else:
                w.departed = True
            digests = {gen.number: ("a", "a")}
            out[name] = WorkerReport(
                w.gpu, status, gen.number, step, 0.5, digests=digests, restored_step=step
            )
        return out

    def advance(self) -> None:
        """One step of every job that has a live member."""
        for job in {w.job for w in self.workers.values() if w.member}:
            self.progress[job] = self.progress.get(job, 10) + 1

    def members_per_gpu(self) -> dict[str, int]:
        """GPU -> live workers that count themselves members of their generation."""
        out: dict[str, int] = {}
        for w in self.workers.values():
            if w.member:
                out[w.gpu] = out.get(w.gpu, 0) + 1
        return out

    def kill(self, name: str) -> None:
        w = self.workers.get(name)
        if w is not None:
            w.alive = False
        self.replicas.pop(name, None)
        self.killed.append(name)

    def die(self, name: str) -> None:
        """The worker's process dies (not by the controller's hand)."""
        self.workers[name].alive = False

    def lose_node(self, node: int) -> None:
        """Node ``node`` leaves the cluster: every process on it dies with it."""
        assert self.nodes is not None
        self.nodes.discard(node)
        for w in self.workers.values():
            if w.gpu.split(".")[0] == str(node):
                w.alive = False
        for name, gpu in list(self.replicas.items()):
            if gpu.split(".")[0] == str(node):
                del self.replicas[name]
        self.caches.pop(node, None)  # its model cache dies with it

    def live_nodes(self) -> frozenset[int] | None:
        return None if self.nodes is None else frozenset(self.nodes)

    def list_workers(self) -> list[str]:
        return sorted(n for n, w in self.workers.items() if w.alive)

    def list_named(self, prefix: str) -> list[str]:
        live = [n for n, w in self.workers.items() if w.alive] + list(self.replicas)
        return sorted(n for n in live if n.startswith(prefix))

    def live(self, job: str) -> dict[str, str]:
        """gpu -> name of ``job``'s live workers."""
        return {w.gpu: n for n, w in self.workers.items() if w.alive and f"|{job}|" in n}
