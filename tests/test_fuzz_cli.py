"""Fuzzing the front door: generated workload rows and flag values, in-process.

Whatever the input, ``deepboot simulate`` ends with exit 0 or 2 (the one-line error),
never a traceback; it changes no file but the output it was asked to write; and every
run is bounded by simulated time and the engine's own progress guard (``--max-time``
and ``SimConfig.stall_ticks``), never by a wall-clock timeout. ``docs/reliability.md``
lists the input classes and what each now gets.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepboot.cli.main import main

HEADERS = (
    "name,time,application,num_replicas,batch_size",
    "name,time,application,num_replicas,batch_size,duration,num_task",
)


def mostly(valid: list[str], odd: list[str]) -> st.SearchStrategy[str]:
    """A valid value 19 times in 20, so that most examples reach the simulation (a
    workload has up to 35 cells, each of which could end the run at the loader)."""
    return st.integers(0, 19).flatmap(
        lambda i: st.sampled_from(odd) if i == 0 else st.sampled_from(valid)
    )


TIMES = mostly(["0", "1", "30", "600", "3000"], ["-1", "nan", "inf", "1e18", "", "x"])
COUNTS = mostly(["1", "2", "4"], ["0", "-1", "0.5", "99999999", "1e18", "", "x"])
BATCHES = mostly(["32", "128", "512"], ["0", "-1", "99999999", "nan", ""])
DURATIONS = mostly(["2", "7.5"], ["0", "-1", "inf", "1e12", "x"])
TRAINING_APPS = mostly(["cifar10", "ncf", "bert"], ["bogus", "infer-x-1", ""])
INFERENCE_APPS = mostly(["infer-cifar10-1", "infer-ncf-2"], ["infer-bogus-1", "cifar10"])


@st.composite
def workload_text(draw: st.DrawFn) -> str:
    header = draw(st.sampled_from(HEADERS))
    deepboot_format = header.endswith("num_task")
    rows = [header]
    for i in range(draw(st.integers(1, 5))):
        inference = deepboot_format and draw(st.booleans())
        name = draw(mostly([f"r{i}"], ["", "dup"]))
        if inference:
            cells = [name, draw(TIMES), draw(INFERENCE_APPS), draw(mostly(["1"], ["2", "0"]))]
            cells += [draw(mostly(["1"], ["64"])), draw(DURATIONS), draw(COUNTS)]
        else:
            cells = [name, draw(TIMES), draw(TRAINING_APPS), draw(COUNTS), draw(BATCHES)]
            if deepboot_format:
                cells += ["-1", "-1"]
        if draw(st.integers(0, 9)) == 0:
            cells = cells[:-1]  # a short row now and then
        rows.append(",".join(cells))
    return "\n".join(rows) + "\n"


FLAGS = st.fixed_dictionaries(
    {
        "--policy": mostly(
            ["pollux", "deepboot", "tiresias", "fifo", "optimus", "afs"], ["bogus", ""]
        ),
        "--cluster": mostly(["1x2", "2x2", "2x4"], ["0x1", "1x0", "100000x64", "ax2", "2"]),
        "--inference-nodes": mostly(["0", "1"], ["-1", "9", "x"]),
        "--seed": mostly(["0", "7"], ["-1", str(2**63), "x"]),
        "--interval": mostly(["60", "30"], ["0", "-5", "nan", "inf", "1e12"]),
    }
)
PARAMS = st.sampled_from(
    [
        [],
        [],
        [],
        ["--param", "p=1000"],
        ["--param", "p=-1"],
        ["--param", "restart_delay=inf"],
        ["--param", "restart_delay=-3"],
        ["--param", "nonsense=1"],
        ["--param", "hysteresis=0.5"],
        ["--no-lending"],
        ["--reserve", "--reserve-target", "0.9"],
        ["--protect-factor", "1e9"],
    ]
)


OUTCOMES: dict[int, int] = {}
"""Exit codes seen (a campaign that never simulates would prove little)."""


def listing(root: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``root``: size and SHA-256."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            out[str(path.relative_to(root))] = (len(data), hashlib.sha256(data).hexdigest())
    return out


@settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(text=workload_text(), flags=FLAGS, params=PARAMS)
def test_simulate_never_crashes_and_touches_only_its_output(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    text: str,
    flags: dict[str, str],
    params: list[str],
) -> None:
    run_dir = Path(tempfile.mkdtemp(dir=tmp_path))  # one folder per example
    workload = run_dir / "w.csv"
    workload.write_text(text)
    out = run_dir / "summary.json"
    before = listing(run_dir)
    argv = ["simulate", "--workload", str(workload), "--summary-json", str(out), "--quiet"]
    for flag, value in flags.items():
        argv += [flag, value]
    # Simulated time bounds every run; the engine's stall guard ends the rest.
    argv += [*params, "--max-time", "20000"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code in (0, 2), (argv, text, err)
    OUTCOMES[code] = OUTCOMES.get(code, 0) + 1
    assert "Traceback" not in err, err
    if code == 2:
        assert "deepboot: error:" in err, err
    after = listing(run_dir)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed <= {"summary.json"}, (changed, argv)
    if code == 0:
        assert out.exists()


def test_the_campaign_reached_the_simulation() -> None:
    # Runs after the fuzz test in file order: some examples must have simulated.
    if not OUTCOMES:
        pytest.skip("run together with the fuzz test")
    assert OUTCOMES.get(0, 0) >= 3, OUTCOMES
