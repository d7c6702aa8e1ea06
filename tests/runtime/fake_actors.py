"""An in-memory :class:`~deepboot.runtime.actors.Actors`: obedient workers, for driving
the controller's generations, polls and recovery in-process (no Ray, no processes).

Each fake worker, when asked for a report, has formed the newest generation offered
to it (a member: RUNNING in it; a stop or a generation without it: DEPARTED). A test
kills one with :meth:`FakeActors.die` (its reports are then None, as a dead Ray
actor's) and reads what the controller did from ``created``, ``offers`` and
``killed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deepboot.elastic.protocol import Generation, WorkerConfig, WorkerReport, WorkerStatus


@dataclass
class FakeWorker:
    gpu: str
    offered: list[Generation]
    alive: bool = True
    step: int = 0


@dataclass
class FakeActors:
    """See the module docstring. ``step``: the step every worker reports."""

    workers: dict[str, FakeWorker] = field(default_factory=dict)
    replicas: dict[str, str] = field(default_factory=dict)  # name -> gpu
    created: list[tuple[str, str, int]] = field(default_factory=list)  # name, gpu, gen
    killed: list[str] = field(default_factory=list)
    step: int = 10

    def create(self, name: str, config: WorkerConfig, gpu: str, first: Generation) -> None:
        assert name not in self.workers, f"{name} created twice"
        self.workers[name] = FakeWorker(gpu, [first])
        self.created.append((name, gpu, first.number))

    def create_replica(self, name: str, spec: dict[str, Any], gpu: str, log_path: str) -> Any:
        self.replicas[name] = gpu
        return name

    def handle(self, name: str) -> Any:
        return name

    def offer(self, name: str, gen: Generation) -> None:
        w = self.workers.get(name)
        if w is not None and w.alive:
            w.offered.append(gen)

    def offers(self, name: str) -> list[int]:
        """The generation numbers offered to ``name``, in order."""
        return [g.number for g in self.workers[name].offered]

    def reports(self, names: list[str]) -> dict[str, WorkerReport | None]:
        out: dict[str, WorkerReport | None] = {}
        for name in names:
            w = self.workers.get(name)
            if w is None or not w.alive:
                out[name] = None
                continue
            gen = w.offered[-1]
            member = not gen.stop and w.gpu in gen.members
            status = WorkerStatus.RUNNING if member else WorkerStatus.DEPARTED
            digests = {gen.number: ("a", "a")}
            out[name] = WorkerReport(
                w.gpu, status, gen.number, self.step, 0.5, digests=digests, restored_step=self.step
            )
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

    def list_workers(self) -> list[str]:
        return sorted(n for n, w in self.workers.items() if w.alive)

    def list_named(self, prefix: str) -> list[str]:
        live = [n for n, w in self.workers.items() if w.alive] + list(self.replicas)
        return sorted(n for n in live if n.startswith(prefix))

    def live(self, job: str) -> dict[str, str]:
        """gpu -> name of ``job``'s live workers."""
        return {w.gpu: n for n, w in self.workers.items() if w.alive and f"|{job}|" in n}
