"""Data sources, the token cache, and reproducible batches (``nas.data``)."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

import nas.data.sources as sources
from nas.data.cache import cache_root
from nas.data.loading import BatchSampler, TokenData, check_enough_tokens, load_data, validation_batches
from nas.data.sources import SEPARATOR, ConcatTokens, is_validation_file
from nas.errors import UsageError


def write_shard(path: Path, tokens, magic: int = 20240520, version: int = 1, n_tokens: int | None = None) -> Path:
    """An llm.c / modded-nanogpt shard: 256 int32 header (magic, version, count), then uint16 tokens."""
    tokens = np.asarray(tokens, dtype=np.uint16)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = magic, version, len(tokens) if n_tokens is None else n_tokens
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    return path


def raises_one_line(match: str, fn, *args, **kwargs) -> str:
    with pytest.raises(UsageError, match=match) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def shard_dir(tmp_path: Path) -> tuple[Path, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 50257, size=n, dtype=np.uint16) for n in (3000, 2000, 1500)]
    d = tmp_path / "fineweb10B"
    d.mkdir()
    write_shard(d / "fineweb_train_000001.bin", parts[0])
    write_shard(d / "fineweb_train_000002.bin", parts[1])
    write_shard(d / "fineweb_val_000000.bin", parts[2])
    return d, parts


# --------------------------------------------------------------------------- .bin shards
def test_shard_directory_concatenates_train_shards_and_reads_val_shard(shard_dir, cache):
    d, parts = shard_dir
    data = load_data(str(d), cache_dir=cache)
    assert isinstance(data.train, ConcatTokens) and data.train.dtype == np.uint16
    np.testing.assert_array_equal(np.asarray(data.train), np.concatenate(parts[:2]))
    np.testing.assert_array_equal(np.asarray(data.val), parts[2])
    assert data.vocab_size == 50304  # GPT-2's 50257 padded to a multiple of 64
    assert data.describe() == {
        "name": str(d),
        "vocab_size": 50304,
        "n_train_tokens": 5000,
        "n_val_tokens": 1500,
        "fingerprint": data.fingerprint,
    }


def test_shard_glob_selects_the_same_shards(shard_dir, cache):
    d, _ = shard_dir
    by_dir = load_data(str(d), cache_dir=cache)
    by_glob = load_data(str(d / "fineweb_*.bin"), cache_dir=cache)
    assert by_glob.fingerprint == by_dir.fingerprint
    assert len(by_glob.train) == 5000


def test_shard_vocab_grows_past_gpt2_when_a_token_needs_it(tmp_path, cache):
    write_shard(tmp_path / "x_train_0.bin", [1, 2, 60000, 3])
    write_shard(tmp_path / "x_val_0.bin", [4, 5])
    assert load_data(str(tmp_path), cache_dir=cache).vocab_size == 60032  # 60001 rounded up to 64


def test_concat_tokens_slices_across_shard_boundaries():
    view = ConcatTokens([np.arange(0, 5), np.arange(5, 7), np.arange(7, 12)])
    whole = np.arange(12)
    for a, b in [(0, 12), (3, 9), (4, 5), (5, 7), (6, 11), (11, 12), (8, 8)]:
        np.testing.assert_array_equal(view[a:b], whole[a:b])
    assert len(view) == 12 and view[6] == 6 and view[-1] == 11


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"magic": 20240519}, r"has magic number 20240519, expected 20240520"),
        ({"version": 2}, r"has version 2, expected 1"),
        ({"n_tokens": 5000}, r"header says 5000 tokens but the file holds 1500"),
    ],
)
def test_bad_shard_header_is_one_line_naming_the_shard(shard_dir, cache, kwargs, match):
    d, parts = shard_dir
    bad = write_shard(d / "fineweb_val_000000.bin", parts[2], **kwargs)
    message = raises_one_line(match, load_data, str(d), cache_dir=cache)
    assert str(bad) in message


def test_truncated_and_empty_shards_are_rejected(shard_dir, cache):
    d, parts = shard_dir
    shard = write_shard(d / "fineweb_val_000000.bin", parts[2])
    with open(shard, "r+b") as f:
        f.truncate(1024 + 2 * 1500 - 1)
    raises_one_line(r"header says 1500 tokens but the file holds 1499.5", load_data, str(d), cache_dir=cache)
    shard.write_bytes(b"")
    raises_one_line(r"shard .*fineweb_val_000000.bin' is empty", load_data, str(d), cache_dir=cache)


@pytest.mark.parametrize("missing", ["train", "val"])
def test_shard_directory_without_a_split_is_an_error_naming_the_path(shard_dir, cache, missing):
    d, _ = shard_dir
    for shard in d.glob(f"*_{missing}_*.bin"):
        shard.unlink()
    message = raises_one_line(rf"has no \*_{missing}_\*.bin shard", load_data, str(d), cache_dir=cache)
    assert str(d) in message
    assert "not read" not in message  # a folder of shards only has nothing else to name


def test_text_folder_with_a_stray_bin_says_its_text_was_not_read(tmp_path, cache):
    """A folder holding any .bin is read as llm.c shards; when that fails, the line says the text was ignored."""
    (tmp_path / "notes.txt").write_text("Attention is all you need. " * 200)
    (tmp_path / "more.md").write_text("Hourglass FFN. " * 200)
    (tmp_path / "model.bin").write_bytes(b"\0" * 64)
    message = raises_one_line(r"has no \*_train_\*.bin shard \(read as llm.c shards because it holds .bin files; "
                              r"its 2 other files, e.g. 'more.md', not read\)",
                              load_data, str(tmp_path), cache_dir=cache)
    assert str(tmp_path) in message


# --------------------------------------------------------------------------- text
def test_text_file_is_byte_level_with_the_last_5_percent_as_validation(tmp_path, cache):
    text = ("Attention is all you need. " * 400).encode()
    path = tmp_path / "corpus.md"  # any extension but .npy/.bin is text
    path.write_bytes(text)
    data = load_data(str(path), cache_dir=cache)
    assert data.vocab_size == 256 and data.train.dtype == np.uint8
    assert len(data.val) == -(-len(text) // 20)
    assert bytes(data.train) + bytes(data.val) == text


def test_text_directory_is_split_by_file_with_the_fixed_hash_rule(tmp_path, cache):
    d = tmp_path / "docs"
    (d / "sub").mkdir(parents=True)
    contents = {f"sub/doc{i:02d}.txt": f"document {i} ".encode() * 30 for i in range(40)}
    for rel, text in contents.items():
        (d / rel).write_bytes(text)
    (d / ".hidden").write_bytes(b"never read")
    (d / "image.png").write_bytes(b"\x89PNG\0\0binary")
    val_files = sorted(rel for rel in contents if is_validation_file(rel))
    assert 0 < len(val_files) < len(contents)  # these names put some files on each side

    data = load_data(str(d), cache_dir=cache)
    assert bytes(data.val) == SEPARATOR.join(contents[r] for r in val_files)
    assert bytes(data.train) == SEPARATOR.join(contents[r] for r in sorted(contents) if r not in val_files)


def test_a_folder_holding_names_that_are_not_utf8_loads_them_split_by_the_bytes_of_their_names(tmp_path, cache):
    """Issue 52: a name found inside a folder whose bytes are not UTF-8 raised UnicodeEncodeError in the split rule;
    it is hashed as the bytes on disk (a valid name hashes as before), in a folder and through a glob."""
    import hashlib

    d = tmp_path / "docs"
    d.mkdir()
    raw = [b"bad\xff%02d.txt" % i for i in range(40)]
    by_bytes = {name: int(hashlib.sha1(name).hexdigest(), 16) % sources.VAL_MODULUS == 0 for name in raw}
    assert any(by_bytes.values()) and not all(by_bytes.values())  # the rule puts some on each side
    for i, name in enumerate(raw):
        with open(os.path.join(os.fsencode(d), name), "wb") as f:
            f.write(f"document {i} ".encode() * 30)
    assert is_validation_file("doc07.txt") == (int(hashlib.sha1(b"doc07.txt").hexdigest(), 16)
                                               % sources.VAL_MODULUS == 0)
    val = [os.fsdecode(n) for n in sorted(raw) if by_bytes[n]]
    for given in (str(d), str(d / "*.txt")):
        data = load_data(given, cache_dir=cache)
        assert bytes(data.val) == SEPARATOR.join((d / name).read_bytes() for name in val)


def test_text_glob_and_few_files_fall_back_to_a_token_tail(tmp_path, cache):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_bytes(name.encode() * 500)
    (tmp_path / "c.log").write_bytes(b"ignored by the glob")
    data = load_data(str(tmp_path / "*.txt"), cache_dir=cache)
    whole = SEPARATOR.join(n.encode() * 500 for n in ("a.txt", "b.txt"))
    assert not any(is_validation_file(n) for n in ("a.txt", "b.txt"))  # so the rule cannot split them
    assert bytes(data.train) + bytes(data.val) == whole
    assert len(data.val) == -(-len(whole) // 20)


def test_text_cache_is_reused_and_rebuilt_when_a_file_changes(tmp_path, cache, monkeypatch):
    path = tmp_path / "t.txt"
    path.write_bytes(b"first version " * 100)
    first = load_data(str(path), cache_dir=cache)
    assert isinstance(first.train, np.memmap)

    def no_build(*args):
        raise AssertionError("cache entry rebuilt")

    with monkeypatch.context() as m:
        m.setattr(sources, "_build_text_cache", no_build)
        assert load_data(str(path), cache_dir=cache).fingerprint == first.fingerprint
    path.write_bytes(b"second version " * 100)
    second = load_data(str(path), cache_dir=cache)
    assert second.fingerprint != first.fingerprint
    assert bytes(second.train) + bytes(second.val) == b"second version " * 100


def test_fingerprint_is_the_content_not_the_path(tmp_path, cache):
    for name in ("x", "y"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.txt").write_bytes(b"same tokens " * 50)
    assert load_data(str(tmp_path / "x"), cache).fingerprint == load_data(str(tmp_path / "y"), cache).fingerprint


def test_concurrent_builds_of_one_entry_agree_and_leave_no_temporary_files(tmp_path, cache):
    (tmp_path / "t.txt").write_bytes(bytes(range(256)) * 400)
    with ThreadPoolExecutor(4) as pool:
        prints = set(pool.map(lambda _: load_data(str(tmp_path / "t.txt"), cache).fingerprint, range(8)))
    assert len(prints) == 1
    assert not list(cache.glob("*.tmp"))


# --------------------------------------------------------------------------- .npy
def test_npy_vocab_is_max_token_plus_one_rounded_up_to_64(tmp_path, cache):
    tokens = np.arange(1000, dtype=np.int32) % 300
    np.save(tmp_path / "tokens.npy", tokens)
    data = load_data(str(tmp_path / "tokens.npy"), cache_dir=cache)
    assert data.vocab_size == 320 and data.train.dtype == np.int32
    np.testing.assert_array_equal(data.train, tokens[:950])
    np.testing.assert_array_equal(data.val, tokens[950:])


@pytest.mark.parametrize(
    ("array", "match"),
    [
        (np.zeros((4, 4), dtype=np.int64), r"shape \(4, 4\).*expected a 1-D integer token array"),
        (np.zeros(8, dtype=np.float32), r"dtype float32.*expected a 1-D integer token array"),
        (np.array([3, -1, 2]), r"holds a negative token \(-1\)"),
        (np.zeros(0, dtype=np.int64), r"is empty"),
    ],
)
def test_bad_npy_arrays_are_one_line(tmp_path, cache, array, match):
    np.save(tmp_path / "bad.npy", array)
    raises_one_line(match, load_data, str(tmp_path / "bad.npy"), cache_dir=cache)


def test_npy_inputs_that_are_not_npy_files_say_what_they_are(tmp_path, cache):
    """A raw token dump (tofile) was called 'a pickled object array'; a .npz and an upper-case .NPY were read as
    byte text and trained on."""
    np.arange(2000, dtype=np.uint16).tofile(tmp_path / "raw.npy")
    raises_one_line(r"'.*raw.npy' is not a .npy file \(it does not start with numpy's header\): save token ids "
                    r"with np.save", load_data, str(tmp_path / "raw.npy"), cache_dir=cache)
    np.savez(tmp_path / "z.npz", a=np.arange(2000) % 256)
    raises_one_line(r"'.*z.npz' is a .npz archive \(np.savez\): pass its token array as one .npy file",
                    load_data, str(tmp_path / "z.npz"), cache_dir=cache)
    np.save(tmp_path / "upper.npy", np.arange(2000) % 300)
    (tmp_path / "upper.npy").rename(tmp_path / "UPPER.NPY")
    assert load_data(str(tmp_path / "UPPER.NPY"), cache_dir=cache).vocab_size == 320  # its tokens, not its bytes


def test_a_shard_named_for_both_splits_is_refused(tmp_path, cache):
    """It was read into both, so the run validated on its training tokens."""
    write_shard(tmp_path / "x_train_val_1.bin", list(range(3000)))
    raises_one_line(r"shard '.*x_train_val_1.bin' is named both \*_train_\* and \*_val_\*", load_data,
                    str(tmp_path), cache_dir=cache)


def test_a_data_file_rewritten_with_its_size_and_time_kept_is_read_again(tmp_path, cache):
    """cp -p, rsync -t or tar keep a file's size and modification time: the cache keyed on those alone served the
    old file's tokens under the old fingerprint."""
    path = tmp_path / "corpus.txt"
    path.write_text("abcdefgh" * 3000)
    os.utime(path, ns=(10**18, 10**18))
    first = load_data(str(path), cache_dir=cache)
    path.write_text("zyxwvuts" * 3000)
    os.utime(path, ns=(10**18, 10**18))
    second = load_data(str(path), cache_dir=cache)
    assert second.fingerprint != first.fingerprint and bytes(second.train[:8]) == b"zyxwvuts"


