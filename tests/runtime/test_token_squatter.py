"""Issue 42, finding 2: no client sends the bearer token to a process that took the
port of a controller that died mid-run.

The controller here is the real :class:`deepboot.runtime.http.router.Router`, without Ray,
in a subprocess of its own (so that it can be SIGKILLed), with a state directory
whose http.json it writes. Its one service has no replica: requests queue or are
refused (503) at once; what matters here is who receives them. Once it has answered
a few requests of a running ``deepboot load`` (or of a sync client), it is killed and
a *squatter* binds its port at once (SO_REUSEADDR): a raw socket server that records
every byte it receives and answers every request 200, ``/healthz`` with the recorded
instance id and a wrong proof (``"wrong-proof"``) or without either (``"all-200"``).
No byte it receives may carry the token.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

pytestmark = pytest.mark.runtime

TOKEN = "7e57" * 16
INSTANCE = "c0ffee" * 4
ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30.0  # the most any step here waits (a bound, never a measurement)

# The controller: the real router, no Ray; it prints "ready" once http.json is
# written, and "infer" as each inference request arrives.
_CONTROLLER = """
import sys, time
from pathlib import Path
from deepboot.core.service import ServiceSpec
from deepboot.runtime.http import router as rt
from deepboot.runtime.http.infer import InferHandler
from deepboot.runtime.prometheus_metrics import Metrics

class Handler(InferHandler):
    async def handle(self, request):
        print("infer", flush=True)
        return await super().handle(request)

rt.InferHandler = Handler  # the route the router builds
Router = rt.Router

state = Path(sys.argv[1])
token = (state / "http-token").read_text().strip()
r = Router(rt.Inbox(), Metrics(), token=token, instance=sys.argv[2])
r.start()
r.set_services({"svc": ServiceSpec("svc", "m", queue_bound=1, request_timeout_s=0.5)})
time.sleep(0.05)
r.write_address(state / "http.json")
print("ready", flush=True)
time.sleep(300)
"""


class Controller:
    """The router in a subprocess; ``wait_for(word, n)`` reads its stdout lines."""

    def __init__(self, state: Path, instance: str = INSTANCE) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CONTROLLER, str(state), instance],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.wait_for("ready")
        info = json.loads((state / "http.json").read_text())
        self.port: int = info["port"]
        self.url: str = info["url"]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def wait_for(self, word: str, n: int = 1) -> None:
        deadline = time.monotonic() + WAIT_S
        seen = 0
        while seen < n:
            left = deadline - time.monotonic()
            assert left > 0 and self.proc.poll() is None, f"the controller never said {word!r}"
            with contextlib.suppress(queue.Empty):
                seen += self.lines.get(timeout=min(left, 1.0)) == word

    def kill(self) -> None:
        """SIGKILL, as in the finding; returns once the process is gone (its port free)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(WAIT_S)


class Squatter:
    """A raw socket server on ``port`` (SO_REUSEADDR) that records every byte it is
    sent, per connection, and answers each request 200 (keep-alive)."""

    def __init__(self, port: int, mode: str) -> None:
        self.mode = mode
        self.received: list[bytearray] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + WAIT_S
        while True:  # at once, as in the finding (retried only if the kernel lags)
            try:
                self.sock.bind(("127.0.0.1", port))
                break
            except OSError:
                assert time.monotonic() < deadline, "the squatter could not bind the port"
                time.sleep(0.005)
        self.sock.listen(128)
        self.sock.settimeout(0.05)
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            data = bytearray()
            with self.lock:
                self.received.append(data)
            threading.Thread(target=self._serve, args=(conn, data), daemon=True).start()

    def _answer(self, path: str) -> bytes:
        body: dict[str, object] = {"ok": True}
        if self.mode == "wrong-proof" and path.startswith("/healthz"):
            body = {"ok": True, "instance": INSTANCE, "proof": "0" * 64}
        raw = json.dumps(body).encode()
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}"
        return head.encode() + b"\r\n\r\n" + raw

    def _serve(self, conn: socket.socket, data: bytearray) -> None:
        conn.settimeout(0.1)
        buf = b""
        with conn:
            while not self.stopping.is_set():
                try:
                    chunk = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not chunk:
                    return
                with self.lock:
                    data += chunk
                buf += chunk
                while b"\r\n\r\n" in buf:
                    head, rest = buf.split(b"\r\n\r\n", 1)
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value.strip())
                    if len(rest) < length:
                        break
                    buf = rest[length:]
                    path = head.split(b"\r\n", 1)[0].split(b" ")[1].decode(errors="replace")
                    with self.lock:
                        self.paths.append(path)
                    try:
                        conn.sendall(self._answer(path))
                    except OSError:
                        return

    def saw_the_token(self) -> bool:
        with self.lock:
            return any(TOKEN.encode() in bytes(d) for d in self.received)

    def stop(self) -> None:
        self.stopping.set()
        self.sock.close()
        self.thread.join(WAIT_S)


