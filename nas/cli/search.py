"""``nas search``: run (or resume) an Optuna study whose trials are short proxy trainings."""

from __future__ import annotations

import shlex
import sys
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nas.cli.app import app
from nas.cli.errors import INTERRUPTED_EXIT_CODE
from nas.cli.options import Dtype, Pruner, Replicates, Sampler, StorageOpt, StudyOpt, plain
from nas.cli.space import with_space_options
from nas.errors import UsageError
from nas.study.config import DEFAULT_STORAGE, display_url, hidden_password_note
from search_spaces.factory import SpaceOptions

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial


FAILURE_WORDS = {"diverged": "diverged", "oom": "ran out of memory"}


def trained_text(trials: Sequence[FrozenTrial]) -> tuple[str, bool]:
    """The search's last line's count of trained trials (with those that failed: diverged or ran out of memory, which
    the board leaves out), and whether every one of them failed (none has a score, so there is no answer to state)."""
    from optuna.trial import TrialState

    from nas.study.records import counts

    trained = [t for t in trials if counts(t)]
    failed = Counter(str(t.user_attrs.get("status")) for t in trained if t.state == TrialState.FAIL)
    text = f"{len(trained)} trained trials"
    if not trained or sum(failed.values()) < len(trained):  # some failed: said, since the board leaves them out
        parts = ", ".join(f"{n} {FAILURE_WORDS.get(status, status)}" for status, n in sorted(failed.items()))
        return text + (f" ({parts}: recorded as failures, not on the board)" if failed else ""), False
    if len(failed) == 1:
        (status,) = failed
        return f"{text}, all {FAILURE_WORDS.get(status, status)}: no shape has a score" + (
            " (a lower --lr may train them)" if status == "diverged" else ""), True
    parts = ", ".join(f"{n} {FAILURE_WORDS.get(status, status)}" for status, n in sorted(failed.items()))
    return f"{text}, all failed ({parts}): no shape has a score", True


def _train_overrides(**values: Any) -> tuple[tuple[str, Any], ...]:
    from nas.units import parse_size

    out = []
    for name, value in values.items():
        if value is None:
            continue
        if name == "tokens":
            value = parse_size(value, "--tokens")
        out.append((name, plain(value)))
    return tuple(out)


def largest_process_mb() -> float:
    """The peak resident set of the largest process of this search: this one or a worker it waited for (what
    ``/usr/bin/time`` reports as the maximum resident set size)."""
    import resource

    unit = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    peaks = (resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return max(peaks) * unit / 2**20


def _workers(value: str) -> int | str:
    """``--workers``: ``auto`` or a whole number (range-checked by ``SearchConfig.validate``)."""
    text = value.strip()
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"--workers {value!r} is invalid: give a number of workers (1-256) or auto") from None


