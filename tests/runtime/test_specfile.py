"""Issue 42, findings 5 and 7, in the spec check itself (deepboot.runtime.client.specfile, as
jobspec and servicespec use it): a reference to a file the system refuses (a name
over NAME_MAX, a path over PATH_MAX, a NUL byte, a symlink loop) is an InputError
naming the key; a spec that came over HTTP (``parse_job``/``parse_service`` with an
endpoint for ``where``) never names a resolved path, while a file given on the command
line (``load_job``/``load_service``) still names the file it looked for.

The HTTP answers themselves: tests/runtime/test_spec_http_errors.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deepboot.core.errors import InputError
from deepboot.runtime.client.jobspec import load_job, parse_job
from deepboot.runtime.client.servicespec import load_service, load_service_file, parse_service

LONG_NAME = "a" * 300 + ".py"
LONG_PATH = "/" + "/".join(["d" * 9] * 500) + "/x.py"


def _http(key: str) -> Callable[[str, Path], Any]:
    """The check a POSTed spec gets: ``ref`` as its entry (or handler)."""
    if key == "entry":
        return lambda ref, base: parse_job({"name": "j", "entry": ref}, "POST /v1/jobs", base)
    return lambda ref, base: parse_service(
        {"name": "s", "model": "m", "handler": ref}, "POST /v1/services", base
    )


def _cli(key: str) -> Callable[[str, Path], Any]:
    """The check a spec file given on the command line gets."""

    def load(ref: str, base: Path) -> Any:
        path = base / "spec.toml"
        if key == "entry":
            path.write_text(f'name = "j"\nentry = {_toml(ref)}\n')
            return load_job(path)
        path.write_text(f'name = "s"\nmodel = "m"\nhandler = {_toml(ref)}\n')
        return load_service(path)

    return load


def _toml(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\x00", "\\u0000") + '"'


def _refused(check: Callable[[str, Path], Any], ref: str, base: Path) -> InputError:
    with pytest.raises(InputError) as info:
        check(ref, base)
    return info.value


@pytest.mark.parametrize("key", ["entry", "handler"])
@pytest.mark.parametrize("form", ["http", "cli"])
@pytest.mark.parametrize("what", ["long_name", "long_path", "nul", "symlink_loop"])
def test_a_path_the_system_refuses_is_an_input_error_naming_the_key(
    tmp_path: Path, key: str, form: str, what: str
) -> None:
    check = (_http if form == "http" else _cli)(key)
    if what == "symlink_loop":
        os.symlink("loop.py", tmp_path / "loop.py")
    target = {
        "long_name": LONG_NAME,
        "long_path": LONG_PATH,
        "nul": "x\x00.py",
        "symlink_loop": "loop.py",
    }[what]
    err = _refused(check, f"{target}:f", tmp_path)
    assert err.field == key, err
    assert len(str(err)) < 300, str(err)  # one short line, the key first
    if form == "http":
        assert str(tmp_path) not in str(err), str(err)


@pytest.mark.parametrize("key", ["entry", "handler"])
def test_a_spec_from_http_never_names_a_resolved_path(tmp_path: Path, key: str) -> None:
    check = _http(key)
    err = _refused(check, "/etc/deepboot-issue-42/x.py:f", tmp_path)
    assert err.field == key and "/etc" not in str(err), str(err)
    err = _refused(check, "sub/nothere.py:f", tmp_path)
    assert err.field == key and str(tmp_path) not in str(err), str(err)
    assert "'sub/nothere.py'" in err.message  # the reference as given (relative)
    (tmp_path / "adir.py").mkdir()
    err = _refused(check, f"{tmp_path / 'adir.py'}:f", tmp_path)
    assert err.field == key and str(tmp_path) not in str(err), str(err)


@pytest.mark.parametrize("key", ["entry", "handler"])
def test_a_spec_file_on_the_command_line_still_names_the_file(tmp_path: Path, key: str) -> None:
    err = _refused(_cli(key), "sub/nothere.py:f", tmp_path)
    assert err.field == key and err.path == str(tmp_path / "spec.toml")
    assert str((tmp_path / "sub" / "nothere.py").resolve()) in err.message, err.message


def test_a_services_file_names_the_file_too(tmp_path: Path) -> None:
    path = tmp_path / "services.toml"
    path.write_text('[[service]]\nname = "s"\nmodel = "m"\nhandler = "nothere.py:f"\n')
    with pytest.raises(InputError) as info:
        load_service_file(path)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), 1, "handler")
    assert str((tmp_path / "nothere.py").resolve()) in err.message, err.message
