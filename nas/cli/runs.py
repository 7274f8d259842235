"""``nas train``: one training run of one shape, outside any study."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from nas.cli.app import app
from nas.errors import UsageError
from nas.units import parse_size


@app.command()
def train(
    config: Annotated[Path, typer.Option("--config", help="A shape: an ArchConfig JSON, or a `nas best --format "
                                         "json` / `nas export` file (its row --rank, default the best).")],
    rank: Annotated[int | None, typer.Option("--rank", help="Which row of a leaderboard file (1 = the best).",
                                                show_default=False)] = None,
    preset: Annotated[str, typer.Option("--preset", help="Training setup: see `nas presets`.")] = "cpu",
    data: Annotated[str, typer.Option("--data", help="As for nas search.")] = "builtin",
    tokens: Annotated[str | None, typer.Option("--tokens", help="Training tokens (default the preset's).",
                                                  show_default=False)] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of init and data order.")] = 0,
    device: Annotated[str | None, typer.Option("--device", help="auto, cpu, cuda, cuda:N or mps.",
                                                  show_default=False)] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the result JSON here "
                                                   "(default stdout).", show_default=False)] = None,
) -> None:
    """Train one shape once and print its result as JSON."""
    from nas.configs import read_arch_config
    from runners.presets import get_preset

    arch = read_arch_config(config, rank)
    overrides = {"seed": seed, **({"tokens": parse_size(tokens, "--tokens")} if tokens else {}),
                 **({"device": device} if device else {})}
    cfg = get_preset(preset).train.with_(**overrides)

    from nas.data import load_data
    from runners.proxy import run

    dataset = load_data(data)
    if arch.vocab_size < dataset.vocab_size:
        raise UsageError(f"the config's vocab_size {arch.vocab_size} is below the data's {dataset.vocab_size}")
    result = run(arch, cfg, dataset)
    text = json.dumps({"arch": arch.to_dict(), "train": cfg.to_dict(), "result": result.to_dict()}, indent=2,
                      default=str)
    if output:
        output.write_text(text)
    else:
        typer.echo(text)
    if result.status != "ok":
        typer.echo(f"run ended {result.status}: {result.reason}", err=True)
        raise typer.Exit(1)
