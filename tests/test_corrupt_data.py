"""Corrupt data given to the command line: one line naming the file and what is wrong with it, exit code 2.

``nas search`` and ``nas train`` read ``--data`` before anything else is done: no storage is
created, no run folder written. The data layer's own messages are tested in ``test_data.py``;
here the whole path from the option to the printed line.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from nas.arch import uniform
from nas.cli import app

WRITE_ONLY_SYSFS = Path("/sys/bus/pci/rescan")  # mode 0200: even root cannot open it for reading


def write_shard(path: Path, n_tokens: int, magic: int = 20240520, version: int = 1,
                header_count: int | None = None) -> Path:
    header = np.zeros(256, dtype=np.int32)
    header[:3] = magic, version, n_tokens if header_count is None else header_count
    path.write_bytes(header.tobytes() + np.arange(n_tokens, dtype=np.uint16).tobytes())
    return path


def shards(folder: Path, **bad) -> tuple[Path, Path]:
    """A train and a val shard in ``folder``; ``bad`` goes to the val shard, which the problem names."""
    folder.mkdir()
    write_shard(folder / "fineweb_train_000001.bin", 5000)
    return folder, write_shard(folder / "fineweb_val_000000.bin", 2000, **bad)


def truncated(tmp_path: Path) -> tuple[Path, Path, str]:
    folder, val = shards(tmp_path / "truncated")
    with open(val, "r+b") as f:
        f.truncate(1024 + 2 * 2000 - 3)
    return folder, val, "header says 2000 tokens but the file holds"


def wrong_magic(tmp_path: Path) -> tuple[Path, Path, str]:
    folder, val = shards(tmp_path / "magic", magic=1234)
    return folder, val, "magic number 1234, expected 20240520"


def wrong_version(tmp_path: Path) -> tuple[Path, Path, str]:
    folder, val = shards(tmp_path / "version", version=7)
    return folder, val, "version 7, expected 1"


def count_past_the_end(tmp_path: Path) -> tuple[Path, Path, str]:
    folder, val = shards(tmp_path / "count", header_count=90_000)
    return folder, val, "header says 90000 tokens but the file holds 2000"


def empty_text_directory(tmp_path: Path) -> tuple[Path, Path, str]:
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "empty.txt").write_bytes(b"")
    return folder, folder, "holds no non-empty text files"


def unreadable_file(tmp_path: Path) -> tuple[Path, Path, str]:
    folder = tmp_path / "unreadable"
    folder.mkdir()
    (folder / "good.txt").write_text("some text " * 500)
    bad = folder / "secret.txt"
    if os.geteuid() == 0:
        if not WRITE_ONLY_SYSFS.exists():
            pytest.skip("running as root without a write-only sysfs file to stand for an unreadable one")
        bad.symlink_to(WRITE_ONLY_SYSFS)
    else:
        bad.write_text("text " * 500)
        bad.chmod(0)
    return folder, bad, "cannot read"


def npy_of_floats(tmp_path: Path) -> tuple[Path, Path, str]:
    path = tmp_path / "floats.npy"
    np.save(path, np.linspace(0, 1, 5000, dtype=np.float32))
    return path, path, "dtype float32"


def npy_with_nan(tmp_path: Path) -> tuple[Path, Path, str]:
    path = tmp_path / "nan.npy"
    tokens = np.arange(5000, dtype=np.float64) % 256
    tokens[17] = np.nan
    np.save(path, tokens)
    return path, path, "dtype float64"


CASES = [truncated, wrong_magic, wrong_version, count_past_the_end, empty_text_directory, unreadable_file,
         npy_of_floats, npy_with_nan]


def assert_one_line_naming(result, named: Path, problem: str) -> None:
    assert result.exit_code == 2, result.output[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert str(named) in lines[0] and problem in lines[0], lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_nas_search_on_corrupt_data_says_which_file_and_what_and_writes_nothing(tmp_path, case):
    data, named, problem = case(tmp_path)
    storage = tmp_path / "study.db"
    result = CliRunner().invoke(app, ["search", "--preset", "tiny", "--data", str(data),
                                      "--storage", f"sqlite:///{storage}", "--trials", "2"])
    assert_one_line_naming(result, named, problem)
    assert not storage.exists()


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_nas_train_on_corrupt_data_says_which_file_and_what_and_writes_nothing(tmp_path, case):
    data, named, problem = case(tmp_path)
    config = tmp_path / "arch.json"
    config.write_text(uniform(4, 32, 4, 256).to_json())
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--config", str(config), "--preset", "tiny", "--tokens", "256",
                                      "--data", str(data), "--out", str(out)])
    assert_one_line_naming(result, named, problem)
    assert not out.exists()


def test_nas_train_on_data_too_small_for_one_batch_says_so_and_makes_no_run_folder(tmp_path):
    """60 validation tokens: nas train refused them in one line, after making --out and an empty log.jsonl in it."""
    data = tmp_path / "small.txt"
    data.write_text("hello world " * 100)
    config = tmp_path / "arch.json"
    config.write_text(uniform(4, 32, 4, 256).to_json())
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--config", str(config), "--preset", "tiny", "--data", str(data),
                                      "--out", str(out)])
    assert result.exit_code == 2 and result.stderr.splitlines() == [
        f"error: data {str(data)!r} has 60 validation tokens; one batch of 4x32 needs 129"], result.stderr
    assert not out.exists()
