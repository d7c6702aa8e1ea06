"""Policies as plug-ins: the example package under examples/plugin, installed by
``make test``, works everywhere a policy name does; a broken plug-in is named."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

import pytest

from deepboot.cli.main import main
from deepboot.core import ConfigError
from deepboot.policies import registry
from deepboot.policies.registry import PLUGIN_GROUP, PolicyRegistry, load_plugins

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = "smallest-first"


def installed() -> bool:
    return any(ep.name == EXAMPLE for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP))


pytestmark = pytest.mark.skipif(
    not installed() and not (REPO / "examples" / "plugin").is_dir(),
    reason="no example plug-in in this checkout",
)


def test_the_example_plugin_is_installed() -> None:
    assert installed(), "run `make test`: it installs examples/plugin (pip install -e)"
    assert EXAMPLE in registry.names()


def test_it_appears_in_deepboot_policies(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policies"]) == 0
    assert EXAMPLE in capsys.readouterr().out


def test_simulate_and_compare_run_it(tmp_path: Path) -> None:
    workload = str(REPO / "examples" / "demo-24.csv")
    out = tmp_path / "s.json"
    argv = ["simulate", "--workload", workload, "--policy", EXAMPLE, "--cluster", "4x4"]
    assert main([*argv, "--param", "packing=most_free", "--quiet", "--summary-json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["policy"] == EXAMPLE
    assert summary["training"]["completed"] == summary["training"]["jobs"] == 24
    code = main(
        ["compare", "--workload", workload, "--cluster", "4x4", "--inference-nodes", "0",
         "--run", EXAMPLE, "--run", "fifo", "--out", str(tmp_path / "cmp"), "--no-figures",
         "--quiet"]
    )  # fmt: skip
    assert code == 0


def test_a_bad_parameter_of_the_plugin_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="packing"):
        registry.create(EXAMPLE, packing="diagonal")


def test_a_broken_plugin_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A real distribution on sys.path whose entry point cannot be imported.
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{PLUGIN_GROUP}]\nbroken = no_such_module:register\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    fresh: PolicyRegistry[object] = PolicyRegistry()
    monkeypatch.setattr(registry, "DEFAULT_REGISTRY", fresh)
    with pytest.raises(ConfigError, match=r"plug-in 'broken' \(no_such_module:register\) failed"):
        load_plugins()
    assert str(tmp_path) in sys.path
