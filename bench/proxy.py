"""What deepboot's proxy route costs: the stand-in model server called directly
against the same server called through deepboot's endpoint, in one run, with the
same client.

**The two paths.** *direct*: a stand-in server (``examples/runtime/standin_server.py``)
this benchmark starts itself on a loopback port. *deepboot*: a local cluster (``deepboot
up``: 1 training + 1 inference node x 1 logical GPU, ``--no-lending``, so nothing ever
takes the replica's GPU), the same server as a command service (``deepboot serve``:
one replica, its ``concurrency`` the client's), and every request sent to
``http://HOST:PORT/v1/standin/v1/completions`` with deepboot's bearer token: the
proxy route forwards it to the replica's ``/v1/completions`` and passes the answer
back as the server writes it.

**The client.** One aiohttp session per run, ``--concurrency`` workers in a closed
loop (each sends its next request when its last is answered) until ``--requests``
requests are answered; the same code for both paths (only the URL and the token
header differ). A warm-up of its own (``--warmup`` requests, not measured) opens the
connections and, through deepboot, wakes the replica first.

**Two workloads.** *small*: a non-streamed completion of one token (the proxy's
per-request cost, nearly nothing else). *stream*: a streamed completion of
``--stream-tokens`` tokens (server-sent events, no delay between tokens), checked
chunk by chunk (every token and the ``[DONE]`` must arrive).

**Measured**, per workload and path: requests per second (answered / wall time),
p50 and p99 latency (request sent to its answer's end; for *stream* also the first
chunk's arrival, TTFT), the added latency through deepboot (the p50 and p99
differences), and the CPU seconds per request of the client (this process), the
server (the stand-in process: the direct one, or the replica's, whose pid its
``/stats`` names) and, through deepboot, the controller process (its pid from
``STATE_DIR/controller.pid``; the endpoint and the proxy run there): user + system
time from ``/proc/<pid>/stat`` before and after the run. ``--rounds`` alternates the
order (direct first, then deepboot first, ...) and pools the rounds.

All processes share this machine's cores: on a small machine the client, the
server and the controller compete for them, so requests per second through deepboot
is lower partly because there is one more busy process; the CPU seconds per request
say what each process spends whatever the machine.

It stops what it started (the server process, the cluster by ``deepboot down
--state-dir``) on every exit, Ctrl-C and SIGTERM included.

    .venv/bin/python bench/proxy.py                          # both paths, ~2 min
    .venv/bin/python bench/proxy.py --requests 500 --rounds 1   # a quick look
    .venv/bin/python bench/proxy.py --direct-only            # the server alone, no cluster
    .venv/bin/python bench/proxy.py --out proxy.json --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
SERVER = REPO / "examples" / "runtime" / "standin_server.py"
sys.path.insert(0, str(REPO))

from runtime_cli import cli, wait_for  # noqa: E402

from deepboot.runtime.client.endpoint import connect  # noqa: E402
from deepboot.runtime.store.statedir import StateDir  # noqa: E402

SERVICE = "standin"
MODEL = "standin-bench"
WEIGHTS_GB = 0.01
"""The server's weights: small (this measures the request path, not the load)."""

IDLE_S = 5.0
"""Seconds the processes of the deepboot path are watched at idle, before the runs."""

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime: fields 14, 15


@dataclass
class Run:
    """One measured run: one workload on one path."""

    path: str
    requests: int = 0
    errors: int = 0
    first_error: str = ""
    wall_s: float = 0.0
    latency_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    cpu_s: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds


@dataclass
class Target:
    """Where a path's requests go, and whose CPU it counts."""

    path: str  # "direct" or "deepboot"
    url: str  # the completions URL
    headers: dict[str, str]
    pids: dict[str, int]  # "server", and "controller" through deepboot
    idle_cpu_ms_per_s: dict[str, float] = field(default_factory=dict)
    """Each process's CPU at idle, measured before the runs (its background work)."""


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def load(
    session: aiohttp.ClientSession,
    target: Target,
    body: dict[str, Any],
    count: int,
    concurrency: int,
    run: Run | None,
) -> None:
    """``count`` requests, ``concurrency`` at a time in a closed loop; recorded in
    ``run`` (None: a warm-up)."""
    payload = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **target.headers}
    stream = bool(body.get("stream"))
    tokens = int(body["max_tokens"])
    next_index = 0

    async def one() -> tuple[float, float | None]:
        started = time.perf_counter()
        first: float | None = None
        async with session.post(target.url, data=payload, headers=headers) as resp:
            if resp.status != 200:
                text = (await resp.read())[:200].decode("utf-8", "replace")
                raise RuntimeError(f"HTTP {resp.status}: {text}")
            if stream:
                chunks, done = 0, False
                async for line in resp.content:
                    if not line.startswith(b"data: "):
                        continue
                    if first is None:
                        first = time.perf_counter()
                    if line[6:].strip() == b"[DONE]":
                        done = True
                    else:
                        chunks += 1
                if chunks != tokens or not done:
                    raise RuntimeError(f"stream: {chunks} chunks of {tokens}, [DONE] {done}")
            else:
                answer = json.loads(await resp.read())
                if not answer.get("choices"):
                    raise RuntimeError(f"no choices in {answer!r:.200}")
        return time.perf_counter() - started, (first - started if first is not None else None)

    async def worker() -> None:
        nonlocal next_index
        while next_index < count:
            next_index += 1
            try:
                latency, ttft = await one()
            except (TimeoutError, aiohttp.ClientError, RuntimeError, ValueError) as exc:
                if run is not None:
                    run.errors += 1
                    run.first_error = run.first_error or f"{type(exc).__name__}: {exc}"
                continue
            if run is not None:
                run.latency_s.append(latency)
                if ttft is not None:
                    run.ttft_s.append(ttft)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def measure(
    target: Target, body: dict[str, Any], requests: int, concurrency: int, warmup: int
) -> Run:
    """A warm-up, then the measured run, on one session; the CPU of every process
    counted around the measured run only."""
    run = Run(target.path)
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await load(session, target, body, warmup, concurrency, None)
        pids = {"client": os.getpid(), **target.pids}
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        started = time.perf_counter()
        await load(session, target, body, requests, concurrency, run)
        run.wall_s = time.perf_counter() - started
        run.cpu_s = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    run.requests = len(run.latency_s)
    return run


def pooled(runs: list[Run]) -> Run:
    """The rounds of one path pooled: their requests, wall times and CPU summed."""
    out = Run(runs[0].path)
    for r in runs:
        out.requests += r.requests
        out.errors += r.errors
        out.first_error = out.first_error or r.first_error
        out.wall_s += r.wall_s
        out.latency_s += r.latency_s
        out.ttft_s += r.ttft_s
        for name, seconds in r.cpu_s.items():
            out.cpu_s[name] = out.cpu_s.get(name, 0.0) + seconds
    return out


def summary(run: Run) -> dict[str, Any]:
    """The figures of a pooled run (milliseconds, CPU ms per answered request)."""
    doc: dict[str, Any] = {
        "requests": run.requests,
        "errors": run.errors,
        "first_error": run.first_error,
        "wall_s": round(run.wall_s, 3),
        "requests_per_s": round(run.requests / run.wall_s, 1) if run.wall_s else 0.0,
    }
    if run.latency_s:
        doc["p50_ms"] = round(1e3 * statistics.median(run.latency_s), 3)
        doc["p99_ms"] = round(1e3 * percentile(run.latency_s, 0.99), 3)
    if run.ttft_s:
        doc["ttft_p50_ms"] = round(1e3 * statistics.median(run.ttft_s), 3)
        doc["ttft_p99_ms"] = round(1e3 * percentile(run.ttft_s, 0.99), 3)
    doc["cpu_ms_per_request"] = {
        name: round(1e3 * seconds / max(run.requests, 1), 4) for name, seconds in run.cpu_s.items()
    }
    return doc


# -- the processes this benchmark starts ---------------------------------------------


_LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


def server_argv(port: str, model: str) -> list[str]:
    """The stand-in's flags, the same on both paths."""
    return ["--port", port, "--model", model, "--weights-gb", str(WEIGHTS_GB),
            "--load-gbps", "0", "--token-delay-s", "0"]  # fmt: skip


@contextmanager
def direct_server(work: Path) -> Iterator[tuple[str, int]]:
    """The direct path's stand-in server: its base URL and pid; stopped on exit."""
    log_path = work / "direct-server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(SERVER), *server_argv("0", MODEL),
             "--weights-file", str(work / "weights.bin")],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:

        def port() -> int | None:
            if proc.poll() is not None:
                raise RuntimeError(f"the stand-in server exited: {log_path.read_text()}")
            found = _LISTENING.search(log_path.read_text())
            return int(found.group(1)) if found else None

        base = f"http://127.0.0.1:{wait_for('the stand-in server to listen', port, 60)}"
        wait_for("the stand-in server to load", lambda: _status(f"{base}/health") == 200, 120)
        yield base, proc.pid
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers or {}), timeout=5
        ) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def _get_json(url: str, headers: dict[str, str]) -> dict[str, Any]:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