@app.command()
@with_space_options
def search(
    opts: SpaceOptions,
    trials: Annotated[int, typer.Option("--trials", help="Trained trials the study should hold (resumable).")] = 200,
    preset: Annotated[str, typer.Option("--preset", help="Proxy/target setup: see `nas presets`.")] = "cpu",
    data: Annotated[str, typer.Option("--data", help="builtin, a text file/dir/glob, a .npy token array, or a "
                                      "directory of llm.c .bin shards; not an SQLite database, and a new study's "
                                      "text folder may not hold its storage.")] = "builtin",
    storage: StorageOpt = DEFAULT_STORAGE,
    study_name: StudyOpt = None,
    sampler: Annotated[Sampler | None, typer.Option("--sampler", help="Proposal sampler (default tpe; nsga2 "
                                                       "with several objectives).", show_default=False)] = None,
    pruner: Annotated[Pruner, typer.Option("--pruner", help="Pruner of unpromising trials (auto: none on an "
                                           "exhaustive walk, median when sampling).")] = Pruner.auto,
    objectives: Annotated[str, typer.Option("--objectives", help="loss, loss,params, loss,tokens_per_s or "
                                            "loss,kv_cache (KV-cache bytes per token; with --kv-groups or "
                                            "--kv-schedule).")] = "loss",
    workers: Annotated[str, typer.Option("--workers", help="Worker processes on this machine, or auto: one per "
                                         "visible GPU on a GPU device (worker i on GPU i mod n, seeing only it), "
                                         "else one per core with one thread each (on 2 cores 1.20x the trials "
                                         "per minute of one 2-thread worker).")] = "auto",
    threads: Annotated[int | None, typer.Option("--threads", help="Torch threads per worker (default: the "
                                                   "usable cores / --workers). With several searches on one "
                                                   "machine, keep workers x threads <= cores.",
                                                   show_default=False)] = None,
    tokens: Annotated[str | None, typer.Option("--tokens", help="Training tokens per trial (e.g. 64k); "
                                                  "default the preset's.", show_default=False)] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help="Context length (default the preset's).",
                                                   show_default=False)] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="Sequences per step (default the "
                                                      "preset's).", show_default=False)] = None,
    lr: Annotated[float | None, typer.Option("--lr", help="Peak learning rate (default the preset's).",
                                                show_default=False)] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Base seed of init, data order and sampler.",
                                                show_default=False)] = None,
    device: Annotated[str | None, typer.Option("--device", help="auto, cpu, cuda or mps.",
                                                  show_default=False)] = None,
    dtype: Annotated[Dtype | None, typer.Option("--dtype", help="Training precision (default the preset's).",
                                                   show_default=False)] = None,
    compile: Annotated[bool | None, typer.Option("--compile/--no-compile", help="torch.compile each trial.",
                                                    show_default=False)] = None,
    replicates: Annotated[Replicates, typer.Option("--replicates", help="After an exhaustive walk: adaptive "
                                                   "(the knowledge gradient on the shrunk posterior: each seed goes "
                                                   "to the shape whose next score is expected to improve the pick "
                                                   "most), adaptive-answer (the same, the answer's comparison "
                                                   "with the baseline valued beside the pick: for a flat space), "
                                                   "race (the best shapes race the baseline on common "
                                                   "seeds, the worse dropped) or fixed (seeds for --replicate-top "
                                                   "shapes).")]
    = Replicates.adaptive,
    race_size: Annotated[int, typer.Option("--race-size", help="race: how many of the first pass's best shapes "
                                           "race the baseline (a resumed study keeps its own).")] = 8,
    replicate_top: Annotated[int, typer.Option("--replicate-top", help="fixed: seed replicates go to the "
                                               "baseline and this many best shapes (a resumed study keeps its "
                                               "own).")] = 4,
    heartbeat: Annotated[int, typer.Option("--heartbeat", help="Seconds between trial heartbeats; a trial "
                                           "silent for 3x this is failed and re-queued.")] = 10,
) -> None:
    """Run (or resume) an Optuna study whose trials are short proxy trainings of shapes from the space."""
    from nas.study.config import SearchConfig, precheck

    config = SearchConfig(
        space=opts, preset=preset, data=data, storage=storage, study_name=study_name, trials=trials,
        sampler=plain(sampler), pruner=plain(pruner),
        objectives=tuple(o.strip() for o in objectives.split(",") if o.strip()),
        workers=_workers(workers), replicates=plain(replicates), race_size=race_size, replicate_top=replicate_top,
        heartbeat_interval=heartbeat,
        train_overrides=_train_overrides(tokens=tokens, seq_len=seq_len, batch_size=batch_size, lr=lr,
                                         seed=seed, device=device, dtype=dtype, compile=compile, threads=threads))
    precheck(config)  # before torch is imported: a mistyped option is reported at once
    from nas.cli.progress import Progress
    from nas.study.parallel import run_search
    from nas.study.signals import interruptible, raise_if_stopped
    from nas.study.storage_faults import first_line, storage_failure
    from nas.study.worker import SearchAborted
    from reports.dashboard_note import NoteRefresher

    raise_if_stopped()  # a stop since `nas` started (nas.cli.main) whose exception an import swallowed
    interruptible()
    try:
        progress = Progress()
        result = run_search(config, on_event=progress, on_start=progress.start, note=NoteRefresher())
    except SearchAborted as error:
        typer.echo(f"error: search stopped: {error}", err=True)
        raise typer.Exit(1) from None
    except Exception as error:
        failure = storage_failure(error)
        if failure is None:
            raise
        typer.echo(f"error: search stopped: storage {display_url(storage)!r} failed: {first_line(failure)}; "
                   "run the same command to resume once the cause is fixed", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.echo("interrupted: re-run the same command to resume; a trial that was running is trained again with "
                   "its shape and seed", err=True)
        raise typer.Exit(INTERRUPTED_EXIT_CODE) from None
    for note in result.notes[progress.notes_shown:]:
        typer.echo(f"warning: {note}", err=True)
    from reports.frame import read_study
    from reports.summary import summarise

    name, shown = shlex.quote(result.config.study_name), shlex.quote(display_url(storage))
    trained, all_failed = trained_text(result.study.get_trials(deepcopy=False))
    memory = f" (peak memory {largest_process_mb():.0f} MB, the largest of its processes)"
    answer = ""
    if not all_failed:  # a study without a score has no answer to state
        summary = summarise(read_study(result.study))
        answer = f" {summary.sentence}" + (f" {summary.rules_text}" if summary.rules_text else "")
    typer.echo(f"done: study {result.config.study_name!r} holds {trained}{memory}.{answer} Next: nas best "
               f"--study-name {name} --storage {shown}; nas rules --study-name {name} --storage {shown}; "
               f"nas report --study-name {name} --storage {shown} -o report.html{hidden_password_note(storage)}",
               err=True)
