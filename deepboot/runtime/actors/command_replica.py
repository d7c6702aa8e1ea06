"""A command service's replica: one Ray actor that runs the service's own HTTP server
(vLLM, TGI, Triton, ``examples/runtime/standin_server.py``) on the replica's GPUs, on a
loopback port it chose, and that the router proxies requests to
(:mod:`deepboot.runtime.http.proxy`).

Its GPUs: the actor itself holds none (it runs on its node); it asks Ray for its
GPUs by a placement group of its own (one bundle, every GPU's resource: they are on
one node; :mod:`deepboot.runtime.actors.rayplacement`), as a promoted standby does
(:mod:`deepboot.runtime.actors.replica_actor`). So Ray starts the server only once
the GPUs' previous holders are gone, and the actor can give the GPUs back without
dying: a *sleep* (the service's ``sleep`` call, vLLM's ``POST /sleep?level=1``: the
server keeps its weights in host memory and frees the GPU) is followed by the
group's removal, and the GPUs are lent with the server process alive. A *wake* asks
for the same GPUs again (the lent worker must be gone first) and makes the
service's ``wake`` call: a host start, in the model cache's terms. A wake that fails
restarts the server (a cold start); both are logged.

The process is supervised as a command job's ranks are
(:mod:`deepboot.elastic.supervise`): its own session, it dies with this actor, its
lines go to ``deepboot logs SERVICE`` prefixed ``[service gpus]``, and a stop is
SIGTERM, ``stop_grace_s``, SIGKILL.

Every wait is bounded: the GPUs (:data:`PLACEMENT_WAIT_S`), the ready path (the
load timeout the caller gives), each sleep and wake (their ``timeout_s``), each
health probe (:data:`PROBE_TIMEOUT_S`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from deepboot.core.service import HttpCall, ServiceSpec
from deepboot.elastic.devices import CUDA_ENV, visible_devices
from deepboot.elastic.supervise import Supervised
from deepboot.runtime.actors.rayplacement import Ask, placement_group_for

PLACEMENT_WAIT_S = 600.0
"""Longest wait for the replica's GPUs (the router's load timeout ends it sooner)."""

READY_POLL_S = 0.1
"""How often the ready path is asked while the server starts or wakes."""

WAKE_RETRY_S = 2.0
"""The pause before a failed wake is tried once more (then, failed again, the server
starts cold)."""

PROBE_TIMEOUT_S = 5.0
"""Longest wait for one answer of the ready or health path."""

HEALTH_EVERY_S = 2.0
"""How often the health path is asked while the replica serves ..."""

HEALTH_FAILURES = 3
"""... and how many failures in a row end the replica."""

SPAWN_WAIT_S = 30.0
"""Longest wait for the server's process to be started (a fork and an exec)."""

