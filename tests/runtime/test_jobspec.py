"""Job files: a good one loads; each bad one is refused naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepboot.core.errors import InputError
from deepboot.runtime.client.jobspec import JobSpec, load_job

GOOD = """\
name = "job-a"
entry = "train.py:train"
min_workers = 1
max_workers = 3
batch_size = 16
max_batch_size = 128
max_local_batch_size = 32
[args]
loss_threshold = 0.01
"""


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "train.py").write_text("def train(ctx):\n    pass\n")
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def test_good_job_file_loads_with_absolute_entry(tmp_path: Path) -> None:
    spec = load_job(_write(tmp_path, GOOD))
    assert spec.name == "job-a"
    assert spec.entry == f"{(tmp_path / 'train.py').resolve()}:train"
    assert (spec.min_workers, spec.max_workers) == (1, 3)
    assert spec.limits.init_batch_size == 16 and spec.limits.max_local_bsz == 32
    assert spec.args == {"loss_threshold": 0.01}
    assert JobSpec.from_json(spec.to_json()) == spec
    assert spec.workers is None and spec.requested == 1  # fixed-size policies: min
    asked = load_job(_write(tmp_path, "workers = 2\n" + GOOD))
    assert asked.requested == 2 and JobSpec.from_json(asked.to_json()) == asked


@pytest.mark.parametrize(
    ("edit", "key", "words"),
    [
        (lambda t: t.replace('name = "job-a"\n', ""), "name", "missing"),
        (lambda t: t.replace('"job-a"', '"bad name!"'), "name", "letters"),
        (lambda t: t.replace("train.py:train", "nothere.py:train"), "entry", "does not exist"),
        (lambda t: t.replace("train.py:train", "train.py"), "entry", "file.py:function"),
        (lambda t: t.replace("max_workers = 3", "max_workers = 0"), "max_workers", "[1, 4096]"),
        (
            lambda t: t.replace("min_workers = 1", "min_workers = 5"),
            "max_workers",
            ">= min_workers",
        ),
        (lambda t: t.replace("batch_size = 16", "batch_size = 1.5"), "batch_size", "integer"),
        (lambda t: t.replace("max_batch_size = 128", "max_batch_size = 8"), "max_batch_size", ">="),
        (lambda t: "gpus = 2\n" + t, "gpus", "unknown key"),
        (lambda t: "workers = 4\n" + t, "workers", "[1, 3]"),
        (lambda t: t.replace("[args]\nloss_threshold = 0.01\n", 'args = "x"\n'), "args", "table"),
    ],
    ids=[
        "no-name",
        "bad-name",
        "missing-file",
        "no-function",
        "zero-workers",
        "min-over-max",
        "float-batch",
        "max-under-initial",
        "unknown-key",
        "workers-over-max",
        "args-not-table",
    ],
)
def test_bad_job_file_names_file_and_key(tmp_path: Path, edit, key: str, words: str) -> None:
    path = _write(tmp_path, edit(GOOD))
    with pytest.raises(InputError) as info:
        load_job(path)
    assert info.value.path == str(path)
    assert info.value.field == key
    assert words in str(info.value)


def test_toml_syntax_error_carries_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace("max_workers = 3", "max_workers = = 3"))
    with pytest.raises(InputError) as info:
        load_job(path)
    assert info.value.line == 4
    assert str(info.value).startswith(f"{path}:4:")


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        load_job(tmp_path / "nope.toml")


ARGV = '["python", "train.py", "--ckpt", "{checkpoint_dir}/{job}"]'
COMMAND = f"""\
name = "ddp"
command = {ARGV}
min_workers = 1
max_workers = 3
application = "cifar10"
max_restarts = 2
stop_grace_s = 4.5
"""


def test_command_job_loads_runs_in_its_directory_and_fills_placeholders(tmp_path: Path) -> None:
    spec = load_job(_write(tmp_path, COMMAND))
    assert spec.command == ("python", "train.py", "--ckpt", "{checkpoint_dir}/{job}")
    assert spec.entry == "" and spec.resize == "restart"
    assert spec.workdir == str(tmp_path.resolve())
    assert spec.argv("/ck") == ("python", "train.py", "--ckpt", "/ck/ddp")
    assert (spec.application, spec.max_restarts, spec.stop_grace_s) == ("cifar10", 2, 4.5)
    assert JobSpec.from_json(spec.to_json()) == spec
    assert load_job(_write(tmp_path, GOOD)).resize == "afe"


@pytest.mark.parametrize(
    ("edit", "key", "words"),
    [
        (lambda t: t + 'entry = "train.py:train"\n', "command", "either entry or command"),
        (lambda t: t.replace(ARGV, "[]"), "command", "non-empty list"),
        (lambda t: t.replace('"train.py"', "3"), "command[1]", "must be a string"),
        (lambda t: t.replace('["python"', '[""'), "command[0]", "must not be empty"),
        (lambda t: t.replace('"cifar10"', '"nope"'), "application", "not in the catalog"),
        (lambda t: t.replace("4.5", "1e9"), "stop_grace_s", "must be in [0, 600]"),
        (lambda t: t.replace("= 2", "= -1"), "max_restarts", "[0, 1000]"),
        (lambda t: t.replace(f"command = {ARGV}\n", ""), "entry", "missing"),
    ],
)  # fmt: skip
def test_bad_command_job_names_the_key(tmp_path: Path, edit, key: str, words: str) -> None:  # type: ignore[no-untyped-def]
    path = _write(tmp_path, edit(COMMAND))
    with pytest.raises(InputError) as err:
        load_job(path)
    assert err.value.field == key and words in str(err.value), str(err.value)
    assert str(path) in str(err.value)


def test_a_measured_profile_is_fitted_when_the_file_is_read(tmp_path: Path) -> None:
    from deepboot.core.params import PerfParams
    from deepboot.runtime.client.jobspec import parse_job
    from deepboot.runtime.controller.jobrecords import _prior

    (tmp_path / "prof.csv").write_text(
        "num_nodes,num_replicas,local_bsz,step_time,sync_time\n"
        "1,1,32,0.20,0.00\n1,2,32,0.23,0.03\n1,4,32,0.26,0.06\n2,8,32,0.35,0.15\n"
        "1,1,64,0.38,0.00\n2,4,64,0.45,0.07\n"
    )
    spec = load_job(
        _write(tmp_path, COMMAND.replace('application = "cifar10"', 'profile = "prof.csv"'))
    )
    assert len(spec.profile_fit) == 7
    assert JobSpec.from_json(spec.to_json()) == spec
    perf, grad = _prior(spec, None, None)
    assert perf == PerfParams(*spec.profile_fit) and grad is not None
    # A bad row names the file, its line and the column.
    (tmp_path / "prof.csv").write_text(
        "num_nodes,num_replicas,local_bsz,step_time,sync_time\n1,1,32,0.2,0.5\n"
    )
    with pytest.raises(InputError) as err:
        load_job(tmp_path / "job.toml")
    assert "prof.csv:2" in str(err.value) and err.value.field == "sync_time"
    # Over HTTP no file is read.
    with pytest.raises(InputError, match="give it in a job file"):
        parse_job({"name": "a", "command": ["x"], "profile": "prof.csv"}, "POST /v1/jobs", tmp_path)


def test_a_command_jobs_own_throughput_wins_over_its_prior(tmp_path: Path) -> None:
    """A command job's report() calls fit its own throughput model (it reports no
    gradient statistics): that model, not the catalog's, is what the policy sees; an
    entry job with neither prior nor statistics stays without a model."""
    from deepboot.core.params import PerfParams
    from deepboot.runtime.controller.jobrecords import NEUTRAL_GRAD, _prior, catalog_prior

    own = PerfParams(0.01, 0.001, 0.1, 0.001, 0.02, 0.002, 2.0)
    spec = load_job(_write(tmp_path, COMMAND))  # application = "cifar10"
    assert _prior(spec, own, None) == (own, catalog_prior("cifar10", spec.batch_size)[1])
    plain = load_job(_write(tmp_path, COMMAND.replace('application = "cifar10"\n', "")))
    assert _prior(plain, own, None) == (own, NEUTRAL_GRAD)
    assert _prior(plain, None, None) == (None, None)  # linear speedup until measured
    entry = load_job(_write(tmp_path, GOOD))
    assert _prior(entry, own, None) == (own, None)  # as before: statistics from 2 ranks
