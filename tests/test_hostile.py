"""What a careless or hostile user gives: paths the OS refuses, damaged storages, output targets that must not be
replaced, closed standard output, data through loops of links. Each family is generated (hypothesis) over every
command it reaches: one line on stderr, exit 2 for the user's input (1 for a standard output that is closed or
full), no traceback, and nothing written where it should not be.

Paths are checked in one place (``nas.files``), storages are opened in one place (``nas.study.storage.make_storage``
and ``nas.study.sqlite_file``), outputs are written in one place (``nas.files.OutputFile``): these tests call the
commands, not those functions, so a command that bypasses them fails here.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
import subprocess
from contextlib import closing
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from search_helpers import NAS, nas_env
from typer.testing import CliRunner

from benchmarks.synthetic_studies import SyntheticSpec, synthetic_study
from nas.arch import uniform
from nas.cli import app

pytestmark = pytest.mark.slow

HOSTILE = settings(max_examples=40, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
INVALID_UTF8 = "bad\udcffname"  # what Python makes of a command-line byte 0xff (surrogateescape)


def digest(path: Path) -> str:
    """The file's sha256 (a file over 64 MB, such as a sparse one, by its size and mtime; an SQLite database
    SQLite can read by the sha256 of its SQL dump)."""
    if not path.is_file():
        return "missing"
    info = path.stat()
    if info.st_size > 64 * 2**20:
        return f"{info.st_size}:{info.st_mtime_ns}"
    content = path.read_bytes()
    if content.startswith(b"SQLite format 3\0"):
        # a database: what it holds, read without writing (mode=ro), since closing the last connection
        # of any process (the refused command's, or this test's own in-process search's) may checkpoint the log
        # into the file: SQLite moving committed pages, not a write of the command's
        dump = sql_dump(path)
        if dump is not None:
            return "sql:" + hashlib.sha256(dump.encode()).hexdigest()
    return hashlib.sha256(content).hexdigest()


def sql_dump(path: Path) -> str | None:
    """The database's SQL text, read without writing (mode=ro); None when SQLite cannot read it (damaged, or in a
    folder it cannot use)."""
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as connection:
            return "\n".join(connection.iterdump())
    except sqlite3.Error:
        return None


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> Path:
    """A folder with a valid study, a shape file, and every kind of bad path a family draws from."""
    root = tmp_path_factory.mktemp("hostile")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    synthetic_study(SyntheticSpec(space="prism", preset="tiny", trials=6), storage=f"sqlite:///{root / 'study.db'}",
                    name="tiny")
    (root / "arch.json").write_text(uniform(4, 32, 4, 256).to_json())
    (root / "text.txt").write_text("hello, this is not a database\n" * 10)
    (root / "empty.db").write_bytes(b"")
    other = sqlite3.connect(root / "other.db")
    other.execute("CREATE TABLE invoices (id INTEGER, total REAL)")
    other.commit()
    other.close()
    good = (root / "study.db").read_bytes()
    (root / "truncated.db").write_bytes(good[: len(good) // 3])
    damaged = bytearray(good)
    damaged[4096:6144] = b"\xa5" * 2048  # a page of the database overwritten
    (root / "damaged.db").write_bytes(bytes(damaged))
    newer = root / "newer.db"
    newer.write_bytes(good)
    with sqlite3.connect(newer) as db:
        db.execute("UPDATE alembic_version SET version_num = 'v9.9.9.z'")
        db.execute("UPDATE version_info SET library_version = '9.1.0'")
    (root / "link.db").symlink_to("study.db")
    os.mkfifo(root / "fifo")
    os.mknod(root / "chardev", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of our own
    (root / "folder").mkdir()
    (root / "readonly.json").write_text("[]\n")
    (root / "readonly.json").chmod(0o444)
    return root


def snapshot(root: Path) -> dict[str, str]:
    """Every file's digest (FIFOs and devices by their kind): what no refused command may change."""
    found = {}
    for path in sorted(root.rglob("*")):
        mode = path.lstat().st_mode
        if path.name.endswith("-shm"):  # SQLite's shared-memory index: every reader's visit writes its read marks
            found[str(path.relative_to(root))] = "present"
            continue
        found[str(path.relative_to(root))] = digest(path) if stat.S_ISREG(mode) else stat.filemode(mode)
    return found


def refused(place: Path, args: list[str], code: int = 2) -> str:
    """Run ``nas args`` in ``place``: one ``error:`` line, exit ``code``, no traceback, every file as it was."""
    before = snapshot(place)
    cwd = os.getcwd()
    os.chdir(place)
    try:
        result = CliRunner().invoke(app, args)
    finally:
        os.chdir(cwd)
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception))
    lines = result.stderr.splitlines()
    assert result.exit_code == code and len(lines) == 1 and lines[0].startswith("error: "), (args, result.output)
    assert "Traceback" not in result.output, args
    after = snapshot(place)
    assert after == before, (args, {k: (before.get(k), after.get(k)) for k in set(before) | set(after)
                                    if before.get(k) != after.get(k)})
    return lines[0]


