"""Driving a real local deepboot cluster from tests: the CLI, status and the event log."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from deepboot.runtime.store.jobstore import EventRow, JobStore, LogKind

REPO = Path(__file__).resolve().parents[2]
JOB_CODE = REPO / "examples" / "runtime" / "regression.py"
ONE_AND_ONE = ("--training-nodes", "1", "--inference-nodes", "1", "--gpus-per-node", "1")
"""``deepboot up`` flags of the smallest shared cluster: one GPU per pool."""


def cli(
    state: Path, *args: str, check: bool = True, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "deepboot.cli.main", *args, "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"deepboot {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def write_job(directory: Path, name: str, threshold: float, delay: float, **extra: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    lines = [
        f'name = "{name}"',
        f'entry = "{JOB_CODE}:train"',
        f"min_workers = {extra.pop('min_workers', 1)}",
        f"max_workers = {extra.pop('max_workers', 4)}",
        *([f"workers = {extra.pop('workers')}"] if "workers" in extra else []),
        "batch_size = 32",
        "max_batch_size = 256",
        "max_local_batch_size = 64",
        f"checkpoint_every = {extra.pop('checkpoint_every', 25)}",
        "[args]",
        f"loss_threshold = {threshold}",
        f"step_delay = {delay}",
        # Simulated GPU time per sample: a job whose steps more workers shorten, so
        # the policy still wants to grow it once its online fit has seen 2 workers.
        *([f"sample_delay = {extra.pop('sample_delay')}"] if "sample_delay" in extra else []),
    ]
    assert not extra, f"write_job does not know {sorted(extra)}"
    path = directory / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def status(state: Path) -> dict[str, Any]:
    return json.loads(cli(state, "status", "--json").stdout)  # type: ignore[no-any-return]


def job(state: Path, name: str) -> dict[str, Any]:
    return next(j for j in status(state)["jobs"] if j["name"] == name)


def wait_for(what: str, ok: Callable[[], Any], timeout: float = 600.0, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = ok()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def events(state: Path, job_name: str | None = None) -> list[EventRow]:
    store = JobStore(state / "deepboot.db")
    try:
        return store.events(job_name)
    finally:
        store.close()


def worker_pids(state: Path, job_name: str) -> list[int]:
    """Pids of the job's workers, from the lines they write to the job's log."""
    path = state / "logs" / f"{job_name}.log"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if "] worker pid " in line:
            out.append(int(line.split("] worker pid ")[1].split()[0]))
    return out


def alive(pid: int) -> bool:
    from deepboot.runtime.cluster.raycluster import process_alive

    return process_alive(pid)


def controller_pid(state: Path) -> int | None:
    pid = status(state)["cluster"]["controller_pid"]
    return int(pid) if pid else None


def kill(pid: int, sig: int) -> None:
    os.kill(pid, sig)


def listening_sockets() -> list[tuple[str, int, set[int]]]:
    """(local address, port, owning pids) of every listening TCP socket, read from
    /proc (what ``ss -ltnp`` shows, without needing iproute2)."""
    import ipaddress

    owners: dict[str, set[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry.name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry.name}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                owners.setdefault(target[8:-1], set()).add(int(entry.name))
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            hex_addr, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_addr)
            # /proc prints each 32-bit word in host (little-endian) order.
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(words)
            mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is loopback too
            out.append((str(mapped or ip), int(hex_port, 16), owners.get(fields[9], set())))
    return out


def assert_exact_resizes(state: Path, name: str) -> list[dict[str, Any]]:
    """Every generation of ``name`` starts from one state on every rank, and the
    survivors of a resize keep theirs bit for bit. Returns the resize details."""
    resizes = []
    for ev in events(state, name):
        if ev.kind not in (LogKind.STARTED, LogKind.RESIZED):
            continue
        digests = ev.detail["digests"]
        assert len({after for _, after in digests.values()}) == 1, ev.detail
        if ev.kind is LogKind.RESIZED:
            resizes.append(ev.detail)
            if ev.detail["how"] == "afe":
                for gpu in set(ev.detail["from"]) & set(ev.detail["to"]):
                    before, after = digests[gpu]
                    assert before == after, (gpu, ev.detail)
    return resizes


@contextlib.contextmanager
def local_cluster(
    state: Path, *flags: str, params: tuple[str, ...] = ("restart_delay=2",)
) -> Iterator[Path]:
    """``deepboot up`` a local cluster with the tests' scaled-down timings (2 s rounds,
    0.3 s polls, 15 s collective timeout, any free HTTP port), the policy's ``params``
    (restart_delay=2 suits DeepBoot and Pollux) and ``flags``; on exit, ``deepboot
    down``, and no process of it may be left."""
    from deepboot.runtime.cluster.raycluster import ClusterRecord, cluster_pids
    from deepboot.runtime.store.statedir import StateDir

    cli(
        state, "up", "--interval", "2", "--poll", "0.3", "--collective-timeout", "15",
        *(f"--param={p}" for p in params), "--http-port", "0", *flags,
    )  # fmt: skip
    record = ClusterRecord.load(StateDir.at(state))
    try:
        yield state
    except BaseException:
        dump_state(state)
        raise
    finally:
        cli(state, "down", check=False)
        left = {p for p in cluster_pids(record) if alive(p)}
        assert not left, f"'deepboot down' left processes running: {left}"


def dump_state(state: Path, events_shown: int = 80, log_lines: int = 40) -> None:
    """Print what a failed runtime test needs to be understood from a CI log alone:
    the newest events (seconds since the first) and the tail of each log file."""
    out = sys.stderr
    try:
        rows = events(state)
    except Exception as exc:  # noqa: BLE001 - a diagnostic must not mask the failure
        print(f"--- no event log: {exc}", file=out)
        rows = []
    t0 = rows[0].time if rows else 0.0
    print(f"--- the last {events_shown} of {len(rows)} events in {state}", file=out)
    for e in rows[-events_shown:]:
        print(f"{e.seq:5d} {e.time - t0:9.2f} {e.kind.value} {e.job} {e.detail}", file=out)
    for log in sorted((state / "logs").glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()[-log_lines:]
        print(f"--- the last {len(lines)} lines of {log.name}", file=out)
        print("\n".join(lines), file=out)


def cancel_leftover_jobs(state: Path) -> None:
    """Cancel every job still queued or running (a failed test's), and wait until no
    GPU is held, so the next test starts clean."""
    left = [
        j["name"] for j in status(state)["jobs"] if j["state"] in ("submitted", "queued", "running")
    ]
    for name in left:
        cli(state, "cancel", name, check=False)
    if left:
        wait_for(
            "the leftover jobs' GPUs",
            lambda: not any(g["holder"] for g in status(state)["gpus"]),
            180,
        )
