"""The controller's process: the controller (:mod:`deepboot.runtime.controller`) and
the router that serves HTTP for it (:mod:`deepboot.runtime.http`), wired together.

One process per cluster: ``deepboot up`` starts it; ``python -m
deepboot.runtime.controller_process --state-dir DIR`` runs it by hand. It takes the
state directory's lock, connects to Ray, builds the controller, opens the router on
the settings' address (a restarted controller keeps its port) and hands it to the
controller as its :class:`~deepboot.runtime.messages.RouterPort`, then runs the
controller's loop until SIGTERM. This is the one module that imports both the
controller and ``http/``; they meet only in :mod:`deepboot.runtime.messages`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import sys
import threading
from typing import Any

from deepboot.runtime.actors.handles import RayActors
from deepboot.runtime.actors.rayplacement import RayAsks
from deepboot.runtime.cluster.raycluster import ClusterRecord, ray_env
from deepboot.runtime.controller.controller_settings import ControllerSettings, settings_file
from deepboot.runtime.controller.wiring import Controller
from deepboot.runtime.logbounds import configure as configure_logging
from deepboot.runtime.store.jobstore import JobStore
from deepboot.runtime.store.statedir import STATE_DIR_HELP, StateDir
from deepboot.runtime.store.statelock import HeldElsewhereError, StateLock

__all__ = ["main", "open_router", "register_service", "submit_job"]

log = logging.getLogger("deepboot.controller")


def submit_job(state: StateDir, wake: threading.Event, raw: dict[str, Any]) -> str:
    """``POST /v1/jobs`` (on the router's thread): check the job's file and store it
    for the controller's next poll, which ``wake`` hastens. Returns its name.

    Raises:
        InputError: The body is not a valid job file (a 400 naming the key).
    """
    from deepboot.runtime.client.jobspec import parse_job

    # A relative entry file is resolved against the state directory's parent (where
    # 'deepboot up' ran); clients should send absolute paths.
    spec = parse_job(raw, "POST /v1/jobs", state.root.parent)
    store = JobStore(state.db)
    try:
        store.submit(spec)
    finally:
        store.close()
    wake.set()
    return spec.name


def register_service(state: StateDir, wake: threading.Event, raw: dict[str, Any]) -> str:
    """``POST /v1/services`` (on the router's thread): check the service's file and
    store it for the controller's next poll. Returns its name.

    Raises:
        InputError: The body is not a valid service file (a 400 naming the key).
    """
    from deepboot.runtime.client.servicespec import parse_service

    raw = {k: v for k, v in raw.items() if v is not None}  # to_json's unset cold start
    spec = parse_service(raw, "POST /v1/services", state.root.parent)
    store = JobStore(state.db)
    try:
        store.register_service(spec)
    finally:
        store.close()
    wake.set()
    return spec.name


def open_router(ctl: Controller) -> Any:
    """Serve HTTP (requests, submissions, metrics, the dashboard) for ``ctl`` on its
    settings' host and port, and record where (``http.json``). A restarted controller
    keeps its address, so clients reconnect; if another process took that port, any
    free one. Returns the :class:`~deepboot.runtime.http.router.Router`, serving; the
    controller records its address once it has handed it the services
    (:meth:`~deepboot.runtime.controller.intake.Intake.connect_router`)."""
    from deepboot.runtime.http.frontdoor import is_loopback  # aiohttp: runtime extra
    from deepboot.runtime.http.router import Router

    s, state = ctl.settings, ctl.state
    # The token guards every route that accepts work, on loopback too.
    state.ensure_http_token()
    token = state.read_http_token()
    port = s.http_port
    if port == 0 and state.http_file.exists():
        with contextlib.suppress(ValueError, OSError, KeyError):
            port = int(json.loads(state.http_file.read_text())["port"])

    def serve(on: int) -> Router:
        router = Router(
            ctl.inbox, ctl.metrics, s.http_host, on, token,
            submit=functools.partial(submit_job, state, ctl.inbox.wake),
            register=functools.partial(register_service, state, ctl.inbox.wake),
            state=state,
        )  # fmt: skip
        router.start()
        return router

    try:
        router = serve(port)
    except OSError:
        if port == s.http_port:
            raise
        router = serve(0)  # the old port is taken: any free one (http.json says)
    reads = "open on loopback" if is_loopback(s.http_host) else "need the token too"
    log.info("HTTP endpoint at %s (work needs the token; reads %s)", router.url, reads)
    return router


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deepboot.runtime.controller_process")
    parser.add_argument("--state-dir", default=None, help=STATE_DIR_HELP)
    args = parser.parse_args(argv)
    state = StateDir.at(args.state_dir)
    # One controller per state directory, whatever started it: the OS lock is held
    # until this process ends (a SIGKILL included), so it is never stale.
    try:
        lock = StateLock(state.ensure().controller_lock, "a controller").acquire()
    except HeldElsewhereError as exc:
        print(f"deepboot: {exc}; this one exits", file=sys.stderr)
        return 3
    state.write_controller_pid(os.getpid())
    record = ClusterRecord.load(state)
    settings = ControllerSettings.load(settings_file(state))
    os.environ.update(ray_env(record))
    # The log rotates, bounded; descriptors 1 and 2 (Ray's C++ core, a traceback at
    # exit) go to it too (deepboot.runtime.logbounds).
    log_path = state.logs / "controller.log"
    if sys.stderr.isatty():
        print(f"deepboot: the controller logs to {log_path}", file=sys.stderr)
    configure_logging(log_path)
    import ray

    ray.init(
        address=record.address,
        namespace="deepboot",
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    ctl = Controller(state, settings, record.cluster, RayActors(RayAsks.of(record)))
    try:
        ctl.run(router=lambda: open_router(ctl))
    finally:
        ray.shutdown()
        lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
