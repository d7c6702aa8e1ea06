"""Throughput per GPU type: measured profiles of one model on several GPU types.

A typed profile folder ``<root>/<model>/`` holds ``placements-<type>.csv`` and
``scalability-<type>.csv`` per GPU type (the layout of Sia's artifact, SOSP'23, in
``shared/traces/hetero/profiles/``). Their columns are those of the untyped files in
any order (Sia's files order them differently), checked by name. A GPU type changes
step times only: gradient statistics and progress per epoch are properties of the
model and its batch, so a typed application borrows its validation traces from the
model's untyped profile (``--profiles``), whose own placements describe the *base*
type (the reference profiles were measured on T4s: :data:`BASE_GPU_TYPE`).

Sia's artifact names its types after the machines: ``aws`` (4 x T4) and ``dgx-ext``
(8 x A100-40GB). :data:`FILE_ALIASES` reads those files for the types ``t4`` and
``a100``; any other type's files carry its own name (``placements-rtx.csv``).

Per-GPU batch limits on a typed profile come from its own measurements (a larger
GPU fits a larger micro-batch), except a limit the model's settings fix below what
was measured; the total batch limits and epochs are the model's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

from deepboot.core.errors import ConfigError, InputError
from deepboot.perf.application import Application
from deepboot.perf.profiles import (
    APP_SETTINGS,
    AppSettings,
    ProfiledApplication,
    ProfileData,
    read_measurements,
)

BASE_GPU_TYPE = "t4"
"""The GPU type the untyped reference profiles (``placements.csv``) were measured on."""

FILE_ALIASES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"t4": ("t4", "aws"), "a100": ("a100", "dgx-ext")}
)
"""GPU type -> the file suffixes its profiles may carry, tried in order (Sia's names)."""

TypedApps = Mapping[str, Mapping[str, Application]]
"""GPU type -> model name -> the model's ground truth on that type."""


def _typed_file(folder: Path, stem: str, gpu_type: str) -> Path | None:
    for suffix in FILE_ALIASES.get(gpu_type, (gpu_type,)):
        path = folder / f"{stem}-{suffix}.csv"
        if path.is_file():
            return path
    return None


def read_typed_profile(folder: Path, gpu_type: str, base: ProfileData) -> ProfileData | None:
    """``folder``'s measurements on ``gpu_type`` with ``base``'s validation traces;
    None when the folder has no placements file for the type.

    Raises:
        InputError: a file is malformed (naming file, line and column), the
            scalability file is missing beside the placements file, or the points
            lie in one plane (:func:`~deepboot.perf.profiles.read_measurements`).
    """
    placements_file = _typed_file(folder, "placements", gpu_type)
    if placements_file is None:
        return None
    scalability_file = _typed_file(folder, "scalability", gpu_type)
    if scalability_file is None:
        raise InputError(
            str(folder), 0, "", f"{placements_file.name} needs a scalability file beside it"
        )
    placements, scalability = read_measurements(placements_file, scalability_file, True)
    return ProfileData(base.name, placements, scalability, base.validation, str(folder))


def _typed_settings(name: str, data: ProfileData) -> AppSettings:
    """The model's settings, with per-GPU batch limits from the typed measurements
    unless the settings fix one below them (see the module doc)."""
    settings = APP_SETTINGS.get(name, AppSettings())
    local = [p[1] for p in data.placements]
    return dataclasses.replace(
        settings,
        min_local_bsz=max(settings.min_local_bsz or 0, min(local)),
        max_local_bsz=max(local),
    )


def load_typed_profiles(
    root: str | Path,
    gpu_types: Iterable[str],
    base: Mapping[str, ProfiledApplication],
    base_type: str = BASE_GPU_TYPE,
) -> dict[str, dict[str, Application]]:
    """Every model of ``base`` on every type of ``gpu_types``: ``base`` itself for
    ``base_type``, else the typed files under ``root/<model>/``.

    A (type, model) pair with no file is left out; :func:`require_types` says which
    a cluster lacks.

    Raises:
        InputError: ``root`` is missing, or a typed file is malformed.
    """
    folder = Path(root)
    if not folder.is_dir():
        raise InputError(str(folder), 0, "", "typed profiles folder not found")
    out: dict[str, dict[str, Application]] = {}
    for gpu_type in dict.fromkeys(gpu_types):
        models: dict[str, Application] = {}
        for name, app in sorted(base.items()):
            if gpu_type == base_type:
                models[name] = app
                continue
            data = read_typed_profile(folder / name, gpu_type, app.data)
            if data is not None:
                models[name] = ProfiledApplication(data, _typed_settings(name, data))
        out[gpu_type] = models
    return out


def require_types(typed: TypedApps, gpu_types: Iterable[str], models: Iterable[str]) -> None:
    """Check that every model of ``models`` has a ground truth on every type.

    Raises:
        ConfigError: naming each missing (type, model) pair.
    """
    missing = [
        f"{name} on {gpu_type}"
        for gpu_type in dict.fromkeys(gpu_types)
        for name in sorted(set(models))
        if name not in typed.get(gpu_type, {})
    ]
    if missing:
        raise ConfigError(
            "no throughput profile for " + ", ".join(missing) + ": give --gpu-profiles a "
            "folder with <model>/placements-<type>.csv and scalability-<type>.csv"
        )


def apps_for_cluster(
    gpu_types: tuple[str, ...],
    apps: Mapping[str, Application],
    gpu_profiles: str | Path | None,
    base_type: str = BASE_GPU_TYPE,
) -> tuple[Mapping[str, Application], dict[str, dict[str, Application]] | None]:
    """The ground truth a run on a cluster of ``gpu_types`` uses: ``(apps, typed)``.

    Untyped or all ``base_type``: ``apps`` as given, no typed apps (so ``t4:16x4`` runs
    exactly as ``16x4``). One other type: that type's profiles in place of ``apps``.
    Several types: ``apps`` (for workload checks) and the typed apps of every type.

    Raises:
        ConfigError: a type other than the base needs ``gpu_profiles`` and measured
            ``apps`` (``--profiles``: their validation traces) and lacks them, or a
            model lacks a profile on one of the types.
        InputError: a typed profile file is malformed.
    """
    if all(t == base_type for t in gpu_types):
        return apps, None
    if gpu_profiles is None or not all(isinstance(a, ProfiledApplication) for a in apps.values()):
        raise ConfigError(
            f"a cluster of GPU types {', '.join(gpu_types)} needs --profiles DIR (the "
            f"{base_type} profiles, whose validation traces every type shares) and "
            "--gpu-profiles DIR (<model>/placements-<type>.csv and scalability-<type>.csv)"
        )
    base = {n: a for n, a in apps.items() if isinstance(a, ProfiledApplication)}
    typed = load_typed_profiles(gpu_profiles, gpu_types, base, base_type)
    require_types(typed, gpu_types, base)
    if len(gpu_types) == 1:
        return typed[gpu_types[0]], None
    return apps, typed