@contextmanager
def cluster(work: Path, concurrency: int, console: Console) -> Iterator[Target]:
    """A local cluster serving the stand-in as a command service; its target (the
    proxy route, the token, the controller's and the replica server's pids).
    ``deepboot down`` on exit, whatever happened."""
    state = work / "state"
    service = work / "standin.toml"
    argv = ", ".join(json.dumps(w) for w in server_argv("{port}", "{model}"))
    service.write_text(
        f'name = "{SERVICE}"\nmodel = "{MODEL}"\n'
        f'command = ["python", {json.dumps(str(SERVER))}, {argv}, '
        f'"--weights-file", {json.dumps(str(work / "weights.bin"))}]\n'
        'ready_path = "/health"\nhealth_path = "/health"\n'
        'sleep = { method = "POST", path = "/sleep?level=1", timeout_s = 10 }\n'
        'wake = { method = "POST", path = "/wake_up", timeout_s = 30 }\n'
        f"concurrency = {concurrency}\nmax_replicas = 1\n"
        f"queue_bound = {max(64, 4 * concurrency)}\nrequest_timeout_s = 120\n"
    )
    try:
        console.print("starting the cluster (deepboot up) ...")
        cli(
            state, "up", "--training-nodes", "1", "--inference-nodes", "1",
            "--gpus-per-node", "1", "--policy", "deepboot", "--no-lending",
            "--interval", "2", "--http-port", "0",
        )  # fmt: skip
        cli(state, "serve", str(service))
        endpoint = connect(StateDir.at(state))  # proved before the token is sent
        headers = {"Authorization": f"Bearer {endpoint.token}"}
        base = f"{endpoint.url}/v1/{SERVICE}"
        console.print("waiting for the replica (a first request starts it) ...")
        wait_for(
            "the replica's server through deepboot",
            lambda: _status(f"{base}/health", headers) == 200,
            300,
            every=1.0,
        )
        server_pid = int(_get_json(f"{base}/stats", headers)["pid"])
        controller_pid = int(StateDir.at(state).controller_pid.read_text().split()[0])
        pids = {"server": server_pid, "controller": controller_pid}
        yield Target("deepboot", f"{base}/v1/completions", headers, pids, idle_cpu(pids))
    finally:
        if state.exists():
            down = subprocess.run(
                [sys.executable, "-m", "deepboot.cli.main", "down", "--state-dir", str(state)],
                capture_output=True,
                text=True,
                cwd=REPO,
                timeout=300,
            )
            if down.returncode != 0 and "no cluster is up" not in down.stderr + down.stdout:
                console.print(f"[red]deepboot down failed:[/red] {down.stderr or down.stdout}")


# -- the run -------------------------------------------------------------------------


def workloads(stream_tokens: int) -> dict[str, dict[str, Any]]:
    return {
        "small": {"model": MODEL, "prompt": "hello", "max_tokens": 1},
        "stream": {"model": MODEL, "prompt": "hello", "max_tokens": stream_tokens, "stream": True},
    }


def idle_cpu(pids: dict[str, int], seconds: float = IDLE_S) -> dict[str, float]:
    """CPU milliseconds per second of each process while no request is sent: the
    controller's rounds and polls go on during a run, and are counted in it."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    return {
        name: round(1e3 * (cpu_seconds(pid) - before[name]) / seconds, 2)
        for name, pid in pids.items()
    }


def run_all(args: argparse.Namespace, console: Console) -> tuple[dict[str, Any], dict[str, float]]:
    """The workloads' results, and the deepboot path's processes' CPU at idle."""
    with tempfile.TemporaryDirectory(prefix="deepboot-proxy-") as tmp:
        work = Path(tmp)
        with direct_server(work) as (direct_base, direct_pid):
            direct = Target("direct", f"{direct_base}/v1/completions", {}, {"server": direct_pid})
            if args.direct_only:
                return measure_paths([direct], args, console), {}
            with cluster(work, args.concurrency, console) as through:
                results = measure_paths([direct, through], args, console)
                return results, through.idle_cpu_ms_per_s


