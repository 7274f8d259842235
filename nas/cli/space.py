"""``nas space count|list|show``: count, list and check the members of a search space.

The shape options are defined once below as ``Annotated`` aliases; ``with_space_options`` adds
all of them to a command (``nas search`` reuses it) and hands the command a ``SpaceOptions``.
"""

import csv
import functools
import inspect
import json
import sys
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Annotated, Any

import typer

from nas.cli.options import Fix, ListFormat, Space, plain
from nas.configs import read_arch_config
from nas.errors import UsageError
from nas.units import parse_size
from search_spaces.base import SearchSpace
from search_spaces.factory import OPTION_NAMES, SpaceOptions, build_space
from search_spaces.grouped import KVScheduleSpace, UniformGroupPrismSpace
from search_spaces.hourglass import HourglassSpace
from search_spaces.joint import JointSpace
from search_spaces.kv import parse_kv_schedule
from search_spaces.prism import PrismSpace, parse_schedule

space_app = typer.Typer(help="Count, list and check the members of a search space.", no_args_is_help=True)

# ----------------------------------------------------------------- the shape options, defined once
_P = "Prism schedule"
_H = "Hourglass grid"
SpaceOpt = Annotated[Space, typer.Option("--space", help="Search space.")]
LayersOpt = Annotated[int | None, typer.Option("--layers", help="Baseline depth L (default 12).", show_default=False)]
DModelOpt = Annotated[int | None, typer.Option("--d-model", help="Baseline width d_model (default 96).",
                                               show_default=False)]
HeadsOpt = Annotated[int | None, typer.Option("--heads", help="Baseline head count h_base, divides d_model "
                                              "(default 12).",
                                                 show_default=False)]
VocabOpt = Annotated[int | None, typer.Option("--vocab", help="Vocabulary size (default 256, bytes).",
                                              show_default=False)]
TieOpt = Annotated[bool | None, typer.Option("--tie-embeddings/--untie-embeddings",
                                                help="Tie input and output embeddings (default tied).",
                                                show_default=False)]
FFNHiddenOpt = Annotated[int | None, typer.Option("--ffn-hidden", help="Conventional FFN hidden size "
                                                     "(default LLaMA's 8/3 d_model).", show_default=False)]
MinPlateauOpt = Annotated[int | None, typer.Option("--min-plateau", help=f"{_P}: shortest step plateau (default 2).",
                                                      show_default=False)]
MaxPlateauOpt = Annotated[int | None, typer.Option("--max-plateau", help=f"{_P}: longest step plateau (default 4).",
                                                      show_default=False)]
MinBaselineOpt = Annotated[int | None, typer.Option("--min-baseline", help=f"{_P}: fewest layers at h_base "
                                                       "(default ceil(L/2)).", show_default=False)]
HWAlignedOpt = Annotated[bool, typer.Option("--hw-aligned", help=f"{_P}: only power-of-two head dims below h_base.")]
MinHeadDimOpt = Annotated[int | None, typer.Option("--min-head-dim", help=f"{_P}: smallest head dim allowed.",
                                                      show_default=False)]
MaxHeadDimOpt = Annotated[int | None, typer.Option("--max-head-dim", help=f"{_P}: largest head dim allowed (the "
                                                      "GPU presets: 256, FlashAttention's largest).",
                                                      show_default=False)]
BudgetOpt = Annotated[str | None, typer.Option("--budget", help=f"{_H}: parameter budget, e.g. 113M, 1.2B "
                                                  "(default the baseline's count).", show_default=False)]
KValuesOpt = Annotated[str | None, typer.Option("--k-values", help=f"{_H}: FFN stack depths K, comma-separated "
                                                   "(default 1,2,4,6,8).", show_default=False)]
LayerValuesOpt = Annotated[str | None, typer.Option("--layer-values", help=f"{_H}: depths L, comma-separated "
                                                       "(default L/6,L/4,L/3,L/2,3L/4,L,3L/2,2L).", show_default=False)]
RatioValuesOpt = Annotated[str | None, typer.Option("--ratio-values", help=f"{_H}: d_h/d_model targets, "
                                                       "comma-separated (default 0.2,0.3,0.4,0.5,0.6,0.8,1).",
                                                       show_default=False)]
HeadDimOpt = Annotated[int | None, typer.Option("--head-dim", help=f"{_H}: fixed head size; d_model is a "
                                                   "multiple of it (default d_model/heads).", show_default=False)]
