"""The runtime's controller at scale, in process (issue 49, item 4): its turn time with
1,000 jobs on 4,096 logical GPUs, and the router's requests per second at 200 services.

**The controller.** A real :class:`~deepboot.runtime.controller.wiring.Controller` (the
policy's control loop, the GPU ledger, the SQLite store in a temporary state
directory, the event log and its flushes) whose workers and replicas are in memory
(``tests/runtime/fake_actors.py``, as the in-process tests drive it: no Ray, no
processes), on a simulated clock. The cluster is ``--gpus / 8`` nodes of 8 GPUs
(4 per node below 64 GPUs), the last eighth of the nodes the inference pool (lent
to training while idle): 512 x 8 (64 of them inference) at the default size.
``--jobs`` elastic jobs (1 to 64 workers), each with a fitted
throughput model of its own (a ``profile`` fit, drawn as ``bench/ats_t_scale.py``
draws them, and a catalog application's gradient statistics), and ``--services``
services are submitted through the store; the first round places them (not timed).

Then ``--turns`` turns of the controller's loop (``Controller.turn``), each 0.25 s of
simulated time: a poll every 4th turn (a poll a second, ``deepboot up``'s default), a
tick every ``--interval`` simulated seconds (5: more rounds to time than ``deepboot
up``'s 60 would give; what a round costs does not depend on it), and between
them the events a busy cluster sends it, as the router and the workers would: a job
that finishes (and a new one submitted in its place, so that ``--jobs`` stay live),
inference arrivals (the router's ``Arrival`` and ``Received``), replicas loaded and
emptied (``Ready``, then ``Served``/``Answered`` and ``Idle``). A turn *with a round*
is one in which the training policy decided (a tick; a worker lost); the others are
*without a round*: those with a poll (every worker's report, the store's rows, the
flush of the whole state) and those with the router's messages only.

**The router.** The router's in-process path at ``--services`` services, one replica
each (its ``concurrency`` 4): a request goes through
:class:`~deepboot.runtime.http.infer.InferHandler`'s admission (the queue, the id,
the ``Pending`` with its deadlines, ``Received``) and
:class:`~deepboot.runtime.http.dispatch.Dispatcher`'s queue, slot and answer, on one
asyncio loop, to a stand-in replica that answers at once (a completed future, as a
finished Ray call); a stand-in controller answers each ``Arrival`` (a request queued
beyond the free slots of its service's active replicas, as when the replica emptied
and went idle) at once with the warm reuse the control loop would decide. Everything but the
HTTP parsing and the socket (bench/proxy.py measures those, through a real
cluster). ``--clients`` closed-loop clients spread over the services send
``--requests`` requests.

    .venv/bin/python bench/controller_scale.py            # 1,000 jobs, 4,096 GPUs, 200 services
                                                          # (~5 min on 2 loaded cores)
    .venv/bin/python bench/controller_scale.py --quick    # 100 jobs, 256 GPUs, 20 services
    .venv/bin/python bench/controller_scale.py --jobs 2000 --gpus 8192 --services 400
    .venv/bin/python bench/controller_scale.py --policy pollux --turns 200
    .venv/bin/python bench/controller_scale.py --profile  # cProfile's top functions per kind
    .venv/bin/python bench/controller_scale.py --no-recording   # what the loop's recording costs

Not a test: nothing fails on a wall-clock figure (tests/bench/test_controller_scale.py
runs the builder at a tiny size and checks what it did, not how fast).
"""

from __future__ import annotations

import os

# One BLAS thread: the arrays are small and threads only contend (see tests/conftest.py).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import concurrent.futures  # noqa: E402
import cProfile  # noqa: E402
import io  # noqa: E402
import pstats  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import deque  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from deepboot.core.cluster import ClusterSpec, Node, Pool  # noqa: E402
from deepboot.core.service import ServiceSpec  # noqa: E402
from deepboot.runtime import messages as rt  # noqa: E402
from deepboot.runtime.client.jobspec import JobSpec  # noqa: E402
from deepboot.runtime.controller.controller_settings import ControllerSettings  # noqa: E402
from deepboot.runtime.controller.wiring import Controller  # noqa: E402
from deepboot.runtime.store.jobstore import JobState  # noqa: E402
from deepboot.runtime.store.statedir import StateDir  # noqa: E402
from deepboot.world.settings import SharedCluster  # noqa: E402
from tests.runtime.fake_actors import FakeActors  # noqa: E402

STEP_S = 0.25
"""Simulated seconds per turn (the real loop wakes at least every poll, and at every
message the router posts)."""
CAPS = (1, 2, 4, 8, 16, 32, 64)
APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
ROUND, POLLED, MESSAGES = "with a round", "without: a poll", "without: messages only"


