"""Calls into a replica's actor from the router's loop: each one bounded, and what its
failure means (the actor died, the handler raised, the wait ran out).

:func:`load` is a new replica's start (its GPU, then its handler's load), classified
into :class:`Loaded` or :class:`LoadFailed` for
:class:`~deepboot.runtime.http.dispatch.Dispatcher`; the helpers below tell its
``infer`` calls' errors apart likewise.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from deepboot.runtime.http.routerstate import PLACE_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class Loaded:
    """A replica loaded: in ``seconds``, by a ``start`` of ``"cold"``, ``"host"``
    (from its node's cache) or ``"wake"`` (a sleeping server woken)."""

    seconds: float
    start: str
    address: str = ""  # a command replica's server
    wake_failed: str = ""  # a command replica whose wake failed (then started cold)


@dataclass(frozen=True, slots=True)
class LoadFailed:
    """A replica did not load. ``broken``: its handler raised (it never will load, so
    what waits for it is failed at once); otherwise it died or ran out of time."""

    error: str
    broken: bool


def ray_future(ref: Any) -> asyncio.Future[Any]:
    """An ``ObjectRef`` as a future of the running loop."""
    return asyncio.wrap_future(ref.future())


async def load(handle: Any, name: str, limit: float, command: bool = False) -> Loaded | LoadFailed:
    """Wait for the replica ``name``'s actor to start (at most ``PLACE_TIMEOUT_S``:
    Ray starts it once its GPU is released, by a lent worker's shrink or an evicted
    replica; a ``command`` replica's actor starts at once and then waits as long for
    its GPUs), then for its handler or server to load (at most ``limit`` seconds).

    Raises:
        asyncio.CancelledError: the calling task itself is cancelled.
    """
    stage = f"did not get its GPU within {PLACE_TIMEOUT_S:g} s"
    try:
        await asyncio.wait_for(ray_future(handle.pid.remote()), PLACE_TIMEOUT_S)
        if command:  # it runs already; its GPUs it holds by a placement group of its own
            await asyncio.wait_for(ray_future(handle.hold.remote()), PLACE_TIMEOUT_S)
        stage = f"did not load within {limit:g} s"
        loaded = await asyncio.wait_for(ray_future(handle.load.remote()), limit)
    except TimeoutError:
        return LoadFailed(f"replica {name} {stage}", broken=False)
    except asyncio.CancelledError:
        if we_are_cancelled():
            raise
        return LoadFailed(f"replica {name}: its load was cancelled", broken=False)
    except Exception as exc:  # the actor died, or the handler failed to build
        return LoadFailed(f"{type(exc).__name__}: {exc}", broken=is_task_error(exc))
    if isinstance(loaded, dict):
        return Loaded(
            float(loaded["seconds"]),
            str(loaded["start"]),
            str(loaded.get("address", "")),
            str(loaded.get("wake_failed", "")),
        )
    # A replica an older deepboot started (detached: it outlives upgrades).
    return Loaded(float(loaded), "cold")


async def watch(handle: Any) -> str:
    """Wait until a command replica's server can serve no more: why ("" when it
    slept or stopped, as the controller asked). Its actor's death is a reason too.

    Raises:
        asyncio.CancelledError: the calling task itself is cancelled.
    """
    try:
        epoch = await ray_future(handle.epoch.remote())
        return str(await ray_future(handle.watch.remote(epoch)))
    except asyncio.CancelledError:
        if we_are_cancelled():
            raise
        return ""
    except Exception as exc:  # the actor died
        return f"{type(exc).__name__}: {exc}"


def we_are_cancelled() -> bool:
    """True when the running task itself is being cancelled (not an awaited future)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def cause_name(exc: BaseException) -> str:
    """The class name of the user's exception inside a Ray task error."""
    cause = getattr(exc, "cause", None)
    return type(cause).__name__ if isinstance(cause, BaseException) else "an exception"


def is_task_error(exc: BaseException) -> bool:
    """True when ``exc`` is the user's code raising (not the actor dying)."""
    with contextlib.suppress(ImportError):
        import ray

        if isinstance(exc, ray.exceptions.RayTaskError) and not isinstance(
            exc, ray.exceptions.RayActorError
        ):
            return True
    return False
