"""``deepboot serve`` with a services file (``[[service]]`` tables, the file the
simulator's ``--services`` reads): every service registered, handlers resolved against
the file's directory, errors naming the file, the service's line and the key. Parsing
and the store only: no Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepboot.cli.main import main
from deepboot.core.errors import InputError
from deepboot.runtime.client.servicespec import load_service, load_service_file

TWO = """\
# two services
[[service]]
name = "echo"
model = "tiny-mlp"
handler = "handlers/echo_service.py:load"
cold_start_s = 2.0

[[service]]
name = "echo-wide"
model = "tiny-mlp"
handler = "handlers/echo_service.py:load"
concurrency = 4
max_replicas = 2
[service.args]
hidden = 128
"""


def write(tmp_path: Path, text: str) -> Path:
    handlers = tmp_path / "handlers"
    handlers.mkdir(exist_ok=True)
    (handlers / "echo_service.py").write_text("def load(device, **kw):\n    pass\n")
    path = tmp_path / "services.toml"
    path.write_text(text)
    return path


def test_a_services_file_gives_every_service_with_its_handler_resolved(tmp_path: Path) -> None:
    a, b = load_service_file(write(tmp_path, TWO))
    handler = f"{(tmp_path / 'handlers' / 'echo_service.py').resolve()}:load"
    assert (a.name, a.handler, a.cold_start_s, a.concurrency) == ("echo", handler, 2.0, 1)
    assert (b.name, b.handler, b.concurrency, b.max_replicas) == ("echo-wide", handler, 4, 2)
    assert dict(b.args) == {"hidden": 128}


def test_a_single_service_file_keeps_working(tmp_path: Path) -> None:
    path = write(
        tmp_path, 'name = "echo"\nmodel = "m"\nhandler = "handlers/echo_service.py:load"\n'
    )
    assert load_service_file(path) == (load_service(path),)


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        (TWO.replace('handler = "handlers/echo_service.py:load"\nconcurrency', "concurrency"),
         8, "handler", "missing (deepboot serve needs a handler or a command)"),
        (TWO.replace("handlers/echo_service.py:load\"\nconcurrency", "nope.py:load\"\nconcurrency"),
         8, "handler", "nope.py"),
        (TWO.replace("concurrency = 4", "concurrency = 0"), 8, "concurrency", "[1, 1024]"),
        (TWO.replace("cold_start_s = 2.0", "colour = 2"), 2, "colour", "unknown key"),
        (TWO.replace('name = "echo-wide"', 'name = "echo"'), 8, "name", "already"),
    ],
    ids=["no-handler", "missing-handler-file", "range", "unknown-key", "duplicate"],
)  # fmt: skip
def test_every_error_names_the_file_the_services_line_and_the_key(
    tmp_path: Path, text: str, line: int, field: str, words: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InputError) as exc:
        load_service_file(path)
    assert (exc.value.path, exc.value.line, exc.value.field) == (str(path), line, field)
    assert words in exc.value.message


def test_serve_registers_every_service_of_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from deepboot.runtime.store.jobstore import JobStore
    from deepboot.runtime.store.statedir import StateDir

    state = StateDir.at(tmp_path / "s").ensure()
    JobStore(state.db).close()
    path = write(tmp_path, TWO)
    assert main(["serve", str(path), "--state-dir", str(state.root)]) == 0
    out = capsys.readouterr().out
    assert "registered service echo " in out and "registered service echo-wide " in out
    store = JobStore(state.db)
    assert sorted(r.spec.name for r in store.services()) == ["echo", "echo-wide"]
    store.close()


def test_serve_stores_nothing_from_a_file_with_one_bad_service(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from deepboot.runtime.store.jobstore import JobStore
    from deepboot.runtime.store.statedir import StateDir

    state = StateDir.at(tmp_path / "s").ensure()
    JobStore(state.db).close()
    path = write(tmp_path, TWO.replace("concurrency = 4", "concurrency = 0"))
    assert main(["serve", str(path), "--state-dir", str(state.root)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"deepboot: error: {path}:8: field 'concurrency': service 'echo-wide' field "
        "'concurrency': must be in [1, 1024], got 0\n"
    )
    store = JobStore(state.db)
    assert store.services() == []
    store.close()
