"""The scheduler: turns a policy's allocation into a validated Decision."""

from __future__ import annotations

import numpy as np

from deepboot.core.errors import InvalidDecisionError
from deepboot.core.modes import JobMode
from deepboot.core.placement import EMPTY
from deepboot.core.state import ClusterState
from deepboot.policies.base import TrainingPolicy
from deepboot.policies.topup import TopUpConfig, top_up
from deepboot.policies.typecut import one_type_each
from deepboot.scheduler.decision import (
    Decision,
    Operation,
    Preempt,
    Resize,
    Start,
    validate_decision,
)


class Scheduler:
    """The control loop's decision step, shared by the simulator and the runtime.

    It holds no per-job state and never reads a clock: time is ``state.now``.

    Attributes:
        policy: The training-allocation policy consulted each round.
    """

    def __init__(self, policy: TrainingPolicy) -> None:
        self.policy = policy

    @property
    def job_mode(self) -> JobMode:
        """The batch/replica regime the policy assumes."""
        return self.policy.job_mode

    def decide(self, state: ClusterState, rng: np.random.Generator) -> Decision:
        """Ask the policy for an allocation and turn it into validated operations.

        On a cluster of several GPU types, a policy that does not declare
        ``type_aware`` has each placement cut to one type
        (:func:`~deepboot.policies.typecut.one_type_each`).

        Args:
            state: The snapshot to decide on; never mutated.
            rng: The only source of randomness, passed to the policy.

        Returns:
            One operation per job whose placement changes, in ``state.jobs`` order.

        Raises:
            InvalidDecisionError: the policy placed an unknown job, double-booked a
                GPU, exceeded a node's capacity or a job's ``max_replicas``. Nothing
                has been applied.
        """
        alloc = self.policy.allocate(state, rng)
        if state.cluster.heterogeneous and not getattr(self.policy, "type_aware", False):
            alloc = one_type_each(alloc, state.cluster, {j.name: j.placement for j in state.jobs})
        active = {j.name for j in state.jobs}
        unknown = sorted(name for name in alloc if name not in active)
        if unknown:
            raise InvalidDecisionError(
                f"policy {self.policy.name!r} placed unknown or inactive jobs {unknown}"
            )
        ops: list[Operation] = []
        for view in state.jobs:
            old = view.placement
            new = alloc.get(view.name, EMPTY)
            if new == old:
                continue
            if not new:
                ops.append(Preempt(view.name, old))
            elif not old:
                ops.append(Start(view.name, new))
            else:
                ops.append(Resize(view.name, old, new))
        decision = Decision(tuple(ops))
        validate_decision(decision, state)
        return decision

    def top_up(self, state: ClusterState, config: TopUpConfig) -> Decision:
        """Hand the GPUs nobody holds to the jobs now, between rounds
        (:func:`deepboot.policies.topup.top_up`), as validated operations.

        Only ``Start`` and growing ``Resize`` operations: no job shrinks or moves.

        Raises:
            InvalidDecisionError: the top-up broke an invariant (a bug); nothing has
                been applied.
        """
        grown = top_up(state, self.policy.job_mode, config)
        if state.cluster.heterogeneous:
            held = {j.name: j.placement for j in state.jobs}
            grown = {
                name: p
                for name, p in one_type_each(grown, state.cluster, held, stay=True).items()
                if p != held.get(name)
            }
        ops: list[Operation] = []
        for view in state.jobs:
            new = grown.get(view.name)
            if new is None:
                continue
            ops.append(
                Resize(view.name, view.placement, new) if view.placement else Start(view.name, new)
            )
        decision = Decision(tuple(ops))
        validate_decision(decision, state)
        return decision
