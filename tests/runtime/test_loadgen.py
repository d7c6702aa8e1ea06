"""The load generator: rate profiles, send times, trace replay schedules, and real
runs against a small aiohttp server started here (loopback, port 0).

The runs need the runtime extra (aiohttp): they carry the ``runtime`` marker and run
in ``make test-runtime``; the rest is in the default suite.
"""

from __future__ import annotations

import asyncio
import csv
import json
import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from deepboot.cli.load import read_trace
from deepboot.core.errors import ConfigError, InputError
from deepboot.runtime.client.loadgen import (
    CSV_COLUMNS,
    PlannedRequest,
    RequestRecord,
    ServiceSlo,
    parse_wait_ms,
    request_id,
    request_wait,
    run_load,
    run_requests,
)
from deepboot.runtime.client.loadsummary import summarize as _summarize
from deepboot.runtime.client.rateprofile import MAX_REQUESTS, RateProfile, send_times
from deepboot.runtime.client.tracereplay import parse_service_map, slo_waits, trace_schedule
from tests.cli_helpers import assert_one_line_error, run_cli, write_state_dir

try:
    from aiohttp import web
except ImportError:  # the runtime extra is missing: the tests that need a server skip
    web = None  # type: ignore[assignment]

TOKEN = "s3cret"
INSTANCE = "5eed" * 4  # the endpoint's instance id, echoed by its /healthz
SLOW = 7  # the request with this index sleeps past the client's timeout


def _profile(tmp_path: Path, text: str, name: str = "p.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------ profiles


def _input_error(
    read: Callable[[], object], path: Path, line: int, column: str, words: str
) -> InputError:
    """The InputError ``read()`` raises, checked: it names ``path``, ``line`` and
    ``column``, and its message says ``words``."""
    with pytest.raises(InputError) as info:
        read()
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), line, column), str(err)
    assert words in err.message
    return err


def test_profile_is_piecewise_constant_and_the_last_row_ends_it(tmp_path: Path) -> None:
    path = _profile(tmp_path, "\ufefftime_s, rps\n\n0,2\n 10 , 20\n\n20,0\n")
    profile = RateProfile.load(path)
    assert profile.times == (0.0, 10.0, 20.0)
    assert profile.rates == (2.0, 20.0)
    assert profile.duration == 20.0
    assert profile.expected_requests() == 220.0


def test_shipped_example_profile_loads() -> None:
    path = Path(__file__).parents[2] / "examples" / "runtime" / "lull-spike-lull.csv"
    profile = RateProfile.load(path)
    assert profile.duration == 75.0
    assert len(send_times(profile)) == 870


@pytest.mark.parametrize(
    ("text", "line", "column", "words"),
    [
        ("", 1, "header", "empty"),
        ("time,rps\n0,1\n1,0\n", 1, "time", "unknown header"),
        ("time_s,rps,x\n0,1\n1,0\n", 1, "x", "unknown header"),
        ("time_s\n0\n", 1, "rps", "unknown header"),
        ("time_s,rps\n", 1, "time_s", "at least two rows"),
        ("time_s,rps\n0,0\n", 2, "time_s", "at least two rows"),
        ("time_s,rps\n0,2\n5\n", 3, "rps", "missing"),
        ("time_s,rps\n0,2,3\n5,0\n", 2, "rps", "extra"),
        ("time_s,rps\nx,2\n5,0\n", 2, "time_s", "not a number"),
        ("time_s,rps\n0,\n5,0\n", 2, "rps", "is empty"),
        ("time_s,rps\n0,nan\n5,0\n", 2, "rps", "not a finite number"),
        ("time_s,rps\n0,inf\n5,0\n", 2, "rps", "not a finite number"),
        ("time_s,rps\n0,-1\n5,0\n", 2, "rps", "must be >= 0"),
        ("time_s,rps\n0,1e9\n5,0\n", 2, "rps", "exceeds the limit"),
        ("time_s,rps\n0,1\n1e12,0\n", 3, "time_s", "exceeds the limit"),
        ("time_s,rps\n-1,1\n5,0\n", 2, "time_s", "must be >= 0"),
        ("time_s,rps\n1,2\n5,0\n", 2, "time_s", "must be at time 0"),
        ("time_s,rps\n0,2\n5,3\n5,0\n", 4, "time_s", "strictly increase"),
        ("time_s,rps\n0,2\n5,3\n4,0\n", 4, "time_s", "strictly increase"),
        ("time_s,rps\n0,2\n5,3\n", 3, "rps", "must be 0"),
    ],
)
def test_bad_profile_names_file_line_and_column(
    tmp_path: Path, text: str, line: int, column: str, words: str
) -> None:
    path = _profile(tmp_path, text)
    err = _input_error(lambda: RateProfile.load(path), path, line, column, words)
    assert str(err).startswith(f"{path}:{line}: field '{column}':")


