"""``nas best``, ``nas export`` and ``nas report``: what a study found, read from its storage."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Annotated

import typer

from nas.cli.app import app
from nas.cli.options import StorageOpt, StudyOpt, TableOrJson, choices
from nas.cli.skipped import warn_skipped
from nas.errors import UsageError, printable
from nas.files import OutputFile
from nas.study.config import DEFAULT_STORAGE, display_url, hidden_password_note

DEFAULT_TOP = 10
TopOpt = Annotated[int, typer.Option("--top", help="How many shapes (the baseline is always shown).")]
PlotlyJs = choices("PlotlyJs", ("inline", "cdn"))
ExportFormat = choices("ExportFormat", ("json", "hf", "llama"))


@app.command()
def studies(storage: StorageOpt = DEFAULT_STORAGE) -> None:
    """List the storage's studies: which are shape searches (what `nas best`, `nas report` and `nas export` read),
    which hold full-scale re-runs, and which another tool made. `trials`: the trials stored; `trained`: those that
    `--trials` counts (a shape search's duplicates, and trials interrupted, killed or crashed, are stored but not
    counted)."""
    from nas.study.existing import list_studies
    from nas.study.storage import EmptyStorage, make_storage

    try:
        listed = list_studies(make_storage(storage, read_only=True))
    except EmptyStorage:
        listed = []
    if not listed:
        typer.echo(f"{display_url(storage)} holds no study yet")
        return
    from rich.cells import cell_len  # columns a terminal gives the text: two for a wide (CJK) character

    rows = [(printable(name), kind, n, "-" if trained is None else trained) for name, kind, n, trained in listed]
    width = max(cell_len(name) for name, *_ in rows + [("study",)])
    for name, kind, n, trained in [("study", "kind", "trials", "trained"), *rows]:
        typer.echo(f"{name}{' ' * (width - cell_len(name))}  {n:>6}  {trained:>7}  {kind}")


@app.command()
def best(
    study_name: StudyOpt = None,
    storage: StorageOpt = DEFAULT_STORAGE,
    top: TopOpt = DEFAULT_TOP,
    format: Annotated[TableOrJson, typer.Option("--format", help="Output format.")] = TableOrJson.table,
) -> None:
    """The leaderboard: shape, the two gains over the baseline (the answer's interval first and starred: the expected
    gain, the paired gain shrunk by what the shape's seeds support, with its credible interval after adaptive
    replicates; the paired t interval on common seeds after a race or fixed replicates), the loss on the seeds the
    baseline trained too, the seed-adjusted loss, whether it is tied with the best, parameters, tokens/s. JSON rows are
    valid `nas train --config` files."""
    from nas.study.existing import load_existing_study
    from reports.export import export_rows
    from reports.frame import read_study
    from reports.leaderboard import expected_gain_text
    from reports.summary import summarise

    if top < 1:
        raise UsageError(f"--top {top} is invalid: give at least 1")
    data = read_study(load_existing_study(storage, study_name))
    warn_skipped(data)
    rows = export_rows(data, top)
    if format.value == "json":
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        from reports.summary import failures_text

        failed = failures_text(data)  # trainings that ended without a score are no "yet"
        typer.echo(f"no shape has a score: every training that ended failed ({failed})" if failed else
                   "no completed trials yet")
        return
    summary = summarise(data)
    for line in (summary.sentence, summary.detail, summary.rules_text):
        if line:
            typer.echo(line)
    grouped = any(r["kv_heads"] not in (None, r["heads"]) for r in rows)  # a KV column for grouped-query studies

    def kv(r: dict) -> str:
        return f" {r['kv_heads'] or '':<20} {r['kv_cache_bytes_per_token'] or 0:>8,}" if grouped else ""

    kv_head = f" {'kv heads':<20} {'KV B/tok':>8}" if grouped else ""
    adaptive = data.evidence.adaptive
    first, second = ("expected gain % [95%]*", "paired gain % [95% CI]") if adaptive else \
        ("paired gain % [95% CI]*", "expected gain % [95%]")
    typer.echo(f"{'rank':>4}  {'heads':<28}{kv_head} {'K':>2} {'d_h':>5} {'d':>5} {'L':>3} {'seeds':>5}  "
               f"{first:>26} {second:>26} {'on base seeds':>13} {'adj. loss':>9} {'tied':>4} {'params':>10} "
               f"{'tok/s':>7}")

    def expected(r: dict) -> str:
        return expected_gain_text(SimpleNamespace(**r)).replace(" %", "")

    def paired(r: dict) -> str:
        if r["paired_gain_low"] is not None:
            return f"{r['paired_gain_pct']:+.2f} [{r['paired_gain_low']:+.2f}, {r['paired_gain_high']:+.2f}]"
        if r["paired_gain_pct"] is not None:
            return f"{r['paired_gain_pct']:+.2f} (1 paired seed)"
        return "-"

    for r in rows:
        pick = r["is_answer_pick"] and not r["is_baseline"] and r["rank"] != 1  # a race's need not rank first
        tag = "  (" + ", ".join(t for t, on in (("baseline", r["is_baseline"]), ("the answer's pick", pick)) if on) \
            + ")" if r["is_baseline"] or pick else ""
        tied = "yes" if r["tied_with_best"] else ""
        on_base = f"{r['loss_on_baseline_seeds']:.4f}" if r["loss_on_baseline_seeds"] is not None else "-"
        gains = (expected(r), paired(r)) if adaptive else (paired(r), expected(r))
        typer.echo(f"{r['rank']:>4}  {r['heads']:<28}{kv(r)} {r['k']:>2} {r['d_h']:>5} {r['d_model']:>5} "
                   f"{r['layers']:>3} {r['seeds']:>5}  {gains[0]:>26} {gains[1]:>26} {on_base:>13} "
                   f"{r['adjusted_loss']:>9.4f} {tied:>4} {r['params']:>10} {r['tokens_per_s'] or 0:>7.0f}{tag}")
    answers = "the 95 % credible interval of the expected gain (robust to the prior's tails)" if adaptive else \
        "the 95 % paired t interval on common seeds"
    typer.echo(f"* the answer's interval: {answers}; the other gain column is per shape and ignores the choice of "
               "the best; 'on base seeds': the loss on the seeds the baseline trained too")


@app.command()
def report(
    study_name: StudyOpt = None,
    storage: StorageOpt = DEFAULT_STORAGE,
    output: Annotated[str, typer.Option("-o", "--output", help="The HTML file to write.")] = "report.html",
    top: TopOpt = DEFAULT_TOP,
    plotlyjs: Annotated[PlotlyJs, typer.Option("--plotlyjs", help="inline: plotly.js embedded once, the page opens "
                                               "with no network (~5 MB); cdn: a small file that loads it from "
                                               "plotly's CDN.")] = PlotlyJs.inline,
) -> None:
    """Write one self-contained HTML page: summary, leaderboard, staircases, width-depth curves, search dynamics,
    training curves, attention distances and full-scale re-runs. Safe while a search writes the study."""
    from nas.study.existing import open_existing_study
    from reports.frame import read_study
    from reports.html import write_report
    from reports.reruns import read_reruns

    if top < 1:
        raise UsageError(f"--top {top} is invalid: give at least 1")
    target = OutputFile.of(output, "-o")  # checked before the study is read: a bad target costs nothing
    study, store = open_existing_study(storage, study_name)
    data = read_study(study, read_reruns(store, study.study_name))
    if storage != DEFAULT_STORAGE:  # the page's commands name the storage where it is not the default
        data.storage, data.storage_note = display_url(storage), hidden_password_note(storage)
    warn_skipped(data)
    path, seconds = write_report(data, target, top, plotlyjs.value)
    size = path.stat().st_size / 2**20
    typer.echo(f"wrote {path} ({size:.1f} MB, {len(data.trials)} trials, {seconds:.1f} s)", err=True)


@app.command()
def export(
    study_name: StudyOpt = None,
    storage: StorageOpt = DEFAULT_STORAGE,
    top: Annotated[int | None, typer.Option("--top", help="json: how many shapes (default 10; the baseline is "
                                            "always among them). hf and llama export one shape: --rank.",
                                            show_default=False)] = None,
    output: Annotated[str | None, typer.Option("-o", "--output", help="The JSON file to write (default, or -: "
                                               "standard output).", show_default=False)] = None,
    format: Annotated[ExportFormat, typer.Option("--format", help="json: the rows; hf: one shape as a Hugging "
                                                 "Face model directory -o DIR (config.json, model.safetensors, "
                                                 "its modeling code: trust_remote_code=True); llama: a stock "
                                                 "LlamaForCausalLM directory (uniform heads, K=1).")]
    = ExportFormat.json,
    rank: Annotated[str | None, typer.Option("--rank", help="hf, llama: the row to export: its rank (default: the "
                                             "answer's pick, rank 1 but after a race; with --checkpoint, its "
                                             "shape's row) or baseline.",
                                             show_default=False)] = None,
    checkpoint: Annotated[str | None, typer.Option("--checkpoint", help="hf, llama: a `nas train --out` or `nas "
                                                   "rerun` run folder (or its checkpoint.pt) whose trained weights "
                                                   "to export (default: freshly initialised weights).",
                                                   show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="hf, llama: replace the model directory an earlier export "
                                        "wrote in -o DIR (its nas-export.json): its files only; files you added "
                                        "there are kept.")]
    = False,
) -> None:
    """The best shapes and the baseline as JSON rows: each shape (a valid `nas train --config`, `--rank N`) with
    the proxy's scores: mean loss ± 95% CI, paired gain over the baseline with its interval, tied with the best.
    `--format hf` writes one shape (and a checkpoint's weights) as a model directory that transformers loads."""
    if format.value != "json":
        from nas.cli.export_hf import export_model_dir

        if top is not None:
            raise UsageError(f"--top {top} goes with --format json (rows); --format {format.value} writes one shape: "
                             "pick it with --rank N (default: the answer's pick) or --rank baseline")

        export_model_dir(study_name, storage, rank, checkpoint, output, format.value, force)
        return
    if rank is not None or checkpoint is not None or force:
        raise UsageError("--rank, --checkpoint and --force go with --format hf or llama (a model directory)")
    from nas.study.existing import load_existing_study
    from reports.export import export_rows
    from reports.frame import read_study

    top = DEFAULT_TOP if top is None else top
    if top < 1:
        raise UsageError(f"--top {top} is invalid: give at least 1")
    target = OutputFile.of("-" if output is None else output, "-o", stdout_ok=True)
    data = read_study(load_existing_study(storage, study_name))
    warn_skipped(data)
    rows = export_rows(data, top)
    target.write(json.dumps(rows, indent=2) + "\n")
    if not target.is_stdout:
        typer.echo(f"wrote {len(rows)} shapes to {target}", err=True)
