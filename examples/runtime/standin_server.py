"""A stand-in for vLLM or TGI: a small HTTP model server for deepboot's tests, demos
and benchmarks, with no GPU and no model.

It behaves, from the outside, like an OpenAI-compatible server with vLLM's sleep
mode, at a size and a pace you state:

- **Cold load.** It binds its port first and answers ``GET /health`` with 503 while
  it loads: it reads a weights file of ``--weights-gb`` GB (created once, if missing)
  in chunks, paced at ``--load-gbps`` GB/s (one stream from remote storage: the load
  takes about ``weights_gb / load_gbps`` seconds), into a "device" buffer (a
  ``bytearray`` standing for GPU memory). Then ``/health`` answers 200. Each full
  load appends ``full_load <pid> <unix time>`` to ``--load-log`` (the tests count
  the full loads of every process from it).
- **Completions.** ``POST /v1/completions`` and ``POST /v1/chat/completions``
  (OpenAI's bodies: ``model``, ``prompt`` or ``messages``, ``max_tokens``,
  ``stream``) answer canned tokens: a JSON answer, or with ``stream: true``
  server-sent events, one ``data: {chunk}`` per token, each written as it is
  produced, ``--token-delay-s`` apart, then ``data: [DONE]``. Each chunk carries
  ``token_index`` and ``created_ns`` (``time.monotonic_ns()`` when it was produced:
  CLOCK_MONOTONIC, which a client on the same Linux machine can compare with its
  own) so that a client can tell a chunk arrived before the last was produced. The
  request path does no work per request beyond parsing the body (the benchmarks
  need thousands of small requests a second from one core).
- **Sleep mode** (vLLM's, ``VLLM_SERVER_DEV_MODE=1 --enable-sleep-mode``):
  ``POST /sleep?level=1`` copies the device buffer into a host buffer and frees the
  device buffer (``{"sleeping": true}``; level 1 only: vLLM's level 2, which drops
  the weights, answers 400 here); ``POST /wake_up`` copies the host buffer
  back into a new device buffer at ``--wake-gbps`` (a host-to-device copy: much
  faster than the cold load) and drops the host buffer; ``GET /is_sleeping``. While
  asleep ``/health`` answers 200 (as vLLM's does) and a completion 503 (no weights
  on the GPU); while waking, both 503.
- ``GET /stats``: ``full_loads`` (this process: always 1 once loaded), ``wakes``,
  ``sleeps``, ``requests`` (completion requests received), ``aborted`` (streams
  whose client went away before their end: the rest is never produced), ``pid``,
  and more.
  ``GET /v1/models`` lists the one model.
- Faults on demand: ``--hang-sleep`` (the sleep route never answers: deepboot's
  sleep timeout), ``--fail-wake`` (the wake route answers 500).

One line per load, sleep and wake goes to stdout. SIGTERM (or SIGINT) ends it
promptly, exit status 0. Only aiohttp is needed (the runtime extra has it).

As a deepboot command service (``examples/runtime/standin.toml``)::

    command = ["python", "standin_server.py", "--port", "{port}", "--model", "{model}",
               "--weights-gb", "0.2", "--load-gbps", "0.1"]

By hand::

    python examples/runtime/standin_server.py --port 8000 --weights-gb 0.05
    curl -s localhost:8000/v1/completions -d '{"prompt": "hi", "max_tokens": 4}'
    curl -sN localhost:8000/v1/completions -d '{"prompt": "hi", "stream": true}'
    curl -s -X POST 'localhost:8000/sleep?level=1'; curl -s -X POST localhost:8000/wake_up
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

CHUNK = 8 << 20
"""Bytes copied per paced chunk (a load's read, a wake's copy)."""

MAX_TOKENS = 4096
"""Most tokens one request may ask for."""

DEFAULT_MAX_TOKENS = 16
"""Tokens of a request that does not say (OpenAI's default for completions)."""

TOKENS = (" The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".")
"""The canned completion, repeated: token ``i`` is ``TOKENS[i % len(TOKENS)]``."""


def default_weights_file(weights_gb: float) -> Path:
    """The weights file of a size when ``--weights-file`` is not given: one per size
    in a cache directory under the system's temporary directory, shared by every
    stand-in process (created once)."""
    return Path(tempfile.gettempdir()) / "deepboot-standin" / f"weights-{_nbytes(weights_gb)}.bin"


def _nbytes(gb: float) -> int:
    return int(round(gb * 1e9))


def ensure_weights(path: Path, nbytes: int) -> Path:
    """Create ``path`` with ``nbytes`` bytes if it is missing or of another size.

    Written to a temporary file beside it and renamed: processes starting at once
    never read a half-written file.
    """
    with contextlib.suppress(OSError):
        if path.stat().st_size == nbytes:
            return path
    path.parent.mkdir(parents=True, exist_ok=True)
    pattern = bytes(range(256)) * (CHUNK // 256)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            left = nbytes
            while left > 0:
                n = min(left, len(pattern))
                f.write(pattern[:n])
                left -= n
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


class Stopped(Exception):
    """A paced copy was cut short by the server's stop."""


def paced_copy(
    read_into: Callable[[memoryview], int], size: int, gbps: float, stop: threading.Event
) -> bytearray:
    """A new buffer of ``size`` bytes filled chunk by chunk by ``read_into`` (which
    fills as much of the view as it can, returning the count), at ``gbps`` GB/s at
    most (0 = as fast as it goes).

    Raises:
        Stopped: ``stop`` was set meanwhile.
        OSError: the source ended early.
    """
    buf = bytearray(size)
    view = memoryview(buf)
    started, done = time.perf_counter(), 0
    while done < size:
        if stop.is_set():
            raise Stopped
        n = read_into(view[done : done + CHUNK])
        if n <= 0:
            raise OSError(f"short copy at byte {done} of {size}")
        done += n
        if gbps > 0:
            ahead = done / (gbps * 1e9) - (time.perf_counter() - started)
            if ahead > 0 and stop.wait(ahead):
                raise Stopped
    return buf


def read_weights(path: Path, gbps: float, stop: threading.Event) -> bytearray:
    """The cold load: the file read into a new "device" buffer at ``gbps``, its pages
    first dropped from the page cache where the system allows (as a fetch from
    remote storage would not find them cached)."""
    with open(path, "rb", buffering=0) as f:
        if hasattr(os, "posix_fadvise"):
            with contextlib.suppress(OSError):
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        size = os.fstat(f.fileno()).st_size
        return paced_copy(lambda view: f.readinto(view) or 0, size, gbps, stop)


def copy_back(host: bytearray, gbps: float, stop: threading.Event) -> bytearray:
    """The wake: the host buffer copied into a new device buffer at ``gbps``."""
    src = memoryview(host)
    pos = 0

    def read_into(view: memoryview) -> int:
        nonlocal pos
        n = len(view)
        view[:] = src[pos : pos + n]
        pos += n
        return n

    return paced_copy(read_into, len(host), gbps, stop)


@functools.lru_cache(maxsize=64)
def canned_text(n: int) -> str:
    """The first ``n`` canned tokens, joined."""
    return "".join(TOKENS[i % len(TOKENS)] for i in range(n))


class Server:
    """The server's state and its routes (see the module doc)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.model: str = args.model
        self.device: bytearray | None = None  # "GPU memory": the weights when awake
        self.host: bytearray | None = None  # the weights offloaded while asleep
        self.loaded = False
        self.waking = False
        self.sleeping = False
        self.counts = {"full_loads": 0, "wakes": 0, "sleeps": 0, "requests": 0, "aborted": 0}
        self.load_seconds: float | None = None
        self.transition = asyncio.Lock()  # one sleep or wake at a time
        self.stop = threading.Event()
        self.hang = asyncio.Event()  # never set: --hang-sleep waits on it

    # -- the cold load --------------------------------------------------------------

    async def load(self) -> None:
        args = self.args
        path = Path(args.weights_file) if args.weights_file else None
        nbytes = _nbytes(args.weights_gb)
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        if path is None:
            path = default_weights_file(args.weights_gb)
        await loop.run_in_executor(None, ensure_weights, path, nbytes)
        read_from = time.perf_counter()
        try:
            self.device = await loop.run_in_executor(
                None, read_weights, path, args.load_gbps, self.stop
            )
        except Stopped:
            return
        now = time.perf_counter()
        self.load_seconds = now - started
        self.counts["full_loads"] += 1
        if args.load_log:
            line = f"full_load {os.getpid()} {time.time():.6f}\n".encode()
            fd = os.open(args.load_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)  # one write with O_APPEND: whole lines across processes
            finally:
                os.close(fd)
        self.loaded = True
        say(
            f"full_load: {len(self.device) / 1e9:g} GB from {path} in {now - read_from:.2f} s "
            f"(paced at {args.load_gbps:g} GB/s; {self.load_seconds:.2f} s in all)"
        )

    # -- routes ---------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/health", self.health),
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
            web.get("/v1/models", self.models),
            web.post("/sleep", self.sleep),
            web.post("/wake_up", self.wake_up),
            web.get("/is_sleeping", self.is_sleeping),
            web.get("/stats", self.stats),
        ]

    async def health(self, request: web.Request) -> web.Response:
        if not self.loaded:
            return _json({"status": "loading"}, 503)
        if self.waking:
            return _json({"status": "waking"}, 503)
        return _json({"status": "asleep" if self.sleeping else "ok"})

    async def models(self, request: web.Request) -> web.Response:
        return _json({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def is_sleeping(self, request: web.Request) -> web.Response:
        return _json({"is_sleeping": self.sleeping})

    async def stats(self, request: web.Request) -> web.Response:
        return _json(
            {
                **self.counts,
                "pid": os.getpid(),
                "model": self.model,
                "loaded": self.loaded,
                "sleeping": self.sleeping,
                "waking": self.waking,
                "device_bytes": len(self.device) if self.device is not None else 0,
                "host_bytes": len(self.host) if self.host is not None else 0,
                "load_seconds": self.load_seconds,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            }
        )

    async def sleep(self, request: web.Request) -> web.Response:
        level = request.query.get("level", "1")
        if level != "1":  # vLLM's level 2 drops the weights: not imitated here
            return _error(f"the stand-in sleeps at level 1 only, got level {level!r}", 400)
        if self.args.hang_sleep:
            say("sleep: asked, never answering (--hang-sleep)")
            await self.hang.wait()
        if not self.loaded:
            return _error("still loading", 503)
        async with self.transition:
            if self.sleeping:
                return _json({"sleeping": True})
            assert self.device is not None
            started = time.perf_counter()
            device = self.device
            self.host = await asyncio.get_running_loop().run_in_executor(None, bytearray, device)
            self.device = None  # the "GPU memory" freed
            self.sleeping = True
            self.counts["sleeps"] += 1
            took = time.perf_counter() - started
            say(f"sleep: level {level}, {len(self.host) / 1e9:g} GB to host memory in {took:.2f} s")
        return _json({"sleeping": True})

    async def wake_up(self, request: web.Request) -> web.Response:
        if self.args.fail_wake:
            say("wake: failed on purpose (--fail-wake)")
            return _error("wake failed (--fail-wake)", 500)
        if not self.loaded:
            return _error("still loading", 503)
        async with self.transition:
            if not self.sleeping:
                return _json({"sleeping": False})
            assert self.host is not None
            self.waking = True
            started = time.perf_counter()
            try:
                self.device = await asyncio.get_running_loop().run_in_executor(
                    None, copy_back, self.host, self.args.wake_gbps, self.stop
                )
            except Stopped:
                return _error("stopping", 503)
            finally:
                self.waking = False
            self.host = None
            self.sleeping = False
            self.counts["wakes"] += 1
            took = time.perf_counter() - started
            say(
                f"wake: {len(self.device) / 1e9:g} GB back on the device in {took:.2f} s "
                f"(paced at {self.args.wake_gbps:g} GB/s)"
            )
        return _json({"sleeping": False})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def _complete(self, request: web.Request, chat: bool) -> web.StreamResponse:
        self.counts["requests"] += 1
        if not self.loaded or self.waking:
            return _error("the model is loading", 503)
        if self.sleeping:
            return _error("the model is asleep (no weights on the device)", 503)
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _error("the body must be JSON", 400)
        if not isinstance(body, dict):
            return _error("the body must be a JSON object", 400)
        model = body.get("model", self.model)
        if model != self.model:
            return _error(f"The model `{model}` does not exist.", 404, "NotFoundError")
        n = body.get("max_tokens", DEFAULT_MAX_TOKENS)
        if chat and "max_completion_tokens" in body:
            n = body["max_completion_tokens"]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_TOKENS:
            return _error(f"max_tokens must be an integer in [1, {MAX_TOKENS}]", 400)
        prompt = _prompt_text(body, chat)
        if prompt is None:
            return _error("'messages' must be a list" if chat else "'prompt' is missing", 400)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        if body.get("stream"):
            return await self._stream(request, rid, n, chat)
        text = canned_text(n)
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}}
            if chat
            else {"index": 0, "text": text, "logprobs": None}
        )
        choice["finish_reason"] = "length"
        prompt_tokens = len(prompt.split())
        return _json(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": n,
                    "total_tokens": prompt_tokens + n,
                },
            }
        )

    async def _stream(
        self, request: web.Request, rid: str, n: int, chat: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"
        delay = self.args.token_delay_s
        for i in range(n):
            if i and delay > 0:
                await asyncio.sleep(delay)
            token = TOKENS[i % len(TOKENS)]
            last = i == n - 1
            choice: dict[str, Any]
            if chat:
                delta = {"role": "assistant", "content": token} if i == 0 else {"content": token}
                choice = {"index": 0, "delta": delta}
            else:
                choice = {"index": 0, "text": token, "logprobs": None}
            choice["finish_reason"] = "length" if last else None
            chunk = {
                "id": rid,
                "object": kind,
                "created": created,
                "model": self.model,
                "choices": [choice],
                "token_index": i,
                "created_ns": time.monotonic_ns(),
            }
            try:
                await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            except (ConnectionResetError, asyncio.CancelledError):
                # The client went away (through deepboot: its client did): the rest is
                # never produced, as vLLM aborts a request whose connection closed.
                self.counts["aborted"] += 1
                print(f"standin[{os.getpid()}]: stream {rid} aborted at token {i}", flush=True)
                raise
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _prompt_text(body: dict[str, Any], chat: bool) -> str | None:
    """The prompt's text (for the usage count), or None when it is malformed."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        return " ".join(
            m["content"]
            for m in messages
            if isinstance(m, dict) and isinstance(m.get("content"), str)
        )
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        return " ".join(p for p in prompt if isinstance(p, str))
    return prompt if isinstance(prompt, str) else None


def _json(doc: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(doc).encode(), status=status, content_type="application/json"
    )


def _error(message: str, status: int, kind: str = "") -> web.Response:
    """OpenAI's error shape."""
    default = {400: "BadRequestError", 500: "InternalServerError", 503: "ServiceUnavailable"}
    return _json(
        {
            "error": {
                "message": message,
                "type": kind or default.get(status, "Error"),
                "code": status,
            }
        },
        status,
    )


def say(line: str) -> None:
    print(f"standin[{os.getpid()}]: {line}", flush=True)


async def serve(args: argparse.Namespace) -> int:
    server = Server(args)
    app = web.Application()
    app.add_routes(server.routes())
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = runner.addresses[0][1]
    say(
        f"listening on http://{args.host}:{port} (model {args.model}, "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')})"
    )
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    loading = asyncio.create_task(server.load())
    waiter = asyncio.create_task(stopping.wait())
    await asyncio.wait({loading, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if loading.done() and loading.exception() is not None:
        say(f"load failed: {loading.exception()!r}")
        server.stop.set()
        await runner.cleanup()
        return 1
    await waiter
    say("stopping (signal)")
    server.stop.set()  # a load or wake in progress ends at its next chunk
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(runner.cleanup(), 3.0)
    loading.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await loading
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="standin_server.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--port",
        type=int,
        required=True,
        help="port to listen on (deepboot passes {port}; 0 = any free port, "
        "printed in the first line)",
    )
    ap.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1: deepboot reaches its servers on loopback)",
    )
    ap.add_argument(
        "--model",
        default="standin",
        help="the model name it serves and checks requests against "
        "(deepboot passes {model}; default %(default)s)",
    )
    ap.add_argument(
        "--weights-gb",
        type=float,
        default=0.05,
        help="size of the weights, GB (1e9 bytes); default %(default)s",
    )
    ap.add_argument(
        "--load-gbps",
        type=float,
        default=0.1,
        help="pace of the cold load from the weights file, GB/s: the load "
        "takes about weights-gb / load-gbps seconds (0 = as fast as the "
        "disk); default %(default)s, one stream from remote storage",
    )
    ap.add_argument(
        "--wake-gbps",
        type=float,
        default=None,
        help="pace of a wake, GB/s: the same bytes copied back from the host "
        "buffer (0 = as fast as memory); default 10x --load-gbps",
    )
    ap.add_argument(
        "--weights-file",
        default="",
        help="the weights file, created once of the stated size if missing "
        "(default: weights-<bytes>.bin in deepboot-standin/ under the "
        "system's temporary directory)",
    )
    ap.add_argument(
        "--token-delay-s",
        type=float,
        default=0.0,
        help="seconds between two streamed tokens (default 0)",
    )
    ap.add_argument(
        "--load-log",
        default="",
        help="append 'full_load <pid> <unix time>' to this file at each full "
        "load (the tests count full loads across processes)",
    )
    ap.add_argument(
        "--hang-sleep",
        action="store_true",
        help="the sleep route never answers (a test of deepboot's sleep timeout)",
    )
    ap.add_argument(
        "--fail-wake",
        action="store_true",
        help="the wake route answers 500 and the server stays asleep",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if not 0 <= args.port <= 65535:
        ap.error(f"--port must be in [0, 65535], got {args.port}")
    for name in ("weights_gb", "load_gbps", "token_delay_s"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.wake_gbps is None:
        args.wake_gbps = 10 * args.load_gbps
    elif args.wake_gbps < 0:
        ap.error("--wake-gbps must be >= 0")
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
