"""``nas.study.storage``: one-transaction attribute writes (same values as Optuna's API), trials that never beat, and
readers that leave no file beside the study (``nas.study.sqlite_file.release_readers``)."""

from __future__ import annotations

import hashlib
import math
import os
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from typer.testing import CliRunner

from nas.cli import app
from nas.study.optuna_internals import unbeaten_trial_ids
from nas.study.sqlite_file import remove_empty_log, side_files
from nas.study.storage import make_storage, write_user_attrs

ATTRS = {"key": "h=4x4", "seed": 3, "curve": [[1, 2.5], [2, None]], "arch": {"heads": [1, 2], "k": 4},
         "val_loss": 2.75, "reason": None, "unicode": "Δ h_l ≤ h_{l+1}"}


def _check_batched_write(url: str) -> None:
    storage = make_storage(url)
    study = optuna.create_study(storage=storage, study_name="attrs")
    trial = study.ask()
    write_user_attrs(storage, trial, ATTRS)
    assert study.get_trials()[0].user_attrs == ATTRS  # what the storage holds now
    write_user_attrs(storage, trial, {"seed": 4, "extra": 1.5})  # overwrites one, adds one
    study.tell(trial, 1.0)
    reference = study.ask()
    for key, value in {**ATTRS, "seed": 4, "extra": 1.5}.items():
        reference.set_user_attr(key, value)
    study.tell(reference, 1.0)
    # a fresh process's view: read back through a new storage object
    stored = optuna.load_study(study_name="attrs", storage=make_storage(url)).get_trials()
    assert stored[0].user_attrs == stored[1].user_attrs == {**ATTRS, "seed": 4, "extra": 1.5}
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):  # a finished trial stays as told
        write_user_attrs(storage, trial, {"late": True})
    assert "late" not in optuna.load_study(study_name="attrs", storage=make_storage(url)).trials[0].user_attrs


def test_batched_attributes_read_back_as_optunas_own_on_sqlite(tmp_path):
    _check_batched_write(f"sqlite:///{tmp_path / 'attrs.db'}")


@pytest.mark.slow
def test_batched_attributes_read_back_as_optunas_own_on_postgresql(postgres_url):
    _check_batched_write(postgres_url)


def test_other_storages_take_optunas_per_key_api():
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage)
    trial = study.ask()
    write_user_attrs(storage, trial, {"a": 1, "b": [math.pi]})
    study.tell(trial, 0.0)
    assert study.trials[0].user_attrs == {"a": 1, "b": [math.pi]}
    assert study.trials[0].state == TrialState.COMPLETE


def _check_unbeaten(url: str) -> None:
    storage = make_storage(url, heartbeat_interval=1)
    study = optuna.create_study(storage=storage, study_name="beats")
    study_id = storage.get_study_id_from_name("beats")
    silent, beating, done = study.ask(), study.ask(), study.ask()
    storage.record_heartbeat(beating._trial_id)
    study.tell(done, 1.0)
    assert unbeaten_trial_ids(storage, study_id, older_than_s=60) == []  # too young to call abandoned
    time.sleep(1.2)
    # not the beating one, not the finished one
    assert unbeaten_trial_ids(storage, study_id, older_than_s=1) == [silent._trial_id]


def test_trials_that_never_beat_are_found_once_old_enough_on_sqlite(tmp_path):
    _check_unbeaten(f"sqlite:///{tmp_path / 'beats.db'}")


@pytest.mark.slow
def test_trials_that_never_beat_are_found_once_old_enough_on_postgresql(postgres_url):
    _check_unbeaten(postgres_url)


# ----------------------------------------------------------------- readers leave no file beside the study
def _wal_study(url: str) -> Path:
    """The copied study's path, checked to be in write-ahead-log mode (the mode a search leaves it in), with no side
    file beside it yet."""
    path = Path(url.removeprefix("sqlite:///"))
    with closing(sqlite3.connect(path)) as connection:
        assert connection.execute("PRAGMA journal_mode=wal").fetchone()[0] == "wal"
    assert not any(side.exists() for side in side_files(path))  # the last connection's close removed them
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("args", [["studies"], ["best"], ["report", "-o", "r.html"], ["export", "-o", "t.csv"],
                                  ["rules", "--rules", "log2_first_heads"], ["best", "--study-name", "missing"]])