ToleranceOpt = Annotated[str | None, typer.Option("--tolerance", help=f"{_H}: budget tolerance, 0.001 or 0.1% "
                                                     "(default 0.1%).", show_default=False)]
RatioToleranceOpt = Annotated[str | None, typer.Option("--ratio-tolerance", help=f"{_H}: achieved d_h/d_model "
                                                          "within this fraction of the target (default 15%).",
                                                          show_default=False)]
FixOpt = Annotated[Fix | None, typer.Option("--fix", help=f"{_H}: 'attention' keeps the baseline's d_model and L, "
                                               "varying only K (d_h follows from the budget).", show_default=False)]

HiddenMultipleOpt = Annotated[int | None, typer.Option("--hidden-multiple", help=f"{_H}: keep d_h a multiple of "
                                                        "this (64 for GPU presets: tile-aligned matmuls, coarser "
                                                        "budgets; raise --tolerance); default exact budgets.",
                                                        show_default=False)]

_KV = "Grouped-query attention (any space)"
KVGroupsOpt = Annotated[str | None, typer.Option("--kv-groups", help=f"{_KV}: group sizes (query heads per key/value "
                                                 "head, dividing h_base), comma-separated; 1, multi-head, is always "
                                                 "one. Alone: one group size per member, in every layer; the saved "
                                                 "K/V parameters go to the FFN (prism), or to width, depth or the "
                                                 "FFN (hourglass, joint grids).", show_default=False)]
KVScheduleOpt = Annotated[bool, typer.Option("--kv-schedule", help=f"{_KV}: a group size per layer, non-decreasing "
                                             "with depth, in plateaus (default groups: every divisor of h_base); the "
                                             "saved parameters go to the FFN hidden size.")]
MinKVHeadsOpt = Annotated[int | None, typer.Option("--min-kv-heads", help=f"{_KV}: fewest key/value heads a grouped "
                                                   "layer keeps (default 1: multi-query allowed).", show_default=False)]
KVMinPlateauOpt = Annotated[int | None, typer.Option("--kv-min-plateau", help=f"{_KV}: --kv-schedule's shortest "
                                                     "plateau of one group size (default 2).", show_default=False)]
KVMaxPlateauOpt = Annotated[int | None, typer.Option("--kv-max-plateau", help=f"{_KV}: --kv-schedule's longest "
                                                     "plateau, the deepest excepted (default 4).", show_default=False)]

# name -> (annotation, default): the signature ``with_space_options`` adds to a command
SPACE_PARAMETERS: dict[str, tuple[Any, Any]] = {
    "space": (SpaceOpt, Space.prism), "layers": (LayersOpt, None), "d_model": (DModelOpt, None),
    "heads": (HeadsOpt, None), "vocab": (VocabOpt, None), "tie_embeddings": (TieOpt, None),
    "ffn_hidden": (FFNHiddenOpt, None), "min_plateau": (MinPlateauOpt, None), "max_plateau": (MaxPlateauOpt, None),
    "min_baseline": (MinBaselineOpt, None), "hw_aligned": (HWAlignedOpt, False), "min_head_dim": (MinHeadDimOpt, None),
    "max_head_dim": (MaxHeadDimOpt, None),
    "budget": (BudgetOpt, None), "k_values": (KValuesOpt, None), "layer_values": (LayerValuesOpt, None),
    "ratio_values": (RatioValuesOpt, None), "head_dim": (HeadDimOpt, None), "tolerance": (ToleranceOpt, None),
    "ratio_tolerance": (RatioToleranceOpt, None), "fix": (FixOpt, None), "hidden_multiple": (HiddenMultipleOpt, None),
    "kv_groups": (KVGroupsOpt, None), "kv_schedule": (KVScheduleOpt, False), "min_kv_heads": (MinKVHeadsOpt, None),
    "kv_min_plateau": (KVMinPlateauOpt, None), "kv_max_plateau": (KVMaxPlateauOpt, None),
}
assert tuple(SPACE_PARAMETERS) == OPTION_NAMES, "every SpaceOptions field needs a CLI option"


def _parse_list(text: str | None, flag: str, kind: type) -> tuple[Any, ...] | None:
    if text is None:
        return None
    items = text.replace(" ", "").split(",")
    if text.strip() and not all(items):
        raise UsageError(f"{flag} {text!r} has an empty item: give comma-separated values (e.g. "
                         f"{'1,2,4' if kind is int else '0.2,0.4'})")
    try:
        values = tuple(kind(item) for item in items if item)
    except ValueError:
        example = "1,2,4" if kind is int else "0.2,0.4"
        raise UsageError(f"{flag} {text!r} is not a comma-separated list of {kind.__name__}s "
                         f"(e.g. {example})") from None
    if not values:
        raise UsageError(f"{flag} is empty: give comma-separated values")
    return values


