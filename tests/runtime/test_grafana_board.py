"""The Grafana dashboard ``examples/grafana/deepboot.json``: a dashboard that Grafana's
"Import dashboard" takes (its data source an import input), whose panels do not overlap,
and whose every query names only metrics and labels that the controller's registry
exposes (:class:`deepboot.runtime.prometheus_metrics.Metrics`, built here without Ray).

The PromQL is read by a small scanner, not a full parser: metric names are the
``deepboot_...`` identifiers, labels those of ``{...}`` selectors, ``by``/``without``
(checked against the metrics of the aggregated argument), ``on``/``ignoring``/
``group_left``/``group_right`` (against every metric of the expression), legends'
``{{label}}`` (against the ``by`` labels) and the ``label_values`` of the template
variables. The self-tests at the end break a copy of the board and expect a complaint."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BOARD = Path(__file__).resolve().parents[2] / "examples" / "grafana" / "deepboot.json"
DS_INPUT = "DS_PROMETHEUS"
DS_REF = {"type": "prometheus", "uid": "${" + DS_INPUT + "}"}

METRIC = re.compile(r"(?<![A-Za-z0-9_:])deepboot_[a-z0-9_]+")
SELECTOR = re.compile(r"(deepboot_[a-z0-9_]+)?\s*\{([^}]*)\}")
MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*\"")
CLAUSE = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
LEGEND_LABEL = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
LABEL_VALUES = re.compile(r"label_values\(\s*(deepboot_[a-z0-9_]+)[^,]*,\s*([A-Za-z_]\w*)\s*\)")

Exposed = dict[str, set[str]]  # sample name -> its label names


def load_board() -> dict[str, Any]:
    board: dict[str, Any] = json.loads(BOARD.read_text())
    return board


def exposed_metrics() -> Exposed:
    """Every sample name the controller's registry exposes, with its label names: a
    :class:`Metrics` given a child of every labelled metric through the calls the
    controller makes (a labelled family shows no sample before its first child)."""
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from deepboot.core.cluster import Pool
    from deepboot.core.gpu import GpuState
    from deepboot.runtime.prometheus_metrics import Metrics
    from deepboot.runtime.slotally import ServiceSlo
    from deepboot.runtime.store.jobstore import LogKind

    m = Metrics()
    m.set_world(
        [(pool, state, "job-a", "svc-a") for pool in Pool for state in GpuState],
        ["running", "queued"],
        {"svc-a": ServiceSlo(3.0, 0.95)},
    )
    m.count(LogKind.GPU, {"op": "lend"})
    m.count(LogKind.GPU, {"op": "reclaim", "proactive": True})
    m.count(LogKind.RESIZED, {"how": "afe"})
    m.count(LogKind.REPLICA, {"op": "ready", "service": "svc-a"})
    m.count(LogKind.REPLICA, {"op": "ready", "service": "svc-a", "start": "host"})
    m.pending.labels("svc-a").set(1)
    m.requests.labels("svc-a", "200").inc()
    m.latency.labels("svc-a").observe(0.1)
    m.wait.labels("svc-a").observe(0.01)
    m.within_slo.labels("svc-a").inc()
    m.over_slo.labels("svc-a").inc()
    m.prewarmed.labels("svc-a").inc()

    exposed: Exposed = {}
    for family in text_string_to_metric_families(m.exposition().decode()):
        # A family with no sample would hide its names and labels from the check below.
        assert family.samples, f"{family.name}: no sample; give it a child above"
        for sample in family.samples:
            exposed.setdefault(sample.name, set()).update(sample.labels)
    # Every family of the registry, labelled ones included, is in the exposition.
    families = {f.name for f in m.registry.collect()}
    assert families <= {_family(name) for name in exposed}
    return exposed


def _family(sample: str) -> str:
    for suffix in ("_total", "_created", "_bucket", "_count", "_sum"):
        if sample.endswith(suffix):
            return sample.removesuffix(suffix)
    return sample


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those nested in collapsed rows too."""
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _skip_string(expr: str, i: int) -> int:
    """The index just past the quoted string that starts at ``expr[i]``."""
    quote, i = expr[i], i + 1
    while expr[i] != quote:
        i += 2 if expr[i] == "\\" else 1
    return i + 1


