"""``deepboot workload from-genai | from-azure-llm | rate-shape | compose``: outputs,
summaries, one-line errors with exit 2, and never writing onto an input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, run_cli
from trace_files import (
    GENAI_DIR,
    azure_file,
    day_of_requests,
    genai_file,
    genai_row,
    loads_file,
    qps_file,
)

from deepboot.core.servicefile import load_services
from deepboot.runtime.client.rateprofile import RateProfile

POLLUX = "name,time,application,num_replicas,batch_size\ncifar10-0,50,cifar10,6,2048\n"


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("from-genai", ["--window busiest-24h", "--top", "FAILED", "PENDING", "CC-BY-4.0"]),
        ("from-azure-llm", ["--hours 8", "--concurrency", "NeMo", "estimate", "CC-BY-4.0"]),
        ("rate-shape", ["--peak-rps 20", "--rate-profile", "rps 0"]),
        ("compose", ["--peak-busy 0.8", "--inference-nodes 8", "10-minute"]),
    ],
    ids=["from-genai", "from-azure-llm", "rate-shape", "compose"],
)
def test_help_teaches_with_an_example(
    capsys: pytest.CaptureFixture[str], command: str, words: list[str]
) -> None:
    code, out, _ = run_cli(capsys, "workload", command, "--help")
    assert code == 0
    assert "example" in out
    for word in words:
        assert word in out, word


Capsys = pytest.CaptureFixture[str]


def genai(capsys: Capsys, tmp_path: Path, *extra: str, out: str = "g.csv") -> tuple[int, str, str]:
    """``from-genai`` on a small trace and load file of the test's own."""
    trace = day_of_requests(tmp_path / "trace.csv")
    loads = loads_file(tmp_path / "loads.csv", [2000.0, 22000.0, 50000.0])
    argv = ["workload", "from-genai", "--trace", str(trace), "--load-latency", str(loads),
            "--out", str(tmp_path / out), *extra]  # fmt: skip
    return run_cli(capsys, *argv)


def test_from_genai_writes_the_workload_and_its_services(capsys: Capsys, tmp_path: Path) -> None:
    code, out, err = genai(capsys, tmp_path, "--window", "busiest-2h", "--top", "2", "--seed", "4")
    assert code == 0, err
    summary = out.splitlines()[0]
    for words in ("from-genai: 3 services", "32 requests", "busiest", "FAILED kept",
                  "PENDING dropped", "demand", "CC-BY-4.0"):  # fmt: skip
        assert words in summary
    lines = (tmp_path / "g.csv").read_text().splitlines()
    assert lines[0] == "name,time,application,num_replicas,batch_size,duration,num_task"
    assert len(lines) == 33 and lines[1].startswith("req-M000")
    specs = load_services(tmp_path / "g.toml")
    assert [s.name for s in specs][-1] == "other"
    assert all(s.cold_start_s in (2.0, 22.0, 50.0) for s in specs)
    assert "CC-BY-4.0" in (tmp_path / "g.toml").read_text().splitlines()[1]
    first = (tmp_path / "g.csv").read_bytes(), (tmp_path / "g.toml").read_bytes()
    code, *_ = genai(capsys, tmp_path, "--window", "busiest-2h", "--top", "2", "--seed", "4")
    assert code == 0
    assert ((tmp_path / "g.csv").read_bytes(), (tmp_path / "g.toml").read_bytes()) == first


def test_a_bad_row_is_one_line_and_nothing_is_written(capsys: Capsys, tmp_path: Path) -> None:
    trace = genai_file(tmp_path / "t.csv", [genai_row("2024-11-15 00:00:00", exec_s="x")])
    out = tmp_path / "g.csv"
    out.write_text("keep me")
    code, _, err = run_cli(
        capsys,
        "workload", "from-genai", "--trace", str(trace), "--cold-start", "5", "--out", str(out),
    )  # fmt: skip
    assert code == 2
    assert_one_line_error(err, f"{trace}:2: field 'exec_time_seconds'", "'x'")
    assert out.read_text() == "keep me" and not (tmp_path / "g.toml").exists()


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--compress", "0"], ["--compress", "(0, 10000]"]),
        (["--top", "0"], ["--top", "[1, 100000]"]),
        (["--hours", "nan"], ["--hours"]),
        (["--window", "busiest-xh"], ["--window", "busiest-Hh"]),
        (["--window", "busiest-24h", "--hours", "2"], ["neither --start nor --hours"]),
        (["--start", "yesterday"], ["--start", "'yesterday'"]),
        (["--service-prefix=-x"], ["prefix"]),
        (["--seed", "-1"], ["--seed"]),
    ],
    ids=["compress", "top", "hours-nan", "window", "busiest-and-hours", "start", "prefix", "seed"],
)
def test_from_genai_flags_out_of_range(
    capsys: Capsys, tmp_path: Path, extra: list[str], words: list[str]
) -> None:
    code, _, err = genai(capsys, tmp_path, *extra)
    assert code == 2
    assert_one_line_error(err, *words)
    assert not (tmp_path / "g.csv").exists()


@pytest.mark.parametrize(
    ("out", "services_out", "words"),
    [
        ("trace.csv", None, ["--out", "would overwrite an input", "--trace"]),
        ("g.csv", "loads.csv", ["--services-out", "--load-latency"]),
        ("g.toml", None, ["--services-out", "is --out"]),
    ],
    ids=["out-is-trace", "services-out-is-loads", "out-is-services-out"],
)
def test_never_writes_onto_an_input(
    capsys: Capsys, tmp_path: Path, out: str, services_out: str | None, words: list[str]
) -> None:
    extra = [] if services_out is None else ["--services-out", str(tmp_path / services_out)]
    code, _, err = genai(capsys, tmp_path, *extra, out=out)
    assert code == 2
    assert_one_line_error(err, *words)
    assert (tmp_path / "trace.csv").read_text().startswith("gmt_create,")
    assert (tmp_path / "loads.csv").read_text().startswith("timestamp_anon,")