def test_profile_asking_for_too_many_requests_is_refused(tmp_path: Path) -> None:
    path = _profile(tmp_path, f"time_s,rps\n0,100000\n{MAX_REQUESTS // 100000 + 1},0\n")
    with pytest.raises(InputError, match="requests; at most"):
        RateProfile.load(path)


def test_unreadable_profiles_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="file not found"):
        RateProfile.load(tmp_path / "missing.csv")
    with pytest.raises(InputError, match="is a directory"):
        RateProfile.load(tmp_path)
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"time_s,rps\n0,\xff\n")
    with pytest.raises(InputError, match="UTF-8"):
        RateProfile.load(binary)


# ------------------------------------------------------------------ send times


def test_even_send_times_two_then_twenty_rps() -> None:
    times = send_times(RateProfile((0.0, 10.0, 20.0), (2.0, 20.0)))
    assert len(times) == 220
    first, second = np.array(times[:20]), np.array(times[20:])
    assert first[0] == 0.0 and second[0] == pytest.approx(10.0)
    assert np.allclose(np.diff(first), 0.5)
    assert np.allclose(np.diff(second), 0.05)
    assert times[-1] == pytest.approx(19.95)


def test_even_send_times_carry_the_fraction_across_pieces_and_lulls() -> None:
    # 1.5 requests in [0, 1), a lull, 1.5 in [2, 3): 3 in all; the third is half a
    # request's spacing into the second busy piece.
    times = send_times(RateProfile((0.0, 1.0, 2.0, 3.0), (1.5, 0.0, 1.5)))
    assert times == pytest.approx([0.0, 2 / 3, 2 + 1 / 3])
    # a leading lull sends nothing before the first busy piece
    assert send_times(RateProfile((0.0, 5.0, 6.0), (0.0, 2.0))) == pytest.approx([5.0, 5.5])


def test_even_send_times_count_is_the_rounded_up_integral() -> None:
    gen = np.random.default_rng(1)
    for _ in range(50):
        n = int(gen.integers(1, 8))
        times = (0.0, *np.cumsum(gen.uniform(0.01, 5, size=n)).tolist())
        rates = tuple(gen.choice([0.0, 0.3, 1.0, 7.0, 33.3], size=n).tolist())
        profile = RateProfile(times, rates)
        got = send_times(profile)
        assert len(got) == math.ceil(profile.expected_requests() - 1e-9)
        assert got == sorted(got) and all(0 <= t < profile.duration for t in got)


def test_poisson_send_times_are_seeded() -> None:
    profile = RateProfile((0.0, 10.0, 20.0, 30.0), (100.0, 0.0, 300.0))
    a = send_times(profile, np.random.default_rng(3))
    b = send_times(profile, np.random.default_rng(3))
    c = send_times(profile, np.random.default_rng(4))
    assert a == b and a != c
    assert a == sorted(a)
    assert not any(10 <= t < 20 for t in a)  # the lull
    assert all(0 <= t < 30 for t in a)
    assert abs(len(a) - 4000) < 5 * math.sqrt(4000)


# ------------------------------------------------------------------ real runs


