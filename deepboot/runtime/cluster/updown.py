"""``deepboot up`` and ``deepboot down``: the cluster and its controller, as a unit."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from deepboot.core.cluster import ClusterSpec
from deepboot.core.errors import ConfigError
from deepboot.policies import registry
from deepboot.runtime import logbounds
from deepboot.runtime.actors.modelcache import bound_bytes
from deepboot.runtime.cluster import raycluster
from deepboot.runtime.cluster.processes import controller_alive, process_alive
from deepboot.runtime.cluster.raycluster import ClusterRecord, ray_env
from deepboot.runtime.controller.controller_settings import ControllerSettings, settings_file
from deepboot.runtime.store.statedir import StateDir
from deepboot.runtime.store.statelock import holding

log = logging.getLogger(__name__)

UP_LOCK_WAIT_S = 300.0
"""How long ``deepboot up`` waits for another ``up`` of the same state directory to
finish (a local cluster and its controller start in well under a minute)."""


def check_policy(name: str, params: dict[str, str] | None = None) -> None:
    """Refuse a training policy the runtime cannot run.

    Raises:
        UnknownPolicyError: no such policy.
        ConfigError: the policy reads knowledge only a simulator has (the remaining
            work of a job: Optimus, AFS, Lyra).
    """
    policy = registry.create(name, **(params or {}))
    if getattr(policy, "needs_oracle", False):
        usable = [
            n for n in registry.names() if not getattr(registry.create(n), "needs_oracle", False)
        ]
        raise ConfigError(
            f"policy {name!r} needs each job's remaining work, which a real cluster does "
            f"not know; on the runtime use one of: {', '.join(usable)}"
        )


def up(
    state: StateDir,
    settings: ControllerSettings,
    cluster: ClusterSpec | None = None,
    address: str | None = None,
    token_file: Path | None = None,
    cuda_devices: str | None = None,
) -> ClusterRecord:
    """Start (or attach to) a cluster and start its controller.

    Args:
        state: The state directory (created if missing).
        settings: The controller's knobs.
        cluster: The local cluster to start (ignored with ``address``).
        address: Attach to this Ray cluster instead of starting one.
        token_file: Ray token of the attached cluster, if it uses one.
        cuda_devices: A local cluster's CUDA devices (``up --cuda-devices``).
    """
    check_policy(settings.policy, settings.params)
    state.ensure()
    # Two 'up' at once run one after the other: the second finds the first's cluster
    # (and its controller) up. The controller's own lock guards the rest.
    with holding(state.up_lock, "'deepboot up'", wait_s=UP_LOCK_WAIT_S):
        return _up(state, settings, cluster, address, token_file, cuda_devices)


def _up(
    state: StateDir,
    settings: ControllerSettings,
    cluster: ClusterSpec | None,
    address: str | None,
    token_file: Path | None,
    cuda_devices: str | None,
) -> ClusterRecord:
    if state.cluster_file.exists():
        # Up already: bring back a controller that died (SIGKILL, OOM, reboot of the
        # process); it reconciles with the workers still running.
        record = ClusterRecord.load(state)
        running = controller_alive(state)
        if running is not None:
            raise ConfigError(f"deepboot is already up in {state.root} (controller pid {running})")
        wait_for_endpoint(state, start_controller(state, record))
        return record
    if address:
        record = raycluster.attach(state, address, token_file)
    else:
        assert cluster is not None
        # The inference nodes' object stores hold the model caches (--host-cache-gb).
        cache = bound_bytes(settings.shared.host_cache_gb)
        record = raycluster.up_local(state, cluster, cache_bytes=cache, cuda_devices=cuda_devices)
    settings.save(settings_file(state))
    try:
        wait_for_endpoint(state, start_controller(state, record))
    except BaseException:
        down(state)
        raise
    return record


def wait_for_endpoint(state: StateDir, pid: int, timeout: float = 120.0) -> dict[str, object]:
    """Wait until the controller just started (``pid``) serves HTTP; returns
    ``http.json``.

    Raises:
        ConfigError: the controller died first (another one held the state
            directory's lock, say), or did not listen within ``timeout`` (the
            message ends with its log's last lines).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = _endpoint(state)
        if info is not None and info.get("pid") == pid:
            return info
        if not process_alive(pid):
            break
        time.sleep(0.2)
    tail = logbounds.tail(state.logs / "controller.log", 15)
    raise ConfigError(f"the controller did not start its HTTP endpoint; its log ends:\n{tail}")


def _endpoint(state: StateDir) -> dict[str, object] | None:
    try:
        info = json.loads(state.http_file.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def start_controller(state: StateDir, record: ClusterRecord) -> int:
    """Start the controller as a detached process; returns its pid. The controller
    writes ``controller.pid`` itself, once it holds the state directory's lock."""
    # Its output until it sets up its log, which then takes descriptors 1 and 2 over
    # and rotates the file (deepboot.runtime.logbounds).
    log_file = open(state.logs / "controller.log", "a")  # noqa: SIM115 (the child's)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "deepboot.runtime.controller_process",
            "--state-dir",
            str(state.root),
        ],
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=ray_env(record),
        start_new_session=True,  # survives the CLI; a Ctrl-C of the CLI does not reach it
        cwd=str(state.root),
    )
    log_file.close()
    return proc.pid


def stop_controller(state: StateDir, sig: int = signal.SIGTERM, grace: float = 10.0) -> bool:
    """Stop the controller (``sig``, then SIGKILL after ``grace``); False if none ran."""
    pid = controller_alive(state)
    if pid is None:
        return False
    os.kill(pid, sig)
    deadline = time.monotonic() + grace
    while controller_alive(state) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    if controller_alive(state) is not None:
        os.kill(pid, signal.SIGKILL)
    return True


def down(state: StateDir) -> str:
    """Stop the controller and what ``up`` started; returns what was done, in words.

    A local cluster's Ray processes (and so every worker) are stopped; on an attached
    cluster only deepboot's own worker, replica and model-cache actors are killed. The
    store and the logs stay.
    """
    if not state.cluster_file.exists():
        raise raycluster.RuntimeNotUpError(f"no cluster is up in {state.root}")
    record = ClusterRecord.load(state)
    stopped = stop_controller(state)
    if record.mode == "local":
        n = raycluster.stop_local(record)  # and its directory, only if it is ours
        what = f"stopped the local Ray cluster ({n} processes)"
    else:
        _kill_attached_workers(record)
        what = f"killed deepboot's workers on the Ray cluster at {record.address}"
    state.cluster_file.unlink(missing_ok=True)
    state.controller_pid.unlink(missing_ok=True)
    return ("stopped the controller; " if stopped else "") + what


def _kill_attached_workers(record: ClusterRecord) -> None:
    from deepboot.runtime.actors.handles import WORKER_PREFIX
    from deepboot.runtime.actors.modelcache import CACHE_PREFIX
    from deepboot.runtime.actors.replica_actor import REPLICA_PREFIX

    ns = raycluster.NAMESPACE
    # The model caches too: their objects (host memory) go with them.
    prefixes = (WORKER_PREFIX, REPLICA_PREFIX, CACHE_PREFIX)
    raycluster.run_on_ray(
        record,
        "from ray.util import list_named_actors\n"
        "for a in list_named_actors(all_namespaces=True):\n"
        f"    if a.get('namespace') == {ns!r} and a['name'].startswith({prefixes!r}):\n"
        f"        ray.kill(ray.get_actor(a['name'], namespace={ns!r}))",
    )