def test_from_azure_llm_and_its_cap(capsys: Capsys, tmp_path: Path) -> None:
    trace = azure_file(
        tmp_path / "conv.csv",
        [(f"2023-11-16 18:{m:02d}:00.1000000", 1000, 100) for m in range(0, 60, 5)],
    )
    argv = ["workload", "from-azure-llm", "--trace", str(trace), "--hours", "5",
            "--concurrency", "4", "--service", "chat", "--out", str(tmp_path / "a.csv"),
            "--services-out", str(tmp_path / "svc.toml")]  # fmt: skip
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert "from-azure-llm: 1 service (chat), 60 requests" in out and "CC-BY-4.0" in out
    (spec,) = load_services(tmp_path / "svc.toml")
    assert (spec.name, spec.concurrency, spec.cold_start_s) == ("chat", 4, 20.0)
    row = (tmp_path / "a.csv").read_text().splitlines()[1]
    assert row == "req-chat-1,0,infer-chat,1,1,1.35,1"  # 0.05 + 0.1 + 1.2 s
    code, out, _ = run_cli(capsys, *argv, "--max-requests", "7")
    assert code == 0 and "CAPPED at --max-requests 7" in out
    code, _, err = run_cli(capsys, *argv, "--concurrency", "0")
    assert code == 2
    assert_one_line_error(err, "--concurrency", "[1, 1024]")


def test_rate_shape_writes_a_profile_deepboot_load_reads(capsys: Capsys, tmp_path: Path) -> None:
    rows = [(10.0 * i, 1.0 + (i // 6) % 3, "Generative Requests") for i in range(40)]
    qps = qps_file(tmp_path / "qps.csv", rows)
    out = tmp_path / "p.csv"
    argv = ["workload", "rate-shape", "--qps", str(qps), "--peak-rps", "30", "--window-s",
            "60", "--out", str(out)]  # fmt: skip
    code, text, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert "rate-shape: 6 windows of 60 s" in text and "CC-BY-4.0" in text
    profile = RateProfile.load(out)
    assert max(profile.rates) == 30 and profile.duration == 360
    code, _, err = run_cli(capsys, *argv[:-1], str(qps))
    assert code == 2
    assert_one_line_error(err, "--out", "--qps")
    code, _, err = run_cli(capsys, *argv, "--peak-rps", "0")
    assert code == 2
    assert_one_line_error(err, "--peak-rps")
    code, _, err = run_cli(capsys, *argv, "--request-type", "Nope")
    assert code == 2
    assert_one_line_error(err, "'Nope'", "'Generative Requests' (40)")


def test_compose_two_streams(capsys: Capsys, tmp_path: Path) -> None:
    assert genai(capsys, tmp_path, "--top", "1", "--service-prefix", "g-", out="g.csv")[0] == 0
    trace = azure_file(
        tmp_path / "conv.csv", [(f"2023-11-16 18:{m:02d}:00", 500, 50) for m in range(60)]
    )
    code, *_ = run_cli(
        capsys,
        "workload", "from-azure-llm", "--trace", str(trace), "--out", str(tmp_path / "a.csv"),
    )  # fmt: skip
    assert code == 0
    training = tmp_path / "t.csv"
    training.write_text(POLLUX)
    argv = ["workload", "compose", "--training", str(training),
            "--inference", str(tmp_path / "g.csv"), "--services", str(tmp_path / "g.toml"),
            "--inference", str(tmp_path / "a.csv"), "--services", str(tmp_path / "a.toml"),
            "--cluster", "4x4", "--inference-nodes", "2", "--peak-busy", "0.5",
            "--out", str(tmp_path / "w.csv")]  # fmt: skip
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert "compose: 1 training jobs" in out and "2 inference stream(s)" in out
    peak = re.search(r"peak busy ([0-9.]+) \(target 0.5\)", out)
    assert peak is not None and float(peak.group(1)) == pytest.approx(0.5, abs=0.01)
    assert "on 8 GPUs" in out
    assert out.count("CC-BY-4.0") == 2
    specs = load_services(tmp_path / "w.toml")
    assert [s.name for s in specs] == ["g-M0002", "g-other", "llm-conv"]
    again = ["--inference", str(tmp_path / "a.csv"), "--services", str(tmp_path / "a.toml")]
    code, _, err = run_cli(capsys, *argv[:-2], *again, "--out", str(tmp_path / "x.csv"))
    assert code == 2
    assert_one_line_error(err, "'llm-conv' is in both")
    code, _, err = run_cli(capsys, *argv[:6], "--out", str(tmp_path / "x.csv"))
    assert code == 2 and "--services" in err.splitlines()[-1]
    code, _, err = run_cli(capsys, *argv, "--inference-nodes", "0")
    assert code == 2
    assert_one_line_error(err, "--inference-nodes")
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.skipif(not GENAI_DIR.is_dir(), reason="../shared/traces is not present")
def test_from_genai_on_the_real_trace(capsys: Capsys, tmp_path: Path) -> None:
    code, out, err = run_cli(
        capsys,
        "workload", "from-genai", "--trace", str(GENAI_DIR / "lora_request_trace.csv"),
        "--load-latency", str(GENAI_DIR / "basemodel_update_latency_anon.csv"),
        "--window", "busiest-24h", "--compress", "3", "--top", "10", "--seed", "1",
        "--out", str(tmp_path / "day.csv"),
    )  # fmt: skip
    assert code == 0, err
    assert "from-genai: 11 services" in out and "26,823 read" in out and "398 FAILED kept" in out