def test_a_damaged_token_statistics_entry_is_computed_again(tmp_path, cache):
    np.save(tmp_path / "tokens.npy", np.arange(2000) % 300)
    first = load_data(str(tmp_path / "tokens.npy"), cache_dir=cache)
    (entry,) = Path(cache).glob("npy-*.json")
    entry.write_text(json.dumps({"format": json.loads(entry.read_text())["format"]}))  # a KeyError traceback before
    again = load_data(str(tmp_path / "tokens.npy"), cache_dir=cache)
    assert again.fingerprint == first.fingerprint and again.vocab_size == 320


# --------------------------------------------------------------------------- bad inputs
def test_missing_path_is_one_line(tmp_path, cache):
    raises_one_line(r"data '.*nowhere.txt' not found: pass 'builtin'", load_data, str(tmp_path / "nowhere.txt"), cache)


def test_glob_matching_nothing_is_one_line(tmp_path, cache):
    raises_one_line(r"data glob '.*\*.txt' matches no files", load_data, str(tmp_path / "*.txt"), cache)


def test_empty_text_file_is_one_line(tmp_path, cache):
    (tmp_path / "empty.txt").write_bytes(b"")
    raises_one_line(r"data file '.*empty.txt' is empty", load_data, str(tmp_path / "empty.txt"), cache)