def _parse_fraction(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        return float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise UsageError(f"{flag} {text!r} is not a fraction: give e.g. 0.001 or 0.1%") from None


def space_options_from_cli(**kwargs: Any) -> SpaceOptions:
    """Turn the raw CLI values (strings for sizes, lists and fractions) into ``SpaceOptions``."""
    unknown = sorted(set(kwargs) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"unknown space option(s): {', '.join(unknown)}")
    values = {name: plain(kwargs.get(name)) for name in OPTION_NAMES}
    values["space"] = values["space"] or "prism"
    values["hw_aligned"] = values["hw_aligned"] or None
    values["kv_schedule"] = values["kv_schedule"] or None
    values["kv_groups"] = _parse_list(values["kv_groups"], "--kv-groups", int)
    if values["budget"] is not None:
        values["budget"] = parse_size(values["budget"], "--budget")
    values["k_values"] = _parse_list(values["k_values"], "--k-values", int)
    values["layer_values"] = _parse_list(values["layer_values"], "--layer-values", int)
    values["ratio_values"] = _parse_list(values["ratio_values"], "--ratio-values", float)
    values["tolerance"] = _parse_fraction(values["tolerance"], "--tolerance")
    values["ratio_tolerance"] = _parse_fraction(values["ratio_tolerance"], "--ratio-tolerance")
    if values["fix"] is not None and values["fix"].lower() == "none":
        values["fix"] = None
    return SpaceOptions(**values)


def with_space_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give a typer command every shape option; it receives them parsed, as ``opts: SpaceOptions``."""
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "opts"]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
             for name, (annotation, default) in SPACE_PARAMETERS.items()]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        opts = space_options_from_cli(**{name: kwargs.pop(name) for name in SPACE_PARAMETERS})
        return command(opts=opts, **kwargs)

    wrapper.__signature__ = inspect.Signature(own + extra)  # type: ignore[attr-defined]
    return wrapper


def _report_grid(space: SearchSpace, opts: SpaceOptions, each: bool = True) -> None:
    """On stderr: a baseline whose width the budget changed from the --d-model given, and every hourglass grid point
    left out and why (or, ``each=False``, how many)."""
    hourglass = space.hourglass if isinstance(space, (JointSpace, KVScheduleSpace)) else space
    if not isinstance(hourglass, HourglassSpace):
        return
    base, given = hourglass.baseline(), hourglass.reference
    if opts.d_model is not None and base.d_model != given.d_model:  # the budget's conventional shape is another
        typer.echo(f"note: the baseline is d_model {base.d_model}, the conventional K=1 shape of {base.n_layers} "
                   f"layers at the budget {hourglass.budget:,}; at --d-model {given.d_model} it has "
                   f"{given.n_params()['total']:,} parameters", err=True)
    if not hourglass.unmatched():
        return
    if not each:
        typer.echo(f"({len(hourglass.unmatched())} grid points unmatched or duplicate; "
                   "`nas space list` names them)", err=True)
    for miss in hourglass.unmatched() if each else ():
        typer.echo(f"unmatched {miss.point}: {miss.reason}", err=True)


# ----------------------------------------------------------------- output formats
def _cell(key: str, value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value))
    if isinstance(value, float):
        return f"{value:+.4%}" if key.endswith("deviation") else f"{value:.4g}"
    return "" if value is None else str(value)


def _print_table(columns: tuple[str, ...], rows: Iterable[dict[str, Any]]) -> None:
    """Aligned columns; widths come from the first 1000 rows so that long listings still stream."""
    rows = iter(rows)
    head = [[_cell(c, r[c]) for c in columns] for r in islice(rows, 1000)]
    widths = [max([len(c)] + [len(line[i]) for line in head]) for i, c in enumerate(columns)]

    def emit(cells: list[str]) -> None:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(cells, widths)).rstrip())

    emit(list(columns))
    for line in head:
        emit(line)
    for r in rows:
        emit([_cell(c, r[c]) for c in columns])


def _print_json(rows: Iterable[dict[str, Any]]) -> None:
    out = sys.stdout
    out.write("[")
    for i, r in enumerate(rows):
        out.write(("," if i else "") + "\n  " + json.dumps(r))
    out.write("\n]\n")


def _print_csv(rows: Iterable[dict[str, Any]]) -> None:
    writer = None
    for r in rows:
        if writer is None:
            writer = csv.DictWriter(sys.stdout, fieldnames=list(r), lineterminator="\n")
            writer.writeheader()
        writer.writerow({k: _cell(k, v) if isinstance(v, list) else v for k, v in r.items()})


# ----------------------------------------------------------------- commands
FormatOpt = Annotated[ListFormat, typer.Option("--format", help="Output format.")]
LimitOpt = Annotated[int | None, typer.Option("--limit", help="List at most N members.", show_default=False)]
ScheduleOpt = Annotated[str | None, typer.Option("--schedule", help="Head counts per layer, 3,3,6,6,12,... or "
                                                    "3x2,6x2,12x8 (prism; joint: its baseline shape).",
                                                    show_default=False)]
ConfigOpt = Annotated[str | None, typer.Option("--config", help="An ArchConfig JSON file (any space).",
                                                  show_default=False)]
KVOpt = Annotated[str | None, typer.Option("--kv", help="Key/value heads per layer for --schedule or --config, "
                                           "4,4,2,2,... or 4x6,2x6 (spaces with --kv-groups on prism, or "
                                           "--kv-schedule); the FFN is the one the space gives them.",
                                           show_default=False)]


@space_app.command("count")
@with_space_options
def count_command(opts: SpaceOptions) -> None:
    """Print the exact number of members (a bare integer)."""
    space = build_space(opts)
    typer.echo(space.count())
    _report_grid(space, opts, each=False)


@space_app.command("list")
@with_space_options
def list_command(opts: SpaceOptions, format: FormatOpt = ListFormat.table, limit: LimitOpt = None) -> None:
    """List the members, baseline first, as an aligned table, a JSON array or CSV."""
    if limit is not None and not 0 <= limit <= sys.maxsize:  # islice takes no more; no space holds that many
        raise UsageError(f"--limit {limit} is invalid: give a count from 0 to {sys.maxsize:,} (or leave it out)")
    space = build_space(opts)
    rows = (space.row(arch) for arch in islice(space, limit))
    if format.value == "json":
        _print_json(rows)
    elif format.value == "csv":
        _print_csv(rows)
    else:
        _print_table(space.table_columns, rows)
    _report_grid(space, opts)


@space_app.command("show")
@with_space_options
def show_command(opts: SpaceOptions, schedule: ScheduleOpt = None, config: ConfigOpt = None, kv: KVOpt = None) -> None:
    """Check one shape: print its description if it is a member, else every reason it is not (exit 1)."""
    space = build_space(opts)
    if (schedule is None) == (config is None):
        raise UsageError("give exactly one of --schedule 3,3,6,6,12,... or --config arch.json")
    if kv is not None and not hasattr(space, "with_kv"):
        raise UsageError("--kv applies to the prism space with --kv-groups and to any space with --kv-schedule; "
                         "give a grouped shape of this space with --config arch.json")
    if config is not None:
        arch = read_arch_config(config)
    else:
        prism = _prism_of(space)
        heads = parse_schedule(schedule)
        reasons = prism.validate_schedule(heads)
        if reasons:
            _print_invalid(reasons)
        arch = prism.member(heads)
    if kv is not None:
        arch = space.with_kv(arch, parse_kv_schedule(kv, arch.n_layers))  # type: ignore[attr-defined]
    reasons = space.validate(arch)
    if reasons:
        _print_invalid(reasons)
    typer.echo(f"valid: a member of the {space.name} space")
    for key, value in space.row(arch).items():
        typer.echo(f"  {key}: {_cell(key, value)}")


def _prism_of(space: SearchSpace) -> PrismSpace:
    """The Prism space a ``--schedule`` is checked against: the prism space, or the joint space's baseline shape."""
    if isinstance(space, (UniformGroupPrismSpace, KVScheduleSpace)):
        space = space.inner_space
    if isinstance(space, PrismSpace):
        return space
    if isinstance(space, JointSpace):
        return space.prism_of(space.baseline())
    raise UsageError("--schedule applies to the prism and joint spaces; "
                     "give an hourglass shape with --config arch.json")


def _print_invalid(reasons: list[str]) -> None:
    typer.echo("invalid:")
    for reason in reasons:
        typer.echo(f"  - {reason}")
    raise typer.Exit(1)
