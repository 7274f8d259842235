"""``nas rules``: the design rules a study's runs resolve (``nas.stats.rules``), and their check at a longer budget.

Without ``--confirm`` it only reads the storage. With ``--confirm PRESET`` it trains a small designed sample of the
study's shapes at that preset (``nas.stats.rule_design``: the baseline and ``--shapes`` others spanning the rules,
on ``--seeds`` common seeds) through the re-run machinery (``nas rerun``'s folders and records: nothing trained
twice, resumable, Ctrl-C as a search), refits, and prints every rule at both budgets side by side.
"""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING, Annotated

import typer

from nas.cli.app import app
from nas.cli.options import StorageOpt, StudyOpt, TableOrJson
from nas.errors import UsageError
from nas.files import output_folder
from nas.study.config import DEFAULT_STORAGE, display_url, hidden_password_note

if TYPE_CHECKING:
    from nas.stats.answer import Answer
    from reports.frame import StudyData
    from search_spaces.base import Rule

def check_rules(data: StudyData, rules: tuple[Rule, ...], named: bool) -> None:
    """``UsageError`` when the study cannot be read by ``rules``: fewer than 3 shapes, no rule in its catalog, or a
    rule named with ``--rules`` that every shape has at the same value."""
    from nas.stats.rules import MIN_SHAPES

    if not rules:
        raise UsageError(f"study {data.name!r} ({data.space_name} space) has no design rules to read")
    if len(data.scores) < MIN_SHAPES:
        raise UsageError(f"study {data.name!r} has {len(data.scores)} shape(s) with a completed training; the rules "
                         f"need at least {MIN_SHAPES}")
    if named:
        inputs = data.rule_inputs(rules)
        for i, rule in enumerate(rules):
            values = {inputs.covariates[k][i] for k in data.scores if k in inputs.covariates} if inputs else set()
            if len(values) < 2:
                raise UsageError(f"--rules: {rule.name} does not vary in study {data.name!r} (every shape has "
                                 f"{next(iter(values), 'no value')}): choose a rule its shapes vary")


def print_rules(data: StudyData, answer: Answer, rules: tuple[Rule, ...], format: str) -> None:
    from reports.rule_text import left_out_text, resolved_sentences, rules_json, table_lines

    part = answer.rules
    if part is None or part.proxy is None:
        raise UsageError(f"study {data.name!r} has too few runs for its seeds and rules to fit the rule model "
                         f"({len(data.scores)} shapes; give fewer --rules, or train more)")
    if format == "json":
        typer.echo(json.dumps(rules_json(data.name, data.preset, part, rules), indent=2))
        return
    for line in table_lines(part.proxy, rules, f"study {data.name!r} at its proxy ({data.preset})"):
        typer.echo(line)
    left = left_out_text(part)
    if left:
        typer.echo(f"  {left}")
    for label, fit in part.budgets:
        typer.echo("")
        if fit is None:
            typer.echo(f"at {label}: too few re-runs to fit the rules (a run for each of at least 3 shapes, beyond "
                       "the seeds and rules)")
            continue
        for line in table_lines(fit, rules, f"at {label}", part, label):
            typer.echo(line)
    sentences = resolved_sentences(part, rules)
    typer.echo("")
    typer.echo("Resolved: " + (" ".join(s[0].upper() + s[1:] + "." for s in sentences) if sentences else
                               "none at this proxy (each rule's MDE above says what the study could have seen)."))


@app.command()
def rules(
    study_name: StudyOpt = None,
    storage: StorageOpt = DEFAULT_STORAGE,
    rules: Annotated[str | None, typer.Option("--rules", help="Comma-separated rules to read (default: the space's "
                                              "default catalog); the space's opt-in rules too.",
                                              show_default=False)] = None,
    format: Annotated[TableOrJson, typer.Option("--format", help="Output format.")] = TableOrJson.table,
    confirm: Annotated[str | None, typer.Option("--confirm", help="Train a designed sample of the study's shapes "
                                                "at this preset (e.g. cpu-long) and read every rule at both budgets.",
                                                show_default=False)] = None,
    shapes: Annotated[int, typer.Option("--shapes", help="--confirm: shapes besides the baseline, up to 1,000.")] = 8,
    seeds: Annotated[int, typer.Option("--seeds", help="--confirm: common seeds per shape (0, 1, ...), up to "
                                       "1,000.")] = 2,
    tokens: Annotated[str | None, typer.Option("--tokens", help="--confirm: training tokens per run (default the "
                                               "preset's).", show_default=False)] = None,
    data: Annotated[str, typer.Option("--data", help="--confirm: as for nas rerun.")] = "builtin",
    runs: Annotated[str, typer.Option("--runs", help="--confirm: folder of the runs (as nas rerun's).")]
    = "runs",
    device: Annotated[str | None, typer.Option("--device", help="--confirm: auto, cpu, cuda or mps (default the "
                                               "preset's).", show_default=False)] = None,
    threads: Annotated[int, typer.Option("--threads", help="--confirm: torch threads per run (0: every core).")]
    = 0,
) -> None:
    """The design rules the study's runs resolve: each rule's effect with its 95 % interval (across shapes, not runs),
    its minimum detectable effect and a verdict (resolved, not resolved, confounded); with --confirm, the same rules
    at a longer budget and whether each held, shrank or reversed. Reads the storage only, unless --confirm."""
    from nas.study.existing import open_existing_study
    from nas.study.signals import raise_if_stopped
    from reports.frame import read_study
    from reports.reruns import read_reruns

    raise_if_stopped()  # a stop since `nas` started (nas.cli.main) whose exception an import swallowed
    if confirm is None:
        given = [flag for flag, value, default in (("--shapes", shapes, 8), ("--seeds", seeds, 2),
                                                   ("--tokens", tokens, None), ("--data", data, "builtin"),
                                                   ("--runs", runs, "runs"), ("--device", device, None),
                                                   ("--threads", threads, 0)) if value != default]
        if given:
            raise UsageError(f"{', '.join(given)} go{'es' if len(given) == 1 else ''} with --confirm PRESET")
    if confirm is not None:  # a mistyped preset or an unwritable storage costs nothing: refused before the read
        from nas.study.storage import check_writable
        from runners.presets import get_preset

        get_preset(confirm)
        check_writable(storage)
        output_folder(runs, "--runs")
    study, store = open_existing_study(storage, study_name)
    proxy = read_study(study, read_reruns(store, study.study_name))
    chosen = proxy.rules(rules)
    check_rules(proxy, chosen, rules is not None)
    if confirm is not None:
        confirm_rules(proxy, chosen, confirm, shapes, seeds, tokens, data, runs, device, threads, storage)
        proxy = read_study(study, read_reruns(store, study.study_name))
    print_rules(proxy, proxy.answer(chosen), chosen, format.value)


