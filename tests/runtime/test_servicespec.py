"""Service specs: the core type's checks and JSON round trip, the simulator's specs, and
service files (a good one loads; each bad one is refused naming the file and the key).
The example service's handler runs with torch (marked ``runtime``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from deepboot.core import ServiceSpec
from deepboot.core.errors import ConfigError, InputError
from deepboot.core.jobs import InferenceTaskSpec
from deepboot.runtime.client.servicespec import load_service, parse_service
from deepboot.sim.serving import service_specs

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "runtime"

GOOD = """\
name = "echo"
model = "tiny-mlp"
handler = "echo_service.py:load"   # file relative to this TOML's directory
concurrency = 2
max_replicas = 4
queue_bound = 16
request_timeout_s = 30
cold_start_s = 2.5
[args]
hidden = 32
"""


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "echo_service.py").write_text("def load(device, **kw):\n    pass\n")
    path = tmp_path / "echo.toml"
    path.write_text(text)
    return path


# -- the core type -----------------------------------------------------------------------


def test_defaults_and_a_frozen_read_only_args() -> None:
    spec = ServiceSpec("infer-bert-1", "bert")
    assert (spec.handler, dict(spec.args), spec.concurrency, spec.max_replicas) == ("", {}, 1, 0)
    assert spec.cold_start_s is None and spec.queue_bound == 64
    assert spec.request_timeout_s == 60.0
    args = {"hidden": 8}
    spec = ServiceSpec("s", "m", args=args)
    args["hidden"] = 9  # the spec keeps its own copy
    assert isinstance(spec.args, MappingProxyType) and spec.args["hidden"] == 8
    with pytest.raises(TypeError):
        spec.args["hidden"] = 1  # type: ignore[index]
    with pytest.raises(AttributeError):
        spec.name = "t"  # type: ignore[misc]


def test_json_round_trip() -> None:
    spec = ServiceSpec(
        "echo", "tiny", "/abs/echo.py:load", {"hidden": 8, "tags": ["a"]}, 4, 2, 1.5, 10, 5.0
    )
    data = spec.to_json()
    assert type(data["args"]) is dict and data["args"] == {"hidden": 8, "tags": ["a"]}
    assert ServiceSpec.from_json(data) == spec
    assert ServiceSpec.from_json({"name": "s", "model": "m"}) == ServiceSpec("s", "m")
    with pytest.raises(ConfigError, match="'gpus'"):
        ServiceSpec.from_json({"name": "s", "model": "m", "gpus": 1})
    with pytest.raises(ConfigError, match="'model'"):
        ServiceSpec.from_json({"name": "s"})


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"name": ""}, "name"),
        ({"name": "-lead"}, "name"),
        ({"name": "a b"}, "name"),
        ({"name": "x" * 64}, "name"),
        ({"model": ""}, "model"),
        ({"handler": 3}, "handler"),
        ({"args": [1]}, "args"),
        ({"args": {1: 2}}, "args"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 1025}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"max_replicas": -1}, "max_replicas"),
        ({"max_replicas": 4097}, "max_replicas"),
        ({"max_replicas": 1.0}, "max_replicas"),
        ({"cold_start_s": -1.0}, "cold_start_s"),
        ({"cold_start_s": math.inf}, "cold_start_s"),
        ({"queue_bound": 0}, "queue_bound"),
        ({"queue_bound": 100_001}, "queue_bound"),
        ({"request_timeout_s": 0.0}, "request_timeout_s"),
        ({"request_timeout_s": 86_401.0}, "request_timeout_s"),
        ({"request_timeout_s": math.nan}, "request_timeout_s"),
    ],
)
def test_a_bad_field_is_a_config_error_naming_it(fields: dict[str, Any], key: str) -> None:
    kw: dict[str, Any] = {"name": "s", "model": "m", **fields}
    with pytest.raises(ConfigError, match=f"field '{key}'"):
        ServiceSpec(**kw)


def test_the_limits_themselves_are_valid() -> None:
    ServiceSpec("x" * 63, "m", concurrency=1024, max_replicas=4096, queue_bound=100_000)
    ServiceSpec("a.b_c-1", "m", cold_start_s=0, request_timeout_s=86_400)


# -- the simulator's specs ---------------------------------------------------------------


def _task(name: str, service: str, model: str) -> InferenceTaskSpec:
    return InferenceTaskSpec(name, 0.0, service, model, 1.0, 1)


def test_the_simulator_builds_one_uncapped_spec_per_service() -> None:
    tasks = [_task("t1", "infer-bert-1", "bert"), _task("t2", "infer-ncf-1", "ncf")]
    tasks.append(_task("t3", "infer-bert-1", "bert"))
    specs = service_specs(tasks, {"bert": 7.0}.get)  # type: ignore[arg-type]
    assert list(specs) == ["infer-bert-1", "infer-ncf-1"]
    assert specs["infer-bert-1"] == ServiceSpec("infer-bert-1", "bert", cold_start_s=7.0)
    assert specs["infer-ncf-1"].max_replicas == 0


def test_the_simulator_refuses_a_service_with_two_models_or_a_bad_name() -> None:
    two = [_task("t1", "infer-bert-1", "bert"), _task("t2", "infer-bert-1", "ncf")]
    with pytest.raises(ConfigError, match="'t2'.*'infer-bert-1'"):
        service_specs(two, lambda _: 1.0)
    with pytest.raises(ConfigError, match="'t1'.*field 'name'"):
        service_specs([_task("t1", "infer bert 1", "bert")], lambda _: 1.0)


# -- service files -----------------------------------------------------------------------


def test_good_service_file_loads_with_absolute_handler(tmp_path: Path) -> None:
    spec = load_service(_write(tmp_path, GOOD))
    assert spec == ServiceSpec(
        name="echo",
        model="tiny-mlp",
        handler=f"{(tmp_path / 'echo_service.py').resolve()}:load",
        args={"hidden": 32},
        concurrency=2,
        max_replicas=4,
        cold_start_s=2.5,
        queue_bound=16,
        request_timeout_s=30.0,
    )
    assert ServiceSpec.from_json(spec.to_json()) == spec


def test_optional_keys_take_their_defaults_and_a_module_handler_stays(tmp_path: Path) -> None:
    text = 'name = "s"\nmodel = "m"\nhandler = "pkg.mod:make"\n'
    spec = load_service(_write(tmp_path, text))
    assert spec == ServiceSpec("s", "m", "pkg.mod:make")
    assert spec.cold_start_s is None


def test_the_shipped_example_loads() -> None:
    spec = load_service(EXAMPLES / "echo.toml")
    assert spec.name == "echo" and spec.max_replicas == 4
    assert spec.handler == f"{EXAMPLES / 'echo_service.py'}:load"
    assert spec.args["hidden"] == 64


Edit = Callable[[str], str]


@pytest.mark.parametrize(
    ("edit", "key", "words"),
    [
        (lambda t: t.replace('name = "echo"\n', ""), "name", "missing"),
        (lambda t: t.replace('model = "tiny-mlp"\n', ""), "model", "missing"),
        (lambda t: t.replace('handler = "echo_service.py:load"', ""), "handler", "missing"),
        (lambda t: t.replace('"echo"', '"bad name!"'), "name", "letters"),
        (lambda t: t.replace('"echo"', "3"), "name", "string"),
        (lambda t: t.replace('"tiny-mlp"', '""'), "model", "empty"),
        (lambda t: t.replace("echo_service.py:load", "nothere.py:load"), "handler", "not exist"),
        (lambda t: t.replace("echo_service.py:load", "echo_service.py"), "handler", "factory"),
        (lambda t: t.replace("echo_service.py:load", "echo_service.py:1x"), "handler", "factory"),
        (lambda t: t.replace("echo_service.py:load", "a/b:load"), "handler", "module"),
        (lambda t: t.replace("concurrency = 2", "concurrency = 0"), "concurrency", "[1, 1024]"),
        (lambda t: t.replace("concurrency = 2", "concurrency = 1.5"), "concurrency", "integer"),
        (lambda t: t.replace("max_replicas = 4", "max_replicas = -1"), "max_replicas", "[0, 4096]"),
        (lambda t: t.replace("queue_bound = 16", "queue_bound = 0"), "queue_bound", "[1, 100000]"),
        (
            lambda t: t.replace("request_timeout_s = 30", "request_timeout_s = 0"),
            "request_timeout_s",
            "(0, 86400]",
        ),
        (
            lambda t: t.replace("request_timeout_s = 30", 'request_timeout_s = "30"'),
            "request_timeout_s",
            "number",
        ),
        (lambda t: t.replace("cold_start_s = 2.5", "cold_start_s = -1"), "cold_start_s", ">= 0"),
        (lambda t: t.replace("cold_start_s = 2.5", "cold_start_s = nan"), "cold_start_s", "finite"),
        (lambda t: "gpus = 2\n" + t, "gpus", "unknown key"),
        (lambda t: t.replace("[args]\nhidden = 32\n", 'args = "x"\n'), "args", "table"),
    ],
    ids=[
        "no-name",
        "no-model",
        "no-handler",
        "bad-name",
        "name-not-string",
        "empty-model",
        "missing-file",
        "no-function",
        "bad-function",
        "bad-module",
        "zero-concurrency",
        "float-concurrency",
        "negative-cap",
        "zero-queue",
        "zero-timeout",
        "string-timeout",
        "negative-cold-start",
        "nan-cold-start",
        "unknown-key",
        "args-not-table",
    ],
)
def test_bad_service_file_names_file_and_key(
    tmp_path: Path, edit: Edit, key: str, words: str
) -> None:
    path = _write(tmp_path, edit(GOOD))
    with pytest.raises(InputError) as info:
        load_service(path)
    assert info.value.path == str(path)
    assert info.value.field == key
    assert words in str(info.value)
    assert str(path) in str(info.value)


def test_a_toml_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace("max_replicas = 4", "max_replicas = = 4"))
    with pytest.raises(InputError) as info:
        load_service(path)
    assert (info.value.path, info.value.line) == (str(path), 5)
    assert f"{path}:5:" in str(info.value) and "TOML" in str(info.value)


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(InputError, match="cannot read") as info:
        load_service(path)
    assert info.value.path == str(path)


# -- the example's handler (torch) -------------------------------------------------------


@pytest.mark.runtime
def test_the_example_handler_runs_a_small_mlp() -> None:
    import importlib.util
    import os

    pytest.importorskip("torch")
    spec = load_service(EXAMPLES / "echo.toml")
    file, _, func = spec.handler.rpartition(":")
    module_spec = importlib.util.spec_from_file_location("echo_service_under_test", file)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    handle = getattr(module, func)("cpu", **spec.args)
    width = module.WIDTH
    out = handle({"x": [1.0, -2.0, 0.5]})
    assert set(out) == {"y", "pid"} and out["pid"] == os.getpid()
    assert len(out["y"]) == width and all(isinstance(v, float) for v in out["y"])
    # Padding with zeros is the same as sending them; extra values are trimmed.
    padded = [1.0, -2.0, 0.5] + [0.0] * (width - 3)
    assert handle({"x": padded})["y"] == out["y"]
    assert handle({"x": padded + [9.0, 9.0]})["y"] == out["y"]
    assert handle({})["y"] == handle({"x": [0.0] * width})["y"]
    # Deterministic: a second replica (same seed) answers the same.
    again = getattr(module, func)("cpu", hidden=spec.args["hidden"], delay_s=0.0, extra="ignored")
    assert again({"x": [1.0, -2.0, 0.5]})["y"] == out["y"]
    with pytest.raises(ValueError, match="'x'"):
        handle({"x": 3})


def test_parse_service_names_where_and_resolves_against_base(tmp_path: Path) -> None:
    _write(tmp_path, GOOD)
    raw = {"name": "s", "model": "m", "handler": "echo_service.py:load", "max_replicas": 2}
    spec = parse_service(raw, "POST /v1/services", tmp_path)
    assert spec.handler == f"{(tmp_path / 'echo_service.py').resolve()}:load"
    with pytest.raises(InputError) as info:
        parse_service({**raw, "max_replicas": 5000}, "POST /v1/services", tmp_path)
    assert (info.value.path, info.value.field) == ("POST /v1/services", "max_replicas")


# -- command services (a server of the user's own: vLLM, TGI, Triton, the stand-in) ----------

COMMAND = """
name = "chat"
model = "llama-8b"
command = ["python", "standin_server.py", "--port", "{port}", "--gpus", "{gpus}", "{model}"]
ready_path = "/health"
health_path = "/health"
sleep = { method = "POST", path = "/sleep?level=1", timeout_s = 5 }
wake = { path = "/wake_up" }
sleep_gpu_gb = 1.5
gpus_per_replica = 2
stop_grace_s = 3
[env]
VLLM_SERVER_DEV_MODE = "1"
"""


def test_a_command_service_reads_every_key_and_fills_its_placeholders(tmp_path: Path) -> None:
    path = tmp_path / "chat.toml"
    path.write_text(COMMAND)
    spec = load_service(path)
    assert spec.is_command and spec.handler == ""
    assert spec.workdir == str(tmp_path.resolve())
    assert spec.argv(8123, "2,3") == [
        "python", "standin_server.py", "--port", "8123", "--gpus", "2,3", "llama-8b",
    ]  # fmt: skip
    assert spec.sleep is not None and spec.wake is not None
    assert (spec.sleep.method, spec.sleep.path, spec.sleep.timeout_s) == (
        "POST",
        "/sleep?level=1",
        5.0,
    )
    assert (spec.wake.method, spec.wake.path, spec.wake.timeout_s) == ("POST", "/wake_up", 30.0)
    assert (spec.gpus_per_replica, spec.sleep_gpu_gb, spec.stop_grace_s) == (2, 1.5, 3.0)
    assert dict(spec.env) == {"VLLM_SERVER_DEV_MODE": "1"}
    assert ServiceSpec.from_json(spec.to_json()) == spec  # what travels to the replica


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (('command = ["python"', 'handler = "x.py:f"\ncommand = ["python"'), "command", "not both"),
        (('wake = { path = "/wake_up" }\n', ""), "sleep", "both sleep and wake"),
        (('"/sleep?level=1"', '"sleep"'), "sleep", "starting with '/'"),
        (('method = "POST"', 'method = "DELETE"'), "sleep", "GET, POST, PUT"),
        (("gpus_per_replica = 2", "gpus_per_replica = 0"), "gpus_per_replica", "[1, 64]"),
        (('ready_path = "/health"', 'ready_path = "/a b"'), "ready_path", "no spaces"),
        (('name = "chat"', 'name = "jobs"'), "name", "reserved"),
        (('command = ["python", "standin_server.py"', 'command = [1, "standin_server.py"'),
         "command", "word 0"),
    ],
    ids=["both", "sleep-alone", "path", "method", "gpus", "ready-path", "reserved", "word"],
)  # fmt: skip
def test_a_bad_command_service_names_the_file_and_the_key(
    tmp_path: Path, change: tuple[str, str], field: str, words: str
) -> None:
    path = tmp_path / "chat.toml"
    path.write_text(COMMAND.replace(*change))
    with pytest.raises(InputError) as exc:
        load_service(path)
    assert (exc.value.path, exc.value.field) == (str(path), field)
    assert words in exc.value.message
