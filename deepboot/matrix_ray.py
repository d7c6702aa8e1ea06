"""The run matrix on a Ray cluster (``deepboot compare --ray [ADDRESS]``).

Each cell is one Ray task running :func:`deepboot.matrix.execute`, exactly what a
local worker process runs, so its outcome is the same as the cell's simulation
alone (a simulation is a pure function of its task, with the same bits on every
machine). Progress comes back through a Ray queue, as it does through a manager
queue for the process pool. A task's workload, loaded by the caller, goes into the
object store once and reaches every task of it from there (the workers never read the
workload's path, which may be the driver's pipe).

Without an address, a Ray instance is started for the sweep and stopped after it,
on loopback only and with Ray's token authentication on (a token in a private
temporary directory). With an address, the caller's environment says how to
authenticate (``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN_PATH``); the package must be
installed on every node. Ray is the ``runtime`` extra.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
import tempfile
from collections.abc import Sequence
from typing import Any

from deepboot.core.errors import ConfigError
from deepboot.matrix import (
    MatrixError,
    MatrixInterrupted,
    MatrixObserver,
    RunOutcome,
    RunTask,
    _drain,
    _execute_in_worker,
    _Silent,
)


def _import_ray(address: str | None, token_dir: str) -> Any:
    if address is None:
        # Before Ray is imported: it reads these once (see deepboot.runtime.cluster.raynode).
        token = os.path.join(token_dir, "ray-token")
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN_PATH"] = token
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--ray needs Ray: pip install -e '.[runtime]' (or make runtime-install)"
        ) from None
    return ray


CONNECT_TIMEOUT_S = 10.0
"""Most seconds to reach a given Ray cluster's address before ``ray.init`` is tried
(``ray.init`` itself retries an unreachable address for many minutes)."""


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Open and close one TCP connection to ``HOST:PORT``.

    Raises:
        MatrixError: nothing accepts connections there within ``timeout`` seconds.
        ConfigError: ``address`` is not ``HOST:PORT``.
    """
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--ray {address!r}: give the Ray cluster's address as HOST:PORT")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as exc:
        reason = "no answer" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise MatrixError(
            f"cannot reach the Ray cluster at {address} ({reason} within {timeout:g} s); "
            "is it up, and is that its GCS address?"
        ) from None


def run_matrix_ray(
    tasks: Sequence[RunTask],
    address: str | None,
    cpus: int,
    display: MatrixObserver | None = None,
) -> list[RunOutcome]:
    """Run every task as a Ray task; outcomes in task order.

    Args:
        tasks: The cells.
        address: A Ray cluster's address, or None to start a private local one.
        cpus: CPUs of the private local instance (one run per CPU).
        display: Told of each cell's progress and end.

    Raises:
        ConfigError: Ray is not installed, or ``address`` is not HOST:PORT.
        MatrixInterrupted: Ctrl-C; carries the runs that finished.
        MatrixError: ``address`` cannot be reached; Ray lost a task (a worker or
            node died, out of memory).
    """
    display = display or _Silent()
    if address is not None and address != "auto" and not address.startswith("ray://"):
        check_reachable(address)
    with tempfile.TemporaryDirectory(prefix="deepboot-sweep-") as token_dir:
        ray = _import_ray(address, token_dir)
        from ray.util.queue import Queue

        if address is None:
            ray.init(
                num_cpus=cpus,
                include_dashboard=False,
                logging_level="ERROR",
                log_to_driver=False,
            )
        else:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        outcomes: dict[int, RunOutcome] = {}
        try:
            queue = Queue()
            remote = ray.remote(num_cpus=1, max_retries=0)(_execute_in_worker)
            # Each workload is stored once; Ray hands its value to the tasks of it.
            stored = {id(t.workload): ray.put(t.workload) for t in tasks}
            pending = [
                remote.remote(dataclasses.replace(t, workload=None), queue, stored[id(t.workload)])
                for t in tasks
            ]
            try:
                while pending:
                    done, pending = ray.wait(pending, num_returns=1, timeout=0.2)
                    _drain(queue, display)
                    for ref in done:
                        outcome: RunOutcome = ray.get(ref)
                        outcomes[outcome.index] = outcome
                        display.finished(outcome.index)
            except KeyboardInterrupt:
                for ref in pending:
                    ray.cancel(ref, force=True)
                raise MatrixInterrupted.of(tasks, outcomes) from None
            except ray.exceptions.RayError as exc:
                if isinstance(exc, ray.exceptions.RayTaskError):
                    raise  # the run raised: a bug, with its traceback
                message = " ".join(str(exc).split())
                raise MatrixError(
                    f"the run matrix could not run on Ray: {type(exc).__name__}: {message} "
                    f"({len(outcomes)} of {len(tasks)} runs had finished)"
                ) from None
        finally:
            ray.shutdown()
    return [outcomes[t.index] for t in tasks]