class _Server:
    """An aiohttp server in a thread: 200 to even request numbers, 503 (Retry-After)
    to odd ones, 404 to services other than 'svc', 401 without the bearer token; the
    request numbered SLOW answers only after 2 s. ``GET /healthz`` answers without
    the token, with the instance id INSTANCE (as the controller's endpoint does)."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner: web.AppRunner | None = None
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"error": "unauthorized"}, status=401)
        if request.match_info["service"] != "svc":
            return web.json_response({"error": "unknown service"}, status=404)
        rid = request.headers["X-Request-Id"]
        self.ids.append(rid)
        body = await request.json()
        n = int(rid.rsplit("-", 1)[1])
        if n == SLOW:
            await asyncio.sleep(2.0)
        if n % 2:
            return web.json_response({"error": "full"}, status=503, headers={"Retry-After": "1"})
        return web.json_response({"id": rid, "echo": body})

    async def _health(self, request: web.Request) -> web.Response:
        from deepboot.runtime.client.endpoint import healthz_proof

        challenge = request.query.get("challenge", "")
        proof = healthz_proof(TOKEN, challenge)
        return web.json_response({"ok": True, "instance": INSTANCE, "proof": proof})

    async def _start(self) -> int:
        app = web.Application()
        app.router.add_post("/v1/{service}/infer", self._handle)
        app.router.add_get("/healthz", self._health)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port: int = self.runner.addresses[0][1]
        return port

    def stop(self) -> None:
        assert self.runner is not None
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def server() -> Iterator[_Server]:
    pytest.importorskip("aiohttp")
    s = _Server()
    try:
        yield s
    finally:
        s.stop()


def _saver(path: Path) -> Callable[[str], int]:
    """Where run_load puts the requests CSV (the CLI writes it atomically)."""
    return lambda text: path.write_text(text)


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == CSV_COLUMNS
        return list(reader)


def _expected_status(i: int) -> int:
    return 0 if i == SLOW else (503 if i % 2 else 200)


# 50 rps for 0.5 s: 25 requests
_SHORT = RateProfile((0.0, 0.5), (50.0,))


@pytest.mark.runtime
def test_run_load_records_every_request_once(server: _Server, tmp_path: Path) -> None:
    out = tmp_path / "requests.csv"
    times = send_times(_SHORT)
    seen: list[tuple[int, int, int]] = []
    summary = asyncio.run(
        run_load(
            server.url,
            "svc",
            times,
            TOKEN,
            _saver(out),
            {"x": [1, 2]},
            timeout_s=0.5,
            progress=lambda s, a, t: seen.append((s, a, t)),
        )
    )
    rows = _read(out)
    assert [r["id"] for r in rows] == [request_id("svc", i) for i in range(25)]
    assert sorted(server.ids) == [r["id"] for r in rows]  # each sent exactly once
    for i, row in enumerate(rows):
        assert int(row["status"]) == _expected_status(i), row
        send, answer = float(row["send_s"]), float(row["answer_s"])
        assert send >= times[i] - 1e-3 and answer >= send
        assert float(row["latency_s"]) == pytest.approx(answer - send, abs=2e-6)
    assert rows[SLOW]["error"] == "timeout" and 0.45 < float(rows[SLOW]["latency_s"]) < 1.5
    assert summary.sent == 25
    assert summary.by_status == {0: 1, 200: 13, 503: 11}
    assert summary.errors == {"timeout": 1}
    assert summary.p50_s is not None and summary.max_s is not None
    assert 0 < summary.p50_s <= summary.max_s < 0.5
    assert seen[-1] == (25, 25, 25)
    # sent on time, without waiting for the slow answer
    assert float(rows[SLOW + 1]["send_s"]) < float(rows[SLOW]["answer_s"])


@pytest.mark.runtime
def test_run_load_without_token_records_401(server: _Server, tmp_path: Path) -> None:
    out = tmp_path / "r.csv"
    times = [0.0, 0.01, 0.02]
    summary = asyncio.run(run_load(server.url, "svc", times, None, _saver(out), {}, 2.0))
    assert [r["status"] for r in _read(out)] == ["401"] * 3
    assert summary.by_status == {401: 3} and summary.p50_s is None
    assert server.ids == []


@pytest.mark.runtime
def test_run_load_unknown_service_and_connection_refused(server: _Server, tmp_path: Path) -> None:
    out = tmp_path / "r.csv"
    asyncio.run(run_load(server.url, "other", [0.0], TOKEN, _saver(out), {}, 2.0))
    assert _read(out)[0]["status"] == "404"
    # a port nothing listens on: status 0 with the connection error
    dead = "http://127.0.0.1:1"
    summary = asyncio.run(run_load(dead, "svc", [0.0, 0.01], TOKEN, _saver(out), {}, 2.0))
    rows = _read(out)
    assert [r["status"] for r in rows] == ["0", "0"]
    assert all(r["error"] and r["error"] != "timeout" for r in rows)
    assert summary.by_status == {0: 2}


def _state(tmp_path: Path, url: str, auth: bool = True) -> Path:
    host, port = url.rsplit(":", 1)
    info = {"url": url, "host": host[7:], "port": int(port), "auth": auth, "instance": INSTANCE}
    return write_state_dir(tmp_path / "state", info, TOKEN)


@pytest.mark.runtime
def test_cli_load_end_to_end(
    server: _Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _state(tmp_path, server.url)
    profile = _profile(tmp_path, "time_s,rps\n0,50\n0.5,0\n")
    out = tmp_path / "out.csv"
    code, stdout, stderr = run_cli(
        capsys,
        "load",
        "svc",
        "--rate-profile",
        str(profile),
        "--out",
        str(out),
        "--state-dir",
        str(state),
        "--timeout",
        "0.5",
        "--body",
        '{"prompt": "hi"}',
    )
    assert code == 0, stderr
    rows = _read(out)
    assert [r["id"] for r in rows] == [request_id("svc", i) for i in range(25)]
    assert [int(r["status"]) for r in rows] == [_expected_status(i) for i in range(25)]
    assert "503" in stdout and "200" in stdout and "p50" in stdout and str(out) in stdout

    # --url without --token-file sends no token: every request is a 401, still exit 0.
    # The first run's CSV is kept: this one goes to out-1.csv, and says so.
    first = out.read_bytes()
    code, stdout, stderr = run_cli(
        capsys,
        "load",
        "svc",
        "--rate-profile",
        str(profile),
        "--out",
        str(out),
        "--url",
        server.url,
    )
    assert code == 0, stderr
    again = tmp_path / "out-1.csv"
    assert out.read_bytes() == first and f"writing {again}" in stdout
    assert {r["status"] for r in _read(again)} == {"401"}
    assert "401 Unauthorized" in stdout  # each status in words
    # --force overwrites.
    argv = ["load", "svc", "--rate-profile", str(profile), "--out", str(out), "--force"]
    code, stdout, stderr = run_cli(capsys, *argv, "--url", server.url)
    assert code == 0, stderr
    assert {r["status"] for r in _read(out)} == {"401"} and not (tmp_path / "out-2.csv").exists()


@pytest.mark.runtime
def test_cli_load_scores_against_the_registered_services_slo(
    server: _Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --slo-wait: the service's slo_wait_s as registered ('deepboot serve' of a
    file saying 3 s); --slo-wait still overrides it."""
    from deepboot.core.service import ServiceSpec
    from deepboot.runtime.store.jobstore import JobStore
    from deepboot.runtime.store.statedir import StateDir

    state = _state(tmp_path, server.url)
    store = JobStore(StateDir.at(state).db)
    store.register_service(ServiceSpec("svc", "m", slo_wait_s=3.0))
    store.close()
    profile = _profile(tmp_path, "time_s,rps\n0,10\n0.2,0\n")
    argv = ["load", "svc", "--rate-profile", str(profile), "--state-dir", str(state)]
    code, stdout, stderr = run_cli(capsys, *argv, "--out", str(tmp_path / "a.csv"))
    assert code == 0, stderr
    [row] = [line for line in stdout.splitlines() if line.startswith("│ svc ")]
    assert "3 s" in row, stdout
    code, stdout, stderr = run_cli(
        capsys, *argv, "--out", str(tmp_path / "b.csv"), "--slo-wait", "0.5"
    )
    assert code == 0, stderr
    [row] = [line for line in stdout.splitlines() if line.startswith("│ svc ")]
    assert "0.5 s" in row, stdout


