"""Builders of inference snapshots for the inference-placement tests.

A node is written as a string of GPU tokens, one per GPU:

    F         FREE
    T:job     TRAINING, a worker of ``job`` (training pool)
    L:job     LENT, a worker of ``job`` (inference pool)
    R:svc     RUNNING, a replica of service ``svc``
    P:svc/h   PROTECT, a replica of ``svc`` with ``h`` hits (``/h`` optional, 0)
    S:svc     SLEEP, a replica of ``svc``

``layout("T:a T:a F F", "L:a S:s1 P:s2/3 R:s1", training_nodes=1)`` is a training node
(two GPUs of job ``a``, two free) and an inference node.
"""

from __future__ import annotations

from collections.abc import Mapping

from deepboot.core import ClusterSpec, GpuState, GpuView, InferenceState, JobView, Node, Pool

from ..builders import make_job

_STATES = {
    "F": GpuState.FREE,
    "T": GpuState.TRAINING,
    "L": GpuState.LENT,
    "R": GpuState.RUNNING,
    "P": GpuState.PROTECT,
    "S": GpuState.SLEEP,
}


def parse_gpu(token: str, node: int, index: int, pool: Pool) -> GpuView:
    """One GPU from its token (see the module docstring)."""
    code, _, rest = token.partition(":")
    state = _STATES[code]
    if state in (GpuState.TRAINING, GpuState.LENT):
        return GpuView(node, index, pool, state, job=rest)
    if state is GpuState.FREE:
        return GpuView(node, index, pool, state)
    service, _, hits = rest.partition("/")
    until = 100.0 if state is GpuState.PROTECT else None
    return GpuView(
        node, index, pool, state, service=service, hits=int(hits or 0), protect_until=until
    )


def layout(
    *nodes: str,
    training_nodes: int = 1,
    lending: bool = True,
    jobs: Mapping[str, Mapping[str, object]] | None = None,
    now: float = 3600.0,
) -> InferenceState:
    """An InferenceState from node strings; the first ``training_nodes`` are training.

    Args:
        nodes: One string of GPU tokens per node.
        training_nodes: How many of the first nodes form the training pool.
        lending: ``state.lending``.
        jobs: Extra ``make_job`` keyword arguments per job name (e.g. ``fitted=True``);
            every job named by a T/L token exists, its placement read from the tokens.
        now: Snapshot time.
    """
    extra = dict(jobs or {})
    gpus: list[GpuView] = []
    spec: list[Node] = []
    for node, text in enumerate(nodes):
        pool = Pool.TRAINING if node < training_nodes else Pool.INFERENCE
        tokens = text.split()
        spec.append(Node(node, len(tokens), pool))
        gpus.extend(parse_gpu(t, node, i, pool) for i, t in enumerate(tokens))
    placements: dict[str, list[int]] = {name: [] for name in extra}
    for g in gpus:
        if g.job is not None:
            placements.setdefault(g.job, []).append(g.node_id)
    views: list[JobView] = []
    for i, (name, where) in enumerate(sorted(placements.items())):
        kwargs: dict[str, object] = {"submit_time": float(i)}
        kwargs.update(extra.get(name, {}))
        views.append(make_job(name, placement=where, **kwargs))  # type: ignore[arg-type]
    views.sort(key=lambda j: (j.submit_time, j.name))
    return InferenceState(now, ClusterSpec(tuple(spec)), tuple(gpus), tuple(views), lending)
