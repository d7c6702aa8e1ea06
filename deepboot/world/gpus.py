"""The GPU ledger of the shared cluster, in both worlds, with its GPU-second accounting.

Every GPU of the cluster is one :class:`BoardGpu` in exactly one
:class:`~deepboot.core.gpu.GpuState`. Every change goes through :meth:`GpuBoard.move`
(a decision's, checked by ``check_transition``), :meth:`GpuBoard.fail` (a failure's:
a process died, checked against ``FAILURES``) or :meth:`GpuBoard.restore` (the runtime's
recovery, from its stored rows), and keeps the per-state counts that the timeline,
the utilisation figures and the runtime's metrics are built from. The GPU part of
every operation is applied here, once for both worlds (:func:`apply_gpu_op`). GPU-seconds are
integrated per (pool, state) between events, so they add up to
``GPUs x elapsed time`` by construction; :meth:`GpuBoard.check` re-derives
everything from the GPUs themselves (the conservation tests' debug hook).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping

from deepboot.core.cluster import ClusterSpec, Pool
from deepboot.core.errors import InvalidDecisionError
from deepboot.core.gpu import GpuId, GpuState, GpuView, check_transition
from deepboot.core.placement import Placement
from deepboot.scheduler import operations as ops

_HELD = frozenset({GpuState.TRAINING, GpuState.LENT})
_LOADED = frozenset({GpuState.RUNNING, GpuState.PROTECT, GpuState.SLEEP})
_STATES = tuple(GpuState)
_POOLS = tuple(Pool)


def _held_state(pool: Pool) -> GpuState:
    """The state of a GPU a training job holds: TRAINING on its own pool, else LENT."""
    return GpuState.TRAINING if pool is Pool.TRAINING else GpuState.LENT


class BoardGpu:
    """One GPU, mutable; the simulator's own record behind a :class:`GpuView`.

    Attributes:
        node_id: Its node.
        index: Its index on the node.
        pool: Its node's pool.
        state: Its state.
        service: The service whose replica is loaded (RUNNING/PROTECT/SLEEP).
        hits: Warm-reuse hit count of that replica.
        job: The training job on it (TRAINING/LENT).
        protect_until: When PROTECT ends (PROTECT only).
        replica: The runtime's name of the loaded replica's actor (None in the
            simulator, and whenever no replica is loaded).
        replica_gpus: Every GPU of the loaded replica when it spans several, lead
            first (``GpuView.replica_gpus``); empty otherwise.
        version: Bumped on every change, so a PROTECT_EXPIRED scheduled before a
            reuse can be recognised as stale.
    """

    __slots__ = (
        "node_id",
        "index",
        "pool",
        "state",
        "service",
        "hits",
        "job",
        "protect_until",
        "replica",
        "replica_gpus",
        "version",
        "_view",
    )

    def __init__(self, node_id: int, index: int, pool: Pool) -> None:
        self.node_id = node_id
        self.index = index
        self.pool = pool
        self.state = GpuState.FREE
        self.service: str | None = None
        self.hits = 0
        self.job: str | None = None
        self.protect_until: float | None = None
        self.replica: str | None = None
        self.replica_gpus: tuple[GpuId, ...] = ()
        self.version = 0
        self._view: GpuView | None = None

    @property
    def gpu_id(self) -> GpuId:
        return (self.node_id, self.index)

    def view(self) -> GpuView:
        """The frozen view of this GPU (cached until it changes)."""
        if self._view is None:
            self._view = GpuView(
                self.node_id,
                self.index,
                self.pool,
                self.state,
                self.service,
                self.hits,
                self.job,
                self.protect_until,
                self.replica_gpus,
            )
        return self._view


class GpuBoard:
    """Every GPU of the cluster, the training jobs holding them, and GPU-seconds.

    Attributes:
        gpus: Every GPU, sorted by (node_id, index).
        evictions: SLEEP replicas evicted so far (by training or by another service).
    """

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        self.gpus: tuple[BoardGpu, ...] = tuple(
            BoardGpu(n.node_id, i, n.pool) for n in cluster.nodes for i in range(n.gpus)
        )
        self._nodes: tuple[tuple[BoardGpu, ...], ...] = tuple(
            tuple(g for g in self.gpus if g.node_id == n.node_id) for n in cluster.nodes
        )
        self._by_id = {g.gpu_id: g for g in self.gpus}
        self._held: dict[str, list[BoardGpu]] = {}
        self._counts: dict[tuple[Pool, GpuState], int] = {
            (p, s): 0 for p in _POOLS for s in _STATES
        }
        for g in self.gpus:
            self._counts[g.pool, g.state] += 1
        self._seconds: dict[tuple[Pool, GpuState], float] = dict.fromkeys(self._counts, 0.0)
        self._clock: float | None = None
        self._start: float | None = None
        self._views: tuple[GpuView, ...] | None = None
        # The views, patched GPU by GPU: a snapshot after a change rebuilds only the
        # changed GPUs' views (a 1,024-GPU cluster took ~1 ms a snapshot to rebuild all).
        self._view_list: list[GpuView] | None = None
        self._position = {g.gpu_id: i for i, g in enumerate(self.gpus)}
        self._dirty: list[BoardGpu] = []
        self.evictions = 0

    # -- time ------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Integrate GPU-seconds per (pool, state) up to ``now`` (call before changes)."""
        if self._clock is None:
            self._clock = self._start = now
            return
        dt = now - self._clock
        if dt > 0.0:
            for key, n in self._counts.items():
                if n:
                    self._seconds[key] += n * dt
            self._clock = now

    @property
    def span(self) -> tuple[float, float]:
        """(first, last) time the accounting has seen; (0, 0) before any event."""
        if self._start is None or self._clock is None:
            return (0.0, 0.0)
        return (self._start, self._clock)

    def gpu_seconds(self, pool: Pool | None = None) -> dict[GpuState, float]:
        """GPU-seconds spent in each state so far, in ``pool`` or the whole cluster."""
        out = dict.fromkeys(_STATES, 0.0)
        for (p, s), v in self._seconds.items():
            if pool is None or p is pool:
                out[s] += v
        return out

    # -- queries ---------------------------------------------------------------------

    def get(self, gpu_id: GpuId) -> BoardGpu:
        """The GPU ``(node_id, index)``.

        Raises:
            KeyError: no such GPU.
        """
        return self._by_id[gpu_id]

    def counts(self, pool: Pool | None = None) -> dict[GpuState, int]:
        """GPUs per state now, in ``pool`` or the whole cluster."""
        out = dict.fromkeys(_STATES, 0)
        for (p, s), n in self._counts.items():
            if pool is None or p is pool:
                out[s] += n
        return out

    def count(self, state: GpuState) -> int:
        """GPUs in ``state`` now, over the whole cluster."""
        return sum(self._counts[p, state] for p in _POOLS)

    def pool_size(self, pool: Pool) -> int:
        return sum(n for (p, _), n in self._counts.items() if p is pool)

    def views(self) -> tuple[GpuView, ...]:
        """Frozen views of every GPU, sorted by (node_id, index); cached until a change."""
        if self._views is None:
            listed = self._view_list
            if listed is None:
                listed = self._view_list = [g.view() for g in self.gpus]
            else:
                position = self._position
                for g in self._dirty:
                    listed[position[g.node_id, g.index]] = g.view()
            self._dirty.clear()
            self._views = tuple(listed)
        return self._views

    def held(self, job: str) -> tuple[BoardGpu, ...]:
        """The GPUs training job ``job`` holds (TRAINING or LENT)."""
        return tuple(self._held.get(job, ()))

    def holders(self) -> Iterator[tuple[str, tuple[BoardGpu, ...]]]:
        """(job, its GPUs) for every job holding at least one GPU."""
        for job, gpus in self._held.items():
            if gpus:
                yield job, tuple(gpus)

    # -- changes ---------------------------------------------------------------------

    def move(self, gpu: BoardGpu, new: GpuState) -> None:
        """Change one GPU's state after checking the transition.

        Clears what the new state does not carry: the job unless TRAINING/LENT, the
        service and hits unless a replica stays loaded, the protect end unless
        PROTECT. The caller sets the fields the new state needs.

        Raises:
            InvalidDecisionError: ``gpu.state -> new`` is not a legal transition.
        """
        check_transition(gpu.state, new, f"GPU {gpu.gpu_id}")
        self._set(gpu, new)

    def fail(self, gpu: BoardGpu, new: GpuState = GpuState.FREE) -> None:
        """A fact of the world, never a decision (checked against ``FAILURES``): a
        failure empties ``gpu`` (its replica's or its worker's process died: FREE), its
        node left the cluster (a FREE GPU goes DOWN) or came back (DOWN -> FREE).

        Raises:
            InvalidDecisionError: ``gpu.state -> new`` is not such a fact (a FREE GPU
                that fails, a loaded one that goes DOWN without failing first).
        """
        check_transition(gpu.state, new, f"GPU {gpu.gpu_id}", failure=True)
        self._set(gpu, new)

    def restore(
        self,
        gpu: BoardGpu,
        state: GpuState,
        *,
        job: str | None = None,
        service: str | None = None,
        replica: str | None = None,
        hits: int = 0,
        protect_until: float | None = None,
    ) -> None:
        """Recovery only: a FREE ``gpu`` takes the state its stored row records, with
        the fields that state carries (a job for TRAINING/LENT; a service for a loaded
        replica; a protect end for PROTECT).

        Raises:
            InvalidDecisionError: ``gpu`` is not FREE, or the fields do not fit ``state``.
        """
        held, loaded = state in _HELD, state in _LOADED
        ok = (
            gpu.state is GpuState.FREE
            and (job is not None) == held
            and (service is not None) == loaded
            and (protect_until is not None) == (state is GpuState.PROTECT)
            and not (held and state is not _held_state(gpu.pool))
        )
        if not ok:
            raise InvalidDecisionError(
                f"GPU {gpu.gpu_id}: cannot restore {state.name} (job {job!r}, service "
                f"{service!r}, protect end {protect_until!r}) onto {gpu.state.name}"
            )
        if held:
            assert job is not None
            self.assign(gpu, job)
            return
        self._set(gpu, state)
        gpu.service, gpu.replica, gpu.hits = service, replica, hits
        gpu.protect_until = protect_until
        self.touch(gpu)

    def _set(self, gpu: BoardGpu, new: GpuState) -> None:
        old = gpu.state
        self._counts[gpu.pool, old] -= 1
        self._counts[gpu.pool, new] += 1
        gpu.state = new
        if new not in _HELD and gpu.job is not None:
            self._held[gpu.job].remove(gpu)
            gpu.job = None
        if new not in _LOADED:
            gpu.service = None
            gpu.hits = 0
            gpu.replica = None
            gpu.replica_gpus = ()
        if new is not GpuState.PROTECT:
            gpu.protect_until = None
        self.touch(gpu)

    def touch(self, gpu: BoardGpu) -> None:
        """Record that ``gpu``'s fields changed (drops cached views, bumps version)."""
        gpu.version += 1
        gpu._view = None
        self._views = None
        if self._view_list is not None:
            self._dirty.append(gpu)

    def release_job(self, job: str) -> None:
        """Every GPU of ``job`` goes back to FREE (the job finished or was preempted)."""
        for gpu in list(self._held.get(job, ())):
            self.move(gpu, GpuState.FREE)
        self._held.pop(job, None)

    def assign(self, gpu: BoardGpu, job: str) -> None:
        """``job`` takes a FREE GPU: TRAINING on the training pool, LENT on the
        inference pool.

        Raises:
            InvalidDecisionError: the GPU is not FREE (evict a SLEEP replica first).
        """
        if gpu.state is not GpuState.FREE:
            raise InvalidDecisionError(f"GPU {gpu.gpu_id} is {gpu.state.name}, not FREE")
        self.move(gpu, _held_state(gpu.pool))
        gpu.job = job
        self._held.setdefault(job, []).append(gpu)

    def take_from_job(self, gpu: BoardGpu, new: GpuState) -> str:
        """Take a LENT GPU back from its job (reclaim); returns the job's name.

        Raises:
            InvalidDecisionError: the GPU is not LENT, or the transition is illegal.
        """
        job = gpu.job
        if gpu.state is not GpuState.LENT or job is None:
            raise InvalidDecisionError(f"GPU {gpu.gpu_id} is {gpu.state.name}, not LENT")
        self.move(gpu, new)
        return job

    # -- debug -----------------------------------------------------------------------

    def check(self, placements: Mapping[str, Placement]) -> None:
        """Re-derive every invariant from the GPUs themselves (debug hook; O(GPUs)).

        Every GPU is in exactly one state; the per-state counts match; TRAINING GPUs
        are on the training pool and LENT ones on the inference pool, each held by
        exactly one job; the GPUs each job holds match its placement node by node
        (so lent GPUs are counted exactly once); loaded replicas name a service.

        Args:
            placements: The placement of every training job holding GPUs.

        Raises:
            AssertionError: an invariant is broken (a simulator bug).
        """
        seen: Counter[tuple[Pool, GpuState]] = Counter((g.pool, g.state) for g in self.gpus)
        assert len({g.gpu_id for g in self.gpus}) == len(self.gpus) == self.cluster.total_gpus
        for key, n in self._counts.items():
            assert seen[key] == n, f"count of {key} is {n}, GPUs say {seen[key]}"
        owners: dict[str, Counter[int]] = {}
        for g in self.gpus:
            if g.state is GpuState.TRAINING:
                assert g.pool is Pool.TRAINING and g.job, f"bad TRAINING GPU {g.gpu_id}"
            if g.state is GpuState.LENT:
                assert g.pool is Pool.INFERENCE and g.job, f"bad LENT GPU {g.gpu_id}"
            if g.state in _HELD:
                assert g.job is not None
                owners.setdefault(g.job, Counter())[g.node_id] += 1
                assert g in self._held[g.job], f"GPU {g.gpu_id} missing from {g.job}'s list"
            else:
                assert g.job is None, f"{g.state.name} GPU {g.gpu_id} names job {g.job}"
            assert (g.service is not None) == (g.state in _LOADED), f"GPU {g.gpu_id}"
            assert (g.protect_until is not None) == (g.state is GpuState.PROTECT)
            if g.replica_gpus:
                assert g.gpu_id in g.replica_gpus, f"GPU {g.gpu_id} outside its replica"
                for member in g.replica_gpus:
                    m = self._by_id[member]
                    same = (m.node_id, m.state, m.service, m.replica_gpus)
                    assert same == (g.node_id, g.state, g.service, g.replica_gpus), (
                        f"replica {g.replica_gpus} split: GPU {member} differs from {g.gpu_id}"
                    )
        for job, gpus in self._held.items():
            assert Counter(g.node_id for g in gpus) == owners.get(job, Counter()), job
        want = {j: Counter(p.counts()) for j, p in placements.items() if p}
        assert owners == want, f"GPUs held {owners} != placements {want}"