@pytest.mark.runtime
def test_cli_load_sends_the_token_to_a_loopback_endpoint_too(
    server: _Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every work route needs the token, on loopback too: the CLI always sends it."""
    state = _state(tmp_path, server.url, auth=False)
    profile = _profile(tmp_path, "time_s,rps\n0,20\n0.2,0\n")
    out = tmp_path / "out.csv"
    argv = ["load", "svc", "--rate-profile", str(profile), "--out", str(out)]
    code, _, stderr = run_cli(capsys, *argv, "--state-dir", str(state), "--timeout", "0.5")
    assert code == 0, stderr
    rows = _read(out)
    assert rows and all(r["status"] in ("200", "503") for r in rows)


@pytest.mark.runtime
def test_cli_load_poisson_with_token_file(
    server: _Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "tok"
    token.write_text(TOKEN)
    profile = _profile(tmp_path, "time_s,rps\n0,40\n0.3,0\n")
    out = tmp_path / "out.csv"
    argv = ["load", "svc", "--rate-profile", str(profile), "--out", str(out)]
    argv += ["--url", server.url, "--token-file", str(token), "--poisson", "--seed", "5"]
    argv += ["--timeout", "0.3"]
    code, _, stderr = run_cli(capsys, *argv)
    assert code == 0, stderr
    expected = send_times(RateProfile((0.0, 0.3), (40.0,)), np.random.default_rng(5))
    rows = _read(out)
    assert len(rows) == len(expected)
    assert all(r["status"] in ("200", "503", "0") for r in rows)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--timeout", "0"], ["--timeout must be"]),
        (["--timeout", "nan"], ["--timeout must be"]),
        (["--max-connections", "0"], ["--max-connections must be"]),
        (["--seed", "3"], ["--seed", "--poisson"]),
        (["--poisson", "--seed", "-1"], ["--seed must be"]),
        (["--body", "{nope"], ["--body is not valid JSON"]),
        (["--url", "localhost:80"], ["--url must look like"]),
        (["--out", ""], ["--out is empty"]),
    ],
)
def test_cli_load_bad_arguments_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], words: list[str]
) -> None:
    profile = _profile(tmp_path, "time_s,rps\n0,1\n1,0\n")
    argv = ["load", "svc", "--rate-profile", str(profile), "--url", "http://127.0.0.1:1"]
    code, _, err = run_cli(capsys, *argv, *extra)
    assert code == 2
    assert_one_line_error(err, *words)


def test_cli_load_input_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = _profile(tmp_path, "time_s,rps\n0,2\n5,3\n")
    state = tmp_path / "nostate"
    code, _, err = run_cli(
        capsys, "load", "svc", "--rate-profile", str(bad), "--state-dir", str(state)
    )
    assert code == 2
    assert_one_line_error(err, "no HTTP endpoint", "deepboot up")

    state = _state(tmp_path, "http://127.0.0.1:1")
    code, _, err = run_cli(
        capsys, "load", "svc", "--rate-profile", str(bad), "--state-dir", str(state)
    )
    assert code == 2
    assert_one_line_error(err, f"{bad}:3: field 'rps':", "must be 0")

    good = _profile(tmp_path, "time_s,rps\n0,1\n1,0\n", "good.csv")
    code, _, err = run_cli(
        capsys, "load", "bad name", "--rate-profile", str(good), "--state-dir", str(state)
    )
    assert code == 2
    assert_one_line_error(err, "service name")

    code, _, err = run_cli(
        capsys,
        "load",
        "svc",
        "--rate-profile",
        str(good),
        "--state-dir",
        str(state),
        "--out",
        str(good),
    )
    assert code == 2
    assert_one_line_error(err, "would overwrite an input")

    (state / "http.json").write_text("{not json")
    code, _, err = run_cli(
        capsys, "load", "svc", "--rate-profile", str(good), "--state-dir", str(state)
    )
    assert code == 2
    assert_one_line_error(err, "http.json")

    # written by a controller from before endpoints had an instance id: no check possible
    (state / "http.json").write_text(json.dumps({"url": "http://127.0.0.1:1", "auth": True}))
    code, _, err = run_cli(
        capsys, "load", "svc", "--rate-profile", str(good), "--state-dir", str(state)
    )
    assert code == 2
    assert_one_line_error(err, "http.json", "field 'instance'", "deepboot up")

    info = {"url": "http://127.0.0.1:1", "instance": INSTANCE}
    (state / "http.json").write_text(json.dumps(info))
    (state / "http-token").write_text("")
    code, _, err = run_cli(
        capsys, "load", "svc", "--rate-profile", str(good), "--state-dir", str(state)
    )
    assert code == 2
    assert_one_line_error(err, "http-token", "empty")


# ------------------------------------------------------------------ trace replay

_DEEPBOOT_HEADER = "name,time,application,num_replicas,batch_size,duration,num_task\n"


def _trace(tmp_path: Path, rows: str, name: str = "w.csv") -> Path:
    path = tmp_path / name
    path.write_text(_DEEPBOOT_HEADER + rows, encoding="utf-8")
    return path


_ROWS = (
    "t0,0,cifar10,1,128,-1,0\n"  # a training row: checked, not replayed
    "i1,120,infer-bert-1,1,1,30,5\n"
    "i0,60,infer-ncf-2,1,1,6,1\n"
    "i2,180,infer-ncf-2,1,1,12.5,1\n"
)


def test_trace_schedule_times_scale_services_and_exec_times(tmp_path: Path) -> None:
    path = _trace(tmp_path, _ROWS)
    workload = read_trace(path)
    got = trace_schedule(workload, str(path), time_scale=60)
    assert got == [
        PlannedRequest(1.0, "infer-ncf-2", 0.1),
        PlannedRequest(2.0, "infer-bert-1", 0.5),
        PlannedRequest(3.0, "infer-ncf-2", 12.5 / 60),
    ]
    mapped = trace_schedule(workload, str(path), service_map={"infer-ncf-2": "echo"})
    assert [(r.due_s, r.service, r.exec_s) for r in mapped] == [
        (60.0, "echo", 6.0),
        (120.0, "infer-bert-1", 30.0),
        (180.0, "echo", 12.5),
    ]
    # '*': every service the map does not name
    star = trace_schedule(workload, str(path), service_map={"*": "echo", "infer-bert-1": "b"})
    assert [r.service for r in star] == ["echo", "b", "echo"]
    # a window: [100, 200) from 100 on, then its first request only
    window = trace_schedule(workload, str(path), time_scale=2, start_s=100, duration_s=100)
    assert [(r.due_s, r.service) for r in window] == [(10.0, "infer-bert-1"), (40.0, "infer-ncf-2")]
    assert len(trace_schedule(workload, str(path), start_s=100, limit=1)) == 1


def test_trace_rows_naming_a_services_file_and_their_slos(tmp_path: Path) -> None:
    from deepboot.sim.services import read_services_file

    services = tmp_path / "s.toml"
    services.write_text(
        '[[service]]\nname = "sd"\nmodel = "sdxl"\nslo_wait_s = 45.0\n\n'  # no cold start
        '[[service]]\nname = "lora"\nmodel = "m2"\ncold_start_s = 20.0\n',
        encoding="utf-8",
    )
    path = _trace(tmp_path, "a,0,infer-sd,1,1,23,1\nb,5,infer-lora,1,1,2,1\n")
    sfile = read_services_file(services)
    workload = read_trace(path, sfile)
    got = trace_schedule(workload, str(path), time_scale=10)
    assert [(r.due_s, r.service, r.exec_s) for r in got] == [(0.0, "sd", 2.3), (0.5, "lora", 0.2)]
    assert slo_waits(workload, {}, sfile.specs) == {"sd": 45.0, "lora": 1.0}
    assert slo_waits(workload, {}, sfile.specs, slo_wait_s=3.0) == {"sd": 3.0, "lora": 3.0}
    with pytest.raises(ConfigError, match="give --slo-wait"):
        slo_waits(workload, {"sd": "x", "lora": "x"}, sfile.specs)


@pytest.mark.parametrize(
    ("rows", "line", "column", "words"),
    [
        ("i0,60,infer-ncf-2,1,1,0,1\n", 2, "duration", "must be positive"),
        ("i0,60,infer-ncf-2,1,1,x,1\n", 2, "duration", "not a number"),
        ("i0,-1,infer-ncf-2,1,1,6,1\n", 2, "time", "non-negative"),
        ("i0,1,infer-ncf-2,1,1,6,1\ni1,2,infer-nope-1,1,1,6,1\n", 3, "application", "nope"),
        ("i0,1,infer-ncf-2,1,1,6\n", 2, "num_task", "missing"),
        ("t0,0,cifar10,1,128,-1,0\n", 0, "application", "no inference rows"),
        # A services file's row without the file: the error says to give it.
        ("i0,1,infer-sd,1,1,6,1\n", 2, "application", "give it with --services"),
    ],
)
def test_bad_traces_name_file_line_and_field(
    tmp_path: Path, rows: str, line: int, column: str, words: str
) -> None:
    path = _trace(tmp_path, rows)
    _input_error(lambda: read_trace(path), path, line, column, words)


def test_bad_schedule_arguments_are_config_errors(tmp_path: Path) -> None:
    path = _trace(tmp_path, _ROWS)
    workload = read_trace(path)
    for kwargs, words in [
        ({"time_scale": 0}, "--time-scale"),
        ({"time_scale": math.inf}, "--time-scale"),
        ({"start_s": -1}, "--start"),
        ({"duration_s": 0}, "--duration"),
        ({"limit": 0}, "--limit"),
        ({"service_map": {"infer-bert-9": "x"}}, "'infer-bert-9', not a service of"),
        ({"start_s": 1000}, "window"),
    ]:
        with pytest.raises(ConfigError, match=words):
            trace_schedule(workload, str(path), **kwargs)  # type: ignore[arg-type]


def test_service_map_values() -> None:
    assert parse_service_map(["a=b", " c = d ", "*=e"]) == {"a": "b", "c": "d", "*": "e"}
    for bad, words in [
        (["a"], "OLD=NEW"),
        (["=b"], "OLD=NEW"),
        (["a="], "OLD=NEW"),
        (["a=no space"], "not a service name"),
        (["a=b", "a=c"], "twice"),
    ]:
        with pytest.raises(ConfigError, match=words):
            parse_service_map(bad)


def test_the_example_handler_spends_the_requests_exec_time() -> None:
    import importlib.util

    path = Path(__file__).parents[2] / "examples" / "runtime" / "echo_service.py"
    spec = importlib.util.spec_from_file_location("echo_service_example", path)
    assert spec is not None and spec.loader is not None
    echo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(echo)
    assert echo._exec_s({}, 0.25) == 0.25  # none given: the service's delay_s
    assert echo._exec_s({"exec_s": 2}, 0.25) == 2.0
    for bad in (True, "1", -1, math.nan, echo.MAX_EXEC_S + 1):
        with pytest.raises(ValueError, match="exec_s"):
            echo._exec_s({"exec_s": bad}, 0.0)


def test_wait_header_and_slo_attainment_without_a_server() -> None:
    assert parse_wait_ms("250") == 0.25 and parse_wait_ms(" 0 ") == 0.0
    for bad in (None, "", "x", "-1", "nan", "inf"):
        assert math.isnan(parse_wait_ms(bad))
    records = [
        # measured: 0.5 s <= 1 s, met; 1.5 s, missed
        RequestRecord("a", 0.0, "s", 2.0, 0.0, 3.0, 200, wait_s=0.5),
        RequestRecord("b", 0.0, "s", 2.0, 0.0, 3.0, 200, wait_s=1.5),
        # estimated: 3 s latency - 2.5 s exec = 0.5 s, met
        RequestRecord("c", 0.0, "s", 2.5, 0.0, 3.0, 200),
        # a 503 without the header, a timeout: no wait, missed
        RequestRecord("d", 0.0, "s", 2.0, 0.0, 0.1, 503),
        RequestRecord("e", 0.0, "t", None, 0.0, 9.0, 0, "timeout"),
    ]
    wait, estimated = request_wait(records[2])
    assert wait == pytest.approx(0.5) and estimated
    assert request_wait(records[3]) == (None, False)
    summary = _summarize(records, {"s": 1.0, "t": 5.0})
    # "s" was warm (its first hand-off, 0.5 s, met the SLO): no warm-up; "t" never
    # reached a replica: all its requests are.
    assert summary.slo == {
        "s": ServiceSlo(4, 2, 1.0, 1),
        "t": ServiceSlo(1, 0, 5.0, 0, warm_up=1, warm_up_met=0),
    }
    assert summary.slo["s"].attainment == 0.5 == summary.slo["s"].after_warm_up


@pytest.mark.runtime
def test_the_warm_up_is_what_was_sent_before_the_first_answer() -> None:
    records = [
        RequestRecord("a", 0.0, "s", 0.1, 0.0, 20.0, 200, wait_s=19.0),  # the cold start
        RequestRecord("b", 1.0, "s", 0.1, 1.0, 20.1, 200, wait_s=19.0),
        RequestRecord("c", 25.0, "s", 0.1, 25.0, 25.2, 200, wait_s=0.1),
        RequestRecord("d", 26.0, "s", 0.1, 26.0, 26.2, 200, wait_s=0.1),
        RequestRecord("e", 27.0, "s", 0.1, 27.0, 31.0, 200, wait_s=3.5),
    ]
    slo = _summarize(records, {"s": 3.0}).slo["s"]
    assert (slo.requests, slo.met, slo.warm_up, slo.warm_up_met) == (5, 2, 2, 0)
    assert slo.attainment == 0.4 and slo.after_warm_up == pytest.approx(2 / 3)


@pytest.mark.runtime
def test_the_default_timeout_outlasts_what_the_router_may_keep_a_request() -> None:
    from deepboot.cli.load import MIN_DEFAULT_TIMEOUT_S, TIMEOUT_MARGIN_S, default_timeout
    from deepboot.core.service import ServiceSpec
    from deepboot.runtime.store.storerows import ServiceRow

    assert default_timeout([]) == MIN_DEFAULT_TIMEOUT_S
    quick = ServiceSpec("q", "m", request_timeout_s=5.0, handler_timeout_s=2.0)
    assert default_timeout([ServiceRow(quick, 0.0, None)]) == MIN_DEFAULT_TIMEOUT_S
    # A cold start measured at 31 s, a 60 s queue bound and a 30 s handler bound:
    # past 31 + 60 (the router answers 503 by then at the latest).
    chat = ServiceSpec("chat", "m", request_timeout_s=60.0, handler_timeout_s=30.0)
    row = ServiceRow(chat, 0.0, cold_start=31.0)
    assert default_timeout([row]) == 31.0 + 60.0 + TIMEOUT_MARGIN_S


class _TraceServer(_Server):
    """200 to every request of services 'a' and 'b', echoing the body; 'a' answers
    with ``X-Wait-Ms: 250`` (as the router does), 'b' without it (an older router)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, object]]] = []
        super().__init__()

    async def _handle(self, request: web.Request) -> web.Response:
        service = request.match_info["service"]
        body = await request.json()
        self.seen.append((service, body))
        headers = {"X-Wait-Ms": "250"} if service == "a" else {}
        return web.json_response({"echo": body}, headers=headers)