# ----------------------------------------------------------------- paths the OS refuses, on every command
BAD_INPUT_PATHS = {
    "long name": "x" * 300 + ".json", "unknown user": "~nosuchuser4242/x.json", "invalid utf-8": INVALID_UTF8,
    "fifo": "fifo", "device": "chardev", "folder": "folder", "missing": "missing/nothing.json",
    "inside a file": "text.txt/x.json",
}
INPUT_COMMANDS = {
    "train --config": lambda p: ["train", "--config", p, "--preset", "tiny", "--tokens", "256"],
    "space show --config": lambda p: ["space", "show", "--config", p, "--layers", "4", "--d-model", "32", "--heads",
                                      "4"],
    "search --data": lambda p: ["search", "--preset", "tiny", "--trials", "1", "--data", p, "--storage",
                                "sqlite:///new.db"],
    "train --data": lambda p: ["train", "--config", "arch.json", "--preset", "tiny", "--tokens", "256", "--data", p],
    "best --storage": lambda p: ["best", "--storage", f"sqlite:///{p}"],
    "search --storage": lambda p: ["search", "--preset", "tiny", "--trials", "1", "--storage", f"sqlite:///{p}"],
}


@HOSTILE
@given(family=st.sampled_from(sorted(BAD_INPUT_PATHS)), command=st.sampled_from(sorted(INPUT_COMMANDS)))
def test_a_path_the_os_refuses_is_one_line_on_every_command(place, family, command):
    path = BAD_INPUT_PATHS[family]
    if family == "folder" and command.endswith("--data"):
        return  # a folder of text is valid data
    if family == "missing" and command == "search --storage":
        return  # a missing SQLite file in a missing folder: refused, but covered by the output family
    refused(place, INPUT_COMMANDS[command](path))


# ----------------------------------------------------------------- storages that are no storage
BAD_STORAGES = {
    "text file": "sqlite:///text.txt", "truncated": "sqlite:///truncated.db", "damaged": "sqlite:///damaged.db",
    "another program's": "sqlite:///other.db", "newer optuna": "sqlite:///newer.db",
    "bad timeout": "sqlite:///study.db?timeout=abc", "unknown option": "sqlite:///study.db?mode=rw",
    "file url": "file:///tmp/x.db", "sqlite file uri": "sqlite:///file:study.db", "fifo": "sqlite:///fifo",
    "device": "sqlite:///chardev", "folder": "sqlite:///folder",
    # named as a file kept beside a study: a search wrote a new database into the study's write-ahead log
    "its log": "sqlite:///study.db-wal", "its log's index": "sqlite:///study.db-shm",
    "its journal": "sqlite:///study.db-journal", "its search lock": "sqlite:///study.db-searches",
}
STORAGE_COMMANDS = {
    "studies": lambda s: ["studies", "--storage", s], "best": lambda s: ["best", "--storage", s],
    "export": lambda s: ["export", "--storage", s], "report": lambda s: ["report", "--storage", s, "-o", "r.html"],
    "search": lambda s: ["search", "--preset", "tiny", "--trials", "1", "--storage", s],
    "rerun": lambda s: ["rerun", "--preset", "tiny", "--storage", s, "--runs", "runs"],
    "dashboard": lambda s: ["dashboard", "--storage", s, "--port", "1"],
}


@HOSTILE
@given(family=st.sampled_from(sorted(BAD_STORAGES)), command=st.sampled_from(sorted(STORAGE_COMMANDS)))
def test_a_storage_that_is_no_storage_is_one_line_and_left_as_it_was(place, family, command):
    line = refused(place, STORAGE_COMMANDS[command](BAD_STORAGES[family]))
    if family == "newer optuna":
        assert "Optuna 9.1.0" in line, line  # says which version made it, and that no Optuna 5.x reads it
        assert line.endswith("prism-nas runs on Optuna 5.x, which cannot read it: open it with the Optuna that made "
                             "it, or give another storage"), line  # it advised pip install -U 'optuna<6'
    if family == "truncated" and command not in ("search",):
        assert "damaged" in line or "not" in line, line


@pytest.mark.parametrize("data", ["study.db", "link.db", "other.db"])
@pytest.mark.parametrize("command", ["search", "search into it", "train"])
def test_a_database_given_as_data_is_refused_before_any_training(place, data, command):
    """``nas search --data nas.db`` trained on the study's own bytes (exit 0), and the study it wrote changed the data's
    fingerprint, so the same command run again found other settings."""
    line = refused(place, _data_commands(data)[command])
    assert f"data file '{data}' is an SQLite database" in line, line


def _data_commands(data: str) -> dict[str, list[str]]:
    return {"search": ["search", "--preset", "tiny", "--trials", "1", "--data", data, "--storage", "sqlite:///new.db"],
            "search into it": ["search", "--preset", "tiny", "--trials", "1", "--data", data, "--storage",
                               f"sqlite:///{data}"],
            "train": ["train", "--config", "arch.json", "--preset", "tiny", "--tokens", "256", "--data", data]}


