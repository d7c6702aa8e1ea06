"""Issue 42, findings 5 and 7: every bad job or service spec POSTed to the endpoint is
a 400 that names the key, never a 500, and never names a path the controller resolved.

The real router on a real socket, without Ray (as tests/runtime/test_front_door_http.py),
its ``submit`` and ``register`` the controller's own
(:func:`~deepboot.runtime.controller_process.submit_job` and ``register_service``,
which ``open_router`` wires in): the real spec check runs, and a good spec reaches the store.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from deepboot.runtime.controller_process import register_service, submit_job  # noqa: E402
from deepboot.runtime.http import router as rt  # noqa: E402
from deepboot.runtime.prometheus_metrics import Metrics  # noqa: E402
from deepboot.runtime.store.jobstore import JobStore  # noqa: E402
from deepboot.runtime.store.statedir import StateDir  # noqa: E402
from tests.runtime.test_front_door_http import TOKEN, authed, send  # noqa: E402

pytestmark = pytest.mark.runtime

ROUTES = {"entry": "/v1/jobs", "handler": "/v1/services"}
BODIES: dict[str, dict[str, Any]] = {
    "entry": {"name": "j", "min_workers": 1, "max_workers": 1},
    "handler": {"name": "s", "model": "m"},
}
MISSING_ABS = "/etc/deepboot-issue-42/nothere.py"
LONG_NAME = "a" * 300 + ".py"  # one name over NAME_MAX (255)
LONG_PATH = "/" + "/".join(["d" * 9] * 500) + "/x.py"  # 5,000 characters, over PATH_MAX


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[tuple[rt.Router, StateDir]]:
    """A router whose submit/register are the controller's, on a state directory
    under ``tmp_path/work`` (a relative entry resolves against ``tmp_path/work``)."""
    state = StateDir.at(tmp_path / "work" / ".deepboot").ensure()
    inbox = rt.Inbox()
    router = rt.Router(
        inbox,
        Metrics(),
        token=TOKEN,
        submit=functools.partial(submit_job, state, inbox.wake),
        register=functools.partial(register_service, state, inbox.wake),
    )
    router.start()
    try:
        yield router, state
    finally:
        router.stop()


def post(router: rt.Router, key: str, ref: str) -> tuple[int, str]:
    """POST a spec whose ``key`` (entry or handler) is ``ref``: the status, and the
    error's text (or the whole answer's, for a 201)."""
    body = json.dumps({**BODIES[key], key: ref}).encode()
    code, _, answer = send(router.url, ROUTES[key], body=body, headers=authed())
    assert isinstance(answer, dict), answer
    return code, str(answer.get("error", answer))


def _assert_names_key_not_paths(text: str, key: str, *paths: str | Path) -> None:
    assert f"'{key}'" in text, text
    for path in paths:
        assert str(path) not in text, (str(path), text)


@pytest.mark.parametrize("key", ["entry", "handler"])
@pytest.mark.parametrize("what", ["long_name", "long_path", "symlink_loop"])
def test_a_path_the_system_refuses_is_a_400_naming_the_key(
    endpoint: tuple[rt.Router, StateDir], key: str, what: str
) -> None:
    router, state = endpoint
    base = state.root.parent
    if what == "symlink_loop":
        os.symlink("loop.py", base / "loop.py")
        target = "loop.py"
    else:
        target = LONG_NAME if what == "long_name" else LONG_PATH
    assert len(LONG_PATH) >= 5000
    code, text = post(router, key, f"{target}:f")
    assert code == 400, (code, text)
    _assert_names_key_not_paths(text, key, base)


@pytest.mark.parametrize("key", ["entry", "handler"])
def test_a_bad_file_is_a_400_naming_the_key_never_a_resolved_path(
    endpoint: tuple[rt.Router, StateDir], key: str
) -> None:
    router, state = endpoint
    base = state.root.parent
    # An absolute path: not repeated (no file-existence oracle in words).
    code, text = post(router, key, f"{MISSING_ABS}:f")
    assert code == 400, (code, text)
    _assert_names_key_not_paths(text, key, MISSING_ABS, "/etc")
    # A relative one: its reference as given, never where the controller resolved it.
    code, text = post(router, key, "nothere.py:f")
    assert code == 400, (code, text)
    _assert_names_key_not_paths(text, key, base)
    assert "nothere.py" in text
    # A directory is no file either.
    (base / "adir.py").mkdir()
    code, text = post(router, key, f"{base / 'adir.py'}:f")
    assert code == 400, (code, text)
    _assert_names_key_not_paths(text, key, base)


@pytest.mark.parametrize("key", ["entry", "handler"])
def test_a_nul_byte_is_a_400_naming_the_key(endpoint: tuple[rt.Router, StateDir], key: str) -> None:
    router, state = endpoint
    base = state.root.parent
    for ref in ("x\x00.py:f", f"{base}/x\x00.py:f"):
        code, text = post(router, key, ref)
        assert code == 400, (code, text)
        _assert_names_key_not_paths(text, key, base)


@pytest.mark.parametrize("key", ["entry", "handler"])
def test_a_good_file_is_stored_with_its_absolute_path(
    endpoint: tuple[rt.Router, StateDir], key: str
) -> None:
    router, state = endpoint
    base = state.root.parent
    (base / "code.py").write_text("def f(*a, **k):\n    pass\n")
    for ref in ("code.py:f", f"{base / 'code.py'}:f"):
        name = f"ok-{len(ref)}"
        body = json.dumps({**BODIES[key], key: ref, "name": name}).encode()
        code, _, answer = send(router.url, ROUTES[key], body=body, headers=authed())
        assert (code, answer) == (201, {"name": name})
    store = JobStore(state.db)
    try:
        stored = [r.spec.entry for r in store.jobs()] + [r.spec.handler for r in store.services()]
    finally:
        store.close()
    assert stored == [f"{(base / 'code.py').resolve()}:f"] * 2
