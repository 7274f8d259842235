"""Shapes read from JSON files (``nas.configs``): plain ArchConfigs, `nas best` rows, leaderboards."""

from __future__ import annotations

import json

import pytest

from nas.arch import ArchConfig, FFNShape, format_plateaus, uniform
from nas.configs import arch_from_json, read_arch_config
from nas.errors import UsageError

BASE = uniform(4, 32, 4, 256)
STEP = ArchConfig(n_layers=4, d_model=32, heads=(2, 2, 4, 4), ffn=BASE.ffn, vocab_size=256)


def row(rank: int, arch: ArchConfig, **scores) -> dict:
    """A row as `nas best --format json` writes it: the proxy's scores beside the shape."""
    return {"rank": rank, "heads": format_plateaus(arch.heads), "mean_loss": 3.1, "ci95": 0.05, "gain_pct": 1.2,
            "seeds": 3, "arch": arch.to_dict(), **scores}


def test_a_plain_config_a_row_and_a_leaderboard_all_give_the_shape(tmp_path):
    assert arch_from_json(STEP.to_dict(), "x") == STEP
    assert arch_from_json(row(1, STEP), "x") == STEP  # the row's scores (ci95, gain_pct ...) are not fields
    board = [row(1, STEP), row(2, BASE, is_baseline=True)]
    assert arch_from_json(board, "x") == STEP and arch_from_json(board, "x", rank=2) == BASE
    path = tmp_path / "best.json"
    path.write_text(json.dumps(board))
    assert read_arch_config(path, rank=2) == BASE


@pytest.mark.parametrize("data, says", [
    ([], "not of `nas best`/`nas export` rows"),
    ([1, 2], "not of `nas best`/`nas export` rows"),
    ("text", "holds a string (JSON), not an ArchConfig"),  # the line named Python's types: "a JSON str"
    (None, "holds null (JSON)"),
    (42, "holds a number (JSON)"),
    ({"arch": [1]}, "its \"arch\" is a list (JSON)"),
    ({**STEP.to_dict(), "n_layers": 4.0}, "n_layers=4.0 is invalid"),
    ({**STEP.to_dict(), "d_model": True}, "d_model=True is invalid"),
    ({**STEP.to_dict(), "heads": "2,2,4,4"}, "heads='2,2,4,4' is invalid"),
    ({**STEP.to_dict(), "ffn": {"k": 1, "hidden": "88"}}, "ffn.hidden='88' is invalid"),
    ({**STEP.to_dict(), "rope_theta": -1}, "rope_theta=-1 is invalid"),
    ({**STEP.to_dict(), "heads": [3, 3, 4, 4]}, "does not divide d_model=32"),
    ({**STEP.to_dict(), "colour": "red"}, "unknown ArchConfig field(s) colour"),
    ({"n_layers": 4}, "is not an ArchConfig"),
])
def test_what_is_not_a_shape_is_one_usage_error(data, says):
    with pytest.raises(UsageError) as error:
        arch_from_json(data, "--config 'f.json'")
    assert says in str(error.value) and "\n" not in str(error.value)


def test_a_rank_outside_the_leaderboard_or_on_a_single_shape_is_refused():
    with pytest.raises(UsageError, match=r"--rank 3 is invalid: f holds the rows of rank 1-2$"):
        arch_from_json([row(1, STEP), row(2, BASE)], "f", rank=3)
    with pytest.raises(UsageError, match=r"--rank 3 is invalid: f holds 2 rows \(ranks 1-2\)"):  # rows without a rank
        arch_from_json([{"arch": STEP.to_dict()}, {"arch": BASE.to_dict()}], "f", rank=3)
    with pytest.raises(UsageError, match="--rank 2 needs a list of rows"):
        arch_from_json(STEP.to_dict(), "f", rank=2)


def test_rank_names_a_rows_own_rank_where_the_rows_carry_one():
    """A `--top 1` file whose baseline ranks 3rd holds ranks 1 and 3: --rank 3 was refused ("2 rows, ranks 1-2") and
    --rank 2 trained the rank-3 row without a word."""
    rows = [row(1, STEP), row(3, BASE)]
    assert arch_from_json(rows, "f", rank=3) == BASE and arch_from_json(rows, "f") == STEP
    with pytest.raises(UsageError, match=r"--rank 2 is invalid: f holds the rows of rank 1, 3$"):
        arch_from_json(rows, "f", rank=2)
    assert arch_from_json([row(3, BASE), row(1, STEP)], "f") == STEP  # no --rank: the best rank the file holds


def test_a_leaderboard_with_two_rows_of_the_asked_rank_is_refused_not_guessed():
    rows = [row(1, STEP), row(1, BASE), row(2, BASE)]  # an edited or concatenated file: it took one silently
    with pytest.raises(UsageError, match="f holds 2 rows of rank 1: keep one"):
        arch_from_json(rows, "f", rank=1)
    assert arch_from_json(rows, "f", rank=2) == BASE  # a rank held once is still read


@pytest.mark.parametrize("text, says", [("", "is not JSON"), ("{", "is not JSON"), ("[NaN]", "NaN is not a valid"),
                                        # Python's own refusal advised sys.set_int_max_str_digits()
                                        ('{"n_layers": ' + "9" * 5000 + "}", "an integer of 5,000 digits")])
def test_unreadable_files_name_the_file(tmp_path, text, says):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(UsageError, match=says) as error:
        read_arch_config(path)
    assert str(path) in str(error.value)
    with pytest.raises(UsageError, match="does not exist"):
        read_arch_config(tmp_path / "missing.json")
    with pytest.raises(UsageError, match="is a directory, not a regular file"):
        read_arch_config(tmp_path)


def test_hourglass_shapes_round_trip():
    hourglass = ArchConfig(n_layers=2, d_model=64, heads=(4, 4), ffn=FFNShape(4, 24), vocab_size=256,
                           tie_embeddings=False)
    assert arch_from_json(json.loads(hourglass.to_json()), "f") == hourglass


def test_a_row_whose_columns_were_edited_but_not_its_arch_is_refused_not_trained_as_it_was():
    """An exported row edited in its visible `heads` (or k, d_h...) trained the unchanged `arch` without a word."""
    edited = {**row(1, STEP), "heads": "4x4"}
    with pytest.raises(UsageError, match=r"f: the row says heads '4x4' but its \"arch\" \(what trains\) has "
                                         r"'2x2,4x2': make them agree"):
        arch_from_json([edited], "f")
    with pytest.raises(UsageError, match="the row says d_h 99 but"):
        arch_from_json([{**row(1, STEP), "d_h": 99}], "f")
    assert arch_from_json([{**row(1, STEP), "d_h": None, "k": STEP.ffn.k}], "f") == STEP  # absent or equal: fine
    assert arch_from_json([{**row(1, STEP), "heads": [2, 2, 4, 4]}], "f") == STEP  # a trial's attrs: heads a list
