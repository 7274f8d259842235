"""``nas best`` and ``nas report``: what a study found, read from its storage (the leaderboard, the HTML page)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from nas.cli.app import app
from nas.cli.options import StorageOpt, StudyOpt, TableOrJson, choices
from nas.errors import UsageError
from nas.study.config import DEFAULT_STORAGE

TopOpt = Annotated[int, typer.Option("--top", help="How many shapes (the baseline is always shown).")]
PlotlyJs = choices("PlotlyJs", ("inline", "cdn"))


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # numpy scalars from the DataFrame
        return value.item()
    return value


def leaderboard_rows(board: Any) -> list[dict[str, Any]]:
    """The leaderboard DataFrame as JSON-ready rows (NaN as null, numpy scalars as Python numbers)."""
    return [{k: _jsonable(v) for k, v in row.items()} for row in board.to_dict(orient="records")]


@app.command()
def best(
    study_name: StudyOpt = None,
    storage: StorageOpt = DEFAULT_STORAGE,
    top: TopOpt = 10,
    format: Annotated[TableOrJson, typer.Option("--format", help="Output format.")] = TableOrJson.table,
) -> None:
    """The leaderboard: shape, mean loss ± 95% CI over seeds, gain over the baseline, parameters, tokens/s."""
    from nas.study.storage import load_existing_study
    from reports.leaderboard import leaderboard

    if top < 1:
        raise UsageError(f"--top {top} is invalid: give at least 1")
    board = leaderboard(load_existing_study(storage, study_name), top)
    if format.value == "json":
        typer.echo(json.dumps(leaderboard_rows(board), indent=2))
        return
    if board.empty:
        typer.echo("no completed trials yet")
        return
    typer.echo(f"{'rank':>4}  {'heads':<28} {'K':>2} {'d_h':>5} {'d':>5} {'L':>3} {'seeds':>5}  "
               f"{'mean loss':>9} {'± ci95':>7} {'gain %':>7} {'params':>10} {'tok/s':>7}")
    for r in board.itertuples():
        ci = f"{r.ci95:.4f}" if r.ci95 is not None and not math.isnan(r.ci95) else "-"
        gain = f"{r.gain_pct:+.2f}" if r.gain_pct is not None and not math.isnan(r.gain_pct) else "-"
        tag = "  (baseline)" if r.is_baseline else ""
        typer.echo(f"{r.rank:>4}  {r.heads:<28} {r.k:>2} {r.d_h:>5} {r.d_model:>5} {r.layers:>3} {r.seeds:>5}  "
                   f"{r.mean_loss:>9.4f} {ci:>7} {gain:>7} {r.params:>10} {r.tokens_per_s:>7.0f}{tag}")


@app.command()
def report(
    study_name: StudyOpt = None,
    storage: StorageOpt = DEFAULT_STORAGE,
    output: Annotated[Path, typer.Option("-o", "--output", help="The HTML file to write.")] = Path("report.html"),
    top: TopOpt = 10,
    plotlyjs: Annotated[PlotlyJs, typer.Option("--plotlyjs", help="inline: plotly.js embedded once, the page opens "
                                               "with no network (~5 MB); cdn: a small file that loads it from "
                                               "plotly's CDN.")] = PlotlyJs.inline,
) -> None:
    """Write one self-contained HTML page: summary, leaderboard, staircases, width-depth curves, search dynamics,
    training curves, attention distances and full-scale re-runs. Safe while a search writes the study."""
    from nas.study.storage import open_existing_study
    from reports.frame import read_study
    from reports.html import write_report
    from reports.reruns import read_reruns

    if top < 1:
        raise UsageError(f"--top {top} is invalid: give at least 1")
    if output.exists() and output.is_dir():
        raise UsageError(f"-o {str(output)!r} is a directory: give a file name such as report.html")
    if not output.parent.exists():
        raise UsageError(f"-o {str(output)!r}: its folder {str(output.parent)!r} does not exist")
    study, store = open_existing_study(storage, study_name)
    data = read_study(study, read_reruns(store, study.study_name))
    try:
        path, seconds = write_report(data, output, top, plotlyjs.value)
    except OSError as error:
        raise UsageError(f"cannot write -o {str(output)!r}: {error.strerror or error}") from None
    size = path.stat().st_size / 2**20
    typer.echo(f"wrote {path} ({size:.1f} MB, {len(data.trials)} trials, {seconds:.1f} s)", err=True)