def confirm_rules(proxy: StudyData, chosen: tuple[Rule, ...], preset: str, shapes: int, seeds: int,
                  tokens: str | None, data: str, runs: str, device: str | None, threads: int, storage: str) -> None:
    """``--confirm``: check everything, print the plan and its time, then train it (module docstring)."""
    from nas.cli.rerun import check_counts, check_target, open_batch, proxy_ranking, train_runs
    from nas.rerun.plan import carry_shapes
    from nas.stats.rule_design import design_sample
    from nas.stats.rules import MIN_SHAPE_DF
    from nas.units import format_duration

    check_counts(("--shapes", shapes), ("--seeds", seeds))
    if shapes < len(chosen) + MIN_SHAPE_DF:  # the longer budget's fit needs S - 1 - R >= MIN_SHAPE_DF shapes
        raise UsageError(f"--shapes {shapes} is too few to check {len(chosen)} rule(s): a rule's interval needs "
                         f"{len(chosen) + MIN_SHAPE_DF} shapes besides the baseline (or fewer --rules)")
    if proxy.baseline_key not in proxy.scores:
        raise UsageError(f"study {proxy.name!r} has no completed baseline: a rule check trains it beside the design")
    target = check_target(preset, tokens, data, 1, device, None, threads=threads)
    proxy_tokens = int((proxy.identity.get("train") or {}).get("tokens", 0) or 0)
    if target.train.tokens <= proxy_tokens:
        raise UsageError(f"--confirm {preset} trains {target.train.tokens:,} tokens a run, no more than the study's "
                         f"proxy ({proxy_tokens:,}): give a longer budget (e.g. cpu-long, or --tokens above it)")
    fit = proxy.answer(chosen).rules.proxy if proxy.answer(chosen).rules is not None else None  # type: ignore[union-attr]
    if fit is None or not fit.resolved:
        carried = [e.name for e in fit.estimates if e.carried_by] if fit is not None else []
        one = len(carried) == 1
        more = (f"; {', '.join(carried)} {'rests on one shape' if one else 'rest on one shape each'}: a study with "
                f"more shapes across {'its range could resolve it' if one else 'their ranges could resolve them'}"
                if carried else "")
        raise UsageError(f"no rule of {', '.join(r.name for r in chosen)} is resolved at the proxy: nothing to "
                         f"confirm (nas rules shows what each could have detected){more}")
    inputs = proxy.rule_inputs(chosen)
    assert inputs is not None  # check_rules: shapes, rules
    covariates = {k: v for k, v in inputs.covariates.items() if k in proxy.scores}
    keys = design_sample(covariates, proxy.baseline_key, shapes, list(proxy.board["key"]),
                         {k: s.n for k, s in proxy.scores.items()})
    planned = carry_shapes(proxy_ranking(proxy), target.preset, keys[1:], "design")
    for shape in planned:
        if not shape.transfer.ok:
            typer.echo(f"skipped {shape.proxy_key}: {shape.transfer.refused}", err=True)
    per_run = seconds_per_run(proxy, target.train.tokens)
    carried = sum(s.transfer.ok for s in planned)
    total = carried * seeds
    resolved = "resolved at the proxy: " + ", ".join(e.name for e in fit.resolved)
    typer.echo(f"confirm at {preset}: the baseline and {carried - 1} shapes spanning "
               f"{', '.join(r.name for r in chosen)} ({resolved}), "
               f"{seeds} common seeds: {total} runs of {target.train.tokens:,} tokens"
               + (f", about {format_duration(per_run * total)} on this machine (from the proxy's own speed)"
                  if per_run else ""), err=True)
    batch = open_batch(proxy, target, planned, seeds, runs, storage, "training proxy rank {rank} as")
    train_runs(batch)
    typer.echo(f"done. Next: nas report --study-name {shlex.quote(proxy.name)} --storage "
               f"{shlex.quote(display_url(storage))} -o report.html (its Design rules section shows both budgets)"
               f"{hidden_password_note(storage)}",
               err=True)


def seconds_per_run(data: StudyData, tokens: int) -> float | None:
    """A run of ``tokens`` at the proxy's median tokens/s, plus a process start: the plan's estimate."""
    speeds = data.frame["tokens_per_s"].dropna() if not data.frame.empty else []
    if len(speeds) == 0:
        return None
    return tokens / float(speeds.median()) + 5.0
