"""Shapes from JSON files: a plain ``ArchConfig``, a ``nas best --format json`` / ``nas export`` row, or a list of rows.

What ``nas train --config``, ``nas space show --config`` and ``nas rerun`` read. A row carries
its shape under ``"arch"`` (the other keys are the proxy's scores: mean loss, interval,
gain); a list of rows is a leaderboard, read by ``rank`` (1 = the best shape). Imports no torch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from nas.arch import ArchConfig, format_plateaus, json_kind
from nas.errors import UsageError
from nas.files import check_input, read_bytes, show

MAX_JSON_BYTES = 64 * 2**20  # a leaderboard of thousands of rows is a few MB; more is no shape file


def _bounded_int(text: str) -> int:
    """A JSON integer of at most 30 digits (a shape's largest count has a dozen): a 5,000-digit one was refused by
    Python's own limit, whose message advised ``sys.set_int_max_str_digits``."""
    if len(text.lstrip("-")) > 30:
        raise ValueError(f"it holds an integer of {len(text.lstrip('-')):,} digits, larger than any size a shape has")
    return int(text)


def read_json_file(path: str | Path, what: str = "--config") -> Any:
    """The parsed JSON of ``path``; one-line ``UsageError`` naming the file when it is missing or not JSON."""
    path = check_input(path, what)
    if path.stat().st_size > MAX_JSON_BYTES:
        raise UsageError(f"{what} {show(path)} holds {path.stat().st_size:,} bytes: a shape file is a few kB "
                         f"(at most {MAX_JSON_BYTES:,})")
    try:
        text = read_bytes(path, what).decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(f"{what} {show(path)} is not UTF-8 text: {error.reason} at byte {error.start}") from None
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_int=_bounded_int)
    except json.JSONDecodeError as error:
        raise UsageError(f"{what} {show(path)} is not JSON: {error.msg} at line {error.lineno} "
                         f"column {error.colno}") from None
    except (ValueError, RecursionError) as error:
        raise UsageError(f"{what} {show(path)}: {error}") from None


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a valid JSON number")


def arch_from_json(data: Any, source: str, rank: int | None = None) -> ArchConfig:
    """The shape in ``data`` (see the module docstring); ``rank`` picks a row of a list (default: the first)."""
    if isinstance(data, list):
        rows = [row for row in data if isinstance(row, dict)]
        if not rows or len(rows) != len(data):
            raise UsageError(f"{source} holds a list, but not of `nas best`/`nas export` rows (JSON objects)")
        labels = [row["rank"] for row in rows if isinstance(row.get("rank"), int) and not isinstance(row["rank"], bool)]
        if labels:  # leaderboard rows carry their rank: --rank names one (a --top file keeps the baseline's own rank)
            rank = min(labels) if rank is None else rank
            ranked = [row for row in rows if row.get("rank") == rank and not isinstance(row.get("rank"), bool)]
            if not ranked:
                raise UsageError(f"--rank {rank} is invalid: {source} holds the rows of rank {spans(labels)}")
            if len(ranked) > 1:  # an edited or concatenated file: which of them was meant is not the tool's guess
                raise UsageError(f"{source} holds {len(ranked)} rows of rank {rank}: keep one (a `nas best --format "
                                 "json` file has one row a rank)")
            data = ranked[0]
        else:  # rows without a rank: --rank counts them
            rank = 1 if rank is None else rank
            if not 1 <= rank <= len(rows):
                raise UsageError(f"--rank {rank} is invalid: {source} holds {len(rows)} rows (ranks 1-{len(rows)})")
            data = rows[rank - 1]
    elif rank is not None and rank != 1:
        raise UsageError(f"--rank {rank} needs a list of rows, and {source} holds one shape")
    if not isinstance(data, dict):
        raise UsageError(f"{source} holds {json_kind(data)} (JSON), not an ArchConfig object or a "
                         "`nas best --format json` row")
    row = None
    if "arch" in data:  # a leaderboard or export row: the shape, plus the proxy's scores
        row, data = data, data["arch"]
        if not isinstance(data, dict):
            raise UsageError(f"{source}: its \"arch\" is {json_kind(data)} (JSON), not an ArchConfig object")
    _check_numbers(data, source)
    try:
        arch = ArchConfig.from_dict(data)
    except TypeError as error:  # a value of the wrong type deep inside
        raise UsageError(f"{source} is not an ArchConfig: {error}") from None
    except UsageError as error:  # a missing or unknown field, a head count that does not divide...
        raise UsageError(f"{source} is not an ArchConfig: {error}") from None
    if row is not None:
        _check_row_matches(row, arch, source)
    return arch