@pytest.fixture
def trace_server() -> Iterator[_TraceServer]:
    pytest.importorskip("aiohttp")
    s = _TraceServer()
    try:
        yield s
    finally:
        s.stop()


@pytest.mark.runtime
def test_run_requests_sends_each_to_its_service_with_its_exec_time(
    trace_server: _TraceServer, tmp_path: Path
) -> None:
    out = tmp_path / "r.csv"
    plan = [PlannedRequest(0.0, "a", 0.5), PlannedRequest(0.05, "b", 0.01)]
    summary = asyncio.run(
        run_requests(
            trace_server.url, plan, None, _saver(out), {"x": [1]}, 2.0, slo_wait_s={"a": 0.2}
        )
    )
    assert sorted(trace_server.seen, key=lambda s: s[0]) == [
        ("a", {"x": [1], "exec_s": 0.5}),
        ("b", {"x": [1], "exec_s": 0.01}),
    ]
    rows = _read(out)
    assert [(r["id"], r["service"], r["exec_s"]) for r in rows] == [
        (request_id("a", 0), "a", "0.500000"),
        (request_id("b", 1), "b", "0.010000"),
    ]
    assert rows[0]["wait_s"] == "0.250000" and rows[1]["wait_s"] == ""
    # a: 0.25 s measured > its 0.2 s SLO; b: estimated (latency - 0.01 s) <= 1 s
    # (a's one request waited past its SLO for the first ready replica: the warm-up.)
    assert summary.slo == {
        "a": ServiceSlo(1, 0, 0.2, 0, warm_up=1),
        "b": ServiceSlo(1, 1, 1.0, 1),
    }
    with pytest.raises(ValueError, match="JSON object"):
        asyncio.run(run_requests(trace_server.url, plan, None, _saver(out), [1], 2.0))


