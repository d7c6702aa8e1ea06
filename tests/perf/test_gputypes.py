"""Throughput per GPU type (deepboot.perf.gputypes): typed profile files read by
column name, the validation traces borrowed from the base profile, the rules for
which ground truth a cluster of given types runs on."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepboot.core.errors import ConfigError, InputError
from deepboot.perf.gputypes import (
    apps_for_cluster,
    load_typed_profiles,
    require_types,
)
from deepboot.perf.profiles import ProfiledApplication, load_profiles
from tests.perf.builders import write_typed_profiles

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


def test_typed_files_in_another_column_order_give_the_types_step_times(tmp_path: Path) -> None:
    base_dir, typed_dir = write_typed_profiles(tmp_path)
    base = load_profiles(base_dir)
    typed = load_typed_profiles(typed_dir, ["t4", "fast", "a100"], base)
    assert typed["t4"]["toy"] is base["toy"]
    for gpu_type, speedup in (("fast", 2.0), ("a100", 4.0)):  # a100 reads dgx-ext files
        app = typed[gpu_type]["toy"]
        for shape, bsz in (((1,), 4), ((2,), 8), ((1, 1), 6), ((1, 1, 1), 4)):
            step, sync = app.step_time(shape, bsz)
            base_step, base_sync = base["toy"].step_time(shape, bsz)
            assert step == pytest.approx(base_step / speedup)
            assert sync == pytest.approx(base_sync / speedup)
        # Gradient statistics and progress are the model's, whatever the type.
        assert app.grad_stats(12, 1) == base["toy"].grad_stats(12, 1)
        assert app.progress_at(2) == base["toy"].progress_at(2)
        assert app.limits == base["toy"].limits


def test_a_bad_typed_file_names_its_file_line_and_column(tmp_path: Path) -> None:
    base_dir, typed_dir = write_typed_profiles(tmp_path)
    bad = typed_dir / "toy" / "placements-fast.csv"
    lines = bad.read_text().splitlines()
    lines[2] = lines[2].replace(lines[2].split(",")[1], "-1", 1)
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as info:
        load_typed_profiles(typed_dir, ["fast"], load_profiles(base_dir))
    assert "placements-fast.csv:3" in str(info.value) and "step_time" in str(info.value)


def test_a_typed_header_must_still_name_every_column(tmp_path: Path) -> None:
    base_dir, typed_dir = write_typed_profiles(tmp_path)
    (typed_dir / "toy" / "scalability-fast.csv").write_text("local_bsz,step_time\n4,1.0\n")
    with pytest.raises(InputError, match="in any order"):
        load_typed_profiles(typed_dir, ["fast"], load_profiles(base_dir))


def test_a_missing_type_is_named_with_its_model(tmp_path: Path) -> None:
    base_dir, typed_dir = write_typed_profiles(tmp_path)
    typed = load_typed_profiles(typed_dir, ["fast", "h100"], load_profiles(base_dir))
    assert typed["h100"] == {}
    with pytest.raises(ConfigError, match="no throughput profile for toy on h100"):
        require_types(typed, ["fast", "h100"], ["toy"])


def test_which_ground_truth_a_cluster_runs_on(tmp_path: Path) -> None:
    base_dir, typed_dir = write_typed_profiles(tmp_path)
    base = load_profiles(base_dir)
    for untyped_or_base in ((), ("t4",)):
        assert apps_for_cluster(untyped_or_base, base, None) == (base, None)
    one, none = apps_for_cluster(("fast",), base, typed_dir)
    assert none is None and one["toy"].step_time((1,), 4)[0] == pytest.approx(0.25)
    apps, typed = apps_for_cluster(("t4", "fast"), base, typed_dir)
    assert apps is base and typed is not None and set(typed) == {"t4", "fast"}
    with pytest.raises(ConfigError, match="needs --profiles DIR"):
        apps_for_cluster(("t4", "fast"), base, None)


@pytest.mark.skipif(not (TRACES / "hetero").is_dir(), reason="../shared/traces is absent")
def test_sias_profiles_load_for_every_model_and_type() -> None:
    base = load_profiles(TRACES / "profiles")
    typed = load_typed_profiles(TRACES / "hetero" / "profiles", ["t4", "rtx", "a100"], base)
    require_types(typed, ["t4", "rtx", "a100"], base)
    # The README's one-GPU peak ratios (A100 vs T4): bert 10.8x, ncf 2.0x.
    for name, ratio in (("bert", 10.8), ("cifar10", 6.9), ("ncf", 2.0)):
        peaks = {}
        for gpu_type in ("t4", "a100"):
            app = typed[gpu_type][name]
            assert isinstance(app, ProfiledApplication)
            peaks[gpu_type] = max(
                bsz / step for digits, bsz, step, _ in app.data.placements if digits == "1"
            )
        assert peaks["a100"] / peaks["t4"] == pytest.approx(ratio, rel=0.06)
