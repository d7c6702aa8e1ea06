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
from typing import TYPE_CHECKING, Any

from deepboot.runtime.store.jobstore import EventRow, JobStore, LogKind

if TYPE_CHECKING:
    from deepboot.core.cluster import ClusterSpec

REPO = Path(__file__).resolve().parents[2]
JOB_CODE = REPO / "examples" / "runtime" / "regression.py"
GATED_CODE = Path(__file__).resolve().parent / "gated_regression.py"
ONE_AND_ONE = ("--training-nodes", "1", "--inference-nodes", "1", "--gpus-per-node", "1")
"""``deepboot up`` flags of the smallest shared cluster: one GPU per pool."""


def cli(
    state: Path, *args: str, check: bool = True, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "deepboot.cli.main", *args, "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    _log_wait(f"deepboot {args[0] if args else ''}", time.monotonic() - started)
    if check and proc.returncode != 0:
        raise AssertionError(f"deepboot {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def write_job(directory: Path, name: str, threshold: float, delay: float, **extra: Any) -> Path:
    """A job file of the example regression job: it trains until its mean loss is below
    ``threshold``, sleeping ``delay`` seconds a step. With ``gate`` (a path), the tests'
    gated copy of it (``gated_regression.py``): it also trains on until
    :func:`open_gate_at` lets it finish, so a test ends the job once what it checks has
    happened rather than after a fixed number of steps."""
    directory.mkdir(parents=True, exist_ok=True)
    gate = extra.pop("gate", None)
    entry = JOB_CODE if gate is None else GATED_CODE
    # The gated job's own default pace per sample is not the example's (none).
    sample_delay = extra.pop("sample_delay", None if gate is None else 0)
    lines = [
        f'name = "{name}"',
        f'entry = "{entry}:train"',
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
        *([f"sample_delay = {sample_delay}"] if sample_delay is not None else []),
        *([f'gate = "{gate}"'] if gate is not None else []),
    ]
    assert not extra, f"write_job does not know {sorted(extra)}"
    path = directory / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def open_gate_at(state: Path, name: str, gate: Path, steps: int = 40) -> None:
    """Let the gated job ``name`` finish ``steps`` steps from now (once its loss is low
    enough): far enough ahead that every rank reads the gate before that step."""
    tmp = gate.with_suffix(".tmp")
    tmp.write_text(str(job(state, name)["step"] + steps))
    os.replace(tmp, gate)


def status(state: Path) -> dict[str, Any]:
    """What ``deepboot status --json`` prints, built in this process.

    The tests poll it every half second; a ``deepboot status`` process per poll cost
    about 0.75 s of CPU (its imports), half a core for each waiting test on a 2-core
    machine. The CLI's own path stays covered where a test calls ``cli(..., "status")``.
    The JSON round trip gives the test what the CLI would: lists, not tuples.
    """
    from deepboot.runtime.client.statusdoc import status_document
    from deepboot.runtime.store.statedir import StateDir

    return json.loads(json.dumps(status_document(StateDir.at(state))))  # type: ignore[no-any-return]


def job(state: Path, name: str) -> dict[str, Any]:
    return next(j for j in status(state)["jobs"] if j["name"] == name)


def wait_for(what: str, ok: Callable[[], Any], timeout: float = 600.0, every: float = 0.5) -> Any:
    """Poll ``ok`` every ``every`` seconds until it returns something true (returned),
    failing after ``timeout``. With ``DEEPBOOT_WAIT_LOG`` set, each wait appends a line
    (test, seconds waited, what) to that file: where a runtime test's time goes."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        value = ok()
        if value:
            _log_wait(what, time.monotonic() - started)
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def _log_wait(what: str, seconds: float) -> None:
    path = os.environ.get("DEEPBOOT_WAIT_LOG")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(path, "a") as f:
            f.write(f"{test}\t{seconds:.1f}\t{what}\n")


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
    from deepboot.runtime.cluster.processes import process_alive

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


SETTINGS = ("--interval", "2", "--poll", "0.3", "--collective-timeout", "15", "--http-port", "0")
"""The tests' scaled-down timings: 2 s rounds, 0.3 s polls, a 15 s collective timeout,
and any free HTTP port."""


@contextlib.contextmanager
def local_cluster(
    state: Path, *flags: str, params: tuple[str, ...] = ("restart_delay=2",), own: bool = False
) -> Iterator[Path]:
    """``deepboot up`` a cluster with the tests' scaled-down timings (:data:`SETTINGS`),
    the policy's ``params`` (restart_delay=2 suits DeepBoot and Pollux) and ``flags``
    (``--policy deepboot`` unless they name one);
    on exit, ``deepboot down``, and no process of it may be left.

    The controller attaches (``up --address``) to the session's shared Ray cluster of
    the shape ``flags`` name (:class:`SharedRays`), so that only the controller starts
    and stops with each test, unless ``own``: then ``up`` starts a local Ray cluster of
    the test's own, which ``down`` stops (a test that kills Ray nodes, or checks
    what a local ``up`` starts). A test also gets its own cluster when no shared one is
    to be had: outside the session's fixture, while another test is attached, or when
    it asks for a larger model cache than the shared clusters are sized for."""
    timings = (*SETTINGS, *(f"--param={p}" for p in params))
    if not any(f == "--policy" or f.startswith("--policy=") for f in flags):
        # The tests were written for the paper's DeepBoot; 'up' alone runs the preset
        # guarded (a test of it names it, or runs 'up' itself).
        flags = ("--policy", "deepboot", *flags)
    shape, attach_flags = _shape(flags)
    shared = None if own or _SHARED is None else _SHARED.borrow(shape, flags)
    if shared is None:
        cm = _own_cluster(state, (*timings, *flags))
    else:
        cm = _attached_cluster(state, shared, (*timings, *attach_flags))
    with cm:
        try:
            yield state
        except BaseException:
            dump_state(state)
            raise


@contextlib.contextmanager
def _own_cluster(state: Path, settings: tuple[str, ...]) -> Iterator[None]:
    from deepboot.runtime.cluster.raycluster import ClusterRecord, cluster_pids
    from deepboot.runtime.store.statedir import StateDir

    cli(state, "up", *settings)
    record = ClusterRecord.load(StateDir.at(state))
    try:
        yield
    finally:
        cli(state, "down", check=False)
        left = {p for p in cluster_pids(record) if alive(p)}
        assert not left, f"'deepboot down' left processes running: {left}"


@contextlib.contextmanager
def _attached_cluster(state: Path, shared: SharedRay, settings: tuple[str, ...]) -> Iterator[None]:
    from deepboot.runtime.cluster.raycluster import ClusterRecord
    from deepboot.runtime.store.statedir import StateDir

    assert _SHARED is not None
    clean = False
    try:
        out = cli(state, "up", *shared.attach_flags(), *settings).stdout
        assert "attached" in out, out
        record = ClusterRecord.load(StateDir.at(state))
        assert record.cluster == shared.cluster, (record.cluster, shared.cluster)
        try:
            yield
        finally:
            controller = _recorded_controller(state)
            cli(state, "down", check=False)
            shared.check_clean(controller)
            clean = True
    finally:
        # Anything of this test's still on the shared cluster (or a failed attach):
        # the next test gets a fresh one rather than this one's leftovers.
        _SHARED.give_back(shared, clean)


def _recorded_controller(state: Path) -> int | None:
    try:
        return int((state / "controller.pid").read_text())
    except (OSError, ValueError):
        return None


_SHAPE_FLAGS = ("--training-nodes", "--inference-nodes", "--gpus-per-node")


def _shape(flags: tuple[str, ...]) -> tuple[ClusterSpec, tuple[str, ...]]:
    """The cluster ``deepboot up flags`` starts (its defaults are the CLI's: parsed by
    its own parser), and ``flags`` without the shape's (``up --address`` takes the
    shape from the Ray cluster)."""
    from deepboot.cli.main import build_parser
    from deepboot.core.cluster import ClusterSpec

    args = build_parser().parse_args(["up", *flags])
    total = args.training_nodes + args.inference_nodes
    shape = ClusterSpec.parse(f"{total}x{args.gpus_per_node}", args.inference_nodes)
    rest: list[str] = []
    words = iter(flags)
    for word in words:
        if word in _SHAPE_FLAGS:
            next(words)
        elif not word.startswith(tuple(f"{f}=" for f in _SHAPE_FLAGS)):
            rest.append(word)
    return shape, tuple(rest)


SHARED_CACHE_GB = 0.05
"""The model cache (``--host-cache-gb``) the shared clusters' inference nodes' object
stores are sized for: the largest a sharing test asks for."""

_RAY_OWN = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")
"""Titles of the Ray processes that are the cluster's own (its agents, and worker
processes waiting for work), not an actor's or a task's."""

CLEAN_WAIT_S = 60.0
"""How long a test's actors may take to be gone from a shared cluster after ``down``."""


