"""The runtime demo (``make demo-runtime``): an idle inference GPU lent to a training
job, and taken back ahead of the requests that need it.

It runs, with the real CLI, what the README's runtime quick start shows by hand:

1. ``deepboot up --slo`` a local cluster: a training pool of 2 logical GPUs and an
   inference pool of 2 (no real GPU needed: torch on the CPU, gloo);
2. ``deepboot serve chat.toml``: a service whose replicas take ~15 s to load and
   whose SLO is a 3 s wait, so only a replica loaded before its requests come meets
   it;
3. ``deepboot submit finetune.toml``: an elastic job that can use 4 GPUs, twice the
   training pool;
4. ``deepboot load chat --rate-profile lull-ramp-spike.csv``: a warm-up, a lull, a
   ramp, a spike and a second lull, about two minutes;

and prints what happened: the job's size over time, the GPUs lent and reclaimed
(proactive: the SLO guard took one back ahead of demand; reactive: a waiting
request did), each request against the SLO, the p99 wait. It draws the run's
timeline from the event log (``deepboot timeline``), prints the picture's path, and
stops the cluster (``deepboot down``), also when interrupted. Usage::

    python examples/runtime/demo.py [--out DIR]

Needs the runtime extra (``make runtime-install``) and matplotlib for the picture.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SERVICE = HERE / "chat.toml"
JOB = HERE / "finetune.toml"
PROFILE = HERE / "lull-ramp-spike.csv"
CLUSTER = ("--training-nodes", "1", "--inference-nodes", "1", "--gpus-per-node", "2")
# Time runs about 30x faster than on a real cluster: rounds every 2 s (60 s real),
# replicas' protect times at a tenth, and the SLO guard's forecast paced to the
# rounds (docs/slo.md). restart_delay=2: the policy's cost of a resize, which AFE
# makes a few seconds here (its default, 10 s, is the paper's checkpoint-restart).
TIMINGS = (
    "--interval", "2", "--poll", "0.3", "--protect-factor", "0.1",
    "--param", "restart_delay=2",
)  # fmt: skip
SLO_WAIT_S = 3.0
JOB_GRACE_S = 30.0
"""Most seconds the demo waits, after the load, for the job to finish."""
COMMAND_TIMEOUT_S = 300.0
"""Most seconds any one CLI command may take."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--out", type=Path, default=Path("out/demo-runtime"),
        help="where the state directory, the requests CSV and the timeline go "
        "(emptied first)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    out: Path = args.out
    state = out / "state"
    if state.exists():
        _cli(state, "down", check=False)  # a previous demo's cluster, if still up
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    began = time.monotonic()
    _say(began, "starting a local cluster: 2 training GPUs, 2 inference GPUs, --slo")
    _cli(state, "up", *CLUSTER, *TIMINGS, "--slo", "--http-port", "0")
    try:
        return _run(state, out, began)
    finally:
        _say(began, "stopping the cluster (deepboot down)")
        _cli(state, "down", check=False)


