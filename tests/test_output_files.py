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
