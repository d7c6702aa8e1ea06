"""A command job's worker: one Ray actor per GPU that runs the user's own script (a
``torchrun`` script, unmodified) as a process with the environment torchrun gives
its workers, so ``init_process_group(backend, init_method="env://")`` works as it
is.

The actor speaks the controller's protocol (:mod:`deepboot.elastic.protocol`) as an
elastic worker does, but a command job is resized by restart only: every generation
is a fresh set of processes, started by fresh actors, and a stop (a resize, a
reclaim, a preemption, a failure elsewhere in the group) is SIGTERM to the process's
group, then SIGKILL after ``stop_grace_s``. The script resumes from its own
checkpoint (``DEEPBOOT_CHECKPOINT_DIR``).

Rendezvous: rank 0's actor picks a free port on its node and publishes
``address:port`` beside the generation's file store (``<store>.master``, replaced
atomically); the other ranks' actors wait for it, at most ``collective_timeout``
seconds, before they start their process.

Progress: the first line on the process's stdout, or its first
:func:`deepboot.elastic.report` call, whichever comes first, ends the restart (its
``progress_at``); the reports, if any, give the job's step, loss and throughput.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from deepboot.elastic.devices import CUDA_ENV, visible_devices
from deepboot.elastic.protocol import (
    Generation,
    Measurement,
    WorkerConfig,
    WorkerReport,
    WorkerStatus,
)
from deepboot.elastic.scriptreport import REPORT_ENV, Progress, read_progress
from deepboot.elastic.supervise import Supervised

MASTER_POLL_S = 0.05
"""How often a rank waiting for rank 0's address looks for it."""

SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
"""torchrun 2.13's ``TORCHELASTIC_SIGNALS_TO_HANDLE`` (copied for scripts that read it)."""


def torchrun_env(
    members: Sequence[str],
    worker: str,
    master_addr: str,
    master_port: int,
    *,
    run_id: str,
    restart_count: int,
    max_restarts: int,
) -> dict[str, str]:
    """The variables torchrun 2.13 gives a worker, for ``worker`` in a group of
    ``members`` (GPU ids "node.index" in rank order), and ``CUDA_VISIBLE_DEVICES``.

    A node's members are its local ranks, in rank order; the nodes are groups in the
    order their first member appears. ``CUDA_VISIBLE_DEVICES`` lists the node's
    GPUs of this job in local-rank order (as the node's processes see its devices:
    :func:`~deepboot.elastic.devices.visible_devices`), so the usual
    ``torch.cuda.set_device(LOCAL_RANK)`` picks the GPU the scheduler gave this rank.

    Left out or changed against torchrun's, and why (``tests/test_command_env.py``
    diffs this against a real torchrun's):

    * ``TORCHELASTIC_USE_AGENT_STORE`` is ``False``: there is no agent, so rank 0's
      ``init_process_group`` hosts the store at ``MASTER_ADDR:MASTER_PORT``.
    * ``TORCHELASTIC_ERROR_FILE`` is set per rank by the worker (a file in the job's
      log directory), as torchrun does per attempt.
    * ``OMP_NUM_THREADS=1`` only when not set already (torchrun's rule).
    """
    rank = list(members).index(worker)
    node = worker.split(".")[0]
    nodes: list[str] = []
    for m in members:
        n = m.split(".")[0]
        if n not in nodes:
            nodes.append(n)
    local = [m for m in members if m.split(".")[0] == node]
    world = str(len(members))
    return {
        "RANK": str(rank),
        "WORLD_SIZE": world,
        "LOCAL_RANK": str(local.index(worker)),
        "LOCAL_WORLD_SIZE": str(len(local)),
        "GROUP_RANK": str(nodes.index(node)),
        "GROUP_WORLD_SIZE": str(len(nodes)),
        "ROLE_NAME": "default",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": world,
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": SIGNALS_TO_HANDLE,
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "CUDA_VISIBLE_DEVICES": visible_devices(
            [int(m.split(".")[1]) for m in local], os.environ.get(CUDA_ENV)
        ),
    }


def master_file(gen: Generation) -> Path:
    """Where rank 0 publishes ``address:port`` for generation ``gen``."""
    return Path(gen.store_path + ".master")


