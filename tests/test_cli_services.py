"""``--services FILE`` of ``deepboot simulate`` and ``deepboot compare``, and the API's
``services=``: the services file's services run in the simulator; a bad file is one
error line naming the file, the line and the key (exit 2)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, run_cli

import deepboot
from deepboot.core.errors import InputError

HEADER = "name,time,application,num_replicas,batch_size,duration,num_task"

SERVICES = """\
# two services of a test
[[service]]
name = "chat"
model = "llama-7b"
cold_start_s = 12.0
concurrency = 2

[[service]]
name = "img"
model = "sd-xl"
cold_start_s = 4.0
"""


def files(tmp_path: Path, services: str = SERVICES, rows: tuple[str, ...] = ()) -> tuple[str, str]:
    """A workload (two ncf jobs; chat tasks at 5 and 6 s that overlap, an img task)
    and a services file; their paths."""
    w = tmp_path / "w.csv"
    body = rows or (
        "ncf-0,0,ncf,1,32768,-1,-1",
        "c1,5,infer-chat,1,1,20,1",
        "c2,6,infer-chat,1,1,20,1",
        "i1,7,infer-img,1,1,3,1",
        "ncf-1,30,ncf,1,32768,-1,-1",
    )
    w.write_text("\n".join([HEADER, *body]) + "\n", encoding="utf-8")
    s = tmp_path / "s.toml"
    s.write_text(services, encoding="utf-8")
    return str(w), str(s)


SIM = ("simulate", "--policy", "pollux", "--cluster", "2x2", "--inference-nodes", "1", "-q")


def test_simulate_runs_the_files_services(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w, s = files(tmp_path)
    out = tmp_path / "summary.json"
    code, _, err = run_cli(
        capsys, *SIM, "--workload", w, "--services", s, "--summary-json", str(out)
    )
    assert code == 0, err
    inference = json.loads(out.read_text())["inference"]
    # c2 joins c1's replica (concurrency 2): two cold starts (chat, img), one warm hit
    assert (inference["tasks"], inference["cold_starts"], inference["warm_hits"]) == (3, 2, 1)


@pytest.mark.parametrize(
    ("services", "rows", "words"),
    [
        (SERVICES.replace("concurrency = 2", "concurrency = 0"), (),
         ["s.toml:2:", "field 'concurrency'", "[1, 1024]"]),
        (SERVICES.replace('model = "sd-xl"\ncold_start_s = 4.0\n', 'model = "sd-xl"\n'), (),
         ["s.toml:8:", "field 'cold_start_s'", "'img'"]),
        (SERVICES + "colour = 1\n", (), ["s.toml:8:", "field 'colour'", "unknown key"]),
        ("[[service]\n", (), ["s.toml:1:", "not valid TOML"]),
        ("", (), ["s.toml:", "field 'service'", "no [[service]]"]),
        (SERVICES, ("ncf-0,0,ncf,1,32768,-1,-1", "c1,5,infer-nope,1,1,2,1"),
         ["w.csv:3:", "field 'application'", "'nope' is not a service of"]),
    ],
    ids=["range", "no-cold-start", "unknown-key", "syntax", "empty", "unknown-service"],
)  # fmt: skip
@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_a_bad_services_file_is_one_line_naming_file_line_and_key(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    services: str,
    rows: tuple[str, ...],
    words: list[str],
) -> None:
    w, s = files(tmp_path, services, rows)
    if command == "simulate":
        argv = [*SIM, "--workload", w, "--services", s]
    else:
        argv = ["compare", "--workload", w, "--services", s, "--out", str(tmp_path / "o")]
        argv += ["--no-figures", "-q", "--procs", "1"]
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert_one_line_error(err, *words)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--services", ""], ["--services"]),
        (["--services", "missing.toml"], ["missing.toml", "cannot read the services file"]),
    ],
    ids=["empty-path", "missing"],
)
def test_a_bad_services_path_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: list[str]
) -> None:
    w, _ = files(tmp_path)
    code, _, err = run_cli(capsys, *SIM, "--workload", w, *argv)
    assert code == 2
    assert_one_line_error(err, *words)


def test_no_output_overwrites_the_services_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w, s = files(tmp_path)
    code, _, err = run_cli(capsys, *SIM, "--workload", w, "--services", s, "--summary-json", s)
    assert code == 2
    assert_one_line_error(err, "--services")
    assert Path(s).read_text() == SERVICES


def test_compare_reads_every_workload_with_the_services_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w, s = files(tmp_path)
    out = tmp_path / "o"
    argv = ["compare", "--workload", w, "--services", s, "--out", str(out), "--no-figures"]
    argv += ["--run", "pollux", "--inference-nodes", "1", "--cluster", "2x2", "-q"]
    code, _, err = run_cli(capsys, *argv, "--procs", "1")
    assert code == 0, err
    with (out / "results.csv").open() as f:
        [row] = list(csv.DictReader(f))
    assert (row["inference.cold_starts"], row["inference.warm_hits"]) == ("2", "1")
    assert f"--services {s}" in (out / "report.html").read_text()


@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_help_explains_services_with_an_example(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    code, text, _ = run_cli(capsys, command, "--help")
    assert code == 0
    assert "--services FILE" in text
    assert "[[service]]" in text and "infer-<name>" in text and "concurrency" in text


# -- the API ----------------------------------------------------------------------------


def test_the_api_takes_services(tmp_path: Path) -> None:
    w, s = files(tmp_path)
    workload = deepboot.load_workload(w, services=s)
    assert [t.service for t in workload.inference] == ["chat", "chat", "img"]
    cluster = deepboot.cluster("2x2", 1)
    direct = deepboot.simulate(workload, cluster, "pollux").summary["inference"]
    assert (direct["cold_starts"], direct["warm_hits"]) == (2, 1)
    # services= on simulate: the file's specs replace the workload's (here concurrency 1)
    one = tmp_path / "one.toml"
    one.write_text(SERVICES.replace("concurrency = 2", "concurrency = 1"))
    rebound = deepboot.simulate(workload, cluster, "pollux", services=one).summary["inference"]
    assert (rebound["cold_starts"], rebound["warm_hits"]) == (3, 0)
    [cell] = deepboot.compare([w], ["pollux"], cluster="2x2", inference_nodes=1, procs=1,
                              services=s)  # fmt: skip
    assert cell.error is None
    assert cell.summary["inference"] == direct
    bad, _ = files(tmp_path, rows=("ncf-0,0,ncf,1,32768,-1,-1", "x,1,infer-x,1,1,1,1"))
    with pytest.raises(InputError, match="is not a service of"):
        deepboot.load_workload(bad, services=s)
