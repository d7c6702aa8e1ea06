"""The shipped catalog: loads without traces, is compact, and stands in for the profiles."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from deepboot.core.errors import InputError
from deepboot.perf.catalog import CatalogApplication, load_catalog, write_catalog
from deepboot.perf.profiles import APP_SETTINGS, ProfiledApplication, load_profiles
from deepboot.perf.validate import BatchRule, completion_time

from .builders import PROFILES, write_profile

needs_traces = pytest.mark.skipif(not PROFILES.is_dir(), reason="reference traces not present")
CATALOG_FILE = Path(__file__).resolve().parents[2] / "deepboot" / "perf" / "catalog.json"
SHAPES = [(1,), (4,), (4, 4), (4, 4, 4, 4)]


@pytest.fixture(scope="module")
def catalog() -> dict[str, CatalogApplication]:
    return load_catalog()


def test_shipped_catalog_is_compact_and_complete(catalog: dict[str, CatalogApplication]) -> None:
    assert CATALOG_FILE.stat().st_size < 50_000
    assert sorted(catalog) == sorted(APP_SETTINGS)
    for name, app in catalog.items():
        settings = APP_SETTINGS[name]
        assert app.name == name
        assert app.max_epochs == settings.max_epochs
        if settings.max_local_bsz is not None:
            assert app.limits.max_local_bsz == settings.max_local_bsz


@pytest.mark.parametrize("model", sorted(APP_SETTINGS))
def test_catalog_answers_like_an_application(
    catalog: dict[str, CatalogApplication], model: str
) -> None:
    app = catalog[model]
    lim = app.limits
    for shape in [*SHAPES, (2, 1), (4,) * 5, (4,) * 20]:
        for bsz in (lim.min_local_bsz, lim.max_local_bsz):
            step, sync = app.step_time(shape, bsz)
            assert 0.0 <= sync < step
            if sum(shape) == 1:
                assert sync == 0.0
    # Bigger per-GPU batches take longer.
    assert app.step_time((4,), lim.max_local_bsz)[0] > app.step_time((4,), lim.min_local_bsz)[0]
    progress = [app.progress_at(e) for e in range(app.max_epochs + 2)]
    assert progress[0] == 0.0
    assert all(b > a for a, b in zip(progress, progress[1:], strict=False))
    for epoch in (0, app.max_epochs // 2, app.max_epochs - 1):
        for batch in (lim.init_batch_size, lim.max_batch_size, 3 * lim.init_batch_size):
            sqr, var = app.grad_stats(batch, epoch)
            assert sqr > 0 and var > 0


def test_catalog_round_trips_through_fit_and_write(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    write_profile(profiles)
    out = write_catalog(profiles, tmp_path / "catalog.json")
    toy = load_catalog(out)["toy"]
    truth = ProfiledApplication.from_dir(profiles / "toy")
    assert toy.limits == truth.limits
    assert toy.max_epochs == truth.max_epochs
    # One GPU: the measured compute time is exactly linear (0.5 at 4, 0.9 at 8).
    assert toy.step_time((1,), 6)[0] == pytest.approx(0.7, rel=1e-3)
    for epoch in range(truth.max_epochs + 1):
        assert toy.progress_at(epoch) == pytest.approx(truth.progress_at(epoch), rel=1e-5)
    # Exact up to the 6 significant digits the JSON keeps.
    for batch, epoch in [(8, 0), (16, 1), (12, 0)]:
        assert toy.grad_stats(batch, epoch) == pytest.approx(
            truth.grad_stats(batch, epoch), rel=1e-5
        )


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ("{not json", 1, ""),
        ('{"version": 99, "models": {}}', 0, "version"),
        ('{"version": 1, "models": {}}', 0, "models"),
        ('{"version": 1, "models": {"x": {"limits": {}}}}', 0, "x"),
    ],
    ids=["not-json", "version", "no-models", "missing-fields"],
)
def test_malformed_catalog_is_an_input_error(
    tmp_path: Path, text: str, line: int, field: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_catalog(path)
    assert (info.value.path, info.value.line, info.value.field) == (str(path), line, field)


def test_missing_catalog_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        load_catalog(tmp_path / "absent.json")
    assert info.value.path.endswith("absent.json")


def test_inconsistent_arrays_are_an_input_error() -> None:
    doc = json.loads(CATALOG_FILE.read_text())
    entry = doc["models"]["cifar10"]
    entry["grad"]["log10_sqr"] = entry["grad"]["log10_sqr"][:-1]
    with pytest.raises(InputError) as info:
        CatalogApplication("cifar10", entry, "x.json")
    assert (info.value.path, info.value.field) == ("x.json", "cifar10")


@pytest.fixture(scope="module")
def completion_ratios(catalog: dict[str, CatalogApplication]) -> dict[str, list[float]]:
    """Model -> catalog / profile time-to-completion over SHAPES x BatchRule."""
    out: dict[str, list[float]] = {}
    for model in sorted(APP_SETTINGS):
        truth = ProfiledApplication.from_dir(PROFILES / model)
        out[model] = [
            completion_time(catalog[model], shape, rule) / completion_time(truth, shape, rule)
            for shape in SHAPES
            for rule in BatchRule
        ]
    return out


@needs_traces
def test_catalog_time_to_completion_is_close_to_the_profiles(
    completion_ratios: dict[str, list[float]],
) -> None:
    errors = {m: [abs(r - 1.0) for r in rs] for m, rs in completion_ratios.items()}
    everything = [e for es in errors.values() for e in es]
    # A smooth fit cannot follow the noise of single measured rows (docs/perf.md has
    # the table): typically within 5%, per model within ~12%, never off by 30%.
    assert statistics.median(everything) < 0.05, completion_ratios
    for model, es in errors.items():
        assert statistics.median(es) < 0.125, (model, completion_ratios[model])
        assert max(es) < 0.30, (model, completion_ratios[model])


@pytest.mark.slow
@needs_traces
def test_shipped_catalog_is_what_fit_catalog_produces(tmp_path: Path) -> None:
    out = write_catalog(PROFILES, tmp_path / "catalog.json")
    fresh = json.loads(out.read_text())
    shipped = json.loads(CATALOG_FILE.read_text())
    # Exactly: the fit gives the same bits on every machine (docs/perf.md), so a
    # difference means the catalog is stale (regenerate it, CONTRIBUTING.md).
    assert fresh == shipped
    assert sorted(fresh["models"]) == sorted(load_profiles(PROFILES))


def test_batch_rule_is_exhaustive() -> None:
    assert {r.value for r in BatchRule} == {"initial", "oracle"}
