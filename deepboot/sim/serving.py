"""Inference tasks in the simulator: placement at arrival, replicas' lifecycle, the queue.

A task is placed the moment it arrives by the configured inference policy (ATS-I or
a variant, through :class:`~deepboot.scheduler.inference.InferenceScheduler`):

* warm reuse of a PROTECT or SLEEP replica of its service starts it at once
  (PROTECT: hit count + 1; SLEEP: hit count reset to 0);
* a cold start (a FREE GPU, an evicted SLEEP replica of another service, or a GPU
  reclaimed from training) starts it after the model's start-up time.

The GPU is RUNNING from the placement (cold start included) until the task ends,
then PROTECT for ``protect_time(hits)``, then SLEEP. A task no GPU can take waits in
a FIFO queue, retried whenever a GPU may have become available.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from deepboot.core.cluster import ClusterSpec
from deepboot.core.gpu import GpuState
from deepboot.core.jobs import InferenceTaskSpec
from deepboot.core.state import InferenceState, JobView
from deepboot.policies.inference import InferencePlacement, PlaceAction
from deepboot.policies.lending import ServiceLoad
from deepboot.policies.lifecycle import LifecycleConfig, protect_time
from deepboot.scheduler.events import Event, EventKind
from deepboot.scheduler.inference import InferenceScheduler
from deepboot.sim.gpus import GpuBoard, GpuId, SimGpu
from deepboot.sim.metrics import InferenceRecord

Push = Callable[[float, Event], None]
"""Schedule an event: ``push(at, event)``."""

Reclaim = Callable[[str, Sequence[int], float], None]
"""``reclaim(job, nodes, now)``: job ``job`` just lost one GPU on each of ``nodes``."""


class SimTask:
    """One inference task inside the simulator (mutable, private to ``deepboot.sim``).

    Attributes:
        spec: The task as submitted.
        gpu: Its GPU once placed.
        start: When it starts serving (after a cold start), once placed.
        end: When it ends, once placed.
        cold: Whether it needed a new replica.
        done: Its end has been handled.
    """

    __slots__ = ("spec", "gpu", "start", "end", "cold", "done")

    def __init__(self, spec: InferenceTaskSpec) -> None:
        self.spec = spec
        self.gpu: SimGpu | None = None
        self.start: float | None = None
        self.end: float | None = None
        self.cold = False
        self.done = False

    def record(self) -> InferenceRecord:
        s = self.spec
        return InferenceRecord(
            name=s.name,
            service=s.service,
            model=s.model,
            submit=s.submit_time,
            start=self.start,
            end=self.end if self.done else None,
            cold=self.cold,
            delay=None if self.start is None else self.start - s.submit_time,
        )


class Serving:
    """The inference side of one simulation run.

    Args:
        tasks: Every inference task, in arrival order.
        cluster: The cluster.
        board: The GPUs (shared with the training side).
        scheduler: Places each task.
        lifecycle: Protect-time rule.
        cold_start: Start-up seconds of a new replica of a model.
        lending: Whether training may hold inference-pool GPUs (passed to the policy).
        rng: The run's generator, passed to the policy.
        push: Schedules this side's events.
        reclaim: Told about every GPU taken back from a training job.
        job_views: The active training jobs, for the policy's reclaim choice.

    Attributes:
        tasks: Name -> task.
        reclaim_times: Time of every GPU taken back from training.
    """

    def __init__(
        self,
        tasks: Sequence[InferenceTaskSpec],
        cluster: ClusterSpec,
        board: GpuBoard,
        scheduler: InferenceScheduler,
        lifecycle: LifecycleConfig,
        cold_start: Callable[[str], float],
        lending: bool,
        rng: np.random.Generator,
        push: Push,
        reclaim: Reclaim,
        job_views: Callable[[], tuple[JobView, ...]],
    ) -> None:
        self.tasks: dict[str, SimTask] = {t.name: SimTask(t) for t in tasks}
        self._order = [self.tasks[t.name] for t in tasks]
        self.cluster = cluster
        self.board = board
        self.scheduler = scheduler
        self.lifecycle = lifecycle
        self._cold_start = cold_start
        self.lending = lending
        self._rng = rng
        self._push = push
        self._reclaim = reclaim
        self._job_views = job_views
        self._waiting: list[SimTask] = []
        self._arrivals: dict[str, deque[float]] = {}
        self._runs: dict[str, deque[tuple[float, float]]] = {}
        self.reclaim_times: list[float] = []
        self.finished = 0

    def schedule_arrivals(self) -> None:
        """Push every task's arrival event."""
        for task in self._order:
            self._push(task.spec.submit_time, Event(EventKind.INFERENCE_ARRIVAL, task.spec.name))

    @property
    def all_done(self) -> bool:
        """Every task has finished."""
        return self.finished == len(self._order)

    def waiting(self) -> tuple[str, ...]:
        """Names of the tasks queued for a GPU, oldest first."""
        return tuple(t.spec.name for t in self._waiting)

    def records(self) -> tuple[InferenceRecord, ...]:
        """One record per task, in arrival order."""
        return tuple(t.record() for t in self._order)

    # -- events ----------------------------------------------------------------------

    def arrive(self, name: str, now: float) -> None:
        """A task arrives: place it now, or queue it behind the waiting ones."""
        task = self.tasks[name]
        self._arrivals.setdefault(task.spec.service, deque()).append(now)
        if not self._try(task, now):
            self._waiting.append(task)

    def service_loads(self, now: float, window_s: float) -> dict[str, ServiceLoad]:
        """Each service's load over ``(now - window_s, now]``, from the past only:
        arrivals per second, and the mean run time of the tasks that finished
        (services with no arrival in the window are left out)."""
        loads: dict[str, ServiceLoad] = {}
        since = now - window_s
        for service, times in self._arrivals.items():
            while times and times[0] <= since:
                times.popleft()
            runs = self._runs.get(service, deque())
            while runs and runs[0][0] <= since:
                runs.popleft()
            if times:
                mean = sum(d for _, d in runs) / len(runs) if runs else 0.0
                loads[service] = ServiceLoad(len(times) / window_s, mean)
        return loads

    def finish(self, name: str, now: float) -> None:
        """A task ends: its replica goes RUNNING -> PROTECT (-> SLEEP at once when the
        protect time is 0) and waiting tasks are retried."""
        task = self.tasks[name]
        gpu = task.gpu
        assert gpu is not None and gpu.state is GpuState.RUNNING
        task.done = True
        self.finished += 1
        if task.start is not None:
            self._runs.setdefault(task.spec.service, deque()).append((now, now - task.start))
        board = self.board
        hold = protect_time(gpu.hits, self.lifecycle)
        board.move(gpu, GpuState.PROTECT)
        gpu.protect_until = now + hold
        board.touch(gpu)
        if hold > 0:
            self._push(
                now + hold, Event(EventKind.PROTECT_EXPIRED, seq=gpu.version, gpu=gpu.gpu_id)
            )
        else:
            self._sleep(gpu)
        self.retry(now)

    def expire(self, gpu_id: GpuId, seq: int, now: float) -> None:
        """A protect time ends: PROTECT -> SLEEP, unless the replica changed since."""
        gpu = self.board.get(gpu_id)
        if gpu.version != seq or gpu.state is not GpuState.PROTECT:
            return
        self._sleep(gpu)
        self.retry(now)

    def retry(self, now: float) -> None:
        """Retry the waiting tasks in FIFO order; those still without a GPU stay queued.

        A failed attempt changes nothing, so once a task of a service finds no GPU,
        later tasks of that service in the same pass would not either: they are
        skipped.
        """
        if not self._waiting:
            return
        failed: set[str] = set()
        still: list[SimTask] = []
        for task in self._waiting:
            service = task.spec.service
            if service in failed or not self._try(task, now):
                failed.add(service)
                still.append(task)
        self._waiting = still

    # -- placement -------------------------------------------------------------------

    def _try(self, task: SimTask, now: float) -> bool:
        state = InferenceState(
            now, self.cluster, self.board.views(), self._job_views(), self.lending
        )
        placement = self.scheduler.place(state, task.spec.service, self._rng)
        if placement is None:
            return False
        self._apply(task, placement, now)
        return True

    def _apply(self, task: SimTask, p: InferencePlacement, now: float) -> None:
        """Carry out a validated placement: reclaims, evictions, then the task's GPU."""
        board = self.board
        lost: dict[str, list[int]] = {}
        for gpu_id, job in p.reclaims:
            new = GpuState.RUNNING if gpu_id == p.gpu else GpuState.FREE
            board.take_from_job(board.get(gpu_id), new)
            lost.setdefault(job, []).append(gpu_id[0])
            self.reclaim_times.append(now)
        for job, nodes in lost.items():
            self._reclaim(job, nodes, now)
        for gpu_id in p.evicts:
            if gpu_id != p.gpu:
                board.move(board.get(gpu_id), GpuState.FREE)
                board.evictions += 1
        gpu = board.get(p.gpu)
        hits = gpu.hits + 1 if p.action is PlaceAction.WARM_PROTECT else 0
        if p.action is PlaceAction.COLD_EVICT:
            board.evictions += 1
        if gpu.state is not GpuState.RUNNING:  # a reclaimed GPU is RUNNING already
            board.move(gpu, GpuState.RUNNING)
        gpu.service = task.spec.service
        gpu.hits = hits
        board.touch(gpu)
        cold = not p.action.warm
        task.gpu = gpu
        task.cold = cold
        task.start = now + (self._cold_start(task.spec.model) if cold else 0.0)
        task.end = task.start + task.spec.duration
        self._push(task.end, Event(EventKind.INFERENCE_DONE, task.spec.name))

    def _sleep(self, gpu: SimGpu) -> None:
        """PROTECT -> SLEEP; the hit count resets."""
        self.board.move(gpu, GpuState.SLEEP)
        gpu.hits = 0
        self.board.touch(gpu)
