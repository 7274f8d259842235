"""Writes that fail leave nothing behind, and a damaged run result is named (issue 32, item 5 and "Output"). Fast:
the one place outputs are written (``nas.files.OutputFile``) and the one place a run's result is read
(``runners.full.read_result``); the command-level families are ``tests/test_hostile.py``."""

from __future__ import annotations

import errno
import os

import pytest

from nas.errors import UsageError
from nas.files import OutputFile
from runners.full import read_result


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failed_write_leaves_no_temporary_file_and_the_old_file_whole(tmp_path, monkeypatch, failing):
    target = tmp_path / "report.html"
    target.write_text("the old report")
    output = OutputFile.of(target, "--output")

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, failing, no_space)
    with pytest.raises(UsageError, match="cannot write --output .*: no space left on device"):
        output.write("the new report " * 1000)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # no <name>.tmp left behind
    assert target.read_text() == "the old report"


def test_a_write_replaces_the_file_atomically_and_keeps_its_mode(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("{}")
    target.chmod(0o640)
    OutputFile.of(target, "--output").write('{"a": 1}')
    assert target.read_text() == '{"a": 1}' and (target.stat().st_mode & 0o777) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


@pytest.mark.parametrize("content, says", [
    (b'{"val_loss": 2.', "is damaged"),
    (b"\xff\xfe not text", "is damaged"),
    (b"[1, 2]", "holds no run result"),
])
def test_a_damaged_run_result_is_one_error_naming_the_file_and_what_to_do(tmp_path, content, says):
    (tmp_path / "result.json").write_bytes(content)
    with pytest.raises(UsageError, match=says) as raised:
        read_result(tmp_path)
    message = str(raised.value)
    assert "result.json" in message and "run the same command" in message and "\n" not in message


def test_a_run_folder_without_a_result_has_none_yet(tmp_path):
    assert read_result(tmp_path) is None


def test_the_write_probe_takes_nothing_from_a_folder_holding_the_users_files_and_the_study(tmp_path):
    """Checking an output place creates and removes one file of its own (``nas.files.writable_folder``): the user's
    files and the study being read stay, byte for byte, and nothing is left beside them."""
    from nas.files import output_folder

    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "nas.db").write_bytes(b"SQLite format 3\x00" + bytes(100))
    (tmp_path / ".nas-write-probe-mine").write_text("a name like the probe's")  # not one the probe made
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    OutputFile.of(tmp_path / "report.html", "-o")
    output_folder(tmp_path / "runs", "--out")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_name_ending_in_a_slash_names_a_folder_not_a_file(tmp_path, monkeypatch):
    """`-o newdir/` (no such folder) wrote a plain file named newdir: the trailing slash was dropped unread."""
    monkeypatch.chdir(tmp_path)
    for name in ("newdir/", "newdir/.", "newdir/sub/.."):
        with pytest.raises(UsageError, match=f"-o '{name}' names a folder: give the name of a file to write"):
            OutputFile.of(name, "-o")
    assert not (tmp_path / "newdir").exists()
    with pytest.raises(UsageError, match="is a directory"):  # the current folder itself, as before
        OutputFile.of("./", "-o")


def test_nas_train_refuses_an_output_that_is_one_of_its_inputs(tmp_path, monkeypatch):
    """`nas train --data corpus.txt -o corpus.txt` replaced the training data by the result JSON; the same for its
    --config, a shard in its --data folder, and a file a --data glob reads. Refused before the training."""
    from typer.testing import CliRunner

    from nas.arch import uniform
    from nas.cli import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "arch.json").write_text(uniform(4, 32, 4, 256).to_json())
    corpus = "hello world. " * 5000
    (tmp_path / "corpus.txt").write_text(corpus)
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text(corpus)
    cases = [(["--data", "corpus.txt", "-o", "corpus.txt"], "-o 'corpus.txt' is the --data this command reads"),
             (["-o", "arch.json"], "-o 'arch.json' is the --config this command reads"),
             (["--data", "texts", "-o", "texts/result.json"], "-o 'texts/result.json' lies in the --data folder"),
             (["--data", "texts/*.txt", "-o", "texts/a.txt"], "-o 'texts/a.txt' is the --data this command reads"),
             # a new file the glob would read next time, and a run folder inside the data's folder
             (["--data", "texts/*.txt", "-o", "texts/b.txt"], "-o 'texts/b.txt' matches the --data glob"),
             (["--data", "texts", "--out", "texts/run"], "--out 'texts/run' lies in the --data folder 'texts'")]
    for args, says in cases:
        result = CliRunner().invoke(app, ["train", "--config", "arch.json", "--preset", "tiny", *args])
        assert result.exit_code == 2 and result.stderr.startswith(f"error: {says}"), (args, result.stderr)
    assert (tmp_path / "corpus.txt").read_text() == corpus and (tmp_path / "texts" / "a.txt").read_text() == corpus
    assert sorted(p.name for p in (tmp_path / "texts").iterdir()) == ["a.txt"]
