"""The runtime's status document: what ``deepboot status --json`` prints, what
``status --watch`` and the dashboard show (schema: docs/runtime.md).

Read from the job store (SQLite) and the state directory only, never from Ray, so it
is quick and works while the controller is down (its last record).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deepboot.core.errors import ConfigError
from deepboot.runtime.store.statedir import StateDir

if TYPE_CHECKING:
    from deepboot.runtime.cluster.raycluster import ClusterRecord
    from deepboot.runtime.store.jobstore import EventRow, GpuRow, JobRow, ServiceRow


def _float_or_none(text: str) -> float | None:
    return round(float(text), 3) if text else None


def _slo_entry(wait_s: float, target: float, counted: dict[str, Any] | None) -> dict[str, Any]:
    """A service's SLO and its attainment as the controller last wrote it (its
    ``slo`` meta, :meth:`deepboot.runtime.slotally.SloTally.view`): ``recent`` over the
    ``window_s`` before that write, ``total`` since the controller started; zeros
    (attainment null) before the service's first answer."""
    from deepboot.runtime.slotally import WINDOW_S, Attainment

    none = Attainment().to_json()
    counted = counted or {}
    return {
        "slo_wait_s": wait_s,
        "slo_target": target,
        "window_s": counted.get("window_s", WINDOW_S),
        "recent": counted.get("recent", none),
        "total": counted.get("total", none),
        "p99_wait_s": counted.get("p99_wait_s"),
    }


def status_document(state: StateDir) -> dict[str, Any]:
    """What ``deepboot status --json`` prints (schema: docs/runtime.md)."""
    from deepboot.runtime.cluster.raycluster import ClusterRecord, RuntimeNotUpError
    from deepboot.runtime.store.jobstore import JobStore

    try:
        record: ClusterRecord | None = ClusterRecord.load(state)
    except RuntimeNotUpError:
        record = None
    if record is None and not state.db.exists():
        raise ConfigError(f"no deepboot state in {state.root} (run 'deepboot up' first)")
    store = JobStore(state.db)
    heartbeat = store.meta("heartbeat")
    gpus = store.gpus()
    slo = json.loads(store.meta("slo", "{}"))
    # The targets the controller applies (--slo-target overrides each service's own);
    # absent before its first flush, and in a store an older deepboot wrote.
    targets = json.loads(store.meta("slo_targets", "{}"))
    # With --slo: what the guard reads of each service's demand (its forecast, its
    # burstiness, the replicas they ask for), as the controller last wrote it.
    demand = json.loads(store.meta("demand", "{}"))
    lent = _lent_by_holder(gpus)
    doc: dict[str, Any] = {
        "cluster": _cluster_entry(state, record, heartbeat),
        "configuration": _configuration(state),
        # The control loop's training rounds, and the latency of the latest (up to
        # 1,000) decisions, as the simulator's summary reports them.
        "scheduler": {
            "rounds": int(store.meta("rounds", "0")),
            "decision_ms_median": _float_or_none(store.meta("decision_ms_median")),
            "decision_ms_max": _float_or_none(store.meta("decision_ms_max")),
        },
        "gpus": [_gpu_entry(g) for g in gpus],
        "services": [
            {**_service_entry(r, gpus, targets, slo), "demand": demand.get(r.spec.name)}
            for r in store.services()
        ],
        # The node-local model caches (--host-cache-gb), as the controller last heard
        # from them: node, models (least recently used first), used_bytes, bound_bytes.
        "caches": json.loads(store.meta("host_cache", "[]")),
        "jobs": [_job_entry(r, lent) for r in store.jobs()],
    }
    store.close()
    return doc


def _cluster_entry(state: StateDir, record: ClusterRecord | None, heartbeat: str) -> dict[str, Any]:
    """The document's ``cluster``: whether it is up, the controller's pid and the age
    of its last heartbeat, and the endpoint http.json records."""
    from deepboot.runtime.cluster.processes import controller_alive

    endpoint = None
    if state.http_file.exists():
        endpoint = json.loads(state.http_file.read_text()).get("url")
    return {
        "up": record is not None,
        "mode": record.mode if record else None,
        "address": record.address if record else None,
        "controller_pid": controller_alive(state),
        "heartbeat_age_s": round(time.time() - float(heartbeat), 3) if heartbeat else None,
        "endpoint": endpoint,
    }


def _configuration(state: StateDir) -> dict[str, Any] | None:
    """The document's ``configuration``: what ``deepboot up`` runs (its preset, ""
    when the policy was named itself; the training policy; the whole in one line),
    from controller.json; null before ``up`` has written it."""
    from deepboot.runtime.controller.controller_settings import ControllerSettings, settings_file

    path = settings_file(state)
    try:
        settings = ControllerSettings.load(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, ConfigError) as exc:
        raise ConfigError(f"{path}: unreadable controller settings: {exc}") from exc
    return {
        "preset": settings.preset,
        "policy": settings.policy,
        "interval_s": settings.interval,
        "described": settings.describe(),
    }