class SharedRay:
    """A loopback-only Ray cluster of one shape, started as ``deepboot up`` starts a
    local one (:func:`~deepboot.runtime.cluster.raycluster.up_local`: Ray's token on,
    its own private directory) but with no controller: tests attach to it one at a
    time (``deepboot up --address``)."""

    def __init__(self, root: Path, cluster: ClusterSpec) -> None:
        from deepboot.runtime.actors.modelcache import bound_bytes
        from deepboot.runtime.cluster import raycluster
        from deepboot.runtime.store.statedir import StateDir

        self.cluster = cluster
        state = StateDir.at(root)
        self.record = raycluster.up_local(state, cluster, bound_bytes(SHARED_CACHE_GB))

    def attach_flags(self) -> tuple[str, ...]:
        return ("--address", self.record.address, "--ray-token", self.record.token_file)

    def busy(self) -> dict[int, str]:
        """pid -> title of each process of this cluster that runs an actor or a task."""
        from deepboot.runtime.cluster.raycluster import cluster_pids

        out = {}
        for pid in cluster_pids(self.record):
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            except OSError:
                continue
            if title.startswith("ray::") and not title.startswith(_RAY_OWN) and alive(pid):
                out[pid] = title
        return out

    def named_actors(self, wait_s: float) -> list[str]:
        """The named actors of deepboot's namespace, once there are none or after
        ``wait_s`` seconds (a killed actor leaves the list once it is dead)."""
        from deepboot.runtime.cluster.raycluster import NAMESPACE, run_on_ray

        out = run_on_ray(
            self.record,
            "import json, time\n"
            "from ray.util import list_named_actors\n"
            f"deadline = time.monotonic() + {wait_s}\n"
            "while True:\n"
            "    left = [a['name'] for a in list_named_actors(all_namespaces=True)\n"
            f"            if a.get('namespace') == {NAMESPACE!r}]\n"
            "    if not left or time.monotonic() > deadline:\n"
            "        break\n"
            "    time.sleep(0.5)\n"
            "print('LEFT=' + json.dumps(left))",
        )
        [line] = [ln for ln in out.splitlines() if ln.startswith("LEFT=")]
        return list(json.loads(line[len("LEFT=") :]))

    def check_clean(self, controller: int | None) -> None:
        """After a test's ``deepboot down``: its controller is gone, and so are its
        actors (by name, so that the next test's ``w|j1|0.0|1`` cannot meet this one's)
        and their processes (so that the next test finds the GPUs free).

        Raises:
            AssertionError: something of the test's was still there after
                :data:`CLEAN_WAIT_S` seconds.
        """
        if controller is not None:
            wait_for("the controller to stop", lambda: not alive(controller), CLEAN_WAIT_S)
        named = self.named_actors(CLEAN_WAIT_S)
        assert not named, f"'deepboot down' left actors on the shared cluster: {named}"
        deadline = time.monotonic() + CLEAN_WAIT_S
        while (busy := self.busy()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not busy, f"'deepboot down' left processes running: {busy}"

    def stop(self) -> None:
        """Stop every process of the cluster (by pid) and remove its directory.

        Raises:
            AssertionError: a process of it is still alive.
        """
        from deepboot.runtime.cluster.raycluster import cluster_pids, stop_local

        stop_local(self.record)
        left = {p for p in cluster_pids(self.record) if alive(p)}
        assert not left, f"the shared Ray cluster left processes running: {left}"


class SharedRays:
    """The session's shared Ray clusters: one at a time, of the shape the test at hand
    asks for (the previous one is stopped when another shape is asked for), lent to
    one test at a time."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.current: SharedRay | None = None
        self.lent = False
        self.started = 0

    def borrow(self, shape: ClusterSpec, flags: tuple[str, ...]) -> SharedRay | None:
        """The shared cluster of ``shape``, started if need be; None when the test
        needs its own (another test is attached, or its model cache is larger than
        :data:`SHARED_CACHE_GB`)."""
        from deepboot.cli.main import build_parser

        cache_gb = build_parser().parse_args(["up", *flags]).host_cache_gb or 0.0
        if self.lent or cache_gb > SHARED_CACHE_GB:
            return None
        if self.current is not None and self.current.cluster != shape:
            self.close()
        if self.current is None:
            self.started += 1
            self.current = SharedRay(self.root / f"ray-{self.started}", shape)
        self.lent = True
        return self.current

    def give_back(self, shared: SharedRay, clean: bool) -> None:
        """The test is done with ``shared``; one it did not leave clean is stopped."""
        assert shared is self.current and self.lent
        self.lent = False
        if not clean:
            self.close()

    def close(self) -> None:
        """Stop the current shared cluster, if any."""
        current, self.current = self.current, None
        if current is not None:
            current.stop()


_SHARED: SharedRays | None = None


@contextlib.contextmanager
def shared_rays(root: Path) -> Iterator[SharedRays]:
    """Make :func:`local_cluster` attach to shared Ray clusters (under ``root``) until
    the end of the block, which stops them (also on an interrupt, and at the
    interpreter's exit should the block never end)."""
    import atexit

    global _SHARED
    assert _SHARED is None, "shared Ray clusters are in use already"
    pool = _SHARED = SharedRays(root)
    atexit.register(pool.close)
    try:
        yield pool
    finally:
        _SHARED = None
        atexit.unregister(pool.close)
        pool.close()


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