@pytest.mark.parametrize("command", ["search", "train"])
def test_a_live_studys_log_given_as_data_is_refused(place, tmp_path, command):
    """The write-ahead log of a study a search has open was read as text: it changes with every trial written."""
    for name in ("study.db", "arch.json"):
        (tmp_path / name).write_bytes((place / name).read_bytes())
    with closing(sqlite3.connect(tmp_path / "study.db")) as search:
        search.execute("PRAGMA journal_mode=wal")
        search.execute("CREATE TABLE written (x)")
        search.commit()  # the log holds it
        line = refused(tmp_path, _data_commands("study.db-wal")[command])
    assert "data file 'study.db-wal' is the name SQLite gives the write-ahead log of 'study.db'" in line, line


def test_a_storage_named_like_a_companion_of_a_file_that_is_no_database_is_used(tmp_path):
    """``results-searches`` beside a CSV named ``results``: no database keeps a lock there, so the name is the user's
    (a reader goes on to find no such file; beside ``study.db`` the same name is refused)."""
    (tmp_path / "results").write_text("shape,loss\n")
    line = refused(tmp_path, ["best", "--storage", "sqlite:///results-searches"])
    assert line.startswith("error: storage file 'results-searches' does not exist: nothing has been searched"), line


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal", "-searches"])
def test_a_storage_named_as_a_live_studys_log_is_refused_and_the_study_writes_on(place, tmp_path, suffix):
    """While a search had ``study.db`` open, ``nas search --storage sqlite:///study.db-wal`` made a whole new database
    in that search's write-ahead log (exit 0: "done: study 'prism-tiny' holds 1 trained trials"), and a reader was
    told the log "holds no study yet"."""
    study = tmp_path / "study.db"
    study.write_bytes((place / "study.db").read_bytes())
    with closing(sqlite3.connect(study)) as search:
        search.execute("PRAGMA journal_mode=wal")
        search.execute("CREATE TABLE before_it (x)")
        search.commit()
        search.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # an empty log, as between a search's writes: SQLite opened
        assert (tmp_path / "study.db-wal").stat().st_size == 0  # it as a new, empty database and the search wrote one
        files = snapshot(tmp_path)
        for args in (["search", "--preset", "tiny", "--trials", "1", "--storage", f"sqlite:///study.db{suffix}"],
                     ["best", "--storage", f"sqlite:///study.db{suffix}"]):
            line = refused(tmp_path, args)
            assert f"'study.db{suffix}' is the name" in line and "--storage sqlite:///study.db for that study" in line
        assert snapshot(tmp_path) == files
        search.execute("CREATE TABLE after_it (x)")
        search.commit()
    with closing(sqlite3.connect(f"file:{study}?mode=ro", uri=True)) as reader:
        tables = {row[0] for row in reader.execute("SELECT name FROM sqlite_master")}
    assert {"before_it", "after_it", "trials"} <= tables


@pytest.mark.parametrize("command", ["studies", "best", "export", "report"])
@pytest.mark.parametrize("file", ["other.db", "empty.db", "study.db"])
def test_a_read_only_command_never_writes_the_storage(place, tmp_path, command, file):
    """Not a byte, not a table: ``nas studies`` on another program's database or an empty file used to create
    Optuna's tables in it. A valid study is read without changing it either."""
    copy = tmp_path / file
    copy.write_bytes((place / file).read_bytes())
    before = (digest(copy), copy.stat().st_mtime_ns)
    args = STORAGE_COMMANDS[command](f"sqlite:///{copy}")
    if command == "report":
        args[-1] = str(tmp_path / "r.html")
    result = CliRunner().invoke(app, args)
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    assert (digest(copy), copy.stat().st_mtime_ns) == before, (command, file)
    tables = {row[0] for row in sqlite3.connect(f"file:{copy}?mode=ro", uri=True).execute(
        "SELECT name FROM sqlite_master WHERE type='table'")}
    assert ("studies" in tables) == (file == "study.db"), tables
    if file == "study.db":
        assert result.exit_code == 0, result.output
    elif file == "empty.db" and command == "studies":
        assert result.exit_code == 0 and "holds no study yet" in result.output
    else:
        assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1, result.output


def test_a_study_in_a_read_only_folder_is_readable(place, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "study.db").write_bytes((place / "study.db").read_bytes())
    (folder / "study.db").chmod(0o444)
    folder.chmod(0o555)
    try:
        result = CliRunner().invoke(app, ["best", "--storage", f"sqlite:///{folder / 'study.db'}"])
        assert result.exit_code == 0, result.output
        assert sorted(p.name for p in folder.iterdir()) == ["study.db"]
    finally:
        folder.chmod(0o755)


# ----------------------------------------------------------------- outputs that must be refused, not replaced
BAD_OUTPUTS = {"character device": "chardev", "fifo": "fifo", "read-only file": "readonly.json", "folder": "folder",
               "missing folder": "nowhere/out.json", "long name": "y" * 300 + ".json", "unknown user":
               "~nosuchuser4242/out.json", "the dot": ".",
               # what writing would destroy: `nas report -o nas.db` replaced the study it read with its page
               "the study's database": "study.db", "a link to it": "link.db", "another program's database": "other.db",
               "the database's write-ahead log": "study.db-wal", "the search lock beside it": "study.db-searches",
               # a folder access() calls writable that takes no file: train -o trained, then lost its result there
               "a folder that takes no file": "/proc/out.json"}