def apply_gpu_op(board: GpuBoard, op: ops.AnyOperation) -> BoardGpu | None:
    """Apply the GPU part of one operation to ``board`` (both worlds call this; what
    else an operation means, a world does around it). Job operations (``Start``,
    ``Resize``, ``Preempt``) change no GPU here: their ``Bind``/``Release``/... do.

    ``StartReplica`` on a RUNNING GPU is a task joining its replica (no move);
    ``WarmReplica`` takes a FREE GPU only (LENT/TRAINING -> RUNNING are a task's
    reclaim, never a warm-up's).

    A replica of several GPUs (the op's ``gpus``) moves as a whole: all of its GPUs
    change together, or the op is refused (:func:`_apply_replica`); an op naming one
    GPU of such a replica without its ``gpus`` is refused too (a split replica).

    Returns:
        The GPU the operation changed (None for a job operation).

    Raises:
        InvalidDecisionError: an illegal transition, or a ``WarmReplica`` on a GPU
            that is not FREE.
    """
    gpu_id = getattr(op, "gpu", None)
    if gpu_id is None:
        return None
    gpu = board.get(gpu_id)
    if isinstance(op, _REPLICA_OPS):
        if op.gpus:
            return _apply_replica(board, op, op.gpus)
        if gpu.replica_gpus and not (isinstance(op, ops.StartReplica) and gpu.state is _RUNNING):
            raise InvalidDecisionError(
                f"{op!r}: GPU {gpu_id} is one of the replica {gpu.replica_gpus}: an "
                "operation on it must name all of its GPUs (gpus)"
            )
    if isinstance(op, ops.Release):
        board.move(gpu, GpuState.FREE)
    elif isinstance(op, ops.Bind | ops.Lend):
        board.assign(gpu, op.job)
    elif isinstance(op, ops.EvictReplica):
        board.move(gpu, GpuState.FREE)
        board.evictions += 1
    elif isinstance(op, ops.Reclaim):
        board.take_from_job(gpu, GpuState.FREE)
    elif isinstance(op, ops.StartReplica | ops.WarmReplica):
        if isinstance(op, ops.WarmReplica) and gpu.state is not GpuState.FREE:
            raise InvalidDecisionError(f"{op!r}: GPU is {gpu.state.name}, not FREE")
        if gpu.state is not GpuState.RUNNING:
            board.move(gpu, GpuState.RUNNING)
        gpu.service = op.service
        gpu.hits = op.hits if isinstance(op, ops.StartReplica) else 0
        board.touch(gpu)
    elif isinstance(op, ops.ProtectReplica):
        board.move(gpu, GpuState.PROTECT)
        gpu.protect_until = op.until
        board.touch(gpu)
    elif isinstance(op, ops.SleepReplica):
        board.move(gpu, GpuState.SLEEP)
        gpu.hits = 0
        board.touch(gpu)
    else:  # pragma: no cover - exhaustiveness guard for future operations
        raise AssertionError(f"no GPU rule for operation {op!r}")
    return gpu


