"""The services file (deepboot.core.servicefile): the one format in which the
simulator, the API and the runtime read services, and the loaders write them."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepboot.core.errors import InputError
from deepboot.core.service import ServiceSpec
from deepboot.core.servicefile import dump_services, load_services

GOOD = """\
# a comment
[[service]]
name = "M0002"
model = "sd-xl"
cold_start_s = 22.7
concurrency = 2

[[service]]   # the second
name = "chat"
model = "llama"
max_replicas = 4
slo_wait_s = 45.0
slo_target = 0.95
guaranteed_replicas = 2
[service.args]
hidden = 64
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "services.toml"
    path.write_text(text)
    return path


def test_a_services_file_reads_into_specs(tmp_path: Path) -> None:
    a, b = load_services(_write(tmp_path, GOOD))
    assert a == ServiceSpec("M0002", "sd-xl", cold_start_s=22.7, concurrency=2)
    assert b == ServiceSpec(
        "chat",
        "llama",
        max_replicas=4,
        args={"hidden": 64},
        slo_wait_s=45.0,
        slo_target=0.95,
        guaranteed_replicas=2,
    )
    assert (a.slo_wait_s, a.slo_target, a.guaranteed_replicas) == (1.0, 0.99, 0)  # defaults


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        ("[[service]]\nname = 'a'\n", 1, "model", "missing"),
        ("[[service]]\nname = 'a'\nmodel = 'm'\n\n[[service]]\nname='a'\nmodel='m'\n", 5, "name",
         "already"),
        ("[[service]]\nname = 'a'\nmodel = 'm'\ncolour = 1\n", 1, "colour", "unknown key"),
        ("[[service]]\nname = 'a'\nmodel = 'm'\n[[service]]\nname = 'b'\nmodel = 'm'\n"
         "concurrency = 0\n", 4, "concurrency", "[1, 1024]"),
        ("[[service]]\nname = 'a\\n'\nmodel = 'm'\n", 1, "name", "letters"),
        ("[[service]]\nname = 'a'\nmodel = 'm'\ncold_start_s = nan\n", 1, "cold_start_s",
         "finite"),
        ("[[service]]\nname = 'a'\nmodel = 'm'\ncold_start_s = -1\n", 1, "cold_start_s",
         "[0, 86400]"),
        ("[[service]]\nname = 'a'\nmodel = 'm'\nslo_target = 1.0\n", 1, "slo_target",
         "(0, 1)"),
        ("[[service]]\nname = 'a'\nmodel = 'm'\nslo_wait_s = 0\n", 1, "slo_wait_s",
         "(0, 86400]"),
        ("[[service]]\nname = 'a'\nmodel = 'm'\nmax_replicas = 2\nguaranteed_replicas = 3\n",
         1, "guaranteed_replicas", "more than max_replicas"),
        ("name = 'a'\n", 0, "name", "unknown top-level key"),
        ("", 0, "service", "no [[service]]"),
        ("[[service]\n", 1, "", "not valid TOML"),
    ],
    ids=["missing", "duplicate", "unknown", "range", "newline", "nan", "negative", "target",
         "wait", "guaranteed", "flat", "empty", "syntax"],
)  # fmt: skip
def test_every_error_names_the_file_line_and_key(
    tmp_path: Path, text: str, line: int, field: str, words: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(InputError) as exc:
        load_services(path)
    assert (exc.value.path, exc.value.line, exc.value.field) == (str(path), line, field)
    assert words in exc.value.message


def test_an_unreadable_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read the services file"):
        load_services(tmp_path / "nope.toml")


_names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True)
_specs = st.integers(0, 4096).flatmap(
    lambda cap: st.builds(
        ServiceSpec,
        name=_names,
        model=st.text(min_size=1, max_size=12).filter(lambda s: all(ord(c) >= 32 for c in s)),
        concurrency=st.integers(1, 1024),
        max_replicas=st.just(cap),
        cold_start_s=st.none() | st.floats(0, 86_400, allow_nan=False),
        request_timeout_s=st.floats(0.001, 86_400),
        slo_wait_s=st.floats(0.001, 86_400),
        slo_target=st.floats(0.001, 0.999),
        guaranteed_replicas=st.integers(0, min(cap, 16) if cap else 16),
    )
)


@settings(max_examples=60, derandomize=True)
@given(st.lists(_specs, min_size=1, max_size=5, unique_by=lambda s: s.name))
def test_dump_then_load_gives_the_same_specs(specs: list[ServiceSpec]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "s.toml"
        path.write_text(dump_services(specs, ["written by a test", "CC-BY-4.0"]))
        assert list(load_services(path)) == specs
        assert path.read_text().startswith("# written by a test\n# CC-BY-4.0\n")
