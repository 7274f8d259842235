"""HTML building blocks of the report: escaped text, tables, sections, and the page around them.

Every string that comes from the user or the storage (study name, data path, shape labels,
reasons) goes through ``text`` (``html.escape``) before it reaches the page; figure text goes
through ``plot_text``, since plotly reads a few HTML tags in labels. plotly.js is embedded once
per page (``inline``: the page opens from disk with no network) or loaded from plotly's CDN
(``cdn``: a small file, for readers who are online); every figure is a ``div`` that calls it.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import plotly.graph_objects as go
import plotly.offline

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True, "toImageButtonOptions": {"format": "png"}}
# the baseline's colour in every figure that draws it beside shapes, and the shapes' own, none of them near it
BASELINE_COLOUR = "#d95f02"
SHAPE_COLOURS = ("#22558c", "#1b9e77", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666")


def text(value: Any) -> str:
    """A value as escaped HTML text."""
    return html.escape("" if value is None else str(value), quote=True)


def plot_text(value: Any) -> str:
    """A label for a plotly figure: escaped, so that plotly's own tag parsing shows it as typed."""
    return html.escape("" if value is None else str(value), quote=False)


def cell(value: Any, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else ""
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return text(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, css: str = "",
          formats: dict[str, str] | None = None) -> str:
    """An HTML table of ``rows`` (dicts), one column per key (or ``columns``), every cell escaped.

    ``formats`` maps a column to a format string for its numbers (``"{:,.0f}"``); numbers are
    right-aligned, text left-aligned.
    """
    if not rows:
        return ""
    columns = list(columns or rows[0])
    formats = formats or {}

    def td(column: str, value: Any) -> str:
        value = value.item() if hasattr(value, "item") else value  # numpy scalars from pandas
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        shown = text(formats[column].format(value)) if number and column in formats and value == value \
            else cell(value)
        return f'<td class="num">{shown}</td>' if number else f"<td>{shown}</td>"

    head = "".join(f"<th>{text(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(td(c, r.get(c)) for c in columns) + "</tr>" for r in rows)
    return f'<table class="{text(css)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


@dataclass
class Section:
    """One section of the page: a title, the one line saying what to read off it, then tables and figures.

    ``empty`` replaces the figures with one line when there is nothing to draw.
    """

    anchor: str
    title: str
    caption: str
    figures: list[go.Figure] = field(default_factory=list)
    html: str = ""  # already-escaped HTML shown before the figures (tables, notes)
    empty: str | None = None
    notes: list[str] = field(default_factory=list)  # one-line remarks shown after the figures (plain text)


def _figure_html(figure: go.Figure, anchor: str, index: int) -> str:
    body = figure.to_html(full_html=False, include_plotlyjs=False, div_id=f"{anchor}-{index}", config=PLOTLY_CONFIG)
    return f'<div class="figure" data-figure="{text(anchor)}-{index}">{body}</div>'


def render_section(section: Section) -> str:
    parts = [f'<section id="{text(section.anchor)}">', f"<h2>{text(section.title)}</h2>",
             f'<p class="caption">{text(section.caption)}</p>', section.html]
    if section.empty:
        parts.append(f'<p class="empty">{text(section.empty)}</p>')
    else:
        parts.extend(_figure_html(f, section.anchor, i) for i, f in enumerate(section.figures))
    parts.extend(f'<p class="note">{text(note)}</p>' for note in section.notes)
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1d2733; background: #fafbfc; }
header { background: #1d2733; color: #fff; padding: 18px 32px; }
header h1 { margin: 0 0 4px; font-size: 22px; }
header p { margin: 0; color: #c9d3de; font-size: 14px; }
nav { position: sticky; top: 0; background: #eef2f6; padding: 8px 32px; font-size: 14px; z-index: 10;
      border-bottom: 1px solid #d7dee6; }
nav a { margin-right: 16px; color: #22558c; text-decoration: none; }
main { padding: 8px 32px 48px; max-width: 1240px; }
section { margin-top: 28px; padding-top: 4px; }
h2 { font-size: 19px; margin: 12px 0 2px; border-bottom: 1px solid #d7dee6; padding-bottom: 4px; }
p.caption { color: #4b5b6b; margin: 4px 0 12px; font-size: 14px; }
p.verdict { font-size: 17px; background: #fff; border-left: 4px solid #22558c; padding: 10px 14px; }
p.empty { color: #6b7b8b; font-style: italic; background: #fff; padding: 10px 14px; border: 1px dashed #c5ced8; }
p.note { color: #4b5b6b; font-size: 13px; }
table { border-collapse: collapse; background: #fff; margin: 8px 0 14px; font-size: 13px; }
th, td { border: 1px solid #d7dee6; padding: 4px 8px; text-align: left; }
th { background: #eef2f6; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.board td { white-space: nowrap; }
table.board { display: block; max-width: 100%; overflow-x: auto; }  /* a wide board scrolls, not the page */
section { scroll-margin-top: 44px; }
div.figure { background: #fff; border: 1px solid #e1e6ec; margin: 10px 0; }
footer { color: #6b7b8b; font-size: 12px; padding: 0 32px 24px; }
"""


def plotly_script(mode: str) -> str:
    """The one ``<script>`` that loads plotly.js: inlined (``inline``) or from plotly's CDN (``cdn``)."""
    if mode == "cdn":
        version = plotly.offline.get_plotlyjs_version()
        return f'<script src="https://cdn.plot.ly/plotly-{version}.min.js" charset="utf-8"></script>'
    source = plotly.offline.get_plotlyjs().replace("</script", "<\\/script")
    return f'<script type="text/javascript">{source}</script>'


def render_page(title: str, subtitle: str, sections: Iterable[Section], plotlyjs: str, footer: str) -> str:
    sections = list(sections)
    nav = "".join(f'<a href="#{text(s.anchor)}">{text(s.title)}</a>' for s in sections)
    body = "\n".join(render_section(s) for s in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{text(title)}</title><style>{STYLE}</style>{plotly_script(plotlyjs)}</head>"
            f"<body><header><h1>{text(title)}</h1><p>{text(subtitle)}</p></header><nav>{nav}</nav>"
            f"<main>{body}</main><footer>{text(footer)}</footer></body></html>\n")