OUTPUT_COMMANDS = {
    "report -o": lambda o: ["report", "--storage", "sqlite:///study.db", "-o", o],
    "export -o": lambda o: ["export", "--storage", "sqlite:///study.db", "-o", o],
    "train -o": lambda o: ["train", "--config", "arch.json", "--preset", "tiny", "--tokens", "256", "-o", o],
    "train --out": lambda o: ["train", "--config", "arch.json", "--preset", "tiny", "--tokens", "256", "--out", o],
    "bench --out": lambda o: ["bench", "--smoke", "--only", "7", "--out", o],
    "rerun --runs": lambda o: ["rerun", "--preset", "tiny", "--storage", "sqlite:///study.db", "--runs", o],
}


@HOSTILE
@given(family=st.sampled_from(sorted(BAD_OUTPUTS)), command=st.sampled_from(sorted(OUTPUT_COMMANDS)))
def test_an_output_target_that_cannot_be_written_is_refused_before_any_work(place, family, command):
    if command in ("train --out", "bench --out", "rerun --runs") and family in ("folder", "the dot", "missing folder",
                                                                                "read-only file"):
        return  # these take a folder, made with its parents when missing (a file there: "fifo", "device" cover it)
    refused(place, OUTPUT_COMMANDS[command](BAD_OUTPUTS[family]))


@pytest.mark.parametrize("command", sorted(OUTPUT_COMMANDS))
def test_a_folder_that_takes_no_file_is_refused_before_any_work(place, command):
    """/proc passes access(W_OK) for root yet creates nothing: `train -o` trained, then failed to write its result."""
    assert "takes no new file" in refused(place, OUTPUT_COMMANDS[command]("/proc/out.json"))


EMPTY_PATHS = {**OUTPUT_COMMANDS,
               "export --format hf -o": lambda o: ["export", "--storage", "sqlite:///study.db", "--format", "hf",
                                                   "-o", o],
               "train --config": lambda o: ["train", "--config", o, "--preset", "tiny"],
               "rules --runs": lambda o: ["rules", "--storage", "sqlite:///study.db", "--confirm", "cpu", "--runs", o]}


@pytest.mark.parametrize("command", sorted(EMPTY_PATHS))
def test_an_empty_path_is_refused_not_read_as_the_working_directory(place, command):
    # `--runs ""` trained into the working directory, and `-o ""` was refused as "'.' is a directory"
    line = refused(place, EMPTY_PATHS[command](""))
    assert line == f"error: {command.split()[-1]} is empty: give a path", line


def test_a_model_directory_name_too_long_is_refused_in_one_line(place):
    refused(place, EMPTY_PATHS["export --format hf -o"]("d" * 300))  # an OSError traceback


@pytest.mark.parametrize("command", ["train --out", "rerun --runs"])
def test_a_fifo_given_for_a_folder_is_refused_without_opening_it(place, command):
    # looking for an SQLite header must not open a FIFO: opening one to read waits for a writer, for ever
    refused(place, OUTPUT_COMMANDS[command]("fifo"))


def test_an_output_named_like_a_log_beside_a_fifo_is_written_without_opening_the_fifo(place, tmp_path):
    os.mkfifo(tmp_path / "fifo")
    result = CliRunner().invoke(app, ["export", "--storage", f"sqlite:///{place / 'study.db'}", "-o",
                                      str(tmp_path / "fifo-wal")])
    assert result.exit_code == 0 and json.loads((tmp_path / "fifo-wal").read_text()), result.output


