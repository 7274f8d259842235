"""``nas export --format hf|llama``: which shape and which weights, then ``nas.hf.export`` writes the directory.

The sources, as the command line combines them:

- ``--study-name S`` alone: the study row ``--rank N`` (default the answer's pick, rank 1 except after a race; or
  ``baseline``), freshly initialised;
- ``--checkpoint RUN`` alone: the run's trained weights and shape, with no study on the card;
- both: the run's weights, and the study row of its shape: the row of the same shape, or the row a
  ``nas rerun`` carried to it (its re-run records the proxy shape); ``--rank N`` must be that row.

A rank the study does not hold, or a checkpoint of another shape, is one ``UsageError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from nas.errors import UsageError
from nas.files import show, user_path

if TYPE_CHECKING:
    from nas.hf.run import TrainedRun
    from reports.frame import StudyData

DEFAULT_CONTEXT = 2048  # max_position_embeddings when neither a run nor a study says


def _rerun_sources(store: Any, study: str, key: str) -> set[str]:
    """The proxy shapes of ``study`` that ``nas rerun`` carried to the shape ``key``."""
    from reports.reruns import read_reruns

    reruns = read_reruns(store, study)
    if reruns is None:
        return set()
    return {str(k) for k in reruns.loc[reruns["key"] == key, "proxy_key"]}


def pick_row(data: StudyData, rows: list[dict[str, Any]], rank: int | str | None, run: TrainedRun | None,
             store: Any = None) -> dict[str, Any]:
    """The study row to export (see the module docstring); ``rank`` is a rank or ``"baseline"``."""
    if not rows:
        raise UsageError(f"study {data.name!r} has no completed training yet: no shape to export")
    by_rank: dict[int | str, dict[str, Any]] = {r["rank"]: r for r in rows}
    by_rank.update(("baseline", r) for r in rows if r["is_baseline"])
    if rank is not None and rank not in by_rank:
        held = f"its leaderboard ranks 1 to {max(r['rank'] for r in rows)}"
        raise UsageError(f"--rank {rank} is not a row of study {data.name!r}: " + (
            held if rank != "baseline" else "it has no completed baseline"))
    if run is None:  # by default the answer's pick: after a race it need not be rank 1 (the board's shrunk order)
        return by_rank[rank] if rank is not None else next((r for r in rows if r["is_answer_pick"]), by_rank[1])
    sources = {run.key} | (_rerun_sources(store, data.name, run.key) if store is not None else set())
    if rank is not None:
        row = by_rank[rank]
        if row["key"] not in sources:
            raise UsageError(f"--checkpoint {str(run.path)!r} trains {run.key}, not the shape of row {rank} of "
                             f"study {data.name!r} ({row['key']}) nor a re-run of it")
        return row
    matching = [r for r in rows if r["key"] in sources]
    if not matching:
        raise UsageError(f"--checkpoint {str(run.path)!r} trains {run.key}, which is not a shape of study "
                         f"{data.name!r} nor a re-run of one")
    return matching[0]


def parse_rank(text: str | None) -> int | str | None:
    """``--rank``: a rank from 1, or ``baseline``."""
    if text is None or text == "baseline":
        return text
    if not (text.strip().isascii() and text.strip().isdigit()) or int(text) < 1:  # '²' is a digit int() refuses
        raise UsageError(f"--rank {text!r} is invalid: give a rank (1 = the best) or baseline")
    return int(text)


def export_model_dir(study_name: str | None, storage: str, rank_text: str | None, checkpoint_text: str | None,
                     output_text: str | None, fmt: str, force: bool) -> None:
    """``nas export --format hf|llama``: resolve the shape and weights, write ``-o DIR``, say what was written."""
    if output_text is None or output_text == "-":
        raise UsageError(f"--format {fmt} writes a model directory: give -o DIR")
    output = user_path(output_text, "-o")
    checkpoint = user_path(checkpoint_text, "--checkpoint") if checkpoint_text is not None else None
    rank = parse_rank(rank_text)
    from nas.arch import ArchConfig
    from nas.hf.card import Provenance
    from nas.hf.export import write_model_dir
    from nas.hf.run import read_run
    from nas.hf.target import check_target

    reads = [checkpoint] if checkpoint is not None else []
    reads_study = study_name is not None or checkpoint is None or rank is not None  # --rank reads the only study
    if reads_study:
        from nas.study.storage import storage_file

        reads += [path for path in (storage_file(storage),) if path is not None]
    check_target(output, force, reads)  # before any reading: a refused target costs nothing
    run = read_run(checkpoint) if checkpoint is not None else None
    row, data_name, context = None, None, DEFAULT_CONTEXT
    if reads_study:  # --rank reads a study: the named or the only one
        from nas.cli.skipped import warn_skipped
        from nas.study.existing import open_existing_study
        from reports.export import export_rows
        from reports.frame import read_study

        study, store = open_existing_study(storage, study_name)
        data = read_study(study)
        warn_skipped(data)
        row = pick_row(data, export_rows(data, len(data.board)), rank, run, store)
        data_name = data.data
        context = int((data.identity.get("train") or {}).get("seq_len") or DEFAULT_CONTEXT)
    if run is not None:
        arch = run.arch
        if arch is None and row is not None and row["key"] == run.key:
            arch = ArchConfig.from_dict(row["arch"])
        if arch is None:
            raise UsageError(f"--checkpoint {str(run.path)!r} has no arch.json or result.json beside it (an "
                             "unfinished `nas train --out` run): give --study-name of the study whose shape it "
                             "trains, or save that shape (the --config given to nas train) there as arch.json")
        context = run.context
    else:
        assert row is not None
        arch = ArchConfig.from_dict(row["arch"])
    provenance = Provenance(row=row, run=run.info if run else None, data=None if run else data_name)
    done = write_model_dir(arch, output, fmt, provenance, weights=run.weights if run else None, context=context,
                           force=force, reads=reads)
    weights = f"trained weights of {show(run.path)} (step {run.info['step']})" if run else "freshly initialised weights"
    what = "PrismForCausalLM, load with trust_remote_code=True" if done.layout == "prism" else "LlamaForCausalLM"
    origin = f", row {row['rank']} of study {row['study']!r}" if row else ""
    kept = f"; kept {', '.join(done.kept)} (not written by an export)" if done.kept else ""
    typer.echo(f"wrote {show(done.path)} ({arch.label()}{origin}; {what}; {weights}): {', '.join(done.files)}{kept}",
               err=True)