def _group_after(expr: str, start: int) -> str:
    """The parenthesised group that opens at ``expr[start]`` (quotes skipped)."""
    assert expr[start] == "(", expr[start:]
    depth, i = 0, start
    while True:
        if expr[i] in "\"'`":
            i = _skip_string(expr, i)
            continue
        depth += {"(": 1, ")": -1}.get(expr[i], 0)
        i += 1
        if depth == 0:
            return expr[start:i]


def _group_before(expr: str, end: int) -> str:
    """The parenthesised group that closes at ``expr[end]`` (``sum(x) by (l)``)."""
    assert expr[end] == ")", expr[: end + 1]
    for start in range(end, -1, -1):
        if expr[start] == "(" and _group_after(expr, start) == expr[start : end + 1]:
            return expr[start : end + 1]
    raise AssertionError(f"unbalanced: {expr[: end + 1]}")


def _labels(text: str) -> list[str]:
    return [label.strip() for label in text.split(",") if label.strip()]


def expr_problems(expr: str, exposed: Exposed) -> tuple[list[str], set[str]]:
    """What in ``expr`` the registry does not expose, and the labels of its ``by``
    clauses (what a legend may name)."""
    problems: list[str] = []
    by_labels: set[str] = set()
    metrics = METRIC.findall(expr)
    if not metrics:
        problems.append(f"names no deepboot metric: {expr!r}")
    for name in metrics:
        if name not in exposed:
            problems.append(f"{name}: not exposed by the controller ({expr!r})")
    for m in SELECTOR.finditer(expr):
        name, body = m.group(1), m.group(2)
        if name is None:
            problems.append(f"a selector without a metric name: {m.group(0)!r}")
            continue
        for label, _ in MATCHER.findall(body):
            if name in exposed and label not in exposed[name]:
                problems.append(f"{name} has no label {label!r} ({expr!r})")
    for m in CLAUSE.finditer(expr):
        keyword, labels = m.group(1), _labels(m.group(2))
        if keyword in ("by", "without"):
            after = m.end()
            while after < len(expr) and expr[after].isspace():
                after += 1
            if after < len(expr) and expr[after] == "(":
                argument = _group_after(expr, after)  # sum by (l) (x)
            else:
                before = m.start() - 1
                while before >= 0 and expr[before].isspace():
                    before -= 1
                argument = _group_before(expr, before)  # sum(x) by (l)
            scope = METRIC.findall(argument)
            if keyword == "by":
                by_labels.update(labels)
        else:
            scope = metrics
        for name in scope:
            for label in labels:
                if name in exposed and label not in exposed[name]:
                    problems.append(f"{name} has no label {label!r}: {keyword} ({expr!r})")
    return problems, by_labels


