"""Start, describe, attach to and stop the Ray cluster the runtime runs on.

A deepboot cluster is a Ray cluster whose nodes carry custom resources that name
them (their node, pool and GPUs: see :mod:`deepboot.runtime.actors.rayresources`).

``up`` on one machine starts one Ray node per deepboot node, loopback only, with Ray's
token authentication on (the token in the state directory, mode 0600). Ray's
directory (its sockets, logs, spilled objects) lies in a new private directory,
``/tmp/deepboot-ray-<12 random hex digits>``, that ``up`` creates mode 0700 before Ray
starts: a name another user could guess, they could create first, and Ray opens the
directories it creates to every user. ``attach``
records an existing cluster whose nodes carry deepboot's Ray node labels
(:mod:`deepboot.runtime.actors.raylabels`: a KubeRay cluster, ``examples/kuberay/``)
or, without labels, those resources (see docs/runtime.md for the ``ray start`` flags).
``down`` stops what ``up`` started and nothing else: the processes whose command
line names this cluster's Ray directory or address, and their children.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import secrets
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from deepboot.core.cluster import ClusterSpec, Node, Pool
from deepboot.core.errors import ConfigError, DeepbootError
from deepboot.elastic.devices import CUDA_ENV, machine_devices, plan_node_devices
from deepboot.runtime.actors.raylabels import NodeForm, labelled_cluster, node_form
from deepboot.runtime.actors.rayresources import cluster_from_ray_nodes, node_resources
from deepboot.runtime.cluster import privatedir, processes
from deepboot.runtime.store.statedir import StateDir

log = logging.getLogger(__name__)

NAMESPACE = "deepboot"
"""The Ray namespace of every actor the runtime creates."""

_OBJECT_STORE_BYTES = 100 * 1024 * 1024


class RuntimeNotUpError(DeepbootError):
    """No cluster is recorded in the state directory (run ``deepboot up``)."""


@dataclass(frozen=True, slots=True)
class ClusterRecord:
    """What ``cluster.json`` holds.

    Attributes:
        mode: "local" (started by ``up``; ``down`` stops it) or "attached".
        address: The Ray GCS address, host:port.
        temp_dir: The directory of a local cluster's Ray (its ``--temp-dir`` is
            :func:`~deepboot.runtime.cluster.privatedir.ray_dir_of` it), created by
            ``up``: a random name, mode 0700; ""
            when attached.
        nodes: (node_id, pool, gpus) of every deepboot node.
        token_file: Ray's token file ("" when the attached cluster has none).
        cache_bytes: A local cluster's model cache per inference node
            (``--host-cache-gb``, bytes): its object store is that much larger
            (:func:`object_store_bytes`).
        cuda_devices: A local cluster's ``CUDA_VISIBLE_DEVICES`` per node, by node
            id (:func:`~deepboot.elastic.devices.plan_node_devices`); empty: the
            variable left as it was (no CUDA device, or attached).
        gpus_line: How its GPUs map to CUDA devices, in words (``up`` prints it).
        ray_node_ids: An attached labelled cluster's Ray node id per deepboot node
            id (its nodes are numbered at attach: they carry no deepboot id); empty
            otherwise.
        gpu_types: The ``deepboot.io/gpu-type`` label per deepboot node id, of the
            labelled nodes that carry it.
    """

    mode: str
    address: str
    temp_dir: str
    nodes: tuple[tuple[int, str, int], ...]
    token_file: str
    cache_bytes: int = 0
    cuda_devices: tuple[tuple[int, str], ...] = ()
    gpus_line: str = ""
    ray_node_ids: tuple[tuple[int, str], ...] = ()
    gpu_types: tuple[tuple[int, str], ...] = ()

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
            cache_bytes=int(raw.get("cache_bytes", 0)),  # absent: before the cache
            # Absent: before the mapping (left the variable as it was).
            cuda_devices=tuple((int(n), str(v)) for n, v in raw.get("cuda_devices", ())),
            gpus_line=str(raw.get("gpus_line", "")),
            # Absent: before the labels (or not a labelled cluster).
            ray_node_ids=tuple((int(n), str(r)) for n, r in raw.get("ray_node_ids", ())),
            gpu_types=tuple((int(n), str(t)) for n, t in raw.get("gpu_types", ())),
        )

    def node_env(self, node_id: int) -> dict[str, str]:
        """The environment of node ``node_id``'s raylet, and so of every process of
        that node: :func:`ray_env`, with the node's ``CUDA_VISIBLE_DEVICES``."""
        env = ray_env(self)
        for n, devices in self.cuda_devices:
            if n == node_id:
                env[CUDA_ENV] = devices
        return env


