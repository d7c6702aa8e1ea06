"""Start, describe, attach to and stop the Ray cluster the runtime runs on.

A deepboot cluster is a Ray cluster whose nodes carry custom resources that name
them (Ray's resources double as labels here):

* ``deepboot_node_<n>``: the node's deepboot id ``n`` (any amount);
* ``deepboot_pool_training`` or ``deepboot_pool_inference``: its pool;
* ``deepboot_gpu_<n>_<i>``: one unit per GPU ``i`` of node ``n``. A worker asks for
  exactly one of these, so that the scheduler, not Ray, decides which GPU it gets
  (DeepBoot reclaims one named GPU). On a machine without GPUs they are logical and
  the workers run torch on the CPU.

``up`` on one machine starts one Ray node per deepboot node, loopback only, with Ray's
token authentication on (the token in the state directory, mode 0600). ``attach``
records an existing cluster whose nodes carry those resources (see
docs/runtime.md for the ``ray start`` flags). ``down`` stops what ``up`` started and
nothing else: the processes whose command line names this cluster's Ray directory or
address, and their children.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from hashlib import sha256
from pathlib import Path

from deepboot.core.cluster import ClusterSpec, Node, Pool
from deepboot.core.errors import ConfigError, DeepbootError
from deepboot.runtime.statedir import StateDir

log = logging.getLogger(__name__)

NAMESPACE = "deepboot"
"""The Ray namespace of every actor the runtime creates."""

_GPU_RESOURCE = re.compile(r"^deepboot_gpu_(\d+)_(\d+)$")
_NODE_RESOURCE = re.compile(r"^deepboot_node_(\d+)$")
_OBJECT_STORE_BYTES = 100 * 1024 * 1024


class RuntimeNotUpError(DeepbootError):
    """No cluster is recorded in the state directory (run ``deepboot up``)."""


def gpu_resource(node: int, index: int) -> str:
    """The Ray resource naming GPU ``index`` of deepboot node ``node``."""
    return f"deepboot_gpu_{node}_{index}"


def node_resources(node: Node) -> dict[str, float]:
    """The custom resources (labels and GPUs) of one deepboot node."""
    res: dict[str, float] = {
        f"deepboot_node_{node.node_id}": 1000.0,
        f"deepboot_pool_{node.pool.value}": 1000.0,
    }
    for i in range(node.gpus):
        res[gpu_resource(node.node_id, i)] = 1.0
    return res


@dataclass(frozen=True, slots=True)
class ClusterRecord:
    """What ``cluster.json`` holds.

    Attributes:
        mode: "local" (started by ``up``; ``down`` stops it) or "attached".
        address: The Ray GCS address, host:port.
        temp_dir: Ray's directory of a local cluster ("" when attached).
        nodes: (node_id, pool, gpus) of every deepboot node.
        token_file: Ray's token file ("" when the attached cluster has none).
    """

    mode: str
    address: str
    temp_dir: str
    nodes: tuple[tuple[int, str, int], ...]
    token_file: str

    @property
    def cluster(self) -> ClusterSpec:
        return ClusterSpec(tuple(Node(n, gpus, Pool(pool)) for n, pool, gpus in sorted(self.nodes)))

    def save(self, state: StateDir) -> None:
        state.ensure()
        tmp = state.cluster_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, state.cluster_file)

    @classmethod
    def load(cls, state: StateDir) -> ClusterRecord:
        try:
            raw = json.loads(state.cluster_file.read_text())
        except FileNotFoundError:
            raise RuntimeNotUpError(
                f"no cluster in {state.root} (run 'deepboot up' first, or pass --state-dir)"
            ) from None
        return cls(
            mode=raw["mode"],
            address=raw["address"],
            temp_dir=raw["temp_dir"],
            nodes=tuple(tuple(n) for n in raw["nodes"]),
            token_file=raw["token_file"],
        )


def ray_env(record: ClusterRecord | None, token_file: Path | None = None) -> dict[str, str]:
    """The environment every deepboot process that talks to Ray runs with.

    Token authentication when the cluster has a token; for a local cluster, the
    setting that keeps Ray's node address (and so its servers) on loopback (see
    ``deepboot.runtime._raynode``).
    """
    env = dict(os.environ)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    tok = str(token_file) if token_file else (record.token_file if record else "")
    if tok:
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN_PATH"] = tok
    if record is None or record.mode == "local":
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        # gloo's sockets on loopback too.
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def _temp_dir_for(state: StateDir) -> str:
    # Ray's unix sockets live under it: keep the path short (sun_path is 108 bytes).
    digest = sha256(str(state.root).encode()).hexdigest()[:10]
    return f"/tmp/deepboot-ray-{digest}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray_start(args: list[str], env: Mapping[str, str], worker: bool) -> str:
    cmd = [sys.executable, "-m", "deepboot.runtime._raynode" if worker else "ray.scripts.scripts"]
    proc = subprocess.run(
        [*cmd, "start", *args], env=dict(env), capture_output=True, text=True, timeout=180
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise DeepbootError(f"'ray start' failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout + proc.stderr


def up_local(state: StateDir, cluster: ClusterSpec) -> ClusterRecord:
    """Start one loopback-only Ray node per node of ``cluster`` on this machine.

    Raises:
        ConfigError: a cluster is already recorded in ``state``.
        DeepbootError: Ray failed to start (what it printed is in the message).
    """
    if state.cluster_file.exists():
        raise ConfigError(f"a cluster is already up in {state.root} (run 'deepboot down' first)")
    token = state.ensure_token()
    temp_dir = _temp_dir_for(state)
    env = ray_env(None, token)
    common = [
        "--num-gpus=0",
        f"--object-store-memory={_OBJECT_STORE_BYTES}",
        "--disable-usage-stats",
        "--log-style=record",
    ]
    head, *rest = cluster.nodes
    port = _free_port()
    _ray_start(
        [
            "--head",
            f"--port={port}",
            f"--temp-dir={temp_dir}",
            "--include-dashboard=false",
            "--dashboard-host=127.0.0.1",
            f"--num-cpus={head.gpus + 1}",
            f"--resources={json.dumps(node_resources(head))}",
            *common,
        ],
        env,
        worker=False,
    )
    address = f"127.0.0.1:{port}"
    record = ClusterRecord(
        mode="local",
        address=address,
        temp_dir=temp_dir,
        nodes=tuple((n.node_id, n.pool.value, n.gpus) for n in cluster.nodes),
        token_file=str(token),
    )
    # Record before the other nodes start, so that 'down' can clean up a partial start.
    record.save(state)
    try:
        for node in rest:
            _ray_start(
                [
                    f"--address={address}",
                    f"--num-cpus={node.gpus + 1}",
                    f"--resources={json.dumps(node_resources(node))}",
                    *common,
                ],
                env,
                worker=True,
            )
    except BaseException:
        stop_local(record)
        state.cluster_file.unlink(missing_ok=True)
        raise
    return record


def cluster_from_ray_nodes(nodes: Iterable[Mapping[str, object]]) -> ClusterSpec:
    """The deepboot cluster described by live Ray nodes' resources (see module doc).

    Raises:
        ConfigError: no node carries deepboot resources, or one lacks its pool or id.
    """
    out: list[Node] = []
    for n in nodes:
        if not n.get("Alive", True):
            continue
        res = n.get("Resources", {})
        assert isinstance(res, Mapping)
        ids = [int(m.group(1)) for k in res if (m := _NODE_RESOURCE.match(k))]
        if not ids:
            continue
        pools = [p for p in Pool if f"deepboot_pool_{p.value}" in res]
        if len(ids) != 1 or len(pools) != 1:
            raise ConfigError(
                f"Ray node {n.get('NodeID', '?')} must carry exactly one deepboot_node_<n> "
                f"and one deepboot_pool_<training|inference> resource"
            )
        gpus = sorted(
            int(m.group(2))
            for k in res
            if (m := _GPU_RESOURCE.match(k)) and int(m.group(1)) == ids[0]
        )
        if gpus != list(range(len(gpus))):
            raise ConfigError(
                f"deepboot node {ids[0]}: GPU resources must be deepboot_gpu_{ids[0]}_0.."
                f"deepboot_gpu_{ids[0]}_{len(gpus) - 1}, got indices {gpus}"
            )
        out.append(Node(ids[0], len(gpus), pools[0]))
    if not out:
        raise ConfigError(
            "no Ray node carries deepboot resources (deepboot_node_<n>, "
            "deepboot_pool_<pool>, deepboot_gpu_<n>_<i>); see docs/runtime.md"
        )
    return ClusterSpec(tuple(sorted(out, key=lambda node: node.node_id)))


def attach(state: StateDir, address: str, token_file: Path | None) -> ClusterRecord:
    """Record an existing Ray cluster (``down`` will leave its Ray processes alone)."""
    if state.cluster_file.exists():
        raise ConfigError(f"a cluster is already up in {state.root} (run 'deepboot down' first)")
    tok = str(token_file.resolve()) if token_file else ""
    probe = ClusterRecord("attached", address, "", (), tok)
    out = run_on_ray(probe, "import json\nprint('NODES=' + json.dumps(ray.nodes()))")
    line = next((ln for ln in out.splitlines() if ln.startswith("NODES=")), "NODES=[]")
    cluster = cluster_from_ray_nodes(json.loads(line[len("NODES=") :]))
    record = ClusterRecord(
        mode="attached",
        address=address,
        temp_dir="",
        nodes=tuple((n.node_id, n.pool.value, n.gpus) for n in cluster.nodes),
        token_file=tok,
    )
    record.save(state)
    return record


def run_on_ray(record: ClusterRecord, body: str) -> str:
    """Run ``body`` in a fresh Python process connected to ``record``'s cluster (with
    the environment of :func:`ray_env`, ``ray`` imported and initialized); returns
    what it printed. A fresh process because Ray reads its settings at import.

    Raises:
        DeepbootError: the process failed (cannot reach the cluster, or ``body`` raised).
    """
    code = f"import ray\nray.init(address={record.address!r}, logging_level='ERROR')\n{body}\n"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=ray_env(record),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise DeepbootError(f"cannot reach the Ray cluster at {record.address}:\n{tail}")
    return proc.stdout


# -- stopping ----------------------------------------------------------------------------


def _cmdlines() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process we can read (Linux /proc)."""
    out: dict[int, tuple[int, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out[pid] = (ppid, cmd)
    return out


def cluster_pids(record: ClusterRecord) -> set[int]:
    """Processes of a local cluster: those naming its Ray directory or GCS address
    on their command line, and all their descendants."""
    procs = _cmdlines()
    marks = [record.temp_dir, f"--address={record.address}", f"--gcs-address={record.address}"]
    roots = {pid for pid, (_, cmd) in procs.items() if any(m and m in cmd for m in marks)}
    roots.discard(os.getpid())
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def kill_pids(pids: Iterable[int], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL what is left after ``grace`` seconds."""
    pending = set(pids)
    for pid in pending:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pending and time.monotonic() < deadline:
        pending = {p for p in pending if process_alive(p)}
        time.sleep(0.1)
    for pid in pending:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_local(record: ClusterRecord) -> int:
    """Stop every process of a local cluster; returns how many were signalled."""
    pids = cluster_pids(record)
    kill_pids(pids)
    return len(pids)