def measure_paths(
    targets: list[Target], args: argparse.Namespace, console: Console
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, body in workloads(args.stream_tokens).items():
        runs: dict[str, list[Run]] = {t.path: [] for t in targets}
        for round_ in range(args.rounds):
            order = targets if round_ % 2 == 0 else targets[::-1]
            for target in order:
                run = asyncio.run(
                    measure(target, body, args.requests, args.concurrency, args.warmup)
                )
                runs[target.path].append(run)
                console.print(
                    f"{name} round {round_ + 1}/{args.rounds} {target.path}: "
                    f"{run.requests / run.wall_s:.0f} req/s, {run.errors} errors"
                )
        doc = {path: summary(pooled(rs)) for path, rs in runs.items()}
        if "deepboot" in doc and "p50_ms" in doc["deepboot"] and "p50_ms" in doc["direct"]:
            for key in ("p50_ms", "p99_ms", "ttft_p50_ms", "ttft_p99_ms"):
                if key in doc["direct"]:
                    added = doc["deepboot"][key] - doc["direct"][key]
                    doc[f"added_{key}"] = round(added, 3)
            rate = doc["deepboot"]["requests_per_s"] / doc["direct"]["requests_per_s"]
            doc["requests_per_s_ratio"] = round(rate, 3)
        results[name] = doc
    return results


def table(results: dict[str, Any], console: Console) -> None:
    t = Table(title="The stand-in server directly and through deepboot's proxy route")
    for col in ("workload", "path", "answered", "errors", "req/s", "p50 ms", "p99 ms",
                "TTFT p50 ms", "added p50 ms", "added p99 ms", "client CPU ms/req",
                "server CPU ms/req", "controller CPU ms/req"):  # fmt: skip
        t.add_column(col, justify="right" if col not in ("workload", "path") else "left")
    for name, doc in results.items():
        for path in ("direct", "deepboot"):
            if path not in doc:
                continue
            s, cpu = doc[path], doc[path]["cpu_ms_per_request"]
            added = path == "deepboot"
            t.add_row(
                name, path, str(s["requests"]), str(s["errors"]), f"{s['requests_per_s']:.0f}",
                _ms(s.get("p50_ms")), _ms(s.get("p99_ms")), _ms(s.get("ttft_p50_ms")),
                _ms(doc.get("added_p50_ms")) if added else "",
                _ms(doc.get("added_p99_ms")) if added else "",
                _ms(cpu.get("client")), _ms(cpu.get("server")), _ms(cpu.get("controller")),
            )  # fmt: skip
    console.print(t)
    for name, doc in results.items():
        for path in ("direct", "deepboot"):
            if doc.get(path, {}).get("first_error"):
                console.print(f"[red]{name} {path}: first error: {doc[path]['first_error']}")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _git_rev() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    )
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--requests",
        type=int,
        default=3000,
        help="requests per workload, path and round (default %(default)s)",
    )
    ap.add_argument(
        "--concurrency",
        type=int,
        default=16,
        help="clients in the closed loop; also the service's concurrency "
        "through deepboot (default %(default)s)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="rounds per workload, the paths' order alternating; pooled (default %(default)s)",
    )
    ap.add_argument(
        "--warmup",
        type=int,
        default=200,
        help="unmeasured requests before each run (default %(default)s)",
    )
    ap.add_argument(
        "--stream-tokens",
        type=int,
        default=16,
        help="tokens of a streamed completion (default %(default)s)",
    )
    ap.add_argument(
        "--direct-only",
        action="store_true",
        help="the direct path only (no cluster): the server and the client",
    )
    ap.add_argument("--out", type=Path, default=None,
                    help="write the results as JSON here")  # fmt: skip
    args = ap.parse_args(argv)
    for key in ("requests", "concurrency", "rounds", "stream_tokens"):
        if getattr(args, key) < 1:
            ap.error(f"--{key.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        ap.error("--warmup must be >= 0")

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # the finally blocks stop the server and the cluster

    signal.signal(signal.SIGTERM, stop)
    console = Console(width=180)
    try:
        results, idle = run_all(args, console)
    except KeyboardInterrupt:
        console.print("interrupted: the server and the cluster were stopped")
        return 130
    table(results, console)
    if idle:
        console.print(
            "at idle (no request), CPU ms per second: "
            + ", ".join(f"{name} {ms:.1f}" for name, ms in idle.items())
            + " (counted in the deepboot runs' CPU per request)"
        )
    doc = {
        "bench": "proxy",
        "revision": _git_rev(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "workloads": results,
        "deepboot_idle_cpu_ms_per_s": idle,
    }
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        console.print(f"wrote {args.out}")
    errors = sum(w[p]["errors"] for w in results.values() for p in ("direct", "deepboot") if p in w)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
