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

With ``--cache``, the node-local model cache instead (issue 23): AFE resizes, and two
services, each without and with ``--host-cache-gb``: the example service (echo, a
tiny MLP) and ``examples/runtime/big_service.py`` with a 200 MB weight matrix whose
full load reads the file from disk (page cache dropped) paced at 0.1 GB/s (one
stream from remote storage, an assumption) and copies it into torch; with the cache
its replica restores from the node's object store (one copy). Before the rounds one
request starts a replica on a FREE GPU (cold, in every mode), so that with the cache
the first reclaim already finds the model cached; each reclaim's start kind
(``ready``'s ``start``) and the replica's load time are read from the event log.

With ``--command``, the job's two ways to resize side by side (issue 46): AFE, the
example ElasticContext job (``regression.py``), against restart, the plain torchrun
script ``examples/runtime/ddp_train.py`` (it imports nothing from deepboot) as a
command job; a command job's pause is from the stop of its group to its rank 0's
first line after the restart (the event log's ``progressed``: its restored
checkpoint and re-formed group), an AFE job's from the offer to the new group formed.

    .venv/bin/python bench/reclaim.py                  # 20 reclaims per mode (~20 min)
    .venv/bin/python bench/reclaim.py --command --reclaims 10   # AFE vs a command job
    .venv/bin/python bench/reclaim.py --reclaims 5     # a quick look
    .venv/bin/python bench/reclaim.py --cache          # the model cache, 4 modes (~30 min)
    .venv/bin/python bench/reclaim.py --sleep          # a command service, evicted or asleep

With ``--sleep``, a command service (issue 47): the stand-in server
``examples/runtime/standin_server.py`` with ``STANDIN_GB`` GB of weights, whose cold
load reads them at ``STANDIN_LOAD_GBPS`` GB/s (one stream from remote storage, as the
large service's) and whose wake copies them back from its host buffer at
``STANDIN_WAKE_GBPS`` GB/s (a host-to-device copy over PCIe is 10-25 GB/s: this is
slower, an assumption that favours the cold start), without and with ``sleep`` and
``wake``: evicted, every reclaim is a cold start (a new process, the weights read
again); asleep, the process stays while its GPU is lent, and a reclaim wakes it. Each
request is an OpenAI-style completion through the proxy.
"""

from __future__ import annotations

import argparse
import json
import re
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

from deepboot.runtime.client.endpoint import connect  # noqa: E402
from deepboot.runtime.store.jobstore import EventRow, JobStore, LogKind  # noqa: E402
from deepboot.runtime.store.statedir import StateDir  # noqa: E402

BIG_MB = 200
"""The large service's weights, MB."""

BIG_FETCH_GBPS = 0.1
"""Its full load's remote-storage bandwidth, GB/s (an assumption: about 1 Gbit/s)."""

STANDIN_GB = 0.5
"""The stand-in server's weights, GB (``--sleep``)."""

STANDIN_LOAD_GBPS = 0.1
"""Its cold load's pace, GB/s: about 5 s for the weights."""

STANDIN_WAKE_GBPS = 2.0
"""Its wake's pace, GB/s (host memory to the "device")."""

CACHE_GB = 0.5
"""``--host-cache-gb`` of the modes with the cache (room for the 200 MB model)."""


@dataclass
class Mode:
    name: str
    flags: tuple[str, ...]
    service: str = "echo"  # or "big", or "standin" (--sleep)
    latency: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)  # the replica's load, seconds
    beyond: list[float] = field(default_factory=list)  # of it, past importing (the model)
    starts: list[str] = field(default_factory=list)  # its start: cold or host
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
    if formed and job.get("resize") == "restart" and not _progressed_after(state, last[-1].seq):
        return False  # a command job: its restart is over at its first progress
    return bool(formed) and all(g["service"] is None for g in doc["gpus"])


def _resize_after(state: Path, seq: int, shrink: bool) -> EventRow | None:
    """The first resize after entry ``seq`` that shrinks (or grows) the job."""
    for e in events(state):
        if e.seq > seq and e.kind is LogKind.RESIZED:
            fewer = len(e.detail["to"]) < len(e.detail["from"])
            if fewer == shrink:
                return e
    return None


def _progressed_after(state: Path, seq: int) -> EventRow | None:
    """A command job's first progress after entry ``seq`` (the end of its restart)."""
    for e in events(state):
        if e.seq > seq and e.kind is LogKind.PROGRESSED:
            return e
    return None


def _ready_after(state: Path, seq: int) -> EventRow | None:
    """The first replica's ``ready`` after entry ``seq``."""
    for e in events(state):
        if e.seq > seq and e.kind is LogKind.REPLICA and e.detail["op"] == "ready":
            return e
    return None


_LOADED = re.compile(
    r"loaded \((\w+) start\) in ([0-9.]+) s on \S+ \(([0-9.]+) s of it importing\)"
)


def beyond_imports(state: Path, service: str) -> float | None:
    """The latest replica load's seconds past importing (torch, the handler's module):
    the model's own part, a full load's or a restore's (the replica's log says)."""
    log = state / "logs" / f"service-{service}.log"
    found = _LOADED.findall(log.read_text()) if log.exists() else []
    if not found:
        return None
    _, total, imported = found[-1]
    return float(total) - float(imported)


def service_toml(mode: Mode, directory: Path) -> Path:
    """The mode's service file (echo, the large model, its weights made once, or the
    stand-in server, asleep when lent or not)."""
    path = directory / f"{mode.service}.toml"
    if mode.service == "standin":
        argv = [
            "python", str(EXAMPLES / "standin_server.py"), "--port", "{port}",
            "--model", "{model}", "--weights-gb", str(STANDIN_GB),
            "--load-gbps", str(STANDIN_LOAD_GBPS), "--wake-gbps", str(STANDIN_WAKE_GBPS),
        ]  # fmt: skip
        sleep = (
            'sleep = { method = "POST", path = "/sleep?level=1", timeout_s = 30 }\n'
            'wake = { method = "POST", path = "/wake_up", timeout_s = 60 }\n'
            if mode.name.endswith("asleep")
            else ""
        )
        path.write_text(
            'name = "standin"\nmodel = "standin-70b"\n'
            f"command = {json.dumps(argv)}\nmax_replicas = 1\nrequest_timeout_s = 300\n"
            f"concurrency = 4\n{sleep}"
        )
        return path
    if mode.service == "echo":
        handler, args = EXAMPLES / "echo_service.py", "delay_s = 0.02\n"
    else:
        sys.path.insert(0, str(EXAMPLES))
        from big_service import make_weights

        weights = directory.parent / "big-weights.npy"
        if not weights.exists():
            make_weights(weights, BIG_MB)
        handler = EXAMPLES / "big_service.py"
        args = f'weights = "{weights}"\nfetch_gbps = {BIG_FETCH_GBPS}\n'
    path.write_text(
        f'name = "{mode.service}"\nmodel = "{mode.service}-model"\n'
        f'handler = "{handler}:load"\nmax_replicas = 1\nrequest_timeout_s = 300\n'
        f"[args]\n{args}"
    )
    return path


def request(url: str, token: str, rid: str, service: str = "echo") -> float:
    path, body = f"/v1/{service}/infer", b'{"x": [1.0]}'
    if service == "standin":  # an OpenAI-style completion, through the proxy
        path, body = "/v1/standin/v1/completions", b'{"prompt": "hi", "max_tokens": 8}'
    req = urllib.request.Request(
        url + path,
        data=body,
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
        # DeepBoot's lending, as measured before the guarded default (whose SLO guard
        # keeps an idle replica, so the job never holds every GPU here).
        "--policy", "deepboot", *mode.flags,
    )  # fmt: skip
    try:
        cli(state, "serve", str(service_toml(mode, work / mode.name)))
        endpoint = connect(StateDir.at(state))  # checked before the token is sent
        url, token = endpoint.url, endpoint.token
        # A first replica on a FREE GPU, before the job: cold in every mode; with the
        # cache, its eviction for lending leaves the model in the node's cache.
        request(url, token, "warm-up", mode.service)
        job = work / mode.name / "bench.toml"
        if mode.name == "command":
            job.write_text(
                f'name = "bench"\ncommand = ["python", "{EXAMPLES / "ddp_train.py"}", '
                '"--checkpoint-dir", "{checkpoint_dir}", "--target-samples", "1000000000", '
                '"--batch-size", "32", "--sample-time", "0.001", "--checkpoint-every", "50"]\n'
                "min_workers = 1\nmax_workers = 4\nbatch_size = 32\n"
            )
        else:
            job.write_text(
                f'name = "bench"\nentry = "{EXAMPLES / "regression.py"}:train"\n'
                "min_workers = 1\nmax_workers = 4\nbatch_size = 32\nmax_batch_size = 512\n"
                "max_local_batch_size = 64\ncheckpoint_every = 50\n"
                "[args]\nloss_threshold = 1e-12\nsample_delay = 0.001\n"
            )
        cli(state, "submit", str(job))
        for i in range(reclaims):
            wait_for("the job on every GPU", lambda: settled(state), 600)
            before = events(state)[-1].seq
            latency = request(url, token, f"reclaim-{i}", mode.service)
            shrink = wait_for(
                "the shrink's new generation",
                lambda before=before: _resize_after(state, before, shrink=True),
                600,
            )
            took = [e for e in events(state) if e.seq > before and e.kind is LogKind.GPU]
            if not any(e.detail["op"] == "reclaim" for e in took):
                console.print(f"round {i}: no reclaim (skipped)")
                continue
            ready = wait_for(
                "the replica's ready", lambda before=before: _ready_after(state, before), 60
            )
            mode.latency.append(latency)
            mode.loads.append(float(ready.detail["load_seconds"]))
            mode.starts.append(str(ready.detail.get("start", "cold")))
            model_s = beyond_imports(state, mode.service)
            if model_s is not None:
                mode.beyond.append(model_s)
            mode.pause.append(_pause(state, shrink, mode))
            mode.steps_lost.append(int(shrink.detail["steps_lost"]))
            grow = wait_for(
                "the job to grow back",
                lambda after=shrink.seq: _resize_after(state, after, shrink=False),
                600,
            )
            mode.grow_pause.append(_pause(state, grow, mode))
            console.print(
                f"{mode.name} reclaim {i + 1}/{reclaims}: answer {latency:.2f} s "
                f"({mode.starts[-1]} start, load {mode.loads[-1]:.2f} s), job paused "
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


def _pause(state: Path, resize: EventRow, mode: Mode) -> float:
    """How long a resize stopped training: an AFE job's from the offer to the new
    group formed (``resized.seconds``); a command job's from the stop to its first
    progress after it (``progressed.seconds``)."""
    if mode.name != "command":
        return float(resize.detail["seconds"])
    done = wait_for(
        "the restart's first progress",
        lambda: _progressed_after(state, resize.seq),
        600,
    )
    return float(done.detail["seconds"])


def _p90(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(int(0.9 * len(ordered)), len(ordered) - 1)]:.2f}"


def _stats(values: list[float]) -> tuple[str, str]:
    if not values:
        return "-", "-"
    return f"{statistics.median(values):.2f}", f"{max(values):.2f}"


def cache_table(modes: list[Mode], console: Console) -> None:
    """The cache's figures: per mode the answer and the replica's load, medians, and
    per service the ratio of the medians without and with the cache."""
    table = Table(title="Reclaim: a request that needs a lent GPU back, to its answer")
    for col in ("service", "cache", "reclaims", "starts", "answer median s",
                "answer max s", "load median s", "load past imports median s",
                "job pause median s"):  # fmt: skip
        table.add_column(col)
    for m in modes:
        service, _, kind = m.name.partition("-")
        starts = ", ".join(f"{m.starts.count(k)} {k}" for k in ("cold", "host") if k in m.starts)
        table.add_row(
            service, "on" if kind == "host" else "off", str(len(m.latency)), starts,
            *_stats(m.latency), _stats(m.loads)[0], _stats(m.beyond)[0], _stats(m.pause)[0],
        )  # fmt: skip
    console.print(table)
    by_name = {m.name: m for m in modes}
    for service in ("echo", "big"):
        cold, host = by_name.get(f"{service}-cold"), by_name.get(f"{service}-host")
        if cold and host and cold.latency and host.latency:
            answer = statistics.median(host.latency) / statistics.median(cold.latency)
            load = statistics.median(host.loads) / statistics.median(cold.loads)
            model = (
                f", its part past imports {_ratio(host.beyond, cold.beyond):.2f}x"
                if host.beyond and cold.beyond
                else ""
            )
            console.print(
                f"{service}: with the cache / without, medians: answer {answer:.2f}x, "
                f"replica load {load:.2f}x{model} (target: answer <= 0.33x)"
            )


def sleep_table(modes: list[Mode], console: Console) -> None:
    """``--sleep``'s figures: per mode the answer and the replica's start, medians, and
    the ratio of the medians asleep / evicted (the target: at most a third)."""
    table = Table(title="Reclaim of a command service's GPU: request to answer")
    for col in ("service", "when lent", "reclaims", "starts", "answer median s",
                "answer p90 s", "answer max s", "replica start median s",
                "job pause median s"):  # fmt: skip
        table.add_column(col)
    for m in modes:
        starts = ", ".join(f"{m.starts.count(k)} {k}" for k in sorted(set(m.starts)))
        median, most = _stats(m.latency)
        table.add_row(
            m.service, m.name.partition("-")[2], str(len(m.latency)), starts, median,
            _p90(m.latency), most, _stats(m.loads)[0], _stats(m.pause)[0],
        )  # fmt: skip
    console.print(table)
    by = {m.name.partition("-")[2]: m for m in modes}
    cold, warm = by.get("evicted"), by.get("asleep")
    if cold and warm and cold.latency and warm.latency:
        console.print(
            f"asleep / evicted, medians: answer {_ratio(warm.latency, cold.latency):.2f}x, "
            f"replica start {_ratio(warm.loads, cold.loads):.2f}x (target: answer <= 0.33x)"
        )


def _ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(a) / statistics.median(b)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reclaims", type=int, default=20, help="reclaims per mode (>= 1)")
    ap.add_argument("--only", help="one mode only (afe, restart; with --cache: "
                    "echo-cold, echo-host, big-cold, big-host)")  # fmt: skip
    ap.add_argument(
        "--cache",
        action="store_true",
        help="the node-local model cache: echo and a 200 MB model, each without and "
        f"with --host-cache-gb {CACHE_GB:g} (AFE resizes)",
    )
    ap.add_argument(
        "--command",
        action="store_true",
        help="AFE (the ElasticContext example) against a command job (the plain "
        "torchrun script examples/runtime/ddp_train.py, resized by restart)",
    )
    ap.add_argument(
        "--sleep",
        action="store_true",
        help="a command service (the stand-in server, 0.5 GB of weights) evicted when "
        "its GPU is lent, against asleep (vLLM's sleep mode: woken at a reclaim)",
    )
    ap.add_argument(
        "--standby",
        action="store_true",
        help="every mode with 'deepboot up --standby-replicas': a replica starts in a "
        "process started ahead of need (imports done), not a new one",
    )
    ap.add_argument(
        "--cuda-devices",
        metavar="LIST",
        help="deepboot up's --cuda-devices: the cluster's 4 GPUs on these CUDA devices "
        "(bench/gpu_check.sh passes 0,1,2,3 on a machine with 4 or more)",
    )
    args = ap.parse_args(argv)
    if args.reclaims < 1:
        ap.error("--reclaims must be >= 1")
    console = Console(width=160)
    if args.cache:
        cached = ("--host-cache-gb", str(CACHE_GB))
        modes = [
            Mode(f"{svc}-{kind}", flags, service=svc)
            for svc in ("echo", "big")
            for kind, flags in (("cold", ()), ("host", cached))
        ]
    elif args.command:
        modes = [Mode("afe", ()), Mode("command", ())]
    elif args.sleep:
        modes = [Mode("standin-evicted", (), "standin"), Mode("standin-asleep", (), "standin")]
    else:
        modes = [Mode("afe", ()), Mode("restart", ("--no-afe",))]
    if args.standby:
        for m in modes:
            m.flags = (*m.flags, "--standby-replicas")
    if args.cuda_devices:
        for m in modes:
            m.flags = (*m.flags, "--cuda-devices", args.cuda_devices)
    if args.only:
        modes = [m for m in modes if m.name == args.only]
        if not modes:
            ap.error(f"--only {args.only}: no such mode")
    with tempfile.TemporaryDirectory(prefix="deepboot-reclaim-") as tmp:
        for mode in modes:
            run_mode(mode, args.reclaims, Path(tmp), console)
    if args.cache:
        cache_table(modes, console)
        return 0
    if args.sleep:
        sleep_table(modes, console)
        return 0
    table = Table(title="Reclaim: a request that needs a lent GPU, to its answer")
    for col in (
        "resize",
        "reclaims",
        "answer median s",
        "answer max s",
        "job pause median s",
        "job pause p90 s",
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
            _stats(m.pause)[0],
            _p90(m.pause),
            _stats(m.pause)[1],
            str(max(m.steps_lost, default=0)),
            _stats(lost)[0],
            _stats(m.grow_pause)[0],
        )
    console.print(table)
    if len(modes) == 2 and modes[0].latency and modes[1].latency:
        a, r = modes
        answer = statistics.median(r.latency) / statistics.median(a.latency)
        pause = statistics.median(r.pause) / statistics.median(a.pause)
        p90 = float(_p90(r.pause)) / float(_p90(a.pause))
        console.print(
            f"{r.name} / AFE, medians: answer {answer:.1f}x, job pause {pause:.1f}x "
            f"(p90 {p90:.1f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