def test_directory_without_usable_files_is_one_line(tmp_path, cache):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blob").write_bytes(b"\0\1\2")
    raises_one_line(r"holds no non-empty text files or .bin shards", load_data, str(tmp_path), cache)


def test_too_few_tokens_for_one_batch_says_how_many_are_needed(tmp_path, cache):
    (tmp_path / "small.txt").write_bytes(b"x" * 1000)
    data = load_data(str(tmp_path / "small.txt"), cache_dir=cache)
    check_enough_tokens(data, batch_size=2, seq_len=16)
    message = raises_one_line("training tokens", check_enough_tokens, data, 8, 128)
    assert message == f"data '{tmp_path / 'small.txt'}' has 950 training tokens; one batch of 8x128 needs 1025"
    raises_one_line(r"has 50 validation tokens; one batch of 4x16 needs 65", check_enough_tokens, data, 4, 16)


# --------------------------------------------------------------------------- batches
def tokens_1d(n: int = 10_000) -> np.ndarray:
    return np.random.default_rng(1).integers(0, 256, size=n).astype(np.uint8)


def test_same_seed_gives_the_same_batches_and_another_seed_others():
    tokens = tokens_1d()
    a, b, c = (BatchSampler(tokens, 4, 32, seed) for seed in (7, 7, 8))
    batches_a = [a.next() for _ in range(5)]
    np.random.seed(123)  # the global RNGs play no part
    torch.manual_seed(123)
    batches_b = [b.next() for _ in range(5)]
    for (xa, ya), (xb, yb) in zip(batches_a, batches_b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(batches_a[0][0], c.next()[0])


def test_batches_are_contiguous_windows_with_targets_shifted_by_one():
    tokens = tokens_1d()
    x, y = BatchSampler(tokens, 8, 64, seed=0).next()
    assert x.shape == y.shape == (8, 64) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row_x, row_y in zip(x.numpy(), y.numpy()):
        starts = [s for s in range(len(tokens) - 64) if tokens[s] == row_x[0]]
        assert any(np.array_equal(tokens[s : s + 65], np.append(row_x, row_y[-1])) for s in starts)


def test_sampler_reaches_the_last_token_and_works_on_shard_views():
    view = ConcatTokens([np.arange(0, 40, dtype=np.uint16), np.arange(40, 65, dtype=np.uint16)])
    sampler = BatchSampler(view, batch_size=2, seq_len=32, seed=3)  # 65 tokens: one batch exactly
    seen = set()
    for _ in range(50):
        x, y = sampler.next()
        assert torch.equal(y, x + 1)
        seen.update(y[:, -1].tolist())
    assert 64 in seen


def test_validation_batches_are_fixed_spread_over_the_split_and_non_overlapping():
    tokens = np.arange(5000, dtype=np.uint16)  # token i == i: a window's first token is its start
    first = validation_batches(tokens, batch_size=4, seq_len=100, n_tokens=1900)
    second = validation_batches(tokens, batch_size=4, seq_len=100, n_tokens=1900)
    assert len(first) == 4  # 1900 tokens rounded down to whole batches of 400
    for (xa, ya), (xb, yb) in zip(first, second):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    # 49 slots of 100 tokens, 16 windows at slots floor(i * 49 / 16): spread over the whole split
    starts = sorted(int(x[0]) for xb, _ in first for x in xb)
    assert starts == [(i * 49 // 16) * 100 for i in range(16)]
    assert starts[-1] >= 4500 and all(b - a >= 100 for a, b in zip(starts, starts[1:]))  # no overlap
    for x, y in first:
        for row_x, row_y in zip(x, y):
            s = int(row_x[0])
            np.testing.assert_array_equal(row_x.numpy(), tokens[s:s + 100])
            np.testing.assert_array_equal(row_y.numpy(), tokens[s + 1:s + 101])
    # batches are dealt round-robin: the first batch alone (a pruning evaluation) spans the split too
    first_batch = sorted(int(x[0]) for x in first[0][0])
    assert first_batch[0] == 0 and first_batch[-1] >= 3000


def test_validation_batches_over_the_whole_split_cover_every_window():
    tokens = np.arange(801, dtype=np.uint16)
    batches = validation_batches(tokens, batch_size=2, seq_len=100, n_tokens=10**9)
    starts = sorted(int(x[0]) for xb, _ in batches for x in xb)
    assert starts == list(range(0, 800, 100))


def test_validation_batches_take_at_least_one_batch_and_at_most_the_split():
    tokens = tokens_1d(1000)
    assert len(validation_batches(tokens, 2, 100, n_tokens=1)) == 1
    assert len(validation_batches(tokens, 2, 100, n_tokens=10**9)) == 4  # (1000 - 1) // 200
    message = raises_one_line("validation split", validation_batches, tokens[:200], 2, 100, 1000)
    assert message == "the validation split has 200 tokens; one batch of 2x100 needs 201"


# --------------------------------------------------------------------------- builtin
@pytest.fixture(scope="module")
def builtin_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("nas-cache")


@pytest.fixture(scope="module")
def builtin(builtin_cache) -> TokenData:
    return load_data("builtin", cache_dir=builtin_cache)


def test_builtin_is_byte_level_stdlib_text_of_reasonable_size(builtin):
    assert builtin.name == "builtin" and builtin.vocab_size == 256
    assert builtin.train.dtype == np.uint8 and isinstance(builtin.train, np.memmap)
    assert len(builtin.train) > 3_000_000  # several MB of source and documentation
    assert len(builtin.val) > 100_000
    assert b"def " in bytes(builtin.val[:100_000])


def test_builtin_excludes_tests_and_splits_train_and_val_by_file(builtin):
    docs, _ = sources.builtin_documents()
    assert not any(set(d.rel.split("/")) & {"test", "tests", "idle_test", "site-packages"} for d in docs)
    train, val = bytes(builtin.train), bytes(builtin.val)
    val_docs = [d for d in docs if d.split is None and is_validation_file(d.rel)]
    train_docs = [d for d in docs if d not in val_docs]
    assert val_docs and train_docs
    for group, inside, outside in ((val_docs, val, train), (train_docs, train, val)):
        largest = max((d for d in group if d.rel != sources.TOPICS_REL), key=lambda d: d.stamp[0])
        text = largest.read()
        assert text in inside and text not in outside, largest.rel


def test_builtin_second_load_hits_the_cache_from_nas_cache(builtin, builtin_cache, monkeypatch):
    monkeypatch.setenv("NAS_CACHE", str(builtin_cache))
    monkeypatch.setattr(sources, "_build_text_cache", lambda *a: pytest.fail("builtin corpus rebuilt"))
    again = load_data()
    assert again.fingerprint == builtin.fingerprint and len(again.train) == len(builtin.train)


def test_unwritable_cache_is_one_line(tmp_path, cache, monkeypatch):
    (tmp_path / "t.txt").write_bytes(b"some text " * 20)

    def refuse(dest, write, mode="wb"):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(sources, "atomic_write", refuse)
    raises_one_line(r"cannot write the data cache .*set NAS_CACHE", load_data, str(tmp_path / "t.txt"), cache)


def test_cache_root_follows_nas_cache_then_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("NAS_CACHE", str(tmp_path / "a"))
    assert cache_root() == tmp_path / "a" and (tmp_path / "a").is_dir()
    monkeypatch.delenv("NAS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "prism-nas"
    assert cache_root(tmp_path / "explicit") == tmp_path / "explicit"
    assert os.path.isdir(tmp_path / "explicit")


# ----------------------------------------------------------------- the full-scale run's stream
def test_a_full_runs_stream_draws_the_proxys_batches_on_any_number_of_processes_and_resumes_exactly():
    from runners.stream import TokenStream

    tokens = np.arange(100_000, dtype=np.uint16)
    proxy = BatchSampler(tokens, 8, 16, seed=3)
    expected = [proxy.next() for _ in range(6)]
    whole = TokenStream(tokens, 8, 16, seed=3)
    ranks = [TokenStream(tokens, 8, 16, rank=r, world=2, micro_batch=2, seed=3) for r in range(2)]
    for step in range(6):
        (x, y), = whole.step()
        assert torch.equal(x, expected[step][0]) and torch.equal(y, expected[step][1])
        parts = [batch for stream in ranks for batch in stream.step()]  # rank 0's two micro-batches, then rank 1's
        assert torch.equal(torch.cat([p[0] for p in parts]), x)
    resumed = TokenStream(tokens, 8, 16, seed=3, position=4)  # as a checkpoint after 4 steps restores it
    assert resumed.position == 4 and torch.equal(resumed.step()[0][0], expected[4][0])


def test_a_full_runs_stream_reads_the_whole_split_from_its_first_steps():
    from runners.stream import TokenStream

    tokens = np.arange(1_000_000, dtype=np.uint32)  # a corpus sorted by file: position is the file
    stream = TokenStream(tokens, 4, 128, seed=0)
    starts = torch.cat([stream.step()[0][0][:, 0] for _ in range(64)]).double()  # 256 windows, 32k tokens
    deciles = np.histogram(starts.numpy(), bins=10, range=(0, len(tokens)))[0]
    assert deciles.min() >= 10  # every tenth of the split is read (an in-order stream would read 3 % of it)


@pytest.mark.parametrize("pattern", ["**/*.txt", "*/*.txt"])
def test_a_folder_a_glob_reaches_but_cannot_read_is_refused_not_skipped(tmp_path, cache, monkeypatch, pattern):
    for folder in ("open", "locked"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "part.txt").write_text("some text to train on\n" * 50)
    locked = str(tmp_path / "locked")
    scandir = os.scandir

    def unreadable(path=".", *args):  # what chmod 000 does for every user but root (the suite may run as root)
        if os.path.abspath(path) == locked:
            raise PermissionError(13, "Permission denied", path)
        return scandir(path, *args)

    monkeypatch.setattr(os, "scandir", unreadable)
    message = raises_one_line(r"cannot read folder .*locked.*: permission denied", load_data,
                              str(tmp_path / pattern), cache)
    assert "locked" in message


def test_data_holds_a_storage_in_a_text_folder_or_glob_and_not_in_shards_or_beside(tmp_path, monkeypatch):
    """``nas.data.loading.data_holds``: the folders whose files a study's outputs would join (``nas.study.session``
    refuses a new study there); a folder of shards reads its ``.bin`` files alone."""
    from nas.data.loading import data_holds

    monkeypatch.chdir(tmp_path)
    (tmp_path / "texts" / "deep").mkdir(parents=True)
    (tmp_path / "texts" / "a.txt").write_text("text " * 100)
    (tmp_path / "shards").mkdir()
    write_shard(tmp_path / "shards" / "x_train_000001.bin", np.arange(100) % 256)
    (tmp_path / "texts" / "s.db").write_bytes(b"")
    assert data_holds("texts", tmp_path / "texts" / "s.db")
    assert not data_holds(".", tmp_path / "nas.db")  # it holds a .bin: read as shards, its other files are not read
    assert data_holds(str(tmp_path / "texts"), tmp_path / "texts" / "deep" / "s.db")
    assert data_holds("texts/*", tmp_path / "texts" / "s.db")  # an existing storage the glob matches
    assert not data_holds("texts/*.txt", tmp_path / "texts" / "s.db")
    assert not data_holds("texts", tmp_path / "nas.db") and not data_holds("texts/a.txt", tmp_path / "texts" / "s.db")
    assert not data_holds("shards", tmp_path / "shards" / "s.db") and not data_holds("builtin", tmp_path / "nas.db")
    monkeypatch.chdir(tmp_path / "texts")
    assert data_holds(".", tmp_path / "texts" / "nas.db")  # nas search --data . with the default storage
    (tmp_path / "texts" / ".nas").mkdir()
    assert not data_holds(".", tmp_path / "texts" / ".nas" / "s.db")  # the walk skips hidden folders
    # a glob matches a storage about to be made as it will match the made one
    assert data_holds("*", tmp_path / "texts" / "new.db")
    assert data_holds("**/*.db", tmp_path / "texts" / "deep" / "n.db")
    assert not data_holds("*.txt", tmp_path / "texts" / "new.db") and not data_holds("*", tmp_path / "texts" / ".n.db")
