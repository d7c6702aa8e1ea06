"""Elastic workers as plain processes (no Ray): the tests play the controller.

Each process runs :class:`ElasticContext` with a tiny regression model and answers
the test through two queues: ``("offer", Generation)`` makes a generation the next
one, ``("report",)`` sends back the worker's :class:`WorkerReport`.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepboot.elastic.protocol import Generation, Restore, WorkerReport, WorkerStatus

CTX = mp.get_context("spawn")


def gen(
    tmp: Path,
    number: int,
    members: list[str],
    restore: Restore = Restore.MEMORY,
    stop: bool = False,
    after: int = 0,
    local_bsz: int = 8,
) -> Generation:
    return Generation(
        number,
        tuple(members),
        str(tmp / f"store-{number}"),
        local_bsz,
        1,
        1,
        restore=restore,
        checkpoint_path=str(tmp / "ckpt.pt"),
        after_generation=after,
        stop=stop,
    )


def _worker(wid: str, first: Generation, steps: int, delay: float, inbox: Any, outbox: Any) -> None:
    import torch

    from deepboot.elastic.context import Departed, ElasticContext

    torch.set_num_threads(1)
    ctx = ElasticContext(wid, first, collective_timeout=15.0, checkpoint_every=0)

    def serve() -> None:
        while True:
            msg = inbox.get()
            if msg[0] == "offer":
                ctx.offer(msg[1])
            elif msg[0] == "report":
                outbox.put(ctx.report())

    threading.Thread(target=serve, daemon=True).start()
    torch.manual_seed(int(wid))  # a different initial model per worker: rank 0 must win
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 4, generator=g)
    y = x @ torch.tensor([[1.0], [2.0], [-1.0], [0.5]])
    try:
        ctx.register(model, opt)
        while ctx.steps < steps:
            idx = ctx.next_batch(len(x))
            torch.nn.functional.mse_loss(model(x[idx]), y[idx]).backward()
            ctx.step(0.0)
            time.sleep(delay)
    except Departed:
        pass
    ctx.set_status(WorkerStatus.DONE if ctx.steps >= steps else ctx.report().status)
    while True:  # stay up to answer reports until the test is done
        time.sleep(1)


@dataclass
class Proc:
    wid: str
    process: Any
    inbox: Any
    outbox: Any

    def offer(self, g: Generation) -> None:
        self.inbox.put(("offer", g))

    def report(self) -> WorkerReport:
        self.inbox.put(("report",))
        return self.outbox.get(timeout=30)  # type: ignore[no-any-return]


def spawn(wid: str, first: Generation, steps: int = 400, delay: float = 0.01) -> Proc:
    inbox, outbox = CTX.Queue(), CTX.Queue()
    p = CTX.Process(target=_worker, args=(wid, first, steps, delay, inbox, outbox), daemon=True)
    p.start()
    return Proc(wid, p, inbox, outbox)


def wait_until(
    procs: list[Proc], ok: Callable[[WorkerReport], bool], timeout: float = 90.0
) -> dict[str, WorkerReport]:
    """Poll until every process's report satisfies ``ok``; returns the reports."""
    deadline = time.monotonic() + timeout
    while True:
        reports = {p.wid: p.report() for p in procs}
        if all(ok(r) for r in reports.values()):
            return reports
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; reports: {reports}")
        time.sleep(0.2)


def stop_all(procs: list[Proc]) -> None:
    for p in procs:
        if p.process.is_alive():
            p.process.kill()
        p.process.join(10)
    for p in procs:
        for q in (p.inbox, p.outbox):
            q.close()
    _ = queue  # (the module is used for its Empty type by callers)