def _run(state: Path, out: Path, began: float) -> int:
    _cli(state, "serve", str(SERVICE))
    _say(began, f"service 'chat' registered ({SERVICE.name}: ~15 s cold start, SLO 3 s wait)")
    _cli(state, "submit", str(JOB))
    _say(began, f"job 'finetune' submitted ({JOB.name}: up to 4 workers)")
    _wait(lambda: _job_state(state) in ("running", "finished"), 180, "the job to start")
    requests = out / "requests.csv"
    _say(began, f"replaying {PROFILE.name}: warm-up, lull, ramp, spike, lull (~2 min)")
    load = subprocess.Popen(
        [sys.executable, "-m", "deepboot.cli.main", "load", "chat", "--rate-profile",
         str(PROFILE), "--out", str(requests), "--force", "-q", "--state-dir", str(state)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    sizes = _Sizes(state, began)
    try:
        while load.poll() is None:
            sizes.show()
            time.sleep(1.0)
        if load.returncode != 0:
            print(load.stdout.read() if load.stdout else "", file=sys.stderr)
            raise SystemExit(f"deepboot load failed (exit {load.returncode})")
    finally:
        if load.poll() is None:
            load.kill()
            load.wait(30)
    _say(began, "load done; waiting for the job to finish")
    deadline = time.monotonic() + JOB_GRACE_S
    while _job_state(state) == "running" and time.monotonic() < deadline:
        sizes.show()
        time.sleep(1.0)
    _report(state, requests)
    picture = out / "timeline.png"
    drawn = _deepboot(
        "timeline", str(state), "--requests", str(requests), "--slo-wait", str(SLO_WAIT_S),
        "--out", str(picture),
        check=False,
    )  # fmt: skip
    if drawn.returncode == 0:
        print(f"\ntimeline: {picture}")
    else:
        print(f"\nno timeline picture: {(drawn.stderr or drawn.stdout).strip()}")
    return 0


def _report(state: Path, requests: Path) -> None:
    from deepboot.runtime.store.jobstore import JobStore, LogKind

    store = JobStore(state / "deepboot.db")
    try:
        events = store.events()
    finally:
        store.close()
    lent = sum(1 for e in events if e.kind is LogKind.GPU and e.detail.get("op") == "lend")
    reclaims = [e for e in events if e.kind is LogKind.GPU and e.detail.get("op") == "reclaim"]
    ahead = sum(1 for e in reclaims if e.detail.get("proactive"))
    prewarms = sum(
        1 for e in events
        if e.kind is LogKind.REPLICA and e.detail.get("op") == "start" and e.detail.get("prewarm")
    )  # fmt: skip
    resizes = [e for e in events if e.kind is LogKind.RESIZED]
    finished = [e for e in events if e.kind is LogKind.FINISHED]
    with requests.open() as f:
        rows = list(csv.DictReader(f))
    warm_up = _warm_up_s()
    counted = [r for r in rows if float(r["send_s"] or "nan") >= warm_up]
    waits = [float(r["wait_s"]) for r in counted if r["wait_s"]]
    within = sum(1 for r in counted if r["status"] == "200" and _waited(r) <= SLO_WAIT_S)
    everything = sum(1 for r in rows if r["status"] == "200" and _waited(r) <= SLO_WAIT_S)
    warm = sum(1 for r in rows if r.get("prewarmed") == "1")
    print()
    print("what happened")
    print(f"  GPUs lent to finetune:        {lent}")
    print(f"  GPUs reclaimed:               {len(reclaims)} ({ahead} proactive, "
          f"{len(reclaims) - ahead} reactive)")  # fmt: skip
    print(f"  replicas pre-warmed:          {prewarms} "
          f"(they served {warm} of {len(rows)} requests)")  # fmt: skip
    print(f"  finetune resized:             {len(resizes)} times "
          f"({sum(1 for e in resizes if e.detail.get('how') == 'afe')} by AFE)")  # fmt: skip
    if finished:
        print(f"  finetune finished in:         {finished[-1].detail.get('seconds', 0):.0f} s")
    else:
        print("  finetune:                     still running when the demo stopped it")
    print(f"  requests within the SLO:      {within} of {len(counted)} after the warm-up "
          f"({100.0 * within / max(len(counted), 1):.1f}%, {SLO_WAIT_S:g} s wait); "
          f"{everything} of {len(rows)} with it")  # fmt: skip
    print(f"  p99 wait after the warm-up:   {_p99(waits):.2f} s")
    print(f"  (the warm-up: the first {warm_up:g} s, whose requests wait for the first")
    print("   replica's cold start: no history yet to forecast from)")


def _waited(row: dict[str, str]) -> float:
    return float(row["wait_s"]) if row["wait_s"] else math.inf


def _warm_up_s() -> float:
    """The profile's warm-up: its first piece (the second row's time)."""
    with PROFILE.open() as f:
        times = [float(r["time_s"]) for r in csv.DictReader(f)]
    return times[1] if len(times) > 1 else 0.0


def _p99(values: list[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


class _Sizes:
    """Prints the job's size whenever it changed since the last look."""

    def __init__(self, state: Path, began: float) -> None:
        self.state, self.began = state, began
        self.last: tuple[int, int] | None = None

    def show(self) -> None:
        size = _job_size(self.state)
        if size != self.last:
            self.last = size
            _say(self.began, f"finetune: {size[0] + size[1]} workers ({size[1]} on lent GPUs)")


def _job_size(state: Path) -> tuple[int, int]:
    """(GPUs of the training pool, lent GPUs) the job holds now."""
    gpus = _status(state)["gpus"]
    mine = [g for g in gpus if g["holder"] == "finetune"]
    return (
        sum(1 for g in mine if g["pool"] == "training"),
        sum(1 for g in mine if g["pool"] == "inference"),
    )


def _job_state(state: Path) -> str:
    jobs = [j for j in _status(state)["jobs"] if j["name"] == "finetune"]
    return str(jobs[0]["state"]) if jobs else ""


def _status(state: Path) -> dict[str, Any]:
    return json.loads(_cli(state, "status", "--json").stdout)  # type: ignore[no-any-return]


def _wait(ok: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``ok`` every second; give up (exit) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up after {timeout:g} s waiting for {what}")
        time.sleep(1.0)


def _cli(state: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``deepboot ARGS --state-dir STATE``."""
    return _deepboot(*args, "--state-dir", str(state), check=check)


def _deepboot(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``deepboot ARGV`` (this interpreter's), bounded by COMMAND_TIMEOUT_S."""
    proc = subprocess.run(
        [sys.executable, "-m", "deepboot.cli.main", *argv],
        capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
    )  # fmt: skip
    if check and proc.returncode != 0:
        raise SystemExit(f"deepboot {' '.join(argv)} failed:\n{proc.stdout}{proc.stderr}")
    return proc


def _say(began: float, text: str) -> None:
    print(f"[{time.monotonic() - began:5.0f} s] {text}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
