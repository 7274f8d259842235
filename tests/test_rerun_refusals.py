"""A re-run that cannot start does not start (issue 52, family 4): ``nas rerun`` checks what its runs need (the
preset's device, dtype and compiler) before it writes anything: one line, exit 2, no run folder, no re-run study in
the storage, no child launched. Fast: a study made without training (``benchmarks.synthetic_studies``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import optuna
import pytest
import torch
from typer.testing import CliRunner

from benchmarks.synthetic_studies import SyntheticSpec, synthetic_study
from nas.cli import app


@pytest.fixture
def study(tmp_path) -> str:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{tmp_path / 'nas.db'}"
    synthetic_study(SyntheticSpec(space="prism", preset="tiny", trials=6), storage=storage, name="proxy")
    return storage


def refused(storage: str, tmp_path: Path, *args: str) -> str:
    """Run ``nas rerun``; assert it is one line, exit 2, and wrote nothing; return the line."""
    before = hashlib.sha256((tmp_path / "nas.db").read_bytes()).hexdigest()
    result = CliRunner().invoke(app, ["rerun", "--storage", storage, "--runs", str(tmp_path / "runs"), *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert not (tmp_path / "runs").exists()
    assert hashlib.sha256((tmp_path / "nas.db").read_bytes()).hexdigest() == before
    assert optuna.get_all_study_names(storage) == ["proxy"]  # no re-run study was added
    return lines[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("args, says", [
    (["--preset", "gpu-prism"], "preset gpu-prism: this machine has no 'cuda' device: run it where there is one, or "
                                "give --device cpu (or auto)"),
    (["--preset", "tiny", "--device", "cuda:1"], "--device cuda:1: this machine has no 'cuda:1' device"),
])
def test_a_preset_whose_device_this_machine_lacks_is_refused_before_anything_is_written(study, tmp_path, args, says):
    """It created the run folder and a ``proxy:rerun:gpu-prism`` study, launched the child, then pointed at a
    log.jsonl that did not exist and said to re-run the same command."""
    assert says in refused(study, tmp_path, *args)


@pytest.mark.parametrize("args, says", [
    (["--micro-batch", "3"], "--micro-batch 3 is invalid: it must divide the 4 sequences the one process takes per "
                             "step"),
    (["--micro-batch", "4", "--nproc", "2"], "--micro-batch 4 is invalid: it must divide the 2 sequences each of the 2 "
                                             "processes takes per step"),
])
def test_a_micro_batch_that_does_not_split_the_batch_is_refused_before_anything_is_written(study, tmp_path, args,
                                                                                          says):
    """Each run's process refused it, after the re-run had made its folder and its study, and the re-run then said
    to run the same command again."""
    assert says in refused(study, tmp_path, "--preset", "tiny", *args)


def test_data_too_small_for_one_batch_is_refused_before_anything_is_written(study, tmp_path):
    """1,200 bytes of text (60 validation tokens): the first run's process refused it, after its folder was made,
    in two error lines; nas search refuses the same data in one line before it touches the storage."""
    small = tmp_path / "small.txt"
    small.write_text("hello world " * 100)
    line = refused(study, tmp_path, "--preset", "tiny", "--data", str(small))
    assert "validation tokens; one batch of 4x32 needs 129" in line, line


def test_a_compiled_run_without_the_compiler_it_needs_is_refused(study, tmp_path, monkeypatch):
    import torch._inductor.config as inductor

    monkeypatch.setattr(inductor.cpp, "cxx", ("no-such-c++-compiler",))
    line = refused(study, tmp_path, "--preset", "tiny", "--device", "cpu", "--compile")
    assert "--device cpu: torch.compile needs a C++ compiler (g++ or clang++, or $CXX) on this machine" in line
    assert line.endswith("give --no-compile")


def test_a_run_that_stopped_points_at_its_log_only_where_there_is_one_and_a_refusal_is_not_resumed(tmp_path):
    from nas.cli.rerun import stopped

    assert stopped("[1/2] baseline", 2, tmp_path) == ("[1/2] baseline: nas train refused it (exit code 2, the line "
                                                      "above says why); fix that, then run the same command")
    assert stopped("[1/2] baseline", 1, tmp_path) == "[1/2] baseline stopped with exit code 1; run the same command " \
                                                     "to resume it"
    (tmp_path / "log.jsonl").write_text("{}\n")
    assert f"exit code 1; see {tmp_path / 'log.jsonl'}; run" in stopped("[1/2] baseline", 1, tmp_path)


def test_a_shape_the_machine_cannot_train_at_the_target_is_refused_before_anything_is_written(study, tmp_path,
                                                                                           monkeypatch):
    """The run would refuse it too (``runners.memory``), after the re-run had made its folder and its study."""
    import runners.memory

    monkeypatch.setattr(runners.memory, "available_bytes", lambda device: (10**6, "this machine has available"))
    line = refused(study, tmp_path, "--preset", "tiny", "--nproc", "2")
    assert "preset tiny: training rank " in line and " x 2 processes (" in line
    assert line.endswith("but this machine has available 1.0 MB: give a smaller shape")


def last_line_error(result) -> str:
    """The refusal that ends a re-run's output (after its progress lines), and no traceback."""
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    line = result.stderr.splitlines()[-1]
    assert line.startswith("error: "), result.stderr
    return line


def test_a_run_folder_whose_arch_json_was_edited_is_refused_not_trained_under_the_planned_shape(study, tmp_path,
                                                                                               monkeypatch):
    """The re-run passed an existing ``arch.json`` to ``nas train`` unchecked and recorded what it trained under the
    planned shape: a file edited by hand trained one shape and stored it as another."""
    import nas.rerun.launch

    launched: list[list[str]] = []

    class StoppedChild:  # a child that stops at once, as an interrupted run does: its folder stays for a resume
        def __init__(self, command: list[str], **_: object) -> None:
            launched.append(command)

        def wait(self) -> int:
            return 1

    monkeypatch.setattr(nas.rerun.launch.subprocess, "Popen", StoppedChild)
    args = ["rerun", "--storage", study, "--runs", str(tmp_path / "runs"), "--preset", "tiny", "--top", "1"]
    first = CliRunner().invoke(app, args)
    assert "stopped with exit code 1" in first.stderr and len(launched) == 1, first.output
    (config,) = (tmp_path / "runs").rglob("arch.json")
    planned = json.loads(config.read_text())
    config.write_text(json.dumps({**planned, "heads": [2, 2, 4, 4]}))
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 2 and len(launched) == 1, again.output  # nothing launched the second time
    line = last_line_error(again)
    assert f"run folder '{config.parent}' holds arch.json of h=2x2,4x2 K1x88 d32 L4, not the planned shape " \
           "h=4x4 K1x88 d32 L4: edited or replaced by hand? Delete the folder to train the planned shape again" in line
    config.write_text("{not json")
    assert "holds an arch.json that cannot be read (" in last_line_error(CliRunner().invoke(app, args))
    config.write_text(json.dumps(planned))  # the file as the re-run wrote it: the run goes on
    CliRunner().invoke(app, args)
    assert len(launched) == 2
