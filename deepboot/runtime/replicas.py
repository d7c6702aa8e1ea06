"""Inference replicas as the controller runs them: a task's replica woken warm or
started cold (an actor per replica, named by service, GPU and incarnation), evicted
ones killed; the ledger has the GPU's state, the router the replica's requests."""

from __future__ import annotations

from deepboot.core.gpu import GpuId
from deepboot.runtime.polling import Polling
from deepboot.runtime.replica import replica_name
from deepboot.runtime.store import LogKind
from deepboot.runtime.world import gpu_name
from deepboot.scheduler.operations import StartReplica
from deepboot.world.gpus import apply_gpu_op


class Replicas(Polling):
    """Replica actors around the ledger's replica operations."""

    def start_replica(self, op: StartReplica) -> None:
        """A task's replica on ``op.gpu``: the idle one of its service there, woken
        (warm), or a new actor (cold; one of another service there is killed first)."""
        rec = self.board.get(op.gpu)
        self.arrived.pop(op.task, None)
        self.waiting.pop(op.task, None)
        replica, service = rec.replica, rec.service
        warm = not op.cold and replica is not None and service == op.service
        if not warm and replica is not None:
            self.replica_gone(op.gpu, replica, service)
        apply_gpu_op(self.board, op)
        gpu = gpu_name(op.gpu)
        if warm:
            assert replica is not None
            rec.replica = replica
            if self.router is not None:
                handle = self.actors.handle(replica)
                self.router.start_replica(
                    gpu, op.service, replica, handle, cold=False, task=op.task
                )
            # A warm reuse is not logged: in a lull it happens at every request.
            return
        spec = self.specs[op.service]
        name = replica_name(op.service, gpu, self._next_incarnation(f"replica:{op.service}"))
        rec.replica = name
        self.note(LogKind.REPLICA, gpu=gpu, service=op.service, op="start", cold=True)
        # Durable before the actor exists: a controller that dies in between finds a
        # row naming a replica that is not there (the GPU comes back FREE), never a
        # live replica no row names.
        self.flush()
        self.fault("cold.recorded")
        handle = self.actors.create_replica(
            name, spec.to_json(), gpu, str(self.state.logs / f"service-{op.service}.log")
        )
        if self.router is not None:
            self.router.start_replica(gpu, op.service, name, handle, cold=True, task=op.task)

    def replica_gone(self, gpu: GpuId, replica: str | None, service: str | None) -> None:
        """The replica ``replica`` that was on ``gpu`` is evicted: kill its actor and
        tell the router (the ledger has moved the GPU already)."""
        if replica is None:
            return
        self.actors.kill(replica)
        self.fault("evict.killed")
        if self.router is not None:
            self.router.stop_replica(gpu_name(gpu))
        self.note(LogKind.REPLICA, gpu=gpu_name(gpu), service=service, op="evict")