_RUNNING = GpuState.RUNNING
_REPLICA_OPS = (
    ops.StartReplica,
    ops.WarmReplica,
    ops.ProtectReplica,
    ops.SleepReplica,
    ops.EvictReplica,
)


def _apply_replica(
    board: GpuBoard,
    op: ops.StartReplica
    | ops.WarmReplica
    | ops.ProtectReplica
    | ops.SleepReplica
    | ops.EvictReplica,
    ids: tuple[GpuId, ...],
) -> BoardGpu:
    """Apply a replica operation to every GPU of a replica that spans ``ids``.

    Rules: ``ids`` are distinct GPUs of one node in index order, ``op.gpu`` first;
    a new replica (``StartReplica`` with ``cold``, ``WarmReplica``) takes GPUs that
    are all FREE; every other operation names exactly the GPUs of the replica loaded
    on ``op.gpu`` (a task joining a RUNNING replica moves nothing).

    Returns:
        The lead GPU (``op.gpu``).

    Raises:
        InvalidDecisionError: a rule is broken; nothing was changed.
    """
    gpus = [board.get(i) for i in ids]
    lead = gpus[0]
    if (
        len(set(ids)) != len(ids)
        or ids[0] != op.gpu
        or list(ids) != sorted(ids)
        or len({g.node_id for g in gpus}) != 1
    ):
        raise InvalidDecisionError(
            f"{op!r}: a replica's GPUs must be distinct GPUs of one node in index order, "
            f"its lead first"
        )
    new = isinstance(op, ops.WarmReplica) or (
        isinstance(op, ops.StartReplica) and op.cold and lead.state is not _RUNNING
    )
    if new:
        busy = [g.gpu_id for g in gpus if g.state is not GpuState.FREE]
        if busy:
            raise InvalidDecisionError(f"{op!r}: GPUs {busy} are not FREE")
    elif lead.replica_gpus != ids:
        raise InvalidDecisionError(
            f"{op!r}: GPU {op.gpu} holds the replica {lead.replica_gpus or (op.gpu,)}, "
            f"not {ids} (a replica moves as a whole)"
        )
    if isinstance(op, ops.StartReplica | ops.WarmReplica):
        hits = op.hits if isinstance(op, ops.StartReplica) else 0
        for g in gpus:
            if g.state is not _RUNNING:
                board.move(g, _RUNNING)
            g.service, g.hits, g.replica_gpus = op.service, hits, ids
            board.touch(g)
    elif isinstance(op, ops.ProtectReplica):
        for g in gpus:
            board.move(g, GpuState.PROTECT)
            g.protect_until = op.until
            g.replica_gpus = ids
            board.touch(g)
    elif isinstance(op, ops.SleepReplica):
        for g in gpus:
            board.move(g, GpuState.SLEEP)
            g.hits = 0
            g.replica_gpus = ids
            board.touch(g)
    else:
        for g in gpus:
            board.move(g, GpuState.FREE)
        board.evictions += 1
    return lead
