"""``deepboot replay``: the runtime's recorded loop, replayed in the simulator's way.

The controller records every step of its control loop (``STATE_DIR/recording``:
the event, the snapshot the loop read, the generator's state, the step it returned;
and each controller start with its settings). A replay builds the loop from each
start's settings (with the caller's overrides: another policy, another parameter),
feeds it every recorded step's inputs on the recorded clock (the loop reads no
other), and compares what it returns with what the runtime's loop returned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from deepboot.runtime.controller.controller_settings import ControllerSettings, build_loop
from deepboot.runtime.store.statedir import StateDir
from deepboot.scheduler.control import ControlLoop, Step
from deepboot.world.recording import Divergence, ReplayResult, read_recording, replay


def replay_state(
    state: StateDir,
    policy: str | None = None,
    params: Mapping[str, str] | None = None,
    on_step: Callable[[], None] | None = None,
) -> ReplayResult:
    """Replay ``state``'s recording; ``policy``/``params`` replace the recorded ones
    (a what-if: where would that policy have decided otherwise?).

    Raises:
        ValueError: no recording, or one of another format.
        ConfigError: an override the runtime cannot build.
    """

    def loop_for(raw: Mapping[str, Any]) -> ControlLoop:
        settings = ControllerSettings.from_dict(raw)
        if policy is not None:
            settings = dataclasses.replace(settings, policy=policy, params={})
        if params:
            settings = dataclasses.replace(settings, params={**settings.params, **params})
        return build_loop(settings)

    return replay(read_recording(state.recording), loop_for, on_step)


def describe(d: Divergence) -> list[str]:
    """The first divergence, in lines a person reads."""
    e = d.event
    what = e.kind.value + "".join(
        f" {k}={v}" for k, v in (("job", e.job), ("gpu", e.gpu), ("service", e.service)) if v
    )
    return [
        f"first divergence at step {d.index} (t={d.now:.3f}, event {what}):",
        f"  recorded: {_step(d.recorded)}",
        f"  replayed: {_step(d.replayed)}",
    ]


def _step(step: Step) -> str:
    ops = ", ".join(repr(op) for op in step.ops) or "no operation"
    waits = ", ".join(f"{u.name} ({u.reason.value})" for u in step.unplaced)
    return ops + (f"; waiting: {waits}" if waits else "")
