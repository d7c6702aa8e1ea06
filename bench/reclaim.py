"""Reclaim latency: from a request that needs a lent GPU back to its answer, with the
job that gives the GPU up resized by AFE (keep-alive) or by checkpoint-restart.

For each resize mode, one real local cluster (1 training + 1 inference node x 2
logical GPUs, torch on the CPU), one service (``examples/runtime/echo_service.py``,
at most one replica, 20 ms per request) and one elastic job
(``examples/runtime/regression.py``, up to 4 workers, never reaching its loss). Each
round:

1. wait until the job holds every GPU (both inference GPUs lent, its generation
   formed) and the service has no replica (its GPU was lent);
2. send one request: ATS-I finds no replica, no FREE GPU, and reclaims a lent GPU;
   the job shrinks; the replica starts cold on that GPU and answers;
3. the replica idles (PROTECT 1.5 s, then SLEEP), the next round (2 s) lends its GPU
   again and the job grows back.

Measured per reclaim: the request's wait for its answer (client side), the job's
pause (the shrink's ``seconds`` in the event log: from the new generation's offer to
its forming on every member), and the steps it lost (restored from an older state).

    .venv/bin/python bench/reclaim.py                  # 20 reclaims per mode (~20 min)
    .venv/bin/python bench/reclaim.py --reclaims 5     # a quick look
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "runtime"
sys.path.insert(0, str(REPO))

from runtime_cli import cli, wait_for  # noqa: E402

from deepboot.runtime.endpoint import connect  # noqa: E402
from deepboot.runtime.statedir import StateDir  # noqa: E402
from deepboot.runtime.store import EventRow, JobStore, LogKind  # noqa: E402


@dataclass
class Mode:
    name: str
    flags: tuple[str, ...]
    latency: list[float] = field(default_factory=list)
    pause: list[float] = field(default_factory=list)
    steps_lost: list[int] = field(default_factory=list)
    grow_pause: list[float] = field(default_factory=list)
    step_time: float = 0.0


def events(state: Path) -> list[EventRow]:
    store = JobStore(state / "deepboot.db")
    try:
        return store.events()
    finally:
        store.close()


def status(state: Path) -> dict[str, Any]:
    return json.loads(cli(state, "status", "--json"))  # type: ignore[no-any-return]


def settled(state: Path) -> bool:
    """The job holds all 4 GPUs in a formed generation; the service has no replica."""
    doc = status(state)
    [job] = doc["jobs"]
    held = {g["gpu"] for g in doc["gpus"] if g["holder"] == "bench"}
    if len(held) != 4 or set(job["workers"]) != held:
        return False
    last = [e for e in events(state) if e.kind in (LogKind.STARTED, LogKind.RESIZED)]
    formed = last and set(last[-1].detail.get("to", last[-1].detail.get("workers"))) == held
    return bool(formed) and all(g["service"] is None for g in doc["gpus"])


def _resize_after(state: Path, seq: int, shrink: bool) -> EventRow | None:
    """The first resize after entry ``seq`` that shrinks (or grows) the job."""
    for e in events(state):
        if e.seq > seq and e.kind is LogKind.RESIZED:
            fewer = len(e.detail["to"]) < len(e.detail["from"])
            if fewer == shrink:
                return e
    return None


def request(url: str, token: str, rid: str) -> float:
    req = urllib.request.Request(
        f"{url}/v1/echo/infer",
        data=b'{"x": [1.0]}',
        headers={
            "X-Request-Id": rid,
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
        },
        method="POST",
    )
    started = time.monotonic()
    with urllib.request.urlopen(req, timeout=300) as r:
        r.read()
        if r.status != 200:
            raise RuntimeError(f"request {rid}: HTTP {r.status}")
    return time.monotonic() - started


def run_mode(mode: Mode, reclaims: int, work: Path, console: Console) -> None:
    state = work / mode.name / "state"
    cli(
        state, "up", "--training-nodes", "1", "--inference-nodes", "1", "--gpus-per-node",
        "2", "--interval", "2", "--poll", "0.3", "--protect-factor", "0.05",
        "--http-port", "0", "--collective-timeout", "15", "--param", "restart_delay=2",
        *mode.flags,
    )  # fmt: skip
    try:
        service = work / mode.name / "echo.toml"
        service.write_text(
            f'name = "echo"\nmodel = "tiny-mlp"\nhandler = "{EXAMPLES / "echo_service.py"}:load"\n'
            "max_replicas = 1\nrequest_timeout_s = 300\n[args]\ndelay_s = 0.02\n"
        )
        cli(state, "serve", str(service))
        job = work / mode.name / "bench.toml"
        job.write_text(
            f'name = "bench"\nentry = "{EXAMPLES / "regression.py"}:train"\n'
            "min_workers = 1\nmax_workers = 4\nbatch_size = 32\nmax_batch_size = 512\n"
            "max_local_batch_size = 64\ncheckpoint_every = 50\n"
            "[args]\nloss_threshold = 1e-12\nsample_delay = 0.001\n"
        )
        cli(state, "submit", str(job))
        endpoint = connect(StateDir.at(state))  # checked before the token is sent
        url, token = endpoint.url, endpoint.token
        for i in range(reclaims):
            wait_for("the job on every GPU", lambda: settled(state), 600)
            before = events(state)[-1].seq
            latency = request(url, token, f"reclaim-{i}")
            shrink = wait_for(
                "the shrink's new generation",
                lambda before=before: _resize_after(state, before, shrink=True),
                600,
            )
            took = [e for e in events(state) if e.seq > before and e.kind is LogKind.GPU]
            if not any(e.detail["op"] == "reclaim" for e in took):
                console.print(f"round {i}: no reclaim (skipped)")
                continue
            mode.latency.append(latency)
            mode.pause.append(float(shrink.detail["seconds"]))
            mode.steps_lost.append(int(shrink.detail["steps_lost"]))
            grow = wait_for(
                "the job to grow back",
                lambda after=shrink.seq: _resize_after(state, after, shrink=False),
                600,
            )
            mode.grow_pause.append(float(grow.detail["seconds"]))
            console.print(
                f"{mode.name} reclaim {i + 1}/{reclaims}: answer {latency:.2f} s, job paused "
                f"{mode.pause[-1]:.2f} s, {mode.steps_lost[-1]} steps lost; grew back in "
                f"{mode.grow_pause[-1]:.2f} s"
            )
        rows = JobStore(state / "deepboot.db")
        [row] = rows.jobs()
        model = json.loads(row.model)
        rows.close()
        full = [p for p in model.get("profile", []) if p[1] == 4]
        if full:
            mode.step_time = sum(p[5] for p in full) / sum(p[3] for p in full)
    finally:
        subprocess.run(
            [sys.executable, "-m", "deepboot.cli.main", "down", "--state-dir", str(state)],
            capture_output=True,
            cwd=REPO,
            timeout=300,
        )


def _stats(values: list[float]) -> tuple[str, str]:
    if not values:
        return "-", "-"
    return f"{statistics.median(values):.2f}", f"{max(values):.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reclaims", type=int, default=20, help="reclaims per mode (>= 1)")
    ap.add_argument("--only", choices=["afe", "restart"], help="one mode only")
    args = ap.parse_args(argv)
    if args.reclaims < 1:
        ap.error("--reclaims must be >= 1")
    console = Console(width=160)
    modes = [Mode("afe", ()), Mode("restart", ("--no-afe",))]
    if args.only:
        modes = [m for m in modes if m.name == args.only]
    with tempfile.TemporaryDirectory(prefix="deepboot-reclaim-") as tmp:
        for mode in modes:
            run_mode(mode, args.reclaims, Path(tmp), console)
    table = Table(title="Reclaim: a request that needs a lent GPU, to its answer")
    for col in (
        "resize",
        "reclaims",
        "answer median s",
        "answer max s",
        "job pause median s",
        "job pause max s",
        "steps lost (max)",
        "training time lost / reclaim s",
        "grow back median s",
    ):
        table.add_column(col)
    for m in modes:
        lost = [p + s * m.step_time for p, s in zip(m.pause, m.steps_lost, strict=True)]
        table.add_row(
            m.name,
            str(len(m.latency)),
            *_stats(m.latency),
            *_stats(m.pause),
            str(max(m.steps_lost, default=0)),
            _stats(lost)[0],
            _stats(m.grow_pause)[0],
        )
    console.print(table)
    if len(modes) == 2 and modes[0].latency and modes[1].latency:
        a, r = modes
        answer = statistics.median(r.latency) / statistics.median(a.latency)
        pause = statistics.median(r.pause) / statistics.median(a.pause)
        console.print(f"restart / AFE, medians: answer {answer:.1f}x, job pause {pause:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