def _state(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    fd = os.open(state / "http-token", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:  # a secret: 0600, as 'up' writes it
        f.write(TOKEN + "\n")
    return state


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    c = Controller(_state(tmp_path))
    try:
        yield c
    finally:
        c.kill()


@pytest.mark.parametrize(
    ("how", "mode"),
    [("state-dir", "wrong-proof"), ("state-dir", "all-200"), ("url", "wrong-proof")],
)
def test_load_sends_no_token_to_a_squatter_after_the_controller_dies(
    controller: Controller, tmp_path: Path, how: str, mode: str
) -> None:
    state = tmp_path / "state"
    profile = tmp_path / "p.csv"
    profile.write_text("time_s,rps\n0,20\n6,0\n")  # 120 requests over 6 s
    out = tmp_path / "out.csv"
    argv = [sys.executable, "-m", "deepboot.cli.main", "load", "svc", "--rate-profile"]
    argv += [str(profile), "--out", str(out), "--timeout", "5", "-q"]
    if how == "url":
        argv += ["--url", controller.url, "--token-file", str(state / "http-token")]
    else:
        argv += ["--state-dir", str(state)]
    load = subprocess.Popen(
        argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    squatter: Squatter | None = None
    try:
        controller.wait_for("infer", 3)  # load runs, with the token, on proven ground
        controller.kill()
        squatter = Squatter(controller.port, mode)
        stdout, stderr = load.communicate(timeout=WAIT_S)
    finally:
        if load.poll() is None:
            load.kill()
            load.wait(WAIT_S)
        if squatter is not None:
            squatter.stop()
    assert squatter is not None
    assert not squatter.saw_the_token(), squatter.paths[:5]
    # The squatter was asked (the scenario happened): /healthz, the token withheld.
    assert squatter.paths and all(p.startswith("/healthz?challenge=") for p in squatter.paths)
    lines = stderr.decode().strip().splitlines()
    assert load.returncode == 2 and len(lines) == 1, stderr.decode()
    assert lines[0].startswith("deepboot: error: ") and "not sent" in lines[0], lines[0]
    assert str(out) in lines[0]
    rows = out.read_text().splitlines()  # the CSV is saved, as on a cancel
    assert rows[0].startswith("id,") and len(rows) == 121
    assert "Traceback" not in stderr.decode() + stdout.decode()


def test_load_follows_a_restarted_controller_after_its_proof(
    controller: Controller, tmp_path: Path
) -> None:
    """The controller is killed mid-run and another starts on the same state directory
    (same token, another instance id and port): load's new connections go where
    http.json now points, prove themselves there, and the run goes on to its end."""
    state = tmp_path / "state"
    profile = tmp_path / "p.csv"
    profile.write_text("time_s,rps\n0,20\n2,0\n")  # 40 requests over 2 s
    out = tmp_path / "out.csv"
    argv = [sys.executable, "-m", "deepboot.cli.main", "load", "svc", "--rate-profile"]
    argv += [str(profile), "--out", str(out), "--timeout", "5", "-q", "--state-dir", str(state)]
    load = subprocess.Popen(
        argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    restarted: Controller | None = None
    try:
        controller.wait_for("infer", 3)
        controller.kill()
        restarted = Controller(state, instance="5ca1ab1e" * 3)
        assert restarted.port != controller.port
        restarted.wait_for("infer", 3)  # load found it, and it proved itself
        stdout, stderr = load.communicate(timeout=WAIT_S)
    finally:
        if load.poll() is None:
            load.kill()
            load.wait(WAIT_S)
        if restarted is not None:
            restarted.kill()
    assert load.returncode == 0, stderr.decode()
    assert b"proved it holds the token" in stdout
    rows = out.read_text().splitlines()
    assert len(rows) == 41


def test_the_sync_client_sends_no_token_to_a_squatter_after_the_controller_dies(
    controller: Controller, tmp_path: Path
) -> None:
    from deepboot.runtime.client.endpoint import EndpointError, connect
    from deepboot.runtime.store.statedir import StateDir

    endpoint = connect(StateDir.at(tmp_path / "state"))
    assert isinstance(endpoint.get_json("/v1/services"), list)
    controller.kill()
    squatter = Squatter(controller.port, "wrong-proof")
    try:
        try:
            endpoint.get_json("/v1/services")
            raised: Exception | None = None
        except Exception as exc:
            raised = exc
    finally:
        squatter.stop()
    assert not squatter.saw_the_token(), squatter.paths
    assert [p.split("?")[0] for p in squatter.paths] == ["/healthz"]
    assert isinstance(raised, EndpointError) and "not sent" in str(raised), raised
