"""A self-contained HTML report: the compare table, the figures and how they were made.

The page needs no network and no other file: styles are inline and figures are
embedded as base64 PNG data URIs, so ``report.html`` can be mailed or archived alone.
Every piece of text is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from deepboot.report.table import MATRIX_HEADERS, MatrixRow, best_cells, matrix_cells


@dataclass(frozen=True, slots=True)
class FigureImage:
    """One embedded figure.

    Attributes:
        title: Heading shown above it.
        png: The PNG bytes.
        caption: What it shows and how to read it (plain text).
        anchor: Id of its section, for the page's table of contents.
    """

    title: str
    png: bytes
    caption: str = ""
    anchor: str = ""


@dataclass(frozen=True, slots=True)
class ReportPage:
    """Everything the report shows.

    Attributes:
        title: Page title.
        command: The command line that produced the results.
        settings: Setting name -> value (cluster, workloads, seed...), shown in order.
        rows: The compare matrix.
        baseline: The run the average JCT is compared with (None: each workload's first).
        runs: Run name -> how it was configured, shown in a legend table.
        figures: Figures, in display order.
        notes: Free-text remarks shown under the table (e.g. runs that failed).
    """

    title: str
    command: str
    settings: Mapping[str, str]
    rows: Sequence[MatrixRow]
    baseline: str | None = None
    runs: Mapping[str, str] = field(default_factory=dict)
    figures: Sequence[FigureImage] = ()
    notes: Sequence[str] = ()


_CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       margin: 2rem auto; max-width: 1320px; padding: 0 1.5rem; color: #1d1d1f;
       font-size: 16px; line-height: 1.45; }
h1 { font-size: 1.8rem; margin-bottom: .2rem; }
h2 { font-size: 1.35rem; margin-top: 2.2rem; border-bottom: 1px solid #ddd;
     padding-bottom: .3rem; }
.sub { color: #555; margin-top: 0; }
table { border-collapse: collapse; margin: .8rem 0; }
th, td { padding: .35rem .7rem; border-bottom: 1px solid #e3e3e3; }
th { background: #f3f5f8; text-align: center; font-weight: 600; }
.wide { overflow-x: auto; max-width: 100%; }
table.matrix { font-size: .85rem; }
table.matrix th, table.matrix td { padding: .3rem .32rem; }
table.matrix td { white-space: nowrap; }
table.matrix td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.matrix td.best { font-weight: 700; background: #e8f4ea; }
table.matrix tr.first td { border-top: 2px solid #999; }
table.matrix tr.ref td { font-style: italic; color: #555; }
table.kv th { text-align: left; background: none; color: #444; }
code, pre { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: .9rem; }
pre { background: #f6f8fa; padding: .8rem 1rem; border-radius: 6px;
      white-space: pre-wrap; overflow-wrap: anywhere; }
figure { margin: 1rem 0 2rem; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #444; margin-top: .4rem; }
nav a { margin-right: 1rem; }
.note { color: #8a4b00; }
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def png_data_uri(png: bytes) -> str:
    """``data:image/png;base64,...`` for an ``<img src>``."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def matrix_html(rows: Sequence[MatrixRow], baseline: str | None = None) -> str:
    """The compare matrix as an HTML ``<table>`` (best values of each workload bold)."""
    cells = matrix_cells(rows, baseline)
    best = best_cells(rows)
    head = "".join(f"<th>{_e(h)}</th>" for h in MATRIX_HEADERS)
    body: list[str] = []
    for i, row in enumerate(cells):
        first = i == 0 or rows[i].workload != rows[i - 1].workload
        tds = []
        for j, text in enumerate(row):
            classes = ["num"] if j >= 2 else []
            if (i, j) in best:
                classes.append("best")
            attr = f' class="{" ".join(classes)}"' if classes else ""
            tds.append(f"<td{attr}>{_e(text)}</td>")
        tr_classes = (["first"] if first and i else []) + (["ref"] if rows[i].reference else [])
        tr_class = f' class="{" ".join(tr_classes)}"' if tr_classes else ""
        body.append(f"<tr{tr_class}>{''.join(tds)}</tr>")
    # A matrix wider than the page scrolls on its own; the page does not.
    return (
        f'<div class="wide"><table class="matrix"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _kv_table(items: Mapping[str, str]) -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in items.items())
    return f'<table class="kv">{rows}</table>'


def render_report(page: ReportPage) -> str:
    """The full HTML document of ``page`` (UTF-8 text, no external resources)."""
    base = page.baseline or "the first run of each workload"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(page.title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(page.title)}</h1>",
        f'<p class="sub">{len(page.rows)} runs. In the JCT, makespan, restart and '
        f"inference delay columns lower is better, in the SLO column higher, and each "
        f"workload's best value is highlighted; reference runs (italic) are not "
        f"ranked. The last column is the change in average training JCT against {_e(base)}.</p>",
    ]
    if page.figures:
        links = "".join(
            f'<a href="#{_e(f.anchor)}">{_e(f.title)}</a>' for f in page.figures if f.anchor
        )
        parts.append(f'<nav><a href="#results">Results</a>{links}<a href="#setup">Setup</a></nav>')
    parts += ['<h2 id="results">Results</h2>', matrix_html(page.rows, page.baseline)]
    parts += [f'<p class="note">{_e(n)}</p>' for n in page.notes]
    if page.runs:
        parts += ["<h3>Runs</h3>", _kv_table(page.runs)]
    for fig in page.figures:
        anchor = f' id="{_e(fig.anchor)}"' if fig.anchor else ""
        caption = f"<figcaption>{_e(fig.caption)}</figcaption>" if fig.caption else ""
        parts += [
            f"<h2{anchor}>{_e(fig.title)}</h2>",
            f'<figure><img alt="{_e(fig.title)}" src="{png_data_uri(fig.png)}">{caption}</figure>',
        ]
    parts += [
        '<h2 id="setup">Setup</h2>',
        "<p>Command line:</p>",
        f"<pre>{_e(page.command)}</pre>",
        _kv_table(page.settings),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"