def test_an_output_through_a_symbolic_link_writes_the_file_it_names_and_the_link_stays(place, tmp_path):
    # the write replaced the link itself by a file: the file it named kept its old content, and as root
    # `-o /dev/stdout` turned the machine's /dev/stdout into a plain file
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "latest.json").write_text("old\n")
    link = tmp_path / "latest.json"
    link.symlink_to(Path("keep") / "latest.json")
    result = CliRunner().invoke(app, ["export", "--storage", f"sqlite:///{place / 'study.db'}", "-o", str(link)])
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and json.loads((tmp_path / "keep" / "latest.json").read_text())[0]["rank"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep", "latest.json"]  # no temporary file left


def test_export_to_dash_writes_standard_output_and_no_file(place):
    cwd = os.getcwd()
    os.chdir(place)
    try:
        result = CliRunner().invoke(app, ["export", "--storage", "sqlite:///study.db", "-o", "-"])
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0 and result.stdout.lstrip().startswith("["), result.output
    assert not (place / "-").exists()


@pytest.mark.parametrize("how", ["full", "closed"])
@pytest.mark.parametrize("command", [["best"], ["export"], ["space", "list", "--space", "prism"], ["presets"]])
def test_a_full_or_closed_standard_output_is_one_line_and_exit_1(place, how, command):
    args = [*command] + (["--storage", "sqlite:///study.db"] if command[0] in ("best", "export") else [])
    with open("/dev/full", "w") as full:
        result = subprocess.run([*NAS, *args], cwd=place, env=nas_env(), stderr=subprocess.PIPE, text=True,
                                timeout=120, stdout=full if how == "full" else None,
                                preexec_fn=(lambda: os.close(1)) if how == "closed" else None)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "standard output" in lines[0]


# ----------------------------------------------------------------- data: loops, devices, damaged caches
def test_a_glob_or_folder_through_loops_of_links_reads_each_file_once(tmp_path):
    from nas.data import load_data

    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("a" * 4000)
    (data / "sub" / "b.txt").write_text("b" * 4000)
    (data / "sub" / "up").symlink_to("..")  # a loop: data/sub/up/sub/up/...
    (data / "sub" / "again").symlink_to("..")  # a second one: glob.glob would visit 2^depth copies
    (data / "sub" / "a-link.txt").symlink_to("../a.txt")  # the same real file under another name
    cache = tmp_path / "cache"
    # two real files and a separator: 8001 tokens (one folder down, b.txt and a-link.txt, which is a.txt)
    for spec, expected in ((f"{data}/**/*.txt", 8001), (str(data), 8001), (f"{data}/*/*.txt", 8001),
                           (f"{data}/**", 8001), (f"{data}/*/b.txt", 4000)):
        loaded = load_data(spec, cache_dir=cache)
        assert len(loaded.train) + len(loaded.val) == expected, spec


def test_a_damaged_cache_entry_is_rebuilt(tmp_path):
    import json

    from nas.data import load_data

    (tmp_path / "t.txt").write_text("hello world\n" * 500)
    cache = tmp_path / "cache"
    first = load_data(str(tmp_path / "t.txt"), cache_dir=cache)
    for meta in cache.glob("text-*.json"):
        entry = json.loads(meta.read_text())
        meta.write_text(json.dumps({**entry, "n_train": "x"}))
    again = load_data(str(tmp_path / "t.txt"), cache_dir=cache)
    assert (len(again.train), again.fingerprint) == (len(first.train), first.fingerprint)


def test_a_sparse_file_and_an_object_array_are_named_for_what_they_are(tmp_path):
    import numpy as np

    sparse = tmp_path / "huge.txt"
    with open(sparse, "wb") as file:
        file.truncate(50 * 2**30)  # 50 GB of holes: read whole it was a MemoryError
    line = refused(tmp_path, ["search", "--preset", "tiny", "--trials", "1", "--data", str(sparse), "--storage",
                              f"sqlite:///{tmp_path / 'x.db'}"])
    assert "sparse" in line and "50.0 GB" in line
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object))
    line = refused(tmp_path, ["search", "--preset", "tiny", "--trials", "1", "--data", str(tmp_path / "objects.npy"),
                              "--storage", f"sqlite:///{tmp_path / 'x.db'}"])
    assert "Python objects" in line and "allow_pickle" not in line


# ----------------------------------------------------------------- names and hints
@pytest.mark.parametrize("name", ["\x1b[31mred", "bell\x07", "line\u2028break", "bidi\u202eevil", INVALID_UTF8])
@pytest.mark.parametrize("command", ["best", "report", "export", "search", "rerun"])
def test_a_study_name_that_does_not_print_is_refused_and_shown_escaped(place, name, command):
    args = {"search": ["search", "--preset", "tiny", "--trials", "1", "--storage", "sqlite:///study.db"],
            "rerun": ["rerun", "--preset", "tiny", "--storage", "sqlite:///study.db"]}.get(
        command, [command, "--storage", "sqlite:///study.db"])
    line = refused(place, [*args, "--study-name", name])
    assert line.isprintable() and "\x1b" not in line, line


def test_the_next_hints_quote_a_study_name_as_a_shell_would(tmp_path):
    from nas.cli.search import search  # noqa: F401 - the command whose hint is read below

    name = "x$(touch pwned)"
    result = CliRunner().invoke(app, ["search", "--preset", "tiny", "--trials", "1", "--study-name", name,
                                      "--storage", f"sqlite:///{tmp_path / 'q.db'}", "--workers", "1", "--threads",
                                      "1"])
    assert result.exit_code == 0, result.output
    hint = result.stderr.strip().splitlines()[-1]
    assert "--study-name 'x$(touch pwned)'" in hint, hint


def test_the_dashboard_on_a_busy_port_is_one_line(place):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refused(place, ["dashboard", "--storage", "sqlite:///study.db", "--port", str(port)])
    assert f"127.0.0.1:{port}" in line and "--port" in line


# ----------------------------------------------------------------- a study interrupted while it was being made
def tiny_search(tmp_path: Path, *extra: str) -> list[str]:
    return ["search", "--preset", "tiny", "--trials", "1", "--storage", f"sqlite:///{tmp_path / 'nas.db'}",
            "--study-name", "s", "--workers", "1", "--threads", "1", *extra]


def _corpus(folder: Path) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "corpus.txt").write_text("the heads grow with depth; the width pays for it. " * 2000)