def _gpu_entry(g: GpuRow) -> dict[str, Any]:
    return {
        "gpu": g.gpu,
        "node": g.node,
        "index": g.idx,
        "pool": g.pool,
        "state": g.state,
        "holder": g.holder or None,
        "service": g.service or None,
    }


def _service_entry(
    r: ServiceRow, gpus: list[GpuRow], targets: dict[str, Any], slo: dict[str, Any]
) -> dict[str, Any]:
    """One of the document's ``services``: its spec's limits, its back-off, its SLO
    (``targets``: the controller's overrides; ``slo``: its counts by service) and
    its replicas among ``gpus``."""
    return {
        "name": r.spec.name,
        "model": r.spec.model,
        "concurrency": r.spec.concurrency,
        "max_replicas": r.spec.max_replicas,
        "queue_bound": r.spec.queue_bound,
        "cold_start_s": r.cold_start,
        # Crash-loop back-off: replicas that died loading in a row, and the
        # Unix time before which no new one starts (null: none).
        "load_failures": r.load_failures,
        "backoff_until": r.backoff_until,
        "slo": _slo_entry(
            r.spec.slo_wait_s,
            targets.get(r.spec.name, r.spec.slo_target),
            slo.get(r.spec.name),
        ),
        "replicas": [
            {"gpu": g.gpu, "state": g.state, "hits": g.hits}
            for g in gpus
            if g.service == r.spec.name
        ],
    }


def _lent_by_holder(gpus: list[GpuRow]) -> dict[str, list[str]]:
    """Job -> the lent GPUs it holds."""
    lent: dict[str, list[str]] = {}
    for g in gpus:
        if g.state == "lent" and g.holder:
            lent.setdefault(g.holder, []).append(g.gpu)
    return lent


def _job_entry(r: JobRow, lent: dict[str, list[str]]) -> dict[str, Any]:
    """One of the document's ``jobs`` (``lent``: :func:`_lent_by_holder`)."""
    return {
        "name": r.name,
        "state": r.state.value,
        "workers": list(r.workers),
        "num_workers": len(r.workers),
        "lent_gpus": sorted(lent.get(r.name, [])),
        "min_workers": r.spec.min_workers,
        "max_workers": r.spec.max_workers,
        "batch_size": r.local_bsz * r.accum * len(r.workers) if r.workers else None,
        "local_batch_size": r.local_bsz or None,
        "accumulation_steps": r.accum,
        "generation": r.generation,
        "step": r.step,
        "loss": r.loss,
        "restarts": r.restarts,
        "steps_lost": r.steps_lost,
        "submitted": r.submitted,
        "started": r.started,
        "finished": r.finished,
        "message": r.message,
        "resize": r.spec.resize,
        "command": list(r.spec.command) or None,
    }


def read_state_dir(state_dir: str | Path) -> tuple[list[EventRow], dict[str, str]]:
    """A state directory's event log and every GPU's pool.

    Pools come from the store's ``gpus`` table (the controller's ledger: every GPU
    with its pool), else from ``cluster.json``'s nodes (a store no controller has
    flushed yet; ``down`` removes ``cluster.json`` but leaves the table).

    Returns:
        (the event log in ``seq`` order, GPU id -> pool).

    Raises:
        ConfigError: the directory holds no store (``deepboot.db``), or the store
            is of a newer deepboot.
    """
    from deepboot.runtime.store.jobstore import JobStore

    state = StateDir.at(state_dir)
    # Checked first: opening a JobStore would create an empty store there.
    if not state.db.is_file():
        raise ConfigError(
            f"no job store in {state.root} (no {state.db.name}): give the state directory "
            "of a 'deepboot up' run (its --state-dir)"
        )
    store = JobStore(state.db)
    try:
        events = store.events()
        pools = {g.gpu: g.pool for g in store.gpus()}
    finally:
        store.close()
    return events, pools or _cluster_pools(state.cluster_file)


def _cluster_pools(cluster_file: Path) -> dict[str, str]:
    """GPU id -> pool from ``cluster.json``'s ``nodes`` ([node, pool, gpus]); {} when
    the file is missing or unreadable (the timeline then places the GPUs by use)."""
    try:
        nodes = json.loads(cluster_file.read_text())["nodes"]
        return {f"{n}.{i}": str(pool) for n, pool, count in nodes for i in range(int(count))}
    except (OSError, ValueError, KeyError, TypeError):
        return {}
