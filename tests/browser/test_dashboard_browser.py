"""The live dashboard in headless Chromium, on a real local cluster (make test-browser).

A job holds a lent GPU and a service gets a replica: the page, loaded through the
login page ``deepboot dashboard`` opens (a file: page going on to the one-time link),
shows that job on that GPU, the
service's SLO attainment, and the job's new size after the reclaim shrinks it; a
load of a data route without the session cookie is refused.

Needs Debian's ``chromium`` and ``chromium-driver`` and the ``selenium`` package.
Without them the test is skipped, unless ``DEEPBOOT_REQUIRE_BROWSER=1`` (CI, where
.ci/run installs them): then it fails, so a CI that meant to run it never passes by
skipping it. ``DEEPBOOT_SCREENSHOT_DIR``: where to keep the page's screenshot
(docs/img/dashboard.png is one).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deepboot.cli.dashboard import write_login_page
from deepboot.runtime.client.statusdoc import status_document
from deepboot.runtime.store.statedir import StateDir
from tests.runtime.cluster_helpers import cli, job, local_cluster, wait_for
from tests.runtime.serving_helpers import gated_job, post, service_file

pytestmark = [pytest.mark.runtime, pytest.mark.browser]

REQUIRED = os.environ.get("DEEPBOOT_REQUIRE_BROWSER") == "1"
PAGE_WAIT_S = 180.0
"""A generous bound on what the page must show (a 2-core machine under load)."""


def _missing(what: str) -> None:
    message = f"{what} (apt-get install chromium chromium-driver; pip install selenium)"
    if REQUIRED:
        pytest.fail(f"DEEPBOOT_REQUIRE_BROWSER=1, but {message}")
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing("selenium is not installed")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        _missing("Chromium or its driver is not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in CI
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1300",
    ):
        options.add_argument(arg)
    # The driver named: selenium never looks for (downloads) one of its own.
    drv = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    drv.set_page_load_timeout(60)
    drv.set_script_timeout(30)
    try:
        yield drv
    finally:
        drv.quit()


# The page redraws its rows every few seconds (replacing the elements), so a row is
# read in one script call: the page's own script cannot run in between, and no
# element handle outlives a redraw (StaleElementReferenceException).
_READ_ROW = """
const row = document.querySelector(arguments[0]);
if (!row) return {};
const out = {};
for (const td of row.querySelectorAll('td')) out[td.dataset.field] = td.textContent;
return out;
"""
_READ_GPU = """
const box = document.querySelector(arguments[0]);
return box ? [box.dataset.state, box.dataset.holder] : ['', ''];
"""


def _cells(drv: Any, row: str) -> dict[str, str]:
    """A table row's cells by their data-field (empty when the row is not there)."""
    return dict(drv.execute_script(_READ_ROW, row))


def _gpu(drv: Any, gpu: str) -> tuple[str, str]:
    """A GPU box's state and holder (empty strings when it is not there)."""
    state, holder = drv.execute_script(_READ_GPU, f'[data-gpu="{gpu}"]')
    return (state, holder)


def _page_shows(drv: Any, what: str, ok: Any) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.wait import WebDriverWait

    wait = WebDriverWait(
        drv,
        PAGE_WAIT_S,
        poll_frequency=0.5,
        ignored_exceptions=(StaleElementReferenceException,),
    )
    return wait.until(lambda d: ok(d), message=f"the dashboard never showed {what}")


def test_the_dashboard_shows_lending_the_slo_and_resizes(browser: Any, tmp_path: Path) -> None:
    state = tmp_path / "state"
    flags = ("--training-nodes", "1", "--inference-nodes", "1", "--gpus-per-node", "2")
    with local_cluster(state, *flags):
        cli(state, "serve", str(service_file(tmp_path, "echo", delay=0.05, max_replicas=1)))
        gate = tmp_path / "gate"  # never opened: the job runs until the cluster stops
        cli(state, "submit", str(gated_job(tmp_path, "trainer", gate, max_workers=4)))
        on_lent = wait_for(
            "trainer on a lent GPU",
            lambda: (
                (j := job(state, "trainer"))["lent_gpus"]
                and set(j["lent_gpus"]) <= set(j["workers"])
                and j
            ),
            600,
        )
        link = cli(state, "dashboard", "--no-open").stdout.splitlines()[0]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/dashboard/login\?code=[0-9a-f]{64}", link)
        base = link.split("/dashboard")[0]
        # As 'deepboot dashboard' opens it: a 0600 file: page in the state directory
        # that goes on to the link (cross-site: a file: origin is opaque); the login
        # route hops to /dashboard from its own origin, where the cookie then works.
        page = write_login_page(state, link)
        browser.get(page.as_uri())
        _page_shows(
            browser,
            "the dashboard after the login page",
            lambda d: (
                d.current_url == base + "/dashboard"  # the code left the address bar
                and d.execute_script("return document.querySelector('[data-gpu]') !== null")
            ),
        )

        # The job on its lent GPU (the page polls; the job may have grown since).
        _page_shows(
            browser,
            "trainer on a lent GPU",
            lambda d: any(_gpu(d, g) == ("lent", "trainer") for g in on_lent["lent_gpus"]),
        )
        _page_shows(
            browser,
            "trainer's workers",
            lambda d: (
                _cells(d, '[data-job="trainer"]').get("workers")
                == str(job(state, "trainer")["num_workers"])
            ),
        )
        resizes = int(_cells(browser, '[data-job="trainer"]')["resizes"])

        # Requests: a replica starts on a GPU taken back from the job, which shrinks.
        for i in range(3):
            code, answer = post(state, "echo", f"r{i}", {"x": [0.0]})
            assert code == 200, answer
        _page_shows(
            browser,
            "echo's replica",
            lambda d: any(
                _gpu(d, g)[1] == "echo" and _gpu(d, g)[0] in ("running", "protect", "sleep")
                for g in ("1.0", "1.1")
            ),
        )
        # All 3 answers, once the controller's next flush has counted them (it writes
        # the SLO counts to the store every few seconds: the page may first show 2).
        _page_shows(
            browser,
            "echo's SLO attainment over its 3 requests",
            lambda d: re.fullmatch(
                r"\d+\.\d% \([0-3]/3\)", _cells(d, '[data-service="echo"]').get("attainment", "")
            ),
        )

        def resized(d: Any) -> bool:
            doc = status_document(StateDir.at(state))
            (now,) = (j for j in doc["jobs"] if j["name"] == "trainer")
            row = _cells(d, '[data-job="trainer"]')
            return (
                now["restarts"] > resizes
                and row.get("workers") == str(now["num_workers"])
                and row.get("resizes") == str(now["restarts"])
            )

        _page_shows(browser, "trainer's new size after the reclaim", resized)
        _page_shows(
            browser,
            "the last hour's timeline",
            lambda d: d.execute_script(
                "const i = document.getElementById('timeline');"
                "return i.complete && i.naturalWidth > 0;"
            ),
        )
        keep = Path(os.environ.get("DEEPBOOT_SCREENSHOT_DIR", str(tmp_path)))
        keep.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(keep / "dashboard.png"))

        # Without the session cookie a data route is refused; with it, the login
        # link (spent) does not open another session.
        browser.delete_all_cookies()
        browser.get(base + "/dashboard/api/status")
        assert "log in with the one-time link" in browser.page_source
        browser.get(link)
        assert "spent or expired" in browser.page_source
        browser.get(base + "/dashboard/api/status")
        assert "log in with the one-time link" in browser.page_source