def _free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def _node_address() -> str:
    """This node's address for the group's store: loopback when the collectives are
    kept on loopback (a local cluster), else Ray's address for this node."""
    if os.environ.get("GLOO_SOCKET_IFNAME") == "lo":
        return "127.0.0.1"
    try:
        import ray

        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
    except Exception:  # noqa: BLE001 (no Ray here: a single machine)
        return "127.0.0.1"


class _Stopped(Exception):
    """Told to stop before the process started."""


class CommandWorker:
    """One rank of a command job (wrapped by ``ray.remote`` in the backend).

    Args:
        config: The job's command, working directory, environment, log and bounds.
        worker: The GPU id "node.index" it runs on.
        first: The generation it runs in (its only one: a resize starts new actors).
    """

    def __init__(self, config: WorkerConfig, worker: str, first: Generation) -> None:
        self.config, self.worker, self.gen = config, worker, first
        self.rank = first.members.index(worker)
        self._lock = threading.Lock()
        self._status = WorkerStatus.STARTING
        self._generation = 0
        self._error = ""
        self._stopping = False
        self._proc: Supervised | None = None
        self._started = math.nan  # monotonic time the process started
        self._started_wall = math.inf  # and its Unix time
        self._progress_at = math.nan
        self._last: Progress | None = None
        self._step, self._loss = 0, math.nan
        log_dir = Path(config.log_path).parent
        stem = f"{config.job}.g{first.number}.r{self.rank}"
        self._report_file = str(log_dir / f"{stem}.progress")
        self._error_file = str(log_dir / f"{stem}.error.json")
        self._out = open(config.log_path, "a", buffering=1)  # noqa: SIM115 (lives with the actor)
        self._out_lock = threading.Lock()
        self._prefix = f"[{config.job} {worker} rank {self.rank}] "
        self._write(f"worker pid {os.getpid()} on GPU {worker}, generation {first.number}\n")
        threading.Thread(target=self._run, name=f"cmd-{config.job}-{worker}", daemon=True).start()

    # -- the controller's calls ----------------------------------------------------------

    def offer(self, gen: Generation) -> None:
        """A new generation: this one ends (a command job restarts as a whole)."""
        if gen.number > self.gen.number or gen.stop:
            self._stop()

    def report(self) -> WorkerReport:
        """Status, progress (from the script's reports, if any) and a failure's text."""
        measurements = self._read_progress()
        with self._lock:
            return WorkerReport(
                worker=self.worker,
                status=self._status,
                generation=self._generation,
                step=self._step,
                loss=self._loss,
                measurements=measurements,
                error=self._error,
                progress_at=self._progress_at,
            )

    def pid(self) -> int:
        return os.getpid()

    # -- the process -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            env = self._environment()
            with self._lock:
                if self._stopping:
                    raise _Stopped
                self._proc = Supervised(
                    self.config.command,
                    self.config.workdir,
                    env,
                    write=self._write,
                    on_stdout=lambda _line: self._progressed(),
                )
                self._started, self._started_wall = time.monotonic(), time.time()
                self._status, self._generation = WorkerStatus.RUNNING, self.gen.number
            proc = self._proc
        except _Stopped:
            self._set(WorkerStatus.DEPARTED)
            return
        except Exception as exc:  # noqa: BLE001 (a command that cannot start is a failure)
            self._write(f"could not start {list(self.config.command)}: {exc}\n")
            self._set(WorkerStatus.FAILED, f"rank {self.rank} ({self.worker}) did not start: {exc}")
            return
        self._write(f"started {proc.argv} (pid {proc.pid})\n")
        rc = proc.wait()
        with self._lock:
            stopping = self._stopping
        if stopping:
            self._write(f"stopped (exit status {rc})\n")
            self._set(WorkerStatus.DEPARTED)
        elif rc == 0:
            self._write("exited 0\n")
            self._set(WorkerStatus.DONE)
        else:
            self._write(f"exited with status {rc}\n")
            self._set(WorkerStatus.FAILED, self._failure(rc))

    def _environment(self) -> dict[str, str]:
        """The process's environment; rank 0 publishes the store's address first, the
        others wait for it (bounded by the collective timeout)."""
        path = master_file(self.gen)
        if self.rank == 0:
            addr = _node_address()
            port = _free_port(addr)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(f"{addr}:{port}")
            os.replace(tmp, path)
        else:
            addr, port = self._await_master(path)
        cfg = self.config
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        env.update(
            torchrun_env(
                self.gen.members,
                self.worker,
                addr,
                port,
                run_id=cfg.env.get("TORCHELASTIC_RUN_ID", cfg.job),
                restart_count=int(cfg.env.get("TORCHELASTIC_RESTART_COUNT", "0")),
                max_restarts=int(cfg.env.get("TORCHELASTIC_MAX_RESTARTS", "0")),
            )
        )
        env.update(cfg.env)
        env[REPORT_ENV] = self._report_file
        if cfg.gpu_reserved_gb > 0:  # a sleeping inference server's share of the GPU
            env["DEEPBOOT_GPU_RESERVED_GB"] = f"{cfg.gpu_reserved_gb:g}"
        env["TORCHELASTIC_ERROR_FILE"] = self._error_file
        env["PYTHONUNBUFFERED"] = "1"  # lines reach the job's log as they are printed
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._report_file)
        return env

    def _await_master(self, path: Path) -> tuple[str, int]:
        deadline = time.monotonic() + self.config.collective_timeout
        while True:
            with self._lock:
                if self._stopping:
                    raise _Stopped
            with contextlib.suppress(OSError, ValueError):
                addr, _, port = path.read_text().rpartition(":")
                if addr:
                    return addr, int(port)
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"rank 0 did not publish its address in {self.config.collective_timeout:.0f} s"
                )
            time.sleep(MASTER_POLL_S)

    def _progressed(self) -> None:
        with self._lock:
            if math.isnan(self._progress_at) and not math.isnan(self._started):
                self._progress_at = time.time()

    def _read_progress(self) -> tuple[Measurement, ...]:
        """The script's newest report: its step and loss, and (rank 0) one throughput
        measurement per report since the previous one."""
        p = read_progress(self._report_file)
        if p is None:
            return ()
        with self._lock:
            if math.isnan(self._started):
                return ()
            if p.time >= self._started_wall and not p.time >= self._progress_at:
                self._progress_at = p.time  # the script said it before any line
            last, self._last = self._last, p
            if p.step >= 0:
                self._step = p.step
            elif p.batch_size > 0:
                self._step = p.samples // p.batch_size
            if math.isfinite(p.loss):
                self._loss = p.loss
        if self.rank != 0 or last is None or p.batch_size <= 0:
            return ()
        steps = (p.samples - last.samples) / p.batch_size
        dt = p.time - last.time
        if steps < 1 or dt <= 0:
            return ()
        step_time = dt / steps
        world = len(self.gen.members)
        # The script's step is one opaque time: it is all "compute" to the fit (no
        # split of the synchronization is known without the script's help).
        return (
            Measurement(
                self.gen.num_nodes,
                world,
                max(p.batch_size // world, 1),
                compute_time=step_time,
                step_time=step_time,
            ),
        )

    def _stop(self) -> None:
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            proc = self._proc
        if proc is not None:
            proc.stop_in_background(self.config.stop_grace_s, say=self._write)

    def _failure(self, rc: int) -> str:
        """A failed rank's message: its exit status, the error torch's ``@record``
        wrote (if any) and the last lines of its stderr."""
        how = f"killed by signal {-rc}" if rc < 0 else f"exited with status {rc}"
        parts = [f"rank {self.rank} ({self.worker}) {how}"]
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            doc = json.loads(Path(self._error_file).read_text())
            msg = doc["message"]
            parts.append(str(msg.get("message", msg) if isinstance(msg, Mapping) else msg))
        tail = self._proc.tail() if self._proc is not None else []
        if tail:
            parts.append("stderr (last lines):\n" + "\n".join(tail))
        return "\n".join(parts)

    def _set(self, status: WorkerStatus, error: str = "") -> None:
        with self._lock:
            self._status = status
            if error:
                self._error = error

    def _write(self, text: str) -> None:
        with self._out_lock:
            for piece in text.splitlines(keepends=True):
                self._out.write(self._prefix + piece)
            self._out.flush()