def spans(numbers: list[int]) -> str:
    """``1-40`` or ``1, 3, 7-9``: the distinct numbers, runs of consecutive ones as ranges."""
    runs: list[list[int]] = []
    for number in sorted(set(numbers)):
        if runs and runs[-1][1] == number - 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _check_row_matches(row: dict[str, Any], arch: ArchConfig, source: str) -> None:
    """A row's own columns (heads, k, d_h, ...) against its ``arch``, which is what trains: a row whose ``heads`` was
    edited and ``arch`` not trained the old shape without a word."""
    shape = {"heads": format_plateaus(arch.heads), "kv_heads": format_plateaus(arch.kv_per_layer()),
             "layers": arch.n_layers, "d_model": arch.d_model, "k": arch.ffn.k, "d_h": arch.ffn.hidden}
    for column, value in shape.items():
        said = row.get(column)
        if isinstance(said, list) and all(isinstance(h, int) and h > 0 for h in said):  # a trial's own attrs: a list
            said = format_plateaus(said)
        if said is not None and said != value:
            raise UsageError(f"{source}: the row says {column} {said!r} but its \"arch\" (what trains) has "
                             f"{value!r}: make them agree, or give the arch alone as the --config")


def _check_numbers(data: dict[str, Any], source: str) -> None:
    """Every integer field an integer (JSON ``12.0`` or ``true`` is not a layer count), every float finite."""
    for name in ("n_layers", "d_model", "vocab_size"):
        value = data.get(name)
        if name in data and (isinstance(value, bool) or not isinstance(value, int)):
            raise UsageError(f"{source}: {name}={value!r} is invalid: it must be a positive integer")
    heads = data.get("heads")
    if "heads" in data and (not isinstance(heads, list) or
                            any(isinstance(h, bool) or not isinstance(h, int) for h in heads)):
        raise UsageError(f"{source}: heads={heads!r} is invalid: give a list of head counts, one per layer")
    kv_heads = data.get("kv_heads")
    if "kv_heads" in data and (not isinstance(kv_heads, list) or
                               any(isinstance(n, bool) or not isinstance(n, int) for n in kv_heads)):
        raise UsageError(f"{source}: kv_heads={kv_heads!r} is invalid: give a list of key/value head counts, one per "
                         "layer")
    ffn = data.get("ffn")
    if "ffn" in data:
        if not isinstance(ffn, dict):
            raise UsageError(f"{source}: ffn={ffn!r} is invalid: give {{\"k\": K, \"hidden\": d_h}}")
        for name in ("k", "hidden"):
            value = ffn.get(name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise UsageError(f"{source}: ffn.{name}={value!r} is invalid: it must be a positive integer")
    for name in ("rope_theta", "norm_eps"):
        value = data.get(name)
        if name in data and (isinstance(value, bool) or not isinstance(value, (int, float))
                             or not math.isfinite(value) or value <= 0):
            raise UsageError(f"{source}: {name}={value!r} is invalid: it must be a positive number")
    tie = data.get("tie_embeddings")
    if "tie_embeddings" in data and not isinstance(tie, bool):
        raise UsageError(f"{source}: tie_embeddings={tie!r} is invalid: give true or false")


def read_arch_config(path: str | Path, rank: int | None = None, what: str = "--config") -> ArchConfig:
    """The shape in the JSON file ``path`` (see the module docstring)."""
    return arch_from_json(read_json_file(path, what), f"{what} {show(path)}", rank)
