"""The browser tests' marker (pytest.ini's markers live in pyproject.toml)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "browser: the dashboard in headless Chromium (selenium); make test-browser",
    )
