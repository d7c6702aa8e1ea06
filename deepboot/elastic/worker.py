"""The elastic worker: one Ray actor per GPU, running the user's training function.

The actor's constructor starts the user's function in a thread with an
:class:`~deepboot.elastic.context.ElasticContext`; the controller talks to the actor
through :meth:`ElasticWorker.offer` (the next generation) and
:meth:`ElasticWorker.report` (poll). The process outlives the controller (the actor is
detached), so a restarted controller finds it by name and goes on.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any, TextIO

from deepboot.elastic.context import Departed, ElasticContext
from deepboot.elastic.protocol import Generation, WorkerConfig, WorkerReport, WorkerStatus


def load_entry(entry: str) -> Callable[[ElasticContext], Any]:
    """The training function named by ``entry``: "path/file.py:function" or
    "package.module:function".

    Raises:
        ValueError: ``entry`` has no ":function" part, or the function is missing.
    """
    target, sep, func = entry.rpartition(":")
    if not sep or not target or not func:
        raise ValueError(f"entry {entry!r} must be 'file.py:function' or 'module:function'")
    if target.endswith(".py"):
        directory = os.path.dirname(os.path.abspath(target))
        if directory not in sys.path:
            sys.path.insert(0, directory)  # the job's own helper modules beside it
        name = "deepboot_job_" + os.path.splitext(os.path.basename(target))[0]
        spec = importlib.util.spec_from_file_location(name, target)
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot load {target}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    fn = getattr(module, func, None)
    if not callable(fn):
        raise ValueError(f"{target} has no function {func!r}")
    return fn  # type: ignore[no-any-return]


class _Prefixed:
    """A text stream that prefixes each line with the worker id (the job's log)."""

    def __init__(self, out: TextIO, prefix: str) -> None:
        self._out, self._prefix, self._fresh = out, prefix, True
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            for piece in text.splitlines(keepends=True):
                if self._fresh:
                    self._out.write(self._prefix)
                self._out.write(piece)
                self._fresh = piece.endswith("\n")
            self._out.flush()
        return len(text)

    def flush(self) -> None:
        self._out.flush()


RESERVED_ENV = "DEEPBOOT_GPU_RESERVED_GB"
"""GB of the worker's GPU a sleeping inference server still holds (unset: none)."""


class ElasticWorker:
    """One worker of one job on one GPU (wrapped by ``ray.remote`` in the backend).

    Args:
        config: The job's entry point, arguments, log file and timeouts.
        worker: The GPU id "node.index" it runs on (its worker id).
        first: The generation it starts in.
    """

    def __init__(self, config: WorkerConfig, worker: str, first: Generation) -> None:
        import torch

        torch.set_num_threads(1)  # one core's worth per logical GPU, no oversubscription
        self.job, self.worker = config.job, worker
        out = open(config.log_path, "a", buffering=1)  # noqa: SIM115 (lives with the actor)
        sys.stdout = sys.stderr = _Prefixed(out, f"[{config.job} {worker}] ")
        print(f"worker pid {os.getpid()} on GPU {worker}, generation {first.number}")
        if config.gpu_reserved_gb > 0:
            os.environ[RESERVED_ENV] = f"{config.gpu_reserved_gb:g}"
            print(f"{config.gpu_reserved_gb:g} GB of GPU {worker} held by a sleeping server")
        self.ctx = ElasticContext(
            worker, first, config.args, config.collective_timeout, config.checkpoint_every,
            gpu_reserved_gb=config.gpu_reserved_gb,
        )  # fmt: skip
        self._thread = threading.Thread(
            target=self._run,
            args=(config.entry,),
            name=f"train-{config.job}-{worker}",
            daemon=True,
        )
        self._thread.start()

    def _run(self, entry: str) -> None:
        try:
            fn = load_entry(entry)
            fn(self.ctx)
        except Departed:
            return
        except BaseException:
            text = traceback.format_exc()
            print(text)
            self.ctx.set_status(WorkerStatus.FAILED, text)
            return
        print(f"finished at step {self.ctx.steps}")
        self.ctx.set_status(WorkerStatus.DONE)

    def offer(self, gen: Generation) -> None:
        """Make ``gen`` the next generation this worker forms (at a step boundary)."""
        self.ctx.offer(gen)

    def report(self) -> WorkerReport:
        """Status, progress, timings and gradient statistics (see WorkerReport)."""
        return self.ctx.report()

    def pid(self) -> int:
        return os.getpid()