@pytest.mark.parametrize("data, storage", [(".", "nas.db"), ("data", "data/s.db"), ("data", "data/deep/s.db"),
                                           ("data/*", "data/s.db"), ("data/*", "data/new.db")])
def test_a_new_study_whose_data_folder_holds_its_storage_is_refused_before_anything_is_written(tmp_path, data,
                                                                                               storage):
    """``nas search --data .`` kept the study in the data folder: ``nas report -o report.html`` wrote 4.7 MB of HTML
    there, which the next run read as text beside a 1.2 MB corpus, and its changed data made it a new study."""
    _corpus(tmp_path / "data")
    (tmp_path / "corpus.txt").write_text((tmp_path / "data" / "corpus.txt").read_text())
    (tmp_path / "data" / "deep").mkdir()
    if storage == "data/s.db" and data == "data/*":  # a storage that holds another study (data/new.db: none yet)
        synthetic_study(SyntheticSpec(space="prism", preset="tiny", trials=2),
                        storage=f"sqlite:///{tmp_path / storage}", name="another")
    line = refused(tmp_path, ["search", "--preset", "tiny", "--trials", "1", "--data", data, "--storage",
                              f"sqlite:///{storage}"])
    assert f"--data '{data}' holds this search's storage sqlite:///{storage}" in line, line
    assert "give the data in a folder of its own" in line


def test_a_study_already_made_with_its_storage_in_the_data_folder_resumes(tmp_path, monkeypatch):
    """The refusal is for a new study: one made so before (by an earlier prism-nas) resumes with the same command."""
    _corpus(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = ["search", "--preset", "tiny", "--trials", "1", "--data", ".", "--workers", "1", "--threads", "1"]
    with monkeypatch.context() as earlier:
        earlier.setattr("nas.study.session.data_holds", lambda spec, target: False)
        assert CliRunner().invoke(app, args).exit_code == 0
    result = CliRunner().invoke(app, [*args[:4], "2", *args[5:]])
    assert result.exit_code == 0, result.output
    assert "holds 2 trained trials" in result.stderr


@pytest.mark.parametrize("file", ["typo.db", "empty.db", "other.db"])
def test_the_dashboard_makes_no_storage_of_a_mistyped_empty_or_foreign_file(place, file):
    # it opened the storage to write, so a mistyped name became a new database and an empty file or another
    # program's database got Optuna's tables; it now refuses them as every reader does, and writes nothing
    line = refused(place, ["dashboard", "--storage", f"sqlite:///{file}", "--port", "1"])
    assert file in line, line


@pytest.mark.parametrize("stage", ["row only", "attributes, no baseline", "baseline queued, no identity"])
def test_a_study_stopped_while_being_made_is_completed_on_resume_not_refused(tmp_path, stage):
    """Ctrl-C right after the study row was made left a study with no identity, and the same command then waited a
    minute and refused the name for good. Each stage of the making, interrupted, is completed by the next run."""
    storage = f"sqlite:///{tmp_path / 'nas.db'}"
    study = optuna.create_study(storage=storage, study_name="s")
    if stage != "row only":
        study.set_user_attr("nas:preset", "tiny")
    if stage == "baseline queued, no identity":
        base = uniform(4, 32, 4, 256)
        study.enqueue_trial({"schedule": 0}, user_attrs={"key": base.key(), "seed": 0, "role": "baseline"},
                            skip_if_exists=False)
    result = CliRunner().invoke(app, tiny_search(tmp_path))
    assert result.exit_code == 0, result.output
    study = optuna.load_study(study_name="s", storage=storage)
    assert "nas:identity" in study.user_attrs
    done = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]
    assert done and done[0].user_attrs["role"] == "baseline"


@pytest.mark.parametrize("made", [("studies",), ("studies", "trials", "version_info"), "all but the revision"])
def test_a_storage_whose_creation_was_killed_is_completed_by_the_next_search(tmp_path, made):
    """A search killed while Optuna was making its tables left some of them and no schema revision; the next run
    refused the file as "not an Optuna storage" (CI, test_faults). A reader finds no study there and writes nothing;
    the search completes the tables and runs."""
    from optuna.storages._rdb import models

    path = tmp_path / "nas.db"
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    tables = models.BaseModel.metadata.sorted_tables
    keep = [t for t in tables if made == "all but the revision" or t.name in made]
    models.BaseModel.metadata.create_all(engine, tables=keep)
    engine.dispose()
    before = path.read_bytes()
    listing = CliRunner().invoke(app, ["studies", "--storage", f"sqlite:///{path}"])
    assert "holds no study yet" in listing.output and listing.exit_code == 0, listing.output
    assert path.read_bytes() == before
    result = CliRunner().invoke(app, tiny_search(tmp_path))
    assert result.exit_code == 0, result.output
    assert optuna.load_study(study_name="s", storage=f"sqlite:///{path}").get_trials()


