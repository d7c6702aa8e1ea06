"""Nodes that leave the Ray cluster, and come back.

A deepboot node is one Ray node (``rayresources``). When Ray stops listing it alive,
its GPUs leave the ledger: each worker there is a dead worker (its job's round on
WORKER_LOST re-plans it on the GPUs that are left), each replica there a dead replica
(REPLICA_LOST: its queued tasks are tried again), and the GPU goes DOWN, where no
decision may use it. When the node is alive again (the same ``deepboot_node_<n>``
resource, e.g. ``ray start`` run again with it), its GPUs come back FREE for the next
round. Both are facts of the world (``GpuBoard.fail``), logged as ``node`` entries.

Ray is asked at most every ``ControllerSettings.node_check`` seconds; an answer it
cannot give (``Actors.live_nodes`` returns None) changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from deepboot.core.cluster import ClusterSpec
from deepboot.core.gpu import GpuState
from deepboot.runtime.actors.handles import Actors
from deepboot.runtime.controller.controller_settings import ControllerSettings
from deepboot.runtime.controller.eventlog import EventLog
from deepboot.runtime.controller.hostcaches import HostCaches
from deepboot.runtime.controller.jobrecords import JobRec, gpu_name
from deepboot.runtime.controller.polling import Polling
from deepboot.runtime.controller.replicas import Replicas
from deepboot.runtime.controller.shared import Post, RouterLink
from deepboot.runtime.store.jobstore import LogKind
from deepboot.scheduler.events import Event, EventKind
from deepboot.world.gpus import BoardGpu, GpuBoard

log = logging.getLogger("deepboot.controller")


class Nodes:
    """The ledger follows the Ray cluster's live nodes (see the module docstring).

    Args:
        cluster: The cluster's nodes.
        board: The GPU ledger.
        jobs: The jobs not yet ended, by name.
        polling: A lost node's workers die through it (frees their GPUs).
        replicas: A lost node's standby and cache are forgotten; a returned node's
            started again.
        actors: Ray's live nodes; the lost replicas' actors.
        router: Told of each replica lost.
        settings: The controller's settings (how often to look).
        log: The event log.
        post: The driver's queue (REPLICA_LOST).
        clock: Wall clock.
        caches: The node-local model caches (a returned node's starts again).
    """

    def __init__(
        self,
        cluster: ClusterSpec,
        board: GpuBoard,
        jobs: dict[str, JobRec],
        polling: Polling,
        replicas: Replicas,
        actors: Actors,
        router: RouterLink,
        settings: ControllerSettings,
        log: EventLog,
        post: Post,
        clock: Callable[[], float],
        caches: HostCaches,
    ) -> None:
        self.caches = caches
        self.cluster, self.board, self.jobs, self.polling = cluster, board, jobs, polling
        self.replicas, self.actors, self.router, self.settings = replicas, actors, router, settings
        self.log, self.post, self.clock = log, post, clock
        self._nodes_checked: float | None = None

    def check_nodes(self) -> None:
        """Take the GPUs of nodes Ray no longer lists alive out of the ledger, and
        bring back those of nodes that returned (at most every ``node_check`` s)."""
        now = self.clock()
        last = self._nodes_checked
        if last is not None and now - last < self.settings.node_check:
            return
        self._nodes_checked = now
        live = self.actors.live_nodes()
        if live is None:
            return  # Ray did not answer: nothing is known to have changed
        for node in self.cluster.nodes:
            gpus = [g for g in self.board.gpus if g.node_id == node.node_id]
            down = [g for g in gpus if g.state is GpuState.DOWN]
            if node.node_id not in live and len(down) < len(gpus):
                self._node_left(node.node_id, [g for g in gpus if g.state is not GpuState.DOWN])
            elif node.node_id in live and down:
                for g in down:
                    self.board.fail(g, GpuState.FREE)
                log.warning("node %d is back: %d GPUs free", node.node_id, len(down))
                self.caches.node_back(node.node_id)
                self.replicas.start_standbys()  # its standby died with it (forgotten when it left)
                self.log.note(LogKind.NODE, node=node.node_id, op="returned",
                          gpus=[gpu_name(g.gpu_id) for g in down])  # fmt: skip

    def _node_left(self, node: int, gpus: list[BoardGpu]) -> None:
        log.warning("node %d left the Ray cluster: %d GPUs out of the ledger", node, len(gpus))
        for g in gpus:
            name = gpu_name(g.gpu_id)
            if g.job is not None:
                rec = self.jobs.get(g.job)
                if rec is not None and name in rec.actors:
                    self.polling.workers_died(rec, [name])  # frees the GPU, posts WORKER_LOST
            if g.replica is not None or g.service is not None:
                self.log.note(LogKind.REPLICA, gpu=name, service=g.service, op="died",
                          error=f"node {node} left the cluster", phase="serve",
                          backoff_s=0.0)  # fmt: skip
                if g.replica is not None:
                    self.actors.kill(g.replica)
                self.router.stop_replica(name)
                self.board.fail(g)
                self.post(Event(EventKind.REPLICA_LOST, gpu=g.gpu_id))
            if g.state is not GpuState.FREE:  # a holder the controller had no actor of
                self.board.fail(g)
            self.board.fail(g, GpuState.DOWN)
        self.log.note(LogKind.NODE, node=node, op="left", gpus=[gpu_name(g.gpu_id) for g in gpus])
        self.replicas.node_left(node)  # its standby and model cache died with it
