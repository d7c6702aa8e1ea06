"""`deepboot up --address`'s attach on a real local Ray cluster whose nodes carry the
labels and per-GPU resources of examples/kuberay/raycluster.yaml (read from the
manifest itself, so the two stay in step: one Ray node per worker group stands for its
pods), and a job run there, each worker on the Ray node recorded for its GPU's node;
and an attach to a node that carries the old hand-typed resources.

Each cluster is this test's own (a private directory, token authentication, every
socket on loopback); every process it started is stopped by id at the end."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")
yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")

from deepboot.runtime.cluster.processes import kill_pids  # noqa: E402
from deepboot.runtime.cluster.raycluster import (  # noqa: E402
    ClusterRecord,
    attach,
    cluster_pids,
    ray_env,
    run_on_ray,
)
from deepboot.runtime.store.statedir import StateDir  # noqa: E402
from tests.runtime.cluster_helpers import (  # noqa: E402
    SETTINGS,
    alive,
    cli,
    job,
    open_gate_at,
    wait_for,
    write_job,
)

pytestmark = pytest.mark.runtime

MANIFEST = Path(__file__).resolve().parents[2] / "examples" / "kuberay" / "raycluster.yaml"


def manifest_groups() -> list[dict[str, Any]]:
    """(labels, GPUs, resources) of each worker group of the manifest: its Ray node
    labels, its container's nvidia.com/gpu limit (KubeRay's ``num-gpus``) and its
    ``resources`` (KubeRay's ``--resources``, amounts as numbers)."""
    (doc,) = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    groups = []
    for group in doc["spec"]["workerGroupSpecs"]:
        (container,) = group["template"]["spec"]["containers"]
        gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
        resources = {k: float(v) for k, v in group.get("resources", {}).items()}
        groups.append({"labels": dict(group["labels"]), "gpus": gpus, "resources": resources})
    return groups


def _ray_start(args: list[str], env: dict[str, str], worker: bool) -> str:
    module = "deepboot.runtime.cluster.raynode" if worker else "ray.scripts.scripts"
    proc = subprocess.run(
        [sys.executable, "-m", module, "start", *args, "--disable-usage-stats"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


@contextmanager
def ray_cluster(
    tmp: Path, head_resources: dict[str, float], workers: list[dict[str, Any]]
) -> Iterator[tuple[str, Path]]:
    """A loopback Ray cluster of a head (``head_resources``, no labels) and one node
    per entry of ``workers`` (``--labels``, ``--num-gpus``, ``--resources``); yields its
    address and token file, and stops every process of it on the way out."""
    token = tmp / "ray-token"
    token.write_text(secrets.token_hex(32))
    os.chmod(token, 0o600)
    temp_dir = f"/tmp/deepboot-labels-{secrets.token_hex(4)}"
    os.mkdir(temp_dir, 0o700)
    env = ray_env(None, token)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"127.0.0.1:{port}"
    # Its processes name its directory or its address: stopped by id, those alone.
    theirs = ClusterRecord("local", address, temp_dir, (), "")
    try:
        _ray_start(
            [
                "--head",
                f"--port={port}",
                f"--temp-dir={temp_dir}/ray",
                "--include-dashboard=false",
                "--num-cpus=1",
                "--num-gpus=0",
                f"--resources={json.dumps(head_resources)}",
            ],
            env,
            worker=False,
        )
        for w in workers:
            labels = ",".join(f"{k}={v}" for k, v in w["labels"].items())
            _ray_start(
                [
                    f"--address={address}",
                    "--num-cpus=1",
                    f"--num-gpus={w['gpus']}",
                    f"--labels={labels}",
                    f"--resources={json.dumps(w.get('resources', {}))}",
                    "--object-store-memory=80000000",
                ],
                env,
                worker=True,
            )
        yield address, token
    finally:
        kill_pids(cluster_pids(theirs))
        assert not cluster_pids(theirs), "a Ray process of the test's cluster survived"
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_attach_reads_the_manifests_labels(tmp_path: Path) -> None:
    groups = manifest_groups()
    pools = {g["labels"]["deepboot.io/pool"] for g in groups}
    assert pools == {"training", "inference"}, pools
    with ray_cluster(tmp_path, {}, groups) as (address, token):
        record = attach(StateDir(tmp_path / "state"), address, token)
    # One node per worker group here (the manifest's replicas would be more pods).
    expected = sorted(
        (g["labels"]["deepboot.io/pool"], g["gpus"], g["labels"].get("deepboot.io/gpu-type"))
        for g in groups
    )
    training_first = sorted(expected, key=lambda e: e[0] != "training")
    assert record.mode == "attached"
    assert [(pool, gpus) for _, pool, gpus in record.nodes] == [
        (pool, gpus) for pool, gpus, _ in training_first
    ]
    assert [n for n, _, _ in record.nodes] == list(range(len(groups)))
    assert dict(record.gpu_types) == {
        i: t for i, (_, _, t) in enumerate(training_first) if t is not None
    }
    assert len({r for _, r in record.ray_node_ids}) == len(groups)
    # What was recorded is what a later command reads.
    assert ClusterRecord.load(StateDir(tmp_path / "state")) == record


def test_attach_still_reads_hand_typed_resources(tmp_path: Path) -> None:
    resources = {
        "deepboot_node_0": 1000.0,
        "deepboot_pool_inference": 1000.0,
        "deepboot_gpu_0_0": 1.0,
        "deepboot_gpu_0_1": 1.0,
    }
    with ray_cluster(tmp_path, resources, []) as (address, token):
        record = attach(StateDir(tmp_path / "state"), address, token)
    assert record.nodes == ((0, "inference", 2),)
    assert record.ray_node_ids == ()


GATED_LOSS = 0.05
"""The gated job's loss threshold (as tests/runtime/test_cluster.py's)."""


def _ray_node_of(pid: int) -> str | None:
    """The Ray node id of the raylet that ``pid`` descends from (a Ray worker process
    is its raylet's child): read from /proc, ``--node_id=`` on the raylet's command
    line; None when ``pid`` is gone or no raylet is above it."""
    while pid > 1:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        for arg in argv:
            if arg.startswith(b"--node_id="):
                return arg[len(b"--node_id=") :].decode()
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the parent's pid
    return None


def _running_workers(state: Path, name: str) -> dict[str, str]:
    """GPU -> Ray node id of each of the job's workers alive now, from the lines they
    write to the job's log (``worker pid P on GPU G``)."""
    log = state / "logs" / f"{name}.log"
    found = (
        re.findall(r"\] worker pid (\d+) on GPU (\d+\.\d+)", log.read_text())
        if log.exists()
        else []
    )
    out = {}
    for pid, gpu in found:
        node = _ray_node_of(int(pid)) if alive(int(pid)) else None
        if node is not None:
            out[gpu] = node
    return out


_PLACE_ON_NODE_1 = """
from ray.util.placement_group import placement_group_table, remove_placement_group
from deepboot.runtime.actors.rayplacement import RayAsks, placement_group_for
placement = RayAsks({ray_node_ids!r})
group = placement_group_for(placement.gpus([(1, 0), (1, 1)]))
ray.get(group.ready(), timeout=60)
print("PG=" + str(sorted(set(placement_group_table(group)["bundles_to_node_id"].values()))))
remove_placement_group(group)
where = ray.remote(lambda: ray.get_runtime_context().get_node_id())
options = placement.node(1).actor_options()
print("NODE=" + ray.get(where.options(num_cpus=0, **options).remote(), timeout=60))
"""
"""Run on the attached cluster (placed as its record's ``ray_node_ids`` say): a
placement group of node 1's GPUs and a task on node 1, each printing its Ray node."""


def test_a_job_runs_on_the_labelled_nodes(tmp_path: Path) -> None:
    """The manifest's cluster, attached by its labels, runs a small elastic job on its
    training pod: every worker on the Ray node recorded for its GPU's deepboot node
    (the inference pod carries the same per-GPU resources: only the node-id selector
    keeps a worker off it), and the job finishes."""
    groups = manifest_groups()
    state = tmp_path / "state"
    with ray_cluster(tmp_path, {}, groups) as (address, token):
        try:
            # No lending: the job runs on the training pool (with it, an idle cluster
            # lends the inference pod's GPUs first).
            up = ("up", "--address", address, "--ray-token", str(token), "--no-lending")
            out = cli(state, *up, *SETTINGS)
            assert "attached" in out.stdout, out.stdout
            record = ClusterRecord.load(StateDir(state))
            ray_ids = dict(record.ray_node_ids)
            training = {n for n, pool, _ in record.nodes if pool == "training"}
            assert training and len(ray_ids) == len(groups), record
            gate = tmp_path / "gate"
            spec = write_job(tmp_path, "labelled", GATED_LOSS, 0.02, max_workers=2, gate=gate)
            cli(state, "submit", str(spec))
            seen = wait_for(
                "the job's workers running on their nodes",
                lambda: job(state, "labelled")["step"] > 5 and _running_workers(state, "labelled"),
                timeout=240,
            )
            for gpu, ray_id in seen.items():
                node = int(gpu.split(".")[0])
                assert ray_ids[node] == ray_id, (gpu, ray_id, record.ray_node_ids)
            assert {int(g.split(".")[0]) for g in seen} <= training, seen
            open_gate_at(state, "labelled", gate)
            wait_for(
                "the job to finish",
                lambda: job(state, "labelled")["state"] == "finished",
                timeout=240,
            )
            # A command replica's placement group (GPUs 1.0 and 1.1 in one bundle) and a
            # node's own actor (a standby, a cache) land on the inference pod too.
            placed = run_on_ray(record, _PLACE_ON_NODE_1.format(ray_node_ids=record.ray_node_ids))
            assert f"PG=['{ray_ids[1]}']" in placed, (placed, ray_ids)
            assert f"NODE={ray_ids[1]}" in placed, (placed, ray_ids)
            assert "killed deepboot's workers" in cli(state, "down").stdout
        finally:
            cli(state, "down", check=False)
