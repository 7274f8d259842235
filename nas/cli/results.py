"""``nas best``: what a study found, read from its storage (the leaderboard)."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

import typer

from nas.cli.app import app
from nas.cli.options import StorageOpt, StudyOpt, TableOrJson
from nas.errors import UsageError
from nas.study.config import DEFAULT_STORAGE

TopOpt = Annotated[int, typer.Option("--top", help="How many shapes (the baseline is always shown).")]


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
