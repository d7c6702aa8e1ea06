"""The control loop shared by the simulator and the runtime: events in, decisions out."""

from deepboot.scheduler.decision import (
    Decision,
    Operation,
    Preempt,
    Resize,
    Start,
    new_placement,
    old_placement,
    resulting_allocation,
    validate_decision,
)
from deepboot.scheduler.events import Event, EventKind
from deepboot.scheduler.inference import (
    InferenceScheduler,
    lendable_capacity,
    validate_placement,
)
from deepboot.scheduler.loop import Scheduler

__all__ = [
    "Decision",
    "Event",
    "EventKind",
    "InferenceScheduler",
    "Operation",
    "Preempt",
    "Resize",
    "Scheduler",
    "Start",
    "new_placement",
    "old_placement",
    "lendable_capacity",
    "resulting_allocation",
    "validate_decision",
    "validate_placement",
]