class SimClock:
    """The controller's clock: simulated seconds, moved by the bench."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class StandInRouter:
    """The router's side the controller calls (``RouterPort``), recorded: the bench
    plays the router's answers (``Ready``, ``Idle``) from what it was told."""

    url = "http://127.0.0.1:0"

    def __init__(self) -> None:
        self.started: deque[tuple[str, str, str, bool, str]] = deque()  # gpu, svc, name, cold, task
        self.starts = 0
        self.stops = 0

    def start_replica(
        self, gpu: str, service: str, name: str, handle: Any, cold: bool, task: str = ""
    ) -> None:
        self.started.append((gpu, service, name, cold, task))
        self.starts += 1

    def stop_replica(self, gpu: str) -> None:
        self.stops += 1

    def set_services(self, specs: Any, cold: Any = None) -> None:
        pass

    def restore_backoff(self, service: str, failures: int, seconds_left: float) -> None:
        pass

    def adopt_replica(self, gpu: str, service: str, name: str, handle: Any) -> None:
        pass

    def write_address(self, path: Path) -> None:
        pass

    def beat(self) -> None:
        pass

    def stop(self) -> None:
        pass


def cluster_of(gpus: int) -> ClusterSpec:
    """``gpus`` GPUs, 8 per node (4 below 64), the last eighth of the nodes (at least
    one) the inference pool."""
    per_node = 4 if gpus < 64 else 8
    nodes = max(gpus // per_node, 2)
    inference = max(nodes // 8, 1)
    return ClusterSpec(
        tuple(
            Node(i, per_node, Pool.INFERENCE if i >= nodes - inference else Pool.TRAINING)
            for i in range(nodes)
        )
    )


def job_spec(name: str, rng: np.random.Generator) -> JobSpec:
    """An elastic job with a fitted throughput model of its own (drawn as
    bench/ats_t_scale.py draws them) and a catalog application's gradient statistics."""
    fit = (
        float(rng.uniform(0.01, 0.05)),
        float(rng.uniform(2e-4, 2e-3)),
        float(rng.uniform(0.05, 0.3)),
        float(rng.uniform(1e-4, 3e-3)),
        float(rng.uniform(0.01, 0.05)),
        float(rng.uniform(1e-4, 1e-3)),
        float(rng.uniform(1.0, 3.0)),
    )
    cap = int(rng.choice(CAPS))
    return JobSpec(
        name,
        "m:f",
        min_workers=1,
        max_workers=cap,
        batch_size=128,
        max_batch_size=128 * cap,
        min_local_batch_size=32,
        max_local_batch_size=1024,
        application=str(rng.choice(APPS)),
        profile_fit=fit,
    )


@dataclass
class Serving:
    """A replica the bench plays the router for: loaded at ``ready_at``, emptied at
    ``idle_at`` (turn numbers)."""

    gpu: str
    service: str
    name: str
    ready_at: int
    idle_at: int


@dataclass
class ControllerBench:
    """The controller built at size, and the world around it the bench plays."""

    ctl: Controller
    fake: FakeActors
    router: StandInRouter
    clock: SimClock
    rng: np.random.Generator
    services: list[str]
    tmp: tempfile.TemporaryDirectory[str]
    next_job: int = 0
    next_request: int = 0
    turn_no: int = 0
    serving: list[Serving] = field(default_factory=list)
    finished_asked: int = 0
    arrivals: int = 0
    times: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)
    profiles: dict[str, pstats.Stats] = field(default_factory=dict)

    def submit(self) -> None:
        name = f"job{self.next_job:05d}"
        self.next_job += 1
        self.ctl.store.submit(job_spec(name, self.rng), now=self.clock())

    def close(self) -> None:
        self.ctl.store.close()
        self.tmp.cleanup()


def build(
    jobs: int,
    gpus: int,
    services: int,
    policy: str = "deepboot",
    seed: int = 0,
    interval: float = 5.0,
    poll: float = 1.0,
) -> ControllerBench:
    """The controller with fake actors at this size, its jobs and services submitted
    and placed by a first round and its generations formed (none of it timed)."""
    tmp = tempfile.TemporaryDirectory(prefix="deepboot-ctl-scale-")
    clock = SimClock()
    fake = FakeActors(clock=clock)
    settings = ControllerSettings(
        policy=policy, interval=interval, poll=poll, seed=seed, shared=SharedCluster()
    )
    state = StateDir.at(Path(tmp.name) / "state").ensure()
    ctl = Controller(state, settings, cluster_of(gpus), fake, clock=clock)
    router = StandInRouter()
    ctl.router.port = router  # it has every call of the RouterPort the controller makes
    bench = ControllerBench(
        ctl, fake, router, clock, np.random.default_rng(seed), [], tmp, times={}, cpu={}
    )
    for i in range(services):
        name = f"svc{i:03d}"
        spec = ServiceSpec(name, "m", handler="m:load", cold_start_s=2.0, slo_wait_s=1.0)
        ctl.store.register_service(spec, now=clock())
        bench.services.append(name)
    for _ in range(jobs):
        bench.submit()
    ctl.start()  # recovers (nothing), posts the first tick
    ctl.turn(polled=True)  # takes the services and submissions; the first round
    for _ in range(3):  # the first generations form (the fake workers obey at once)
        clock.t += poll
        ctl.turn(polled=True)
    return bench


def _inject(b: ControllerBench, polls_every: int) -> None:
    """What the router and the workers tell the controller before turn ``b.turn_no``."""
    n, rng, inbox = b.turn_no, b.rng, b.ctl.inbox
    now = b.clock()
    # The router's answers to the controller's starts: loaded next turn, emptied later.
    while b.router.started:
        gpu, service, name, _, _ = b.router.started.popleft()
        hold = int(rng.integers(2, 40))
        b.serving.append(Serving(gpu, service, name, n + 1, n + 1 + hold))
    keep = []
    for s in b.serving:
        if s.ready_at == n:
            inbox.put(rt.Ready(s.gpu, s.name, 2.0, 1.5, "cold", inflight=1))
        if s.idle_at == n:
            inbox.put(rt.Served(s.service, 0.5, now))
            inbox.put(rt.Answered(s.service, True, 0.2, now))
            inbox.put(rt.Idle(s.gpu, s.name))
        else:
            keep.append(s)
    b.serving = keep
    # Inference arrivals: a few requests a turn, each posted as the router posts one
    # that found no free replica.
    for _ in range(int(rng.poisson(2.0))):
        service = b.services[int(rng.integers(len(b.services)))] if b.services else ""
        if not service:
            break
        rid = f"r{b.next_request}"
        b.next_request += 1
        inbox.put(rt.Received(service, now))
        inbox.put(rt.Arrival(rid, service))
        b.arrivals += 1
    # A job finishes now and then (reported DONE at the next poll); a new one takes
    # its place, read from the store at that poll.
    if n % polls_every == 1:
        running = [j for j, rec in b.ctl.jobs.items() if rec.row.state is JobState.RUNNING]
        for _ in range(min(int(rng.poisson(1.0)), len(running))):
            job = running[int(rng.integers(len(running)))]
            if b.fake.work.get(job) != 0:
                b.fake.work[job] = 0  # its last step is done: its workers report DONE
                b.finished_asked += 1
                b.submit()


def run_turns(b: ControllerBench, turns: int, profile: bool = False) -> None:
    """``turns`` turns of the loop, each timed and sorted by kind into ``b.times``."""
    settings = b.ctl.settings
    polls_every = max(round(settings.poll / STEP_S), 1)
    for _ in range(turns):
        b.turn_no += 1
        b.clock.t += STEP_S
        _inject(b, polls_every)
        polled = b.turn_no % polls_every == 0
        rounds = b.ctl.driver.rounds
        prof = cProfile.Profile() if profile else None
        cpu0, t0 = time.process_time(), time.perf_counter()
        if prof is not None:
            prof.enable()
        b.ctl.turn(polled)
        if prof is not None:
            prof.disable()
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        kind = ROUND if b.ctl.driver.rounds > rounds else POLLED if polled else MESSAGES
        b.times.setdefault(kind, []).append(wall)
        b.cpu.setdefault(kind, []).append(cpu)
        if prof is not None:
            if kind in b.profiles:
                b.profiles[kind].add(prof)
            else:
                b.profiles[kind] = pstats.Stats(prof)


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


# -- the router ------------------------------------------------------------------------------


class _Done:
    """A finished Ray call's reference: ``future()`` is complete already."""

    def __init__(self, value: Any) -> None:
        self._value = value

    def future(self) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        fut.set_result(self._value)
        return fut


class _Method:
    def __init__(self, value: Any) -> None:
        self.value = value
        self.calls = 0

    def remote(self, *args: Any) -> _Done:
        self.calls += 1
        return _Done(self.value)


class StandInReplica:
    """A replica's actor handle that answers every call at once."""

    def __init__(self) -> None:
        self.pid = _Method(1)
        self.load = _Method({"seconds": 0.0, "start": "cold"})
        self.infer = _Method({"y": [1.0]})


class StandInControllerInbox(rt.Inbox):
    """The router's inbox, read by a stand-in controller: an ``Arrival`` (a request
    that found its service's replica emptied and deactivated) is answered at once
    with the warm reuse the control loop would decide; every message is counted."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}
        self.reuse: Any = None  # (service, task) -> None, set once the router is built

    def put(self, msg: rt.Message) -> None:
        kind = type(msg).__name__
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if isinstance(msg, rt.Arrival) and self.reuse is not None:
            self.reuse(msg.service, msg.task)


@dataclass
class RouterResult:
    services: int
    clients: int
    requests: int
    seconds: float
    cpu_seconds: float
    statuses: dict[int, int]
    messages: dict[str, int]
    latencies: list[float]

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


def router_bench(services: int, requests: int, clients: int, concurrency: int = 4) -> RouterResult:
    """``requests`` requests through the router's in-process path (see the module
    docstring) at ``services`` services, from ``clients`` closed-loop clients."""
    from deepboot.runtime.http.router import Router
    from deepboot.runtime.prometheus_metrics import Metrics

    inbox = StandInControllerInbox()
    router = Router(inbox, Metrics(), token="ab" * 32)
    dispatcher, handler = router.dispatcher, router.infer
    names = [f"svc{i:03d}" for i in range(services)]
    specs = {
        n: ServiceSpec(n, "m", handler="m:load", concurrency=concurrency, queue_bound=1024)
        for n in names
    }
    gpu_of = {n: f"{1 + i // 8}.{i % 8}" for i, n in enumerate(names)}
    statuses: dict[int, int] = {}
    latencies: list[float] = []

    async def main() -> float:
        dispatcher.loop = asyncio.get_running_loop()
        dispatcher.set_services(specs, {})

        def reuse(service: str, task: str) -> None:
            gpu = gpu_of[service]
            rep = dispatcher.replicas[gpu]
            # As the controller's warm reuse: scheduled on the loop, as Router.call does.
            dispatcher.loop.call_soon(  # type: ignore[union-attr]
                dispatcher.start_replica, gpu, service, rep.name, rep.handle, False, task
            )

        for n in names:
            dispatcher.start_replica(gpu_of[n], n, f"r|{n}|{gpu_of[n]}|1", StandInReplica(),
                                     cold=True, task="")  # fmt: skip
        while not all(r.ready for r in dispatcher.replicas.values()):
            await asyncio.sleep(0.001)
        inbox.reuse = reuse
        counter = iter(range(requests))

        async def client(c: int) -> None:
            service = names[c % len(names)]
            body = {"x": [1.0]}
            for i in counter:
                rid = f"q{i}"
                began = time.perf_counter()
                # InferHandler.handle, but the HTTP: admission, the id taken (as
                # read_body takes it), the Pending, Received, the queue, the answer.
                q = handler.admit_queue(service)
                full = handler.full(q, rid)
                if full is not None:
                    statuses[full.status] = statuses.get(full.status, 0) + 1
                    continue
                dispatcher.ids.add(rid)
                p = handler.pending(q, rid, body)
                inbox.put(rt.Received(service, time.time()))
                dispatcher.enqueue(p)
                answer = await asyncio.wait_for(
                    asyncio.shield(p.future), p.deadline - time.monotonic() + 1.0
                )
                latencies.append(time.perf_counter() - began)
                statuses[answer.status] = statuses.get(answer.status, 0) + 1

        t0 = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        return time.perf_counter() - t0

    cpu0 = time.process_time()
    seconds = asyncio.run(main())
    return RouterResult(
        services, clients, requests, seconds, time.process_time() - cpu0, statuses,
        dict(inbox.counts), latencies,
    )  # fmt: skip


# -- the report ------------------------------------------------------------------------------


def turn_table(b: ControllerBench, title: str) -> Table:
    table = Table(title=title)
    for col in ("turns", "count", "median ms", "p99 ms", "max ms", "CPU median ms", "CPU p99 ms"):
        table.add_column(col, justify="right")
    without = [t for k in (POLLED, MESSAGES) for t in b.times.get(k, [])]
    without_cpu = [t for k in (POLLED, MESSAGES) for t in b.cpu.get(k, [])]
    rows = [
        (ROUND, b.times.get(ROUND, []), b.cpu.get(ROUND, [])),
        ("without a round (all)", without, without_cpu),
        (POLLED, b.times.get(POLLED, []), b.cpu.get(POLLED, [])),
        (MESSAGES, b.times.get(MESSAGES, []), b.cpu.get(MESSAGES, [])),
    ]
    for name, xs, cs in rows:
        ms = [x * 1e3 for x in xs]
        cms = [c * 1e3 for c in cs]
        table.add_row(
            name,
            str(len(xs)),
            f"{pct(ms, 50):.1f}",
            f"{pct(ms, 99):.1f}",
            f"{max(ms) if ms else float('nan'):.1f}",
            f"{pct(cms, 50):.1f}",
            f"{pct(cms, 99):.1f}",
        )
    return table


def profile_text(stats: pstats.Stats, top: int) -> str:
    out = io.StringIO()
    stats.stream = out  # type: ignore[attr-defined]
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 jobs, 256 GPUs, 20 services")
    parser.add_argument("--jobs", type=int, help="live jobs (default 1000)")
    parser.add_argument("--gpus", type=int, help="logical GPUs (default 4096)")
    parser.add_argument("--services", type=int, help="services (default 200)")
    parser.add_argument("--policy", default="deepboot", help="training policy (deepboot up's)")
    parser.add_argument("--turns", type=int, help="timed turns (default 200; quick 300)")
    parser.add_argument("--interval", type=float, default=5.0, help="simulated s between ticks")
    parser.add_argument("--requests", type=int, help="router requests (default 20000)")
    parser.add_argument(
        "--clients", type=int, help="closed-loop clients (default 4 per service: its concurrency)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="cProfile each kind of turn")
    parser.add_argument("--top", type=int, default=20, help="functions listed per profile")
    parser.add_argument(
        "--no-recording",
        action="store_true",
        help="without the loop's recording (deepboot replay's; always on in deepboot up): "
        "what it costs",
    )
    parser.add_argument("--no-router", action="store_true", help="the controller only")
    parser.add_argument("--no-controller", action="store_true", help="the router only")
    args = parser.parse_args()
    jobs = args.jobs or (100 if args.quick else 1000)
    gpus = args.gpus or (256 if args.quick else 4096)
    services = args.services or (20 if args.quick else 200)
    turns = args.turns or (300 if args.quick else 200)
    requests = args.requests or (4000 if args.quick else 20000)
    clients = args.clients or 4 * services
    console = Console(width=max(Console().width, 110))
    cluster = cluster_of(gpus)
    inf = sum(n.gpus for n in cluster.nodes if n.pool is Pool.INFERENCE)
    shape = f"{cluster.num_nodes} nodes x {cluster.nodes[0].gpus} GPUs ({inf} inference)"
    if not args.no_controller:
        t0 = time.perf_counter()
        b = build(jobs, gpus, services, args.policy, args.seed, args.interval)
        built = time.perf_counter() - t0
        if args.no_recording:
            b.ctl.driver.observe = None
        try:
            run_turns(b, turns, profile=args.profile)
            running = sum(r.row.state is JobState.RUNNING for r in b.ctl.jobs.values())
            title = (
                f"Controller turns: {len(b.ctl.jobs)} jobs ({running} running), {shape}, "
                f"{services} services, policy {args.policy}, a tick every {args.interval:g} "
                "simulated s, a poll every 1 s" + (", no recording" if args.no_recording else "")
            )
            console.print(turn_table(b, title))
            console.print(
                f"built and placed in {built:.1f} s; {b.ctl.driver.rounds} rounds in all; "
                f"{b.finished_asked} jobs finished (as many submitted), {b.arrivals} "
                f"arrivals, {b.router.starts} replica starts; "
                f"{len(b.fake.workers)} workers created in all"
            )
            if args.profile:
                for kind, stats in b.profiles.items():
                    console.rule(f"cProfile: turns {kind} ({len(b.times[kind])})")
                    print(profile_text(stats, args.top))
        finally:
            b.close()
    if not args.no_router:
        r = router_bench(services, requests, clients)
        table = Table(title=f"Router, in process: {services} services, one replica each")
        for col in ("clients", "requests", "seconds", "req/s", "CPU s", "p50 ms", "p99 ms"):
            table.add_column(col, justify="right")
        lat = [x * 1e3 for x in r.latencies]
        table.add_row(
            str(r.clients), str(r.requests), f"{r.seconds:.2f}", f"{r.per_second:,.0f}",
            f"{r.cpu_seconds:.2f}", f"{statistics.median(lat):.2f}", f"{pct(lat, 99):.2f}",
        )  # fmt: skip
        console.print(table)
        console.print(f"answers {dict(sorted(r.statuses.items()))}; messages {r.messages}")


if __name__ == "__main__":
    main()