def test_a_study_resumed_with_other_settings_names_the_setting_and_its_stored_value(tmp_path):
    assert CliRunner().invoke(app, tiny_search(tmp_path)).exit_code == 0
    line = refused(tmp_path, tiny_search(tmp_path, "--tokens", "8k"))
    assert "train.tokens is 4096 there, 8000 here" in line, line
    # the data is compared by fingerprint (two hashes said nothing): the line names the data the study was made on
    (tmp_path / "corpus.txt").write_text("a corpus of my own\n" * 2000)
    line = refused(tmp_path, tiny_search(tmp_path, "--data", str(tmp_path / "corpus.txt")))
    assert "data is " in line and "(the study was made on --data 'builtin';" in line, line


def test_the_same_command_on_changed_data_says_it_starts_a_new_study_beside_the_old_one(tmp_path):
    """The default study name hashes the data: after the file changed, the same command started a new study silently
    (and `nas best` then asked which of two studies)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a corpus of my own\n" * 2000)
    args = ["search", "--preset", "tiny", "--trials", "1", "--storage", f"sqlite:///{tmp_path / 'nas.db'}",
            "--workers", "1", "--threads", "1", "--data", str(corpus)]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0 and "a new study" not in first.stderr, first.output
    corpus.write_text("a corpus of my own, edited\n" * 2000)
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    (note,) = [line for line in again.stderr.splitlines() if "a new study" in line]
    assert "has the same options on other data (--data " in note and "give that data to resume it" in note, note
    # changed once more: the note named the first study found, the oldest, not the one this command just resumed
    second = note.split("a new study ", 1)[1].split(":", 1)[0]
    corpus.write_text("a corpus of my own, edited twice\n" * 2000)
    third = CliRunner().invoke(app, args)
    assert third.exit_code == 0, third.output
    (note,) = [line for line in third.stderr.splitlines() if "a new study" in line]
    assert f"the storage's {second} has the same options" in note, note
    assert note.endswith("give that data to resume it (1 older study there on other data too)"), note


def test_a_study_keeps_its_replicates_policy_when_resumed_with_another(tmp_path):
    first = CliRunner().invoke(app, tiny_search(tmp_path, "--replicates", "race"))
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(app, with_trials(tiny_search(tmp_path, "--replicates", "fixed"), 2))
    assert again.exit_code == 0, again.output
    assert "was begun with --replicates race; it continues with it, not fixed" in again.stderr, again.stderr
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'nas.db'}")
    assert study.user_attrs["nas:replicates"] == "race"


def with_trials(args: list[str], trials: int) -> list[str]:
    return [*args[:4], str(trials), *args[5:]]


@pytest.mark.parametrize("policy, flag, begun, resumed", [("race", "--race-size", "2", "5"),
                                                          ("fixed", "--replicate-top", "1", "3")])
def test_a_study_keeps_the_size_of_its_race_or_fixed_replicates_when_resumed_with_another(tmp_path, policy, flag,
                                                                                           begun, resumed):
    """Each planning call recomputes a race's candidates from --race-size (fixed replicates' from --replicate-top):
    another size on resume re-planned the running allocation without a word."""
    storage = f"sqlite:///{tmp_path / 'nas.db'}"
    first = CliRunner().invoke(app, tiny_search(tmp_path, "--replicates", policy, flag, begun))
    assert first.exit_code == 0 and flag not in first.stderr, first.output
    again = CliRunner().invoke(app, with_trials(tiny_search(tmp_path, "--replicates", policy, flag, resumed), 2))
    assert again.exit_code == 0, again.output
    assert f"was begun with {flag} {begun}; it continues with it, not {resumed}" in again.stderr, again.stderr
    attr = "nas:" + flag.removeprefix("--").replace("-", "_")
    assert optuna.load_study(study_name="s", storage=storage).user_attrs[attr] == int(begun)
    same = CliRunner().invoke(app, with_trials(tiny_search(tmp_path, "--replicates", policy, flag, begun), 2))
    assert same.exit_code == 0 and flag not in same.stderr, same.output


@pytest.mark.parametrize("attr, bogus, says", [
    ("nas:replicates", "sometimes", "it goes on with --replicates adaptive"),
    ("nas:sampler", ["tpe"], "it goes on with --sampler tpe"),
    ("nas:race_size", -3, "it goes on with --race-size 8"),
    ("nas:race_size", True, "it goes on with --race-size 8"),
])
def test_a_stored_setting_edited_into_nonsense_is_said_and_replaced_not_obeyed(tmp_path, attr, bogus, says):
    """A bogus stored policy planned nothing (an unknown policy), a bogus sampler crashed the proposal: each is now
    said in one note, with the value it held, and replaced."""
    storage = f"sqlite:///{tmp_path / 'nas.db'}"
    policy = ["--replicates", "race"] if attr == "nas:race_size" else []
    assert CliRunner().invoke(app, tiny_search(tmp_path, *policy)).exit_code == 0
    optuna.load_study(study_name="s", storage=storage).set_user_attr(attr, bogus)
    again = CliRunner().invoke(app, with_trials(tiny_search(tmp_path, *policy), 2))
    assert again.exit_code == 0, again.output
    (note,) = [line for line in again.stderr.splitlines() if attr in line]
    assert f"study 's' holds {attr} = {bogus!r}, which is not " in note and says in note, note
    fixed = optuna.load_study(study_name="s", storage=storage).user_attrs[attr]
    assert fixed == {"nas:replicates": "adaptive", "nas:sampler": "tpe", "nas:race_size": 8}[attr]
    assert len(optuna.load_study(study_name="s", storage=storage).get_trials()) == 2


def test_a_resumed_study_keeps_its_sampler_unless_another_is_named_and_says_so(tmp_path):
    """Optuna stores no sampler: a study begun with --sampler random went on with TPE when resumed without it."""
    storage = f"sqlite:///{tmp_path / 'nas.db'}"
    first = CliRunner().invoke(app, tiny_search(tmp_path, "--sampler", "random"))
    assert first.exit_code == 0 and "--sampler" not in first.stderr, first.output
    resumed = CliRunner().invoke(app, with_trials(tiny_search(tmp_path), 2))
    assert resumed.exit_code == 0, resumed.output
    assert "was searched with --sampler random; it continues with it (--sampler tpe switches)" in resumed.stderr
    assert optuna.load_study(study_name="s", storage=storage).user_attrs["nas:sampler"] == "random"
    switched = CliRunner().invoke(app, with_trials(tiny_search(tmp_path, "--sampler", "tpe"), 3))
    assert switched.exit_code == 0, switched.output
    assert "was searched with --sampler random so far; tpe proposes its trials from here on" in switched.stderr
    assert optuna.load_study(study_name="s", storage=storage).user_attrs["nas:sampler"] == "tpe"
    same = CliRunner().invoke(app, with_trials(tiny_search(tmp_path, "--sampler", "tpe"), 3))
    assert same.exit_code == 0 and "--sampler" not in same.stderr, same.output
    # a switch on a study that has its trials trains nothing: stored, the next plain resume went on with it
    idle = CliRunner().invoke(app, with_trials(tiny_search(tmp_path, "--sampler", "random"), 3))
    assert idle.exit_code == 0, idle.output
    assert "has its 3 trials: --sampler random proposes none, and the study keeps --sampler tpe" in idle.stderr
    assert optuna.load_study(study_name="s", storage=storage).user_attrs["nas:sampler"] == "tpe"


def test_inspecting_a_storage_never_releases_the_locks_this_process_holds_on_it(tmp_path):
    """The storage is inspected through SQLite only: closing any other descriptor of the file (reading its header
    with open()) released every POSIX lock this process held on it, so another process's writer went ahead beside
    ours and a search with two workers corrupted its database ("database disk image is malformed")."""
    import sys

    from nas.study.sqlite_file import inspect_sqlite
    from nas.study.storage import make_storage

    path = tmp_path / "held.db"
    make_storage(f"sqlite:///{path}")  # Optuna's tables, WAL
    reader = sqlite3.connect(path, timeout=0, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM studies").fetchone()  # a read in WAL mode: a shared lock on the file
    try:
        inspect_sqlite(path, "storage file")
        make_storage(f"sqlite:///{path}", read_only=True)
        # leaving WAL needs the file to itself: refused while this process's lock still stands
        probe = ("import sqlite3, sys\nc = sqlite3.connect(sys.argv[1], timeout=0)\n"
                 "try:\n    print(c.execute('PRAGMA journal_mode=DELETE').fetchone()[0])\n"
                 "except sqlite3.OperationalError as e:\n    print(e)\n")
        other = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=60)
        assert other.stdout.strip() == "database is locked", other.stdout + other.stderr
    finally:
        reader.execute("ROLLBACK")
        reader.close()


@pytest.mark.parametrize("attr, value, why", [("key", "5", "'key' is 5, not a string"),
                                              ("role", "7", "'role' is 7, not a string"),
                                              ("arch", '"nope"', "'arch' is not a shape")])
def test_a_resumed_search_says_which_counted_trial_no_report_can_read(tiny_study, tmp_path, attr, value, why):
    """A trained trial whose shape attributes were edited into nonsense counted toward --trials without a word, while
    `nas best` and `nas report` skip it with a warning: the resumed search now says so in a note."""
    path = tmp_path / "nas.db"
    with closing(sqlite3.connect(path)) as db, db:
        (trial_id,) = db.execute("SELECT trial_id FROM trials WHERE number = 1").fetchone()
        db.execute("UPDATE trial_user_attributes SET value_json = ? WHERE trial_id = ? AND key = ?",
                   (value, trial_id, attr))
    resumed = CliRunner().invoke(app, ["search", "--preset", "tiny", "--trials", "4", "--storage", tiny_study,
                                       "--study-name", "proxy", "--workers", "1", "--threads", "1"])
    assert resumed.exit_code == 0, resumed.output
    (note,) = [line for line in resumed.stderr.splitlines() if "no report can read" in line]
    assert note.startswith("note: trial #1 of study 'proxy' counts toward --trials, but no report can read it: "
                           f"the stored attribute {why}"), note
    assert note.endswith("nas best and nas report skip it"), note
    best = CliRunner().invoke(app, ["best", "--storage", tiny_study, "--study-name", "proxy"])
    assert f"warning: trial #1 skipped: its stored attribute {why}" in best.stderr, best.output
