"""The lock beside an SQLite study that tells a starting search whether any search of the file is alive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from nas.study.liveness import alone, lease, lock_path


def sqlite_url(path) -> str:
    return f"sqlite:///{path}"


def test_the_lock_lies_beside_the_database_and_a_server_has_none(tmp_path):
    assert lock_path(sqlite_url(tmp_path / "nas.db")) == tmp_path.resolve() / "nas.db-searches"
    assert lock_path("postgresql://user:secret@localhost:5432/nas") is None
    with lease("postgresql://user:secret@localhost:5432/nas") as held:
        assert not held.held
    with alone("postgresql://user:secret@localhost:5432/nas") as only:
        assert not only  # a server's workers cannot be seen from here: never a shortcut


def test_one_database_named_through_a_link_has_one_lock(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link.db").symlink_to(tmp_path / "real" / "nas.db")
    (tmp_path / "linked-folder").symlink_to(tmp_path / "real")
    paths = [tmp_path / "real" / "nas.db", tmp_path / "link.db", tmp_path / "linked-folder" / "nas.db"]
    assert {lock_path(sqlite_url(path)) for path in paths} == {tmp_path.resolve() / "real" / "nas.db-searches"}
    with lease(sqlite_url(paths[1])), alone(sqlite_url(paths[2])) as only:
        assert not only


def test_a_starting_search_is_alone_only_while_no_lease_is_held(tmp_path):
    url = sqlite_url(tmp_path / "nas.db")
    with alone(url) as only:
        assert only
    with lease(url) as held:
        assert held.held
        with alone(url) as only:
            assert not only
        with lease(url) as second:  # workers share the lock
            assert second.held
    with alone(url) as only:
        assert only


def test_a_killed_workers_lease_ends_with_it(tmp_path):
    url = sqlite_url(tmp_path / "nas.db")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom nas.study.liveness import Lease\n"
        f"held = Lease({url!r})\nprint(held.held, flush=True)\ntime.sleep(600)")],
        stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        assert holder.stdout.readline().strip() == "True"
        with alone(url) as only:
            assert not only
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    with alone(url) as only:
        assert only  # the kernel released it: nothing of the dead process blocks the next search


def test_a_lock_file_that_cannot_be_opened_leaves_the_search_as_before(tmp_path):
    (tmp_path / "a-file").write_text("")
    url = sqlite_url(tmp_path / "a-file" / "nas.db")  # no lock file can be made or opened there (as on a full or
    with lease(url) as held:  # read-only file system)
        assert not held.held
    with alone(url) as only:
        assert not only  # no lock, so no knowledge: the heartbeat checks alone, as before


@pytest.mark.parametrize("make", [os.mkfifo, os.mkdir], ids=["fifo", "folder"])
def test_something_else_where_the_lock_file_would_be_is_not_locked_and_never_blocks(tmp_path, make):
    url = sqlite_url(tmp_path / "nas.db")
    make(lock_path(url))  # a FIFO opened for reading would wait for a writer
    with lease(url) as held:
        assert not held.held
    with alone(url) as only:
        assert not only


def test_without_flock_there_is_no_lease_and_no_shortcut(tmp_path, monkeypatch):
    import nas.study.liveness

    monkeypatch.setattr(nas.study.liveness, "fcntl", None)  # as on Windows
    url = sqlite_url(tmp_path / "nas.db")
    with lease(url) as held:
        assert not held.held
    with alone(url) as only:
        assert not only
    assert not lock_path(url).exists()


def test_the_lock_file_is_readable_by_every_user_whatever_the_umask(tmp_path):
    url = sqlite_url(tmp_path / "nas.db")
    previous = os.umask(0o077)
    try:
        with lease(url) as held:
            assert held.held
    finally:
        os.umask(previous)
    assert lock_path(url).stat().st_mode & 0o777 == 0o644  # another user's worker opens it read-only and locks it
    lock_path(url).chmod(0o444)
    with lease(url) as held, alone(url) as only:  # a read-only file takes both kinds of lock
        assert held.held and not only