def ray_env(record: ClusterRecord | None, token_file: Path | None = None) -> dict[str, str]:
    """The environment every deepboot process that talks to Ray runs with.

    Token authentication when the cluster has a token; for a local cluster, the
    setting that keeps Ray's node address (and so its servers) on loopback (see
    ``deepboot.runtime.cluster.raynode``), and gloo's and NCCL's sockets (the workers'
    collectives) on the loopback interface too. Ray's workers inherit the raylet's
    environment, and so these settings. An attached cluster whose address is a
    loopback one is such a cluster too (every node of it runs on this machine, at
    127.0.0.1): without the setting a client takes the machine's routable address for
    its own node's and never finds its raylet there (``ray.init`` waits forever).
    """
    env = dict(os.environ)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # The nodes carry no Ray GPUs: a process keeps its raylet's CUDA_VISIBLE_DEVICES
    # (Ray's default today, pinned here should it change; deepboot.elastic.devices).
    env["RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"] = "0"
    tok = str(token_file) if token_file else (record.token_file if record else "")
    if tok:
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN_PATH"] = tok
    if record is None or record.mode == "local" or on_loopback(record.address):
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        # The collectives' sockets (gloo on CPUs, NCCL's bootstrap and socket
        # transport on GPUs) on loopback too.
        env["GLOO_SOCKET_IFNAME"] = "lo"
        env["NCCL_SOCKET_IFNAME"] = "lo"
    return env


def on_loopback(address: str) -> bool:
    """Whether a Ray address (``host:port``) is on a loopback interface (127.0.0.0/8,
    ::1, ``localhost``)."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _new_temp_dir_name() -> str:
    """A fresh name for a local cluster's directory: random (nobody can create it
    first), and short: Ray's unix sockets live under it (sun_path is 108 bytes)."""
    return f"/tmp/deepboot-ray-{secrets.token_hex(6)}"


