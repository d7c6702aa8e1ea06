"""The elastic-training API a user's training function is written against.

A training function takes one :class:`ElasticContext` and trains; deepboot runs one
copy per GPU (one Ray actor each) and resizes the job under it::

    def train(ctx: ElasticContext) -> None:
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ctx.register(model, opt)        # joins the job; state comes from rank 0
        data = make_dataset()
        while True:
            idx = ctx.next_batch(len(data))          # this rank's micro-batch
            loss = loss_fn(model(data.x[idx]), data.y[idx])
            loss.backward()
            mean = ctx.step(loss.item())             # sync, optimizer step, resize point
            if mean is not None and mean < ctx.args["loss_threshold"]:
                return

Rules: build the model and optimizer before :meth:`register`; do not call
``optimizer.step()`` or ``zero_grad()`` yourself (:meth:`step` does both); put any
other state to keep across resizes in ``ctx.state`` (a dict of picklable values).
A resize happens inside :meth:`step`: a worker that leaves the job unwinds with
:class:`Departed` (a ``BaseException``: do not catch it).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import math
import os
import threading
import time
from datetime import timedelta
from typing import Any

import numpy as np

from deepboot.elastic.devices import torch_device
from deepboot.elastic.protocol import (
    Generation,
    Measurement,
    Restore,
    WorkerReport,
    WorkerStatus,
    read_checkpoint,
)

log = logging.getLogger(__name__)

_GNS_SMOOTHING = 0.9


class Departed(BaseException):
    """Raised inside :meth:`ElasticContext.step` in a worker that leaves the job."""


class _GroupBroken(Exception):
    """A collective of the current generation failed (a peer died or timed out)."""


def _torch() -> Any:
    import torch

    return torch


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def _reset_group_names(dist: Any) -> None:
    """Name this process's next default group as every other member names theirs.

    torch names a default process group by a per-process counter (its keys in the
    rendezvous store sit under that name) and resets the counter only when a formed
    group is destroyed. A member that failed *inside* ``init_process_group`` (it had
    arrived, the others had already left for a newer generation) has used one name
    more than the others: every later rendezvous of the job then waits on keys that
    nobody writes, generation after generation (the livelock seen after two quick
    reclaims). No group exists here, so no name is in use.
    """
    world = getattr(getattr(dist, "distributed_c10d", None), "_world", None)
    if world is not None and not dist.is_initialized():
        world.group_count = 0


def state_digest(model: Any) -> str:
    """SHA-256 of a model's parameters and buffers, in state_dict order (exact bits)."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class ElasticContext:
    """One worker's handle on its job (see the module docstring).

    Thread-safety: the training thread calls :meth:`register`, :meth:`next_batch` and
    :meth:`step`; the worker actor's thread calls :meth:`offer`, :meth:`report` and
    :meth:`fail`. They share state under one lock.

    Args:
        worker: This worker's id ("node.index").
        first: The generation it starts in.
        args: The job file's ``[args]`` table.
        collective_timeout: Seconds before a hung collective fails.
        join_timeout: Seconds the members of a new generation wait for each other
            (default: max(120, 4 x collective_timeout); a joiner's start is slow).
        checkpoint_every: Rank 0 checkpoints every this many steps (0 = only at stops).
        seed: Seed of the data sampler's shuffles.
        gpu_reserved_gb: GPU memory, GB, a sleeping inference server holds on this
            worker's GPU: on CUDA, torch's allocator is capped below it at
            :meth:`register` (``WorkerConfig.gpu_reserved_gb``).
    """

    def __init__(
        self,
        worker: str,
        first: Generation,
        args: dict[str, Any] | None = None,
        collective_timeout: float = 60.0,
        checkpoint_every: int = 0,
        seed: int = 0,
        join_timeout: float | None = None,
        gpu_reserved_gb: float = 0.0,
    ) -> None:
        self.worker = worker
        self.gpu_reserved_gb = gpu_reserved_gb
        self.args: dict[str, Any] = dict(args or {})
        self.state: dict[str, Any] = {}
        self._timeout = collective_timeout
        self._join_timeout = (
            join_timeout if join_timeout is not None else max(120.0, 4 * collective_timeout)
        )
        self._checkpoint_every = checkpoint_every
        self._seed = seed
        self._cond = threading.Condition()
        self._offered: Generation = first
        self._gen: Generation | None = None
        self._status = WorkerStatus.STARTING
        self._model: Any = None
        self._optimizer: Any = None
        self._rank = 0
        self._world = 1
        self._step = 0
        self._micro = 0
        self._epoch = 0
        self._offset = 0
        self._loss = math.nan
        self._loss_acc = 0.0
        self._t_mark = time.perf_counter()
        self._compute = 0.0
        self._measurements: list[Measurement] = []
        self._gen_steps = 0  # steps since the current generation formed
        self._grad_sqr = math.nan
        self._grad_var = math.nan
        self._digests: dict[int, tuple[str, str]] = {}
        self._restored_step = 0
        self._pending_number = 0
        self._broken = 0
        self._error = ""

    # -- what the training function reads ------------------------------------------------

    @property
    def device(self) -> Any:
        """Where the model belongs: the CUDA device of the deepboot GPU this worker holds
        (``cuda:<index>``, :mod:`deepboot.elastic.devices`), or the CPU where that GPU
        is logical. Move the model there before :meth:`register`."""
        return torch_device(self.worker)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world

    @property
    def generation(self) -> int:
        return self._gen.number if self._gen else 0

    @property
    def local_batch_size(self) -> int:
        return self._gen.local_bsz if self._gen else 1

    @property
    def accumulation_steps(self) -> int:
        return self._gen.accum_steps if self._gen else 1

    @property
    def batch_size(self) -> int:
        """Total batch of one optimizer step over all ranks."""
        return self.local_batch_size * self.accumulation_steps * self._world

    @property
    def steps(self) -> int:
        """Optimizer steps the job has taken (kept across resizes)."""
        return self._step

    # -- the API ---------------------------------------------------------------------------

    def register(self, model: Any, optimizer: Any) -> None:
        """Join the job: form the first generation and take rank 0's state.

        Call once, after building the model and optimizer and before training.
        """
        self._model, self._optimizer = model, optimizer
        if self.device.type == "cuda":
            torch = _torch()
            torch.cuda.set_device(self.device)  # NCCL and broadcast_object_list use it
            if self.gpu_reserved_gb > 0:
                # A sleeping inference server keeps this much of the GPU: torch's
                # allocator stops short of it (an OOM here, not in the server's wake).
                total = torch.cuda.get_device_properties(self.device).total_memory / 1e9
                fraction = max(1.0 - self.gpu_reserved_gb / total, 0.0)
                torch.cuda.set_per_process_memory_fraction(fraction, self.device)
        self._form(self._offered)
        self._t_mark = time.perf_counter()

    def next_batch(self, dataset_size: int) -> list[int]:
        """Indices of this rank's next micro-batch of a dataset of ``dataset_size``.

        Every rank draws from one shuffle per epoch (seeded by the job's seed and the
        epoch), in disjoint slices; the position is part of the kept state, so a
        resize neither repeats nor skips samples.
        """
        m, world = self.local_batch_size, self._world
        span = m * world
        if self._offset + span > dataset_size:
            self._epoch, self._offset = self._epoch + 1, 0
        order = np.random.default_rng([self._seed, self._epoch]).permutation(dataset_size)
        start = self._offset + self._rank * m
        self._offset += span
        return [int(i) for i in order[start : start + m]]

    def step(self, loss: float) -> float | None:
        """Account one micro-batch whose ``loss.backward()`` has run.

        On the last micro-batch of an optimizer step: average the gradients over the
        ranks, step the optimizer, zero the gradients, time it, and handle a pending
        resize. Returns the step's loss averaged over all ranks, or None while
        gradients accumulate.

        Raises:
            Departed: this worker leaves the job at this step boundary.
        """
        self._micro += 1
        self._loss_acc += float(loss)
        if self._micro < self.accumulation_steps:
            return None
        while True:
            try:
                mean = self._sync_and_step()
                self._boundary()
                return mean
            except _GroupBroken as exc:
                self._recover(str(exc))
                # The step was not taken by this group: its gradients are dropped and
                # the loop goes on from the state rank 0 of the new generation held.
                return None

    def offer(self, gen: Generation) -> None:
        """(Controller, via the actor) Make ``gen`` the next generation to form."""
        with self._cond:
            # Only ever forward: the actor runs calls concurrently, so two offers may
            # arrive out of order (a resize offered while the worker still starts).
            if gen.number > self._offered.number:
                self._offered = gen
            self._cond.notify_all()

    def report(self) -> WorkerReport:
        """(Controller, via the actor) The worker's state; takes its measurements."""
        with self._cond:
            ms, self._measurements = tuple(self._measurements), []
            return WorkerReport(
                worker=self.worker,
                status=self._status,
                generation=self.generation,
                step=self._step,
                loss=self._loss,
                measurements=ms,
                grad_sqr=self._grad_sqr,
                grad_var=self._grad_var,
                digests=dict(self._digests),
                restored_step=self._restored_step,
                broken=self._broken,
                error=self._error,
            )

    def set_status(self, status: WorkerStatus, error: str = "") -> None:
        with self._cond:
            self._status = status
            if error:
                self._error = error

    # -- internals -------------------------------------------------------------------------

    def _sync_and_step(self) -> float:
        torch, dist = _torch(), _dist()
        t0 = time.perf_counter()
        compute = t0 - self._t_mark
        params = [p for p in self._model.parameters() if p.requires_grad]
        grads = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params
        ]
        accum = self.accumulation_steps
        flat = torch.cat(grads) / accum
        local_sqr = float(flat.pow(2).sum())
        extra = torch.tensor(
            [self._loss_acc / accum, local_sqr], dtype=flat.dtype, device=flat.device
        )
        buf = torch.cat([flat, extra])
        pending = torch.tensor([self._offered.number], dtype=torch.int64, device=flat.device)
        try:
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            dist.all_reduce(pending, op=dist.ReduceOp.MAX)
        except Exception as exc:  # gloo raises RuntimeError/DistBackendError
            raise _GroupBroken(f"collective failed: {exc}") from exc
        world = self._world
        buf /= world
        offset = 0
        for p in params:
            n = p.numel()
            g = buf[offset : offset + n].view_as(p)
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)
            offset += n
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=False)
        mean_loss, mean_local_sqr = float(buf[-2]), float(buf[-1])
        global_sqr = float(buf[:-2].pow(2).sum())
        t1 = time.perf_counter()
        self._note_step(mean_loss, compute, t1 - t0, mean_local_sqr, global_sqr)
        self._pending_number = int(pending[0])
        self._t_mark = time.perf_counter()
        return mean_loss

    def _note_step(
        self, loss: float, compute: float, sync: float, local_sqr: float, global_sqr: float
    ) -> None:
        gen = self._gen
        assert gen is not None
        accum = gen.accum_steps
        with self._cond:
            self._step += 1
            self._micro, self._loss_acc = 0, 0.0
            self._loss = loss
            # A generation's first step is no measure of its speed: it pays the group's
            # warm-up (gloo connects lazily on the first collective; first allocations),
            # and the throughput fit the policy decides on would misjudge the
            # configuration until many steps dilute it.
            warm = self._gen_steps > 0
            self._gen_steps += 1
            if self._rank == 0 and warm:
                per_micro = compute / accum
                self._measurements.append(
                    Measurement(
                        gen.num_nodes, self._world, gen.local_bsz, per_micro, per_micro + sync
                    )
                )
            # Gradient noise: E|g_b|^2 = |G|^2 + tr(S)/b for a batch of b samples, with
            # the per-rank batch b and the global batch B = world * b (AdaptDL's
            # estimator). Needs two ranks or more.
            if self._world >= 2:
                b = gen.local_bsz * accum
                big = b * self._world
                var = max((local_sqr - global_sqr) / (1.0 / b - 1.0 / big), 0.0)
                sqr = max(global_sqr - var / big, 1e-12)
                if math.isnan(self._grad_sqr):
                    self._grad_sqr, self._grad_var = sqr, var
                else:
                    a = _GNS_SMOOTHING
                    self._grad_sqr = a * self._grad_sqr + (1 - a) * sqr
                    self._grad_var = a * self._grad_var + (1 - a) * var

    def _boundary(self) -> None:
        assert self._gen is not None
        if self._pending_number > self._gen.number:
            gen = self._await_offer(self._pending_number)
            self._transition(gen)
        elif (
            self._checkpoint_every and self._rank == 0 and self._step % self._checkpoint_every == 0
        ):
            self._save_checkpoint(self._gen.checkpoint_path, self._gen.number)

    def _await_offer(self, number: int) -> Generation:
        deadline = time.monotonic() + self._timeout
        with self._cond:
            while self._offered.number < number:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _GroupBroken(f"generation {number} was announced but never offered")
                self._cond.wait(left)
            return self._offered

    def _transition(self, gen: Generation) -> None:
        """Leave, or re-form the group as ``gen`` (at a step boundary)."""
        assert self._gen is not None
        if gen.stop:
            if self._rank == 0:
                self._save_checkpoint(gen.checkpoint_path or self._gen.checkpoint_path, gen.number)
            self._leave()
        self._form(gen)

    def _leave(self) -> None:
        self._destroy_group()
        self.set_status(WorkerStatus.DEPARTED)
        raise Departed()

    def _recover(self, why: str) -> None:
        """The group broke: wait for the controller's next generation, and form it."""
        log.warning("worker %s: %s; waiting for the next generation", self.worker, why)
        self._destroy_group()
        self.set_status(WorkerStatus.WAITING)
        broken = self._gen.number if self._gen else 0
        with self._cond:
            self._broken = max(self._broken, broken)
            self._micro, self._loss_acc = 0, 0.0
            while self._offered.number <= broken:
                self._cond.wait(1.0)
            gen = self._offered
        self._form(gen)

    def _form(self, gen: Generation) -> None:
        """Join ``gen``'s rendezvous and take rank 0's state; retried on a break."""
        while True:
            if gen.stop or self.worker not in gen.members:
                self._leave()
            try:
                self._form_once(gen)
                return
            except _GroupBroken as exc:
                self._destroy_group()
                with self._cond:
                    self._broken = max(self._broken, gen.number)
                self.set_status(WorkerStatus.WAITING)
                log.warning(
                    "worker %s: forming generation %d failed: %s", self.worker, gen.number, exc
                )
                with self._cond:
                    while self._offered.number <= gen.number:
                        self._cond.wait(1.0)
                    gen = self._offered

    def _form_once(self, gen: Generation) -> None:
        dist = _dist()
        self.set_status(WorkerStatus.JOINING)
        before = state_digest(self._model)
        self._destroy_group()
        rank, world = gen.members.index(self.worker), len(gen.members)
        if rank == 0 and gen.restore is Restore.CHECKPOINT:
            # Before the rendezvous: the others must not wait on a collective meanwhile.
            self._load_checkpoint(gen)
        try:
            store = dist.FileStore(gen.store_path, world)
            self._arrive(store, world, gen)
            store.set_timeout(timedelta(seconds=self._timeout))
            dist.init_process_group(
                "nccl" if self.device.type == "cuda" else "gloo",
                store=store,
                rank=rank,
                world_size=world,
                timeout=timedelta(seconds=self._timeout),
            )
            payload: list[Any] = [None]
            if rank == 0:
                payload[0] = self._pack()
            dist.broadcast_object_list(payload, src=0)
        except Exception as exc:
            raise _GroupBroken(f"rendezvous of generation {gen.number}: {exc}") from exc
        if rank != 0:
            self._unpack(payload[0])
        after = state_digest(self._model)
        with self._cond:
            self._gen, self._rank, self._world = gen, rank, world
            self._pending_number = gen.number
            self._restored_step = self._step
            self._gen_steps = 0
            self._digests[gen.number] = (before, after)
            self._status = WorkerStatus.RUNNING
        self._t_mark = time.perf_counter()

    def _arrive(self, store: Any, world: int, gen: Generation) -> None:
        """Wait until every member has reached the rendezvous (a joiner's process may
        take long to start), or the generation is superseded, within the join timeout.
        Only then the process group forms, under the (short) collective timeout."""
        store.set_timeout(timedelta(seconds=self._join_timeout))
        store.add("arrived", 1)
        deadline = time.monotonic() + self._join_timeout
        while int(store.add("arrived", 0)) < world:
            if self._offered.number > gen.number:
                raise _GroupBroken(f"superseded by generation {self._offered.number}")
            if time.monotonic() > deadline:
                raise _GroupBroken(f"not every member arrived within {self._join_timeout:g} s")
            time.sleep(0.05)

    def _destroy_group(self) -> None:
        dist = _dist()
        if dist.is_initialized():
            # A broken group may fail to tear down; it is gone anyway.
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        _reset_group_names(dist)

    def _pack(self) -> bytes:
        torch = _torch()
        buf = io.BytesIO()
        torch.save(
            {
                "model": self._model.state_dict(),
                "optimizer": self._optimizer.state_dict(),
                "step": self._step,
                "epoch": self._epoch,
                "offset": self._offset,
                "loss": self._loss,
                "grad": (self._grad_sqr, self._grad_var),
                "state": self.state,
            },
            buf,
        )
        return buf.getvalue()

    def _unpack(self, blob: bytes) -> None:
        torch = _torch()
        # Onto the CPU first: the blob's tensors name the sender's device (rank 0's
        # cuda:<i>, which this process may not have, or may be another's GPU);
        # load_state_dict then copies them onto this worker's own.
        data = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=False)
        self._model.load_state_dict(data["model"])
        self._optimizer.load_state_dict(data["optimizer"])
        self._step, self._epoch, self._offset = data["step"], data["epoch"], data["offset"]
        self._loss = data["loss"]
        self._grad_sqr, self._grad_var = data["grad"]
        self.state.clear()
        self.state.update(data["state"])

    def _save_checkpoint(self, path: str, generation: int) -> None:
        if not path:
            return
        tmp = f"{path}.tmp.{os.getpid()}"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(generation.to_bytes(8, "little"))
            f.write(self._pack())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _load_checkpoint(self, gen: Generation) -> None:
        """Load the job's checkpoint, once the generation that stopped has written it.
        Given up when a later generation is offered meanwhile (the controller decided
        the wait was in vain: it says what to restore instead) or after the join
        timeout."""
        deadline = time.monotonic() + self._join_timeout
        while True:
            written_by, blob = read_checkpoint(gen.checkpoint_path)
            if written_by >= gen.after_generation and blob:
                self._unpack(blob)
                return
            if written_by < 0 and gen.after_generation == 0:
                return  # a fresh job: nothing to restore
            if self._offered.number > gen.number:
                raise _GroupBroken(f"superseded by generation {self._offered.number}")
            if time.monotonic() > deadline:
                raise _GroupBroken(
                    f"checkpoint {gen.checkpoint_path} of generation {gen.after_generation} "
                    "never appeared"
                )
            time.sleep(0.1)
