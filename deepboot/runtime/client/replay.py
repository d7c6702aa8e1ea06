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
from deepboot.world.recording import ReplayResult, read_recording, replay


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


def describe(result: ReplayResult) -> list[str]:
    """The first divergence and what followed it, in lines a person reads; times are
    seconds after the first step replayed."""
    d = result.divergence
    if d is None:
        return []
    e = d.event
    what = e.kind.value + "".join(
        f" {k}={v}" for k, v in (("job", e.job), ("gpu", e.gpu), ("service", e.service)) if v
    )
    since = d.now - (d.now if result.first_now is None else result.first_now)
    lines = [
        f"first divergence at step {d.index}, {since:.1f} s into the recording (event {what}):",
        f"  recorded: {_step(d.recorded)}",
        f"  replayed: {_step(d.replayed)}",
    ]
    after = result.after
    if after is None:
        return lines
    lines.append(
        f"after it: {after.differing} of {after.steps} steps decided otherwise"
        + (f" (the replay stopped at {after.stopped})" if after.stopped else "")
    )
    kinds = sorted(set(after.recorded) | set(after.replayed))
    if kinds:
        counts = ", ".join(
            f"{k} {after.recorded.get(k, 0)} -> {after.replayed.get(k, 0)}" for k in kinds
        )
        lines.append(f"  operations, recorded -> replayed: {counts}")
    if after.by_job:
        largest = sorted(after.by_job.items(), key=lambda kv: (-abs(kv[1]), kv[0]))[:5]
        lines.append(
            "  largest differences (replayed minus recorded operations): "
            + ", ".join(f"{who} {n:+d}" for who, n in largest)
        )
    lines.append(
        "  (the recorded world followed the recorded decisions: what the other choices "
        "would have done to completion times is for 'deepboot simulate' to tell)"
    )
    return lines


def _step(step: Step) -> str:
    ops = ", ".join(repr(op) for op in step.ops) or "no operation"
    waits = ", ".join(f"{u.name} ({u.reason.value})" for u in step.unplaced)
    return ops + (f"; waiting: {waits}" if waits else "")