def test_a_read_command_leaves_no_file_beside_the_study_and_its_bytes_as_they_were(tiny_study, tmp_path, args,
                                                                                   monkeypatch):
    """A reader of a WAL database makes SQLite's -wal and -shm and cannot remove them (read-only): they were left
    beside the study after every `nas best` (32 KB and an empty log) until the command removed them itself; a
    refused read (a study that is not there) too."""
    path = _wal_study(tiny_study)
    before, mtime = _digest(path), path.stat().st_mtime_ns
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == (2 if "missing" in args else 0), result.output  # the readers did read
    assert "Traceback" not in result.output
    assert not [side.name for side in side_files(path) if side.exists()], args
    assert _digest(path) == before and path.stat().st_mtime_ns == mtime


def test_a_study_read_through_a_symbolic_link_leaves_no_file_beside_the_file_it_names(tiny_study, tmp_path,
                                                                                       monkeypatch):
    """SQLite follows the link and puts its side files beside the file the link names, where they were left."""
    path = _wal_study(tiny_study)
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "elsewhere" / "link.db"
    link.symlink_to(path)
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(app, ["best", "--storage", f"sqlite:///{link}"]).exit_code == 0
    assert sorted(p.name for p in tmp_path.rglob("*") if p.name.endswith(("-wal", "-shm"))) == []


SEARCH_HOLDING = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('SELECT count(*) FROM trials')"
                  ".fetchone(); print('open', flush=True); sys.stdin.readline(); "
                  "c.execute('CREATE TABLE still_writing (x)'); c.commit(); c.close(); print('closed', flush=True)")


def test_a_reader_leaves_the_log_of_a_search_that_has_the_study_open(tiny_study, tmp_path, monkeypatch):
    """While another process has the file open (a search), its -wal and -shm are SQLite's and stay: the reader did
    not make them, and even asked to, SQLite deletes nothing while the file has another connection."""
    path = _wal_study(tiny_study)
    search = subprocess.Popen([sys.executable, "-c", SEARCH_HOLDING, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert search.stdout.readline().strip() == "open"  # it has read: the log is open
        assert all(side.exists() for side in side_files(path))
        monkeypatch.chdir(tmp_path)
        assert CliRunner().invoke(app, ["best"]).exit_code == 0
        assert all(side.exists() for side in side_files(path))
        remove_empty_log(path)
        assert all(side.exists() for side in side_files(path))
        search.stdin.write("go on\n")
        search.stdin.flush()
        assert search.stdout.readline().strip() == "closed"  # the search wrote on, then closed
    finally:
        search.kill()
        search.wait()
    assert not any(side.exists() for side in side_files(path))  # the search's own last close removed them
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as reader:
        assert reader.execute("SELECT count(*) FROM sqlite_master WHERE name = 'still_writing'").fetchone()[0] == 1


def test_a_log_with_frames_left_by_a_killed_writer_is_left_to_the_writers(tiny_study):
    """A writer killed before its close leaves committed frames in the log: removing them is a checkpoint, a write
    to the database, so a reader leaves the log (the next search's open recovers it)."""
    path = _wal_study(tiny_study)
    killed = ("import os, sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_autocheckpoint=0'); "
              "c.execute('CREATE TABLE written (x)'); c.commit(); os._exit(0)")
    subprocess.run([sys.executable, "-c", killed, str(path)], check=True)
    wal = side_files(path)[0]
    size, before = wal.stat().st_size, _digest(path)
    assert size > 0
    remove_empty_log(path)
    assert wal.stat().st_size == size and _digest(path) == before


def test_a_library_reader_leaves_no_file_at_exit(tiny_study):
    """Through the library (a notebook reading a study) the side files go when the interpreter exits."""
    path = _wal_study(tiny_study)
    code = ("import sys; from nas.study.existing import load_existing_study; "
            "print(len(load_existing_study(sys.argv[1], None).trials))")
    done = subprocess.run([sys.executable, "-c", code, tiny_study], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert done.returncode == 0 and int(done.stdout) > 0, done.stderr
    assert not any(side.exists() for side in side_files(path))


def test_a_study_read_through_a_link_to_a_name_no_uri_can_hold_ends_without_a_traceback(tiny_study, tmp_path,
                                                                                     monkeypatch):
    """The link's own name is UTF-8 (what prism-nas asks of a stored name); the file it names is not: SQLite puts the
    side files beside that file, and the clean-up cannot name it in a URI: it leaves them, in silence."""
    path = _wal_study(tiny_study)
    odd = tmp_path / os.fsdecode(b"\xffstudy.db")
    path.rename(odd)
    (tmp_path / "link.db").symlink_to(odd)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["best", "--storage", "sqlite:///link.db"])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
