"""Where a run's models come from: measured profiles, or the built-in catalog."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from deepboot.perf.application import Application


def load_apps(profiles: str | Path | None = None) -> Mapping[str, Application]:
    """The models a run can use: measured profiles from ``profiles`` (a folder of
    ``<model>/`` profiles), else the built-in catalog. Both are loaded on demand: the
    catalog is a package resource, the profiles a few CSV files per model.

    Raises:
        InputError: the profile directory is missing or malformed.
    """
    if profiles is not None:
        from deepboot.perf.profiles import load_profiles

        return load_profiles(profiles)
    from deepboot.perf.catalog import load_catalog

    return load_catalog()