@pytest.mark.runtime
def test_cli_load_trace_end_to_end(
    trace_server: _TraceServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path, _ROWS)
    out = tmp_path / "out.csv"
    argv = ["load", "--trace", str(trace), "--out", str(out), "--url", trace_server.url]
    argv += ["--time-scale", "600", "--service-map", "infer-ncf-2=a"]
    argv += ["--service-map", "infer-bert-1=b", "--slo-wait", "0.3"]
    code, stdout, stderr = run_cli(capsys, *argv)
    assert code == 0, stderr
    rows = _read(out)
    assert [(r["service"], r["exec_s"], r["status"]) for r in rows] == [
        ("a", "0.010000", "200"),
        ("b", "0.050000", "200"),
        ("a", f"{12.5 / 600:.6f}", "200"),
    ]
    assert float(rows[2]["send_s"]) >= 0.2  # trace second 180 at 600x
    assert "SLO attainment" in stdout and "100.0 %" in stdout
    assert "X-Wait-Ms" in stdout  # b's wait was estimated, and the summary says so
    assert "cold start" in stdout  # compressed: the summary says what that does


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["svc", "--rate-profile", "p.csv", "--trace", "w.csv"], ["--trace and --rate-profile"]),
        ([], ["--rate-profile", "--trace"]),
        (["--rate-profile", "p.csv"], ["needs SERVICE"]),
        (["svc", "--trace", "w.csv"], ["not used with --trace", "--service-map"]),
        (["--trace", "w.csv", "--poisson"], ["--poisson"]),
        (["svc", "--rate-profile", "p.csv", "--time-scale", "60"], ["--time-scale", "only"]),
        (["svc", "--rate-profile", "p.csv", "--service-map", "a=b"], ["--service-map", "only"]),
        (["svc", "--rate-profile", "p.csv", "--limit", "3"], ["--limit", "only"]),
        (["--trace", "w.csv", "--slo-wait", "0"], ["--slo-wait must be"]),
        (["--trace", "w.csv", "--body", "[1]"], ["--body must be a JSON object"]),
        (["--trace", "w.csv", "--body", '{"exec_s": 1}'], ["--body sets 'exec_s'"]),
        (["--trace", "w.csv", "--service-map", "x"], ["OLD=NEW"]),
        (["--trace", "w.csv", "--time-scale", "-1"], ["--time-scale must be"]),
    ],
)
def test_cli_load_trace_bad_arguments_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: list[str]
) -> None:
    _trace(tmp_path, _ROWS)
    _profile(tmp_path, "time_s,rps\n0,1\n1,0\n")
    argv = [a if not a.endswith(".csv") else str(tmp_path / a) for a in argv]
    code, _, err = run_cli(capsys, "load", *argv, "--url", "http://127.0.0.1:1")
    assert code == 2
    assert_one_line_error(err, *words)


def test_cli_load_trace_input_error_names_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = _trace(tmp_path, "i0,60,infer-ncf-2,1,1,6,1\ni1,61,infer-ncf-2,1,1,-3,1\n")
    code, _, err = run_cli(capsys, "load", "--trace", str(bad), "--url", "http://127.0.0.1:1")
    assert code == 2
    assert_one_line_error(err, f"{bad}:3: field 'duration':")


def test_cli_load_help_says_what_compression_does(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = run_cli(capsys, "load", "--help")
    assert code == 0
    text = " ".join(stdout.split())
    assert "--trace" in text and "--time-scale" in text
    assert "a 20 s cold start is 20 s at any --time-scale" in text and "pessimistic" in text
