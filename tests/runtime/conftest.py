"""Runtime tests: the shared Ray clusters, and what a failure prints.

The tests that start a cluster with :func:`~tests.runtime.cluster_helpers.local_cluster`
attach to a Ray cluster the session shares (one of their shape at a time, started on
first use and stopped at the session's end): only their controller starts and stops
with each test. Those that kill Ray nodes or check what a local ``deepboot up``
starts keep a cluster of their own (``local_cluster(..., own=True)``, or their own
``deepboot up``).

A test that fails on a module's shared cluster leaves its story in that cluster's
event log and worker logs, which are gone once the module's ``deepboot down`` runs
and the CI machine is recycled. A failed test's report therefore carries them (the
newest events, seconds since the first, and each log's tail): the CI log alone must
be enough to tell a flaky test from a scheduling bug.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _shared_ray(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The session's shared Ray clusters (none is started before a test asks)."""
    from tests.runtime.cluster_helpers import shared_rays

    with shared_rays(tmp_path_factory.mktemp("shared-ray")):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    state = funcargs.get("cluster")
    if not isinstance(state, Path) or not (state / "deepboot.db").exists():
        return
    from tests.runtime.cluster_helpers import dump_state

    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        dump_state(state)
    report.sections.append(("the cluster when it failed", buf.getvalue()))