COMMAND_CONCURRENCY = 8
"""The actor's ``max_concurrency``: the router's load and watch, the controller's
sleep and stop, and a pid call; requests never go through the actor."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (the server binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def http_call(url: str, method: str, timeout: float) -> tuple[int, str]:
    """One bounded request to the server; its status and the start of its body
    (status 0 and the error's words when it did not answer)."""
    req = urllib.request.Request(url, method=method, data=b"" if method != "GET" else None)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (loopback)
            return int(resp.status), resp.read(200).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read(200).decode("utf-8", "replace")
    except (OSError, ValueError) as exc:
        return 0, f"{type(exc).__name__}: {exc}"


class CommandReplica:
    """One replica of a command service (wrapped by ``ray.remote`` by the controller).

    Args:
        spec: The service (``ServiceSpec.to_json()``; ``command`` set).
        gpus: The GPU ids "node.index" it runs on (all of one node); the first names it.
        log_path: The service's log.
        ask: Its GPUs asked of Ray together (its placement group's one bundle:
            :meth:`~deepboot.runtime.actors.rayplacement.Placement.gpus`).
    """

    def __init__(self, spec: dict[str, Any], gpus: list[str], log_path: str, ask: Ask) -> None:
        from deepboot.runtime.logbounds import SharedLog

        self.spec = ServiceSpec.from_json(spec)
        self.gpus, self.ask = list(gpus), ask
        self._log = SharedLog(Path(log_path))
        self._prefix = f"[{self.spec.name} {','.join(self.gpus)}] "
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._server: Supervised | None = None
        self._port = 0
        self._placement: Any = None
        self._sleeping = False
        self._epoch = 0  # grows at each sleep and at each end: a watch returns
        self._broken = ""  # why the server can serve no more ("" while it can)
        self._stopped = False
        self.say(f"replica pid {os.getpid()} for GPUs {','.join(self.gpus)}\n")

    # -- the router's calls ----------------------------------------------------------------

    def pid(self) -> int:
        return os.getpid()

    def hold(self) -> None:
        """Wait until the replica's GPUs are its own (the router asks this before
        :meth:`load`, bounded as a replica actor's wait for its GPU)."""
        self._hold_gpus()

    def load(self, limit_s: float | None = None) -> dict[str, Any]:
        """Hold the GPUs, then start the server and wait for its ready path (a cold
        start), or wake the sleeping one (``start`` "wake"; a failed wake restarts it
        cold). Idempotent once ready.

        Returns:
            ``seconds`` (from the GPUs held to ready), ``start`` ("cold", "wake", or ""
            when it was ready already), ``address`` ("127.0.0.1:port") and
            ``wake_failed`` (why its wake failed, when it did: then it started cold).

        Raises:
            RuntimeError: the server exited, or did not answer its ready path with 200
                within ``limit_s`` (the service's load timeout by default).
        """
        limit = self.spec.load_timeout(self.spec.cold_start_s) if limit_s is None else limit_s
        with self._lock:
            ready = self._server is not None and not self._sleeping and self._placement is not None
            if ready and not self._broken:
                return {"seconds": 0.0, "start": "", "address": self.address()}
        self._hold_gpus()
        started = time.perf_counter()
        start, wake_failed = "cold", ""
        if self._sleeping and self._server is not None and self.spec.wake is not None:
            ok, why = self._call(self.spec.wake)
            if not ok and self._server.poll() is None:
                # Once more, after a pause: Ray gives the GPU back when the process that
                # held it disconnects, which may be before that process's GPU memory
                # is back with the driver (its socket closes first as it exits); a
                # wake that asked for it then may have run out of memory.
                self.say(f"wake failed ({why}); trying again in {WAKE_RETRY_S:g} s\n")
                time.sleep(WAKE_RETRY_S)
                ok, why = self._call(self.spec.wake)
            if ok and self._wait_ready(started + limit):
                start = "wake"
            else:
                wake_failed = why or f"not ready within {limit:g} s after its wake"
                self.say(f"wake failed ({wake_failed}); restarting the server: a cold start\n")
                self._end_server()
        if start == "cold":
            self._start_server()
            if not self._wait_ready(started + limit):
                tail = "\n".join(self._server.tail()) if self._server is not None else ""
                raise RuntimeError(
                    f"the server did not answer {self.spec.ready_path} with 200 within "
                    f"{limit:g} s" + (f"; stderr:\n{tail}" if tail else "")
                )
        with self._lock:
            self._sleeping, self._broken = False, ""
        seconds = time.perf_counter() - started
        self.say(f"ready ({start} start) in {seconds:.3f} s at {self.address()}\n")
        if self.spec.health_path:
            epoch = self._epoch
            threading.Thread(target=self._health_loop, args=(epoch,), daemon=True).start()
        return {
            "seconds": seconds,
            "start": start,
            "address": self.address(),
            "wake_failed": wake_failed,
        }

    def address(self) -> str:
        return f"127.0.0.1:{self._port}"

    def watch(self, epoch: int) -> str:
        """Block until the server can serve no more (it exited, or its health path
        failed :data:`HEALTH_FAILURES` times in a row): why; or until it sleeps or is
        stopped (epoch ``epoch`` ended): "". The router keeps one such call per
        replica, so it hears of a dead server without a request failing first."""
        with self._changed:
            while not self._broken and self._epoch == epoch:
                self._changed.wait(timeout=HEALTH_EVERY_S)
                self._check_exit()
            return self._broken if self._epoch == epoch else ""

    def epoch(self) -> int:
        return self._epoch

    # -- the controller's calls ---------------------------------------------------------

    def sleep(self) -> dict[str, Any]:
        """Ask the server to sleep (the service's ``sleep`` call, bounded by its
        ``timeout_s``); once it answered 2xx, give the GPUs back (the placement
        group removed) and keep the process. Returns ``ok``, ``seconds`` and, when
        not ok, ``error`` (the caller then evicts: stops and kills it)."""
        call = self.spec.sleep
        if call is None or self._server is None or self._server.poll() is not None:
            return {"ok": False, "seconds": 0.0, "error": "no server to sleep"}
        started = time.perf_counter()
        ok, why = self._call(call)
        seconds = time.perf_counter() - started
        if not ok:
            self.say(f"sleep failed after {seconds:.3f} s ({why}): evicted instead\n")
            return {"ok": False, "seconds": seconds, "error": why}
        with self._changed:
            self._sleeping = True
            self._epoch += 1
            self._changed.notify_all()
        self._release_gpus()
        self.say(f"asleep after {seconds:.3f} s; GPUs {','.join(self.gpus)} given back\n")
        return {"ok": True, "seconds": seconds}

    def stop(self) -> int:
        """Stop the server (SIGTERM, ``stop_grace_s``, SIGKILL), then give the GPUs
        back; its exit status (-1: none ran). The caller kills the actor next."""
        with self._changed:
            self._stopped = True
            self._epoch += 1
            self._changed.notify_all()
        rc = self._end_server()
        self._release_gpus()
        return rc

    # -- the server ----------------------------------------------------------------------

    def say(self, text: str) -> None:
        for piece in text.splitlines(keepends=True):
            self._log.write(self._prefix + piece)
        self._log.flush()

    def _start_server(self) -> None:
        port = free_port()
        # This node's GPUs of the replica, as the devices the node's processes see
        # (a local cluster's node has its own slice of the machine's).
        indices = visible_devices(
            [int(g.split(".", 1)[1]) for g in self.gpus], os.environ.get(CUDA_ENV)
        )
        env = dict(os.environ)
        env.update(self.spec.env)
        env[CUDA_ENV] = indices
        env["PYTHONUNBUFFERED"] = "1"
        argv = self.spec.argv(port, indices)
        # The process dies with the thread that started it (PR_SET_PDEATHSIG): a
        # thread of its own, alive as long as the process, never one of Ray's call
        # threads.
        box: dict[str, Any] = {}
        started = threading.Event()

        def parent() -> None:
            try:
                box["server"] = Supervised(argv, self.spec.workdir, env, write=self.say)
            except Exception as exc:  # noqa: BLE001 (raised in the caller below)
                box["error"] = exc
            started.set()
            if "server" in box:
                box["server"].proc.wait()

        threading.Thread(target=parent, name=f"server-{self.spec.name}", daemon=True).start()
        started.wait(SPAWN_WAIT_S)
        if "server" not in box:
            raise RuntimeError(f"could not start {argv}: {box.get('error', 'no answer')}")
        server: Supervised = box["server"]
        with self._lock:
            self._server, self._port = server, port
        self.say(f"started {server.argv} (pid {server.pid})\n")

    def _end_server(self) -> int:
        with self._lock:
            server, self._server = self._server, None
        if server is None:
            return -1
        rc = server.stop(self.spec.stop_grace_s, say=self.say)
        self.say(f"server exited with status {rc}\n")
        return rc

    def _wait_ready(self, deadline: float) -> bool:
        """Poll the ready path until 200 (True), the server exits, or ``deadline``."""
        url = f"http://{self.address()}{self.spec.ready_path}"
        while time.perf_counter() < deadline:
            server = self._server
            if server is None or server.poll() is not None:
                return False
            left = deadline - time.perf_counter()
            status, _ = http_call(url, "GET", max(min(PROBE_TIMEOUT_S, left), 0.05))
            if status == 200:
                return True
            time.sleep(READY_POLL_S)
        return False

    def _call(self, call: HttpCall) -> tuple[bool, str]:
        """The sleep or wake call: (answered 2xx, what happened)."""
        status, body = http_call(f"http://{self.address()}{call.path}", call.method, call.timeout_s)
        if 200 <= status < 300:
            return True, ""
        if status == 0:
            return False, f"no answer within {call.timeout_s:g} s ({body})"
        return False, f"answered {status}: {body.strip()[:120]}"

    def _health_loop(self, epoch: int) -> None:
        url = f"http://{self.address()}{self.spec.health_path}"
        failures = 0
        while True:
            time.sleep(HEALTH_EVERY_S)
            with self._lock:
                if self._epoch != epoch or self._broken:
                    return
            status, body = http_call(url, "GET", PROBE_TIMEOUT_S)
            failures = 0 if status == 200 else failures + 1
            if failures >= HEALTH_FAILURES:
                self._break(f"{self.spec.health_path} failed {failures} times in a row "
                            f"(last: {status or body})")  # fmt: skip
                return

    def _check_exit(self) -> None:
        """(Lock held) A server that exited while it should serve breaks the replica."""
        server = self._server
        if server is None or self._stopped or self._broken:
            return
        rc = server.poll()
        if rc is not None:
            tail = server.tail()
            self._broken = f"the server exited with status {rc}" + (f": {tail[-1]}" if tail else "")
            self._changed.notify_all()

    def _break(self, why: str) -> None:
        with self._changed:
            if not self._broken:
                self._broken = why
                self.say(f"broken: {why}\n")
            self._changed.notify_all()

    # -- the GPUs ------------------------------------------------------------------------

    def _hold_gpus(self) -> None:
        """Ask Ray for the GPUs' resources (a placement group of this actor's) and
        wait until it has them (the previous holders gone), at most
        :data:`PLACEMENT_WAIT_S`."""
        import ray

        with self._lock:
            if self._placement is not None:
                return
            self._placement = placement_group_for(self.ask)
            group = self._placement
        started = time.perf_counter()
        ray.get(group.ready(), timeout=PLACEMENT_WAIT_S)
        waited = time.perf_counter() - started
        if waited > 0.05:
            self.say(f"had the GPUs after {waited:.3f} s\n")

    def _release_gpus(self) -> None:
        with self._lock:
            group, self._placement = self._placement, None
        if group is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):  # already gone with its node
                remove_placement_group(group)
