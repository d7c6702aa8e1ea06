"""The HTML report: self-contained, escaped, with the table and the figures."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser

from deepboot.report.html import FigureImage, ReportPage, matrix_html, render_report
from deepboot.report.table import MATRIX_HEADERS, MatrixRow

from .builders import make_rows, make_summary

FAKE_PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))


class _Collector(HTMLParser):
    """Collects tags and attributes, and checks that every opened tag is closed."""

    VOID = {"meta", "img", "br", "hr", "link", "input"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.attrs: list[tuple[str, dict[str, str | None]]] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.attrs.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unexpected </{tag}> with open {self.stack}")
        else:
            self.stack.pop()


def parse(html: str) -> _Collector:
    c = _Collector()
    c.feed(html)
    c.close()
    return c


def make_page(**overrides: object) -> ReportPage:
    fields: dict[str, object] = {
        "title": "deepboot compare: small, middle",
        "command": "deepboot compare --workload small.csv --run deepboot=deepboot --out o",
        "settings": {"cluster": "16x4", "seed": "0"},
        "rows": make_rows(),
        "runs": {"deepboot": "deepboot=deepboot", "pollux-only": "pollux:no-lending"},
        "figures": [FigureImage("JCT CDF", FAKE_PNG, "how to read it", anchor="jct-cdf")],
    }
    fields.update(overrides)
    return ReportPage(**fields)  # type: ignore[arg-type]


def test_report_is_well_formed_and_self_contained() -> None:
    html = render_report(make_page())
    doc = parse(html)
    assert doc.errors == [] and doc.stack == []
    for tag, attrs in doc.attrs:
        for name in ("src", "href"):
            value = attrs.get(name) or ""
            # Only in-page anchors and embedded data: nothing is fetched.
            assert not re.match(r"(https?:)?//", value), (tag, value)
            if value and name == "src":
                assert value.startswith("data:image/png;base64,")


def test_figures_are_embedded_byte_for_byte() -> None:
    html = render_report(make_page())
    srcs = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert [base64.b64decode(s) for s in srcs] == [FAKE_PNG]
    assert "how to read it" in html
    assert 'href="#jct-cdf"' in html and 'id="jct-cdf"' in html


def test_report_shows_table_command_settings_and_runs() -> None:
    html = render_report(make_page(notes=["run x on y: failed"], baseline="pollux-only"))
    for header in MATRIX_HEADERS:
        assert f"<th>{header}</th>" in html
    assert "deepboot compare --workload small.csv" in html
    assert "<th>cluster</th><td>16x4</td>" in html
    assert "pollux:no-lending" in html
    assert "run x on y: failed" in html
    assert "-46.8%" in html  # deepboot's average JCT against the named baseline
    assert "against pollux-only" in html


def test_every_text_is_escaped() -> None:
    evil = "<script>alert(1)</script>"
    page = make_page(
        title=evil,
        command=f"deepboot compare --run '{evil}'",
        settings={evil: evil},
        rows=[MatrixRow(evil, evil, make_summary())],
        runs={evil: evil},
        notes=[evil],
        figures=[FigureImage(evil, FAKE_PNG, evil, anchor="a")],
    )
    html = render_report(page)
    assert "<script" not in html
    assert "&lt;script&gt;" in html


def test_best_cells_are_marked_per_workload() -> None:
    html = matrix_html(make_rows())
    body = html.split("<tbody>")[1]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", body)
    assert len(rows) == 4
    # The avg-JCT cell (4th) is best for deepboot on both workloads, not for pollux.
    avg_cells = [re.findall(r"<td([^>]*)>", r)[3] for r in rows]
    assert ["best" in c for c in avg_cells] == [True, False, True, False]
    # Reclaims and lent GPU-hours are descriptive: never highlighted.
    for r in rows:
        assert not any("best" in c for c in re.findall(r"<td([^>]*)>", r)[-3:])


def test_reference_rows_are_marked() -> None:
    rows = [*make_rows()[:2], MatrixRow("small", "limit", make_summary(), reference=True)]
    html = matrix_html(rows)
    assert html.count('class="ref"') == 1
    assert re.search(r'<tr class="ref"><td>small</td><td>limit</td>', html)