def board_problems(board: dict[str, Any], exposed: Exposed) -> list[str]:
    """Every query of the board checked against the registry's names and labels."""
    problems: list[str] = []
    for panel in panels(board):
        for target in panel.get("targets", []):
            found, by_labels = expr_problems(target["expr"], exposed)
            problems += [f"panel {panel['title']!r}: {p}" for p in found]
            for label in LEGEND_LABEL.findall(target.get("legendFormat", "")):
                if label not in by_labels:
                    problems.append(
                        f"panel {panel['title']!r}: legend names {label!r}, which its "
                        f"query does not keep ({target['expr']!r})"
                    )
    for var in board["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = LABEL_VALUES.fullmatch(query.strip())
        if m is None:
            problems.append(f"variable {var['name']!r}: not a label_values() query")
            continue
        name, label = m.groups()
        if name not in exposed:
            problems.append(f"variable {var['name']!r}: {name} not exposed")
        elif label not in exposed[name]:
            problems.append(f"variable {var['name']!r}: {name} has no label {label!r}")
    return problems


# -- the dashboard's shape ---------------------------------------------------------------


def test_the_board_is_an_importable_dashboard() -> None:
    board = load_board()
    assert board["title"] and isinstance(board["title"], str)
    assert isinstance(board["uid"], str) and 0 < len(board["uid"]) <= 40  # Grafana's limit
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    assert board.get("id") is None  # an import makes a new dashboard
    inputs = {i["name"]: i for i in board["__inputs"]}
    assert inputs[DS_INPUT]["type"] == "datasource"
    assert inputs[DS_INPUT]["pluginId"] == "prometheus"
    assert board["panels"]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            assert var["datasource"] == DS_REF
    assert "service" in {v["name"] for v in board["templating"]["list"]}


def test_every_panel_queries_the_input_data_source() -> None:
    for panel in panels(load_board()):
        assert panel["type"] and panel["title"], panel
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DS_REF, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target["datasource"] == DS_REF, panel["title"]


def test_panel_ids_are_unique_and_panels_do_not_overlap() -> None:
    board = load_board()
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))
    boxes = []
    for panel in board["panels"]:  # the top level: a collapsed row's panels are hidden
        g = panel["gridPos"]
        assert all(isinstance(g[k], int) for k in "xywh"), panel["title"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["y"] >= 0, panel["title"]
        assert g["x"] + g["w"] <= 24, panel["title"]  # Grafana's grid is 24 wide
        boxes.append((panel["title"], g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"]))
    for i, (a, ax0, ay0, ax1, ay1) in enumerate(boxes):
        for b, bx0, by0, bx1, by1 in boxes[i + 1 :]:
            overlap = ax0 < bx1 and bx0 < ax1 and ay0 < by1 and by0 < ay1
            assert not overlap, f"{a!r} overlaps {b!r}"


# -- the queries against the registry ----------------------------------------------------


@pytest.fixture(scope="module")
def exposed() -> Exposed:
    return exposed_metrics()


def test_the_registry_exposes_the_documented_names(exposed: Exposed) -> None:
    # The names the dashboard relies on, as the exposition spells them.
    for name in (
        "deepboot_gpus",
        "deepboot_gpus_lent_total",
        "deepboot_gpus_reclaimed_ahead_total",
        "deepboot_job_resizes_total",
        "deepboot_requests_within_slo_total",
        "deepboot_inference_request_wait_seconds_bucket",
    ):
        assert name in exposed
    assert exposed["deepboot_inference_request_wait_seconds_bucket"] == {"service", "le"}
    assert exposed["deepboot_gpus"] == {"pool", "state"}


def test_every_query_names_exposed_metrics_and_labels(exposed: Exposed) -> None:
    assert board_problems(load_board(), exposed) == []


def test_the_board_covers_the_controllers_metrics(exposed: Exposed) -> None:
    named: set[str] = set()
    for panel in panels(load_board()):
        for target in panel.get("targets", []):
            named.update(_family(n) for n in METRIC.findall(target["expr"]))
    assert {_family(n) for n in exposed} <= named


# -- the checker catches what it should --------------------------------------------------


def _broken(edit: tuple[str, str]) -> dict[str, Any]:
    """A copy of the board with the first query that contains ``edit[0]`` changed."""
    board = copy.deepcopy(load_board())
    old, new = edit
    for panel in panels(board):
        for target in panel.get("targets", []):
            if old in target["expr"]:
                target["expr"] = target["expr"].replace(old, new, 1)
                return board
    raise AssertionError(f"no query has {old!r}")


@pytest.mark.parametrize(
    "edit",
    [
        ("deepboot_gpus_lent_total", "deepboot_gpu_lent_total"),  # a misspelled metric
        ("deepboot_job_resizes_total", "deepboot_job_resizes"),  # a counter without _total
        (
            "deepboot_inference_request_wait_seconds_bucket",
            "deepboot_inference_request_wait_seconds",
        ),
        ('{service=~"$service"}', '{svc=~"$service"}'),  # a label it does not have
        ("sum by (pool, state)", "sum by (pool, status)"),  # a by() label it does not have
        ("sum by (service, le)", "sum by (service, bucket)"),
        ("sum by (kind)", "sum by (how)"),
    ],
)
def test_the_check_catches_a_broken_query(exposed: Exposed, edit: tuple[str, str]) -> None:
    assert board_problems(_broken(edit), exposed)


def test_the_check_catches_a_legend_of_a_dropped_label(exposed: Exposed) -> None:
    board = _broken(("sum by (pool, state)", "sum by (pool)"))  # {{state}} in its legend
    assert any("legend" in p for p in board_problems(board, exposed))


def test_the_check_reads_both_forms_of_by() -> None:
    exposed = {"deepboot_x_total": {"a"}}
    assert expr_problems("sum(rate(deepboot_x_total[5m])) by (a)", exposed) == ([], {"a"})
    assert expr_problems("sum by (a) (rate(deepboot_x_total[5m]))", exposed) == ([], {"a"})
    assert expr_problems("sum(rate(deepboot_x_total[5m])) by (b)", exposed)[0]
    assert expr_problems('deepboot_x_total{a="(", b="x"}', exposed)[0]