def remove_temp_dir(record: ClusterRecord) -> bool:
    """Remove a local cluster's directory (``record.temp_dir``, Ray's inside) if it is
    ours (:func:`~deepboot.runtime.cluster.privatedir.remove_private_dir`); True if it
    is gone. An attached cluster's is never touched."""
    if record.mode != "local" or not record.temp_dir:
        return False
    return privatedir.remove_private_dir(record.temp_dir, "the cluster's directory")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray_start(args: list[str], env: Mapping[str, str], worker: bool) -> str:
    cmd = [
        sys.executable,
        "-m",
        "deepboot.runtime.cluster.raynode" if worker else "ray.scripts.scripts",
    ]
    proc = subprocess.run(
        [*cmd, "start", *args], env=dict(env), capture_output=True, text=True, timeout=180
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise DeepbootError(f"'ray start' failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout + proc.stderr


_COMMON = (
    "--num-gpus=0",
    "--disable-usage-stats",
    "--log-style=record",
)
"""The ``ray start`` flags of every node of a local cluster (and its object store's
size: :func:`object_store_bytes`)."""


def object_store_bytes(node: Node, cache_bytes: int) -> int:
    """The object store of a local cluster's ``node``: 100 MiB, and on an inference
    node twice its model cache's bound more (the cache's objects, and an export's
    argument on its way into the cache: the object store holds both until the
    export's call returns; beyond that Ray spills to disk rather than fail)."""
    extra = 2 * cache_bytes if node.pool is Pool.INFERENCE else 0
    return _OBJECT_STORE_BYTES + extra


def start_local_node(record: ClusterRecord, node: Node) -> None:
    """Start (or start again, after it died) the Ray node of deepboot ``node`` in the
    local cluster ``record`` describes; the controller brings its GPUs back into the
    ledger once Ray lists it alive.

    Raises:
        DeepbootError: Ray failed to start it.
    """
    _ray_start(
        [
            f"--address={record.address}",
            f"--num-cpus={node.gpus + 1}",
            f"--resources={json.dumps(node_resources(node))}",
            f"--object-store-memory={object_store_bytes(node, record.cache_bytes)}",
            *_COMMON,
        ],
        record.node_env(node.node_id),
        worker=True,
    )


def up_local(
    state: StateDir, cluster: ClusterSpec, cache_bytes: int = 0, cuda_devices: str | None = None
) -> ClusterRecord:
    """Start one loopback-only Ray node per node of ``cluster`` on this machine (each
    inference node's object store sized for a model cache of ``cache_bytes``), each
    with its own slice of the machine's CUDA devices (``cuda_devices``, ``up
    --cuda-devices``: :func:`~deepboot.elastic.devices.plan_node_devices`).

    Ray's directory is ``<temp_dir>/ray`` in a new private directory ``temp_dir``
    (see :func:`~deepboot.runtime.cluster.privatedir.make_private_dir`), recorded in
    the cluster record; a failed start stops what it started and removes it.

    Raises:
        ConfigError: a cluster is already recorded in ``state``, or ``cuda_devices``
            does not fit the cluster.
        DeepbootError: Ray failed to start (what it printed is in the message), or
            its directory exists and is not this user's.
    """
    if state.cluster_file.exists():
        raise ConfigError(f"a cluster is already up in {state.root} (run 'deepboot down' first)")
    per_node, gpus_line = plan_node_devices(
        [n.gpus for n in cluster.nodes], machine_devices(), cuda_devices
    )
    token = state.ensure_token()
    temp_dir = privatedir.make_private_dir(_new_temp_dir_name())
    ray_dir = privatedir.ray_dir_of(temp_dir)
    head, *rest = cluster.nodes
    port = _free_port()
    address = f"127.0.0.1:{port}"
    record = ClusterRecord(
        mode="local",
        address=address,
        temp_dir=temp_dir,
        nodes=tuple((n.node_id, n.pool.value, n.gpus) for n in cluster.nodes),
        token_file=str(token),
        cache_bytes=cache_bytes,
        cuda_devices=()
        if per_node is None
        else tuple((n.node_id, d) for n, d in zip(cluster.nodes, per_node, strict=True)),
        gpus_line=gpus_line,
    )
    try:
        _ray_start(
            [
                "--head",
                f"--port={port}",
                f"--temp-dir={ray_dir}",
                "--include-dashboard=false",
                "--dashboard-host=127.0.0.1",
                f"--num-cpus={head.gpus + 1}",
                f"--resources={json.dumps(node_resources(head))}",
                f"--object-store-memory={object_store_bytes(head, cache_bytes)}",
                *_COMMON,
            ],
            record.node_env(head.node_id),
            worker=False,
        )
        # Record before the other nodes start, so that 'down' can clean up a partial start.
        record.save(state)
        for node in rest:
            start_local_node(record, node)
    except BaseException:
        stop_local(record)
        state.cluster_file.unlink(missing_ok=True)
        raise
    return record


def attach(state: StateDir, address: str, token_file: Path | None) -> ClusterRecord:
    """Record the existing Ray cluster at ``address`` (``down`` will leave its Ray
    processes alone) and return the record.

    Its deepboot nodes are read from ``ray.nodes()``: from deepboot's Ray node labels
    when any live node carries one (:func:`~deepboot.runtime.actors.raylabels.
    labelled_cluster`: the pool from ``deepboot.io/pool``, the GPUs from Ray's ``GPU``
    resource, the nodes numbered here), else from the custom resources typed by hand
    (:func:`~deepboot.runtime.actors.rayresources.cluster_from_ray_nodes`).

    Raises:
        ConfigError: a cluster is already recorded in ``state``; no node is deepboot's;
            a node's labels or resources are malformed (the message names the node
            and the label or resource).
        DeepbootError: the cluster cannot be reached.
    """
    if state.cluster_file.exists():
        raise ConfigError(f"a cluster is already up in {state.root} (run 'deepboot down' first)")
    tok = str(token_file.resolve()) if token_file else ""
    probe = ClusterRecord("attached", address, "", (), tok)
    out = run_on_ray(probe, "import json\nprint('NODES=' + json.dumps(ray.nodes()))")
    line = next((ln for ln in out.splitlines() if ln.startswith("NODES=")), "NODES=[]")
    record = record_attached(address, tok, json.loads(line[len("NODES=") :]))
    record.save(state)
    return record


def record_attached(
    address: str, token_file: str, nodes: Sequence[Mapping[str, object]]
) -> ClusterRecord:
    """The record of an attached cluster whose Ray nodes are ``nodes`` (``ray.nodes()``'s
    entries, never mutated): labels when present, else the custom resources (see
    :func:`attach`, whose errors it raises)."""
    if node_form(nodes) is NodeForm.LABELS:
        cluster, labelled = labelled_cluster(nodes)
        ray_ids = tuple((i, n.ray_node_id) for i, n in enumerate(labelled))
        types = tuple((i, n.gpu_type) for i, n in enumerate(labelled) if n.gpu_type)
        log.info("attached by labels: %d nodes", len(labelled))
    else:
        cluster, ray_ids, types = cluster_from_ray_nodes(nodes), (), ()
    return ClusterRecord(
        mode="attached",
        address=address,
        temp_dir="",
        nodes=tuple((n.node_id, n.pool.value, n.gpus) for n in cluster.nodes),
        token_file=token_file,
        ray_node_ids=ray_ids,
        gpu_types=types,
    )


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


def _marks(record: ClusterRecord) -> re.Pattern[str] | None:
    """What names a local cluster on a command line: its Ray directory (whole: not
    another one whose name merely starts the same) or ``--address``/``--gcs-address``
    with its whole GCS address."""
    alts = []
    if record.temp_dir:
        alts.append(rf"(?:^|[\s=]){re.escape(record.temp_dir.rstrip('/'))}(?=[/\s]|$)")
    if record.address:
        alts.append(rf"(?:^|\s)--(?:gcs-)?address={re.escape(record.address)}(?=\s|$)")
    return re.compile("|".join(alts)) if alts else None


def cluster_pids(record: ClusterRecord) -> set[int]:
    """Processes of a local cluster: those naming its Ray directory or GCS address
    on their command line (see :func:`_marks`), and all their descendants."""
    marks = _marks(record)
    return set() if marks is None else processes.marked_with_descendants(marks)


STOP_ROUNDS = 3
"""How many times :func:`stop_local` looks again for the cluster's processes."""


def stop_local(record: ClusterRecord) -> int:
    """Stop every process of a local cluster and remove its Ray directory if it is
    ours (:func:`remove_temp_dir`); returns how many processes were signalled.

    A raylet may start a worker while its others are being stopped: the cluster's
    processes are looked for again after each round, up to :data:`STOP_ROUNDS`."""
    signalled: set[int] = set()
    for _ in range(STOP_ROUNDS):
        pids = cluster_pids(record)
        if not pids:
            break
        processes.kill_pids(pids)
        signalled |= pids
    remove_temp_dir(record)
    return len(signalled)
