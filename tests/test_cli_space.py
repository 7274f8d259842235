"""``nas space count|list|show`` and the option factory behind it."""

from __future__ import annotations

import csv
import io
import json
import signal
import subprocess
import time

import pytest
from search_helpers import NAS, nas_env
from typer.testing import CliRunner

from nas.cli import app
from nas.cli.space import space_options_from_cli
from nas.errors import UsageError
from search_spaces.factory import DEFAULT_BASELINE, SpaceOptions, build_space
from search_spaces.hourglass import HourglassSpace
from search_spaces.joint import JointSpace
from search_spaces.prism import PrismSpace

GPT2 = ["--layers", "12", "--d-model", "768", "--heads", "12"]


def run(*args: str):
    return CliRunner().invoke(app, ["space", *args])


def test_count_prints_the_bare_integer():
    result = run("count", "--space", "prism", *GPT2)
    assert result.exit_code == 0 and result.stdout == "129\n"
    assert run("count", "--space", "prism", *GPT2, "--hw-aligned").stdout == "13\n"


def test_list_json_has_one_heads_list_per_member():
    result = run("list", "--space", "prism", *GPT2, "--format", "json")
    members = json.loads(result.stdout)
    assert result.exit_code == 0 and len(members) == 129
    assert members[0]["heads"] == [12] * 12 and all(len(m["heads"]) == 12 for m in members)
    assert len(json.loads(run("list", "--space", "prism", *GPT2, "--format", "json", "--limit", "5").stdout)) == 5


def test_list_table_and_csv():
    table = run("list", "--space", "prism", *GPT2, "--limit", "3").stdout.splitlines()
    assert table[0].split() == ["plateaus", "head_dims"] and table[1].startswith("12x12 ") and len(table) == 4
    rows = list(csv.DictReader(io.StringIO(run("list", "--space", "prism", *GPT2, "--format", "csv").stdout)))
    assert len(rows) == 129 and rows[0]["plateaus"] == "12x12"


def test_list_hourglass_json_fields_and_unmatched_on_stderr():
    result = run("list", "--space", "hourglass", "--budget", "113M", "--vocab", "50304", "--d-model", "768", "--heads",
                 "12", "--format", "json")
    assert result.exit_code == 0
    members = json.loads(result.stdout)
    for field in ("k", "layers", "d_model", "d_h", "params", "budget_deviation", "d_model_per_layer",
                  "d_h_over_d_model"):
        assert field in members[0]
    assert members[0]["kind"] == "baseline" and members[0]["k"] == 1
    assert all(abs(m["budget_deviation"]) <= 0.001 for m in members)
    assert any(m["k"] == 4 and abs(m["d_h_over_d_model"] - 0.4) < 0.06 for m in members)
    assert "unmatched K=" in result.stderr


def test_a_baseline_whose_width_the_budget_changed_is_said():
    """At vocabulary 50304 the d768 K=1 shape holds 123.6M parameters: the 113M baseline is d704, which the listing
    showed without a word (the README's example gave --d-model 768)."""
    wider = run("count", "--space", "hourglass", "--budget", "113M", "--vocab", "50304", *GPT2)
    assert wider.exit_code == 0 and wider.stdout == "184\n"
    assert ("note: the baseline is d_model 704, the conventional K=1 shape of 12 layers at the budget 113,000,000; at "
            "--d-model 768 it has 123,587,328 parameters") in wider.stderr
    paper = run("count", "--space", "hourglass", "--budget", "113M", "--vocab", "32000", *GPT2)
    assert paper.stdout == "223\n" and "note:" not in paper.stderr  # the paper's base: d768 is the baseline
    preset = run("count", "--space", "hourglass", "--budget", "50M")  # no --d-model: no width of the user's to name
    assert preset.exit_code == 0 and "note:" not in preset.stderr


def test_list_hourglass_fixed_attention():
    result = run("list", "--space", "hourglass", "--fix", "attention", "--tolerance", "1%", "--format", "json")
    members = json.loads(result.stdout)
    assert {(m["d_model"], m["layers"]) for m in members} == {(96, 12)} and len(members) > 1


def test_heads_not_dividing_d_model_is_one_line_and_exit_2():
    result = run("count", "--space", "prism", "--layers", "12", "--d-model", "768", "--heads", "7")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: 7 does not divide d_model=768; divisors ≤ 12 are 1,2,3,4,6,8,12"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--space", "foo"], "Invalid value for '--space': 'foo' is not one of 'prism', 'hourglass', 'joint'"),
        (["--space", "hourglass", "--fix", "ffn"], "'ffn' is not one of 'attention', 'none'"),
        (["--min-plateau", "5"], "min_plateau=5 > max_plateau=4"),
        (["--min-head-dim", "64", "--max-head-dim", "8"], "min_head_dim=64 > max_head_dim=8"),  # counted 1
        (["--space", "prism", "--budget", "1M"], "--budget only applies to the hourglass and joint spaces"),
        (["--space", "hourglass", "--k-values", "1,x"], "--k-values '1,x' is not a comma-separated list of ints"),
        (["--space", "hourglass", "--budget", "lots"], "--budget 'lots' is not a size"),
        (["--space", "hourglass", "--tolerance", "abc"], "--tolerance 'abc' is not a fraction"),
        # it blamed "group size 1", which the user never gave
        (["--d-model", "100000000"], "d_model=100,000,000 is too large: at most 131,072"),  # it named ffn.hidden
        (["--d-model", "97"], "12 does not divide d_model=97; its only divisor up to 24 is 1 (--heads not given: 12 "
                              "is the baseline's head count; give --heads)"),  # "divisors ≤ 1 are 1"; whose 12
        (["--kv-schedule", "--min-kv-heads", "12"], "--min-kv-heads 12 leaves no group size above 1: sharing among 2 "
                                                    "of the baseline's 12 heads already keeps only 6; give "
                                                    "--min-kv-heads from 1 to 6"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(args, message):
    result = run("count", *args)
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr


def test_a_limit_past_any_count_is_one_line_and_exit_2():
    result = run("list", "--space", "prism", "--limit", "99999999999999999999")  # islice's traceback before
    assert result.exit_code == 2 and result.stderr.startswith("error: --limit 99999999999999999999 is invalid: give a "
                                                              "count from 0 to ")


def test_a_plateau_of_zero_layers_is_refused_not_dropped():
    result = run("show", "--space", "prism", *GPT2, "--schedule", "12x0,12x12")  # it read as 12x12: "valid"
    assert result.exit_code == 2 and "schedule item '12x0' spans 0 layers" in result.stderr


def test_show_a_valid_schedule():
    result = run("show", "--space", "prism", *GPT2, "--schedule", "3,3,6,6,12,12,12,12,12,12,12,12")
    assert result.exit_code == 0
    assert "valid" in result.stdout and "plateaus: 3x2,6x2,12x8" in result.stdout


def test_show_an_invalid_schedule_says_why():
    result = run("show", "--space", "prism", *GPT2, "--schedule", "8,8,8,8,6,6,12,12,12,12,12,12")
    assert result.exit_code == 1
    assert "layer 5: 6 heads after 8 — schedules must not decrease" in result.stdout
    result = run("show", "--space", "prism", *GPT2, "--schedule", "3x2,7x2,12x8")
    assert result.exit_code == 1 and "layer 3: 7 heads does not divide d_model=768" in result.stdout


def test_show_a_config_file(tmp_path):
    space = build_space(SpaceOptions(space="hourglass"))
    member = list(space)[3]
    path = tmp_path / "arch.json"
    path.write_text(member.to_json())
    result = run("show", "--space", "hourglass", "--config", str(path))
    assert result.exit_code == 0 and f"d_h: {member.ffn.hidden}" in result.stdout


def test_build_space_fills_defaults_from_the_proxy_baseline():
    prism = build_space(SpaceOptions())
    assert isinstance(prism, PrismSpace) and prism.baseline() == DEFAULT_BASELINE
    hourglass = build_space(SpaceOptions(space="hourglass"))
    assert isinstance(hourglass, HourglassSpace) and hourglass.baseline() == DEFAULT_BASELINE
    assert isinstance(build_space(SpaceOptions(space="joint")), JointSpace)
    other = DEFAULT_BASELINE.replace(n_layers=6, heads=[12] * 6)
    assert build_space(SpaceOptions(), defaults=other).baseline() == other
    wider = build_space(SpaceOptions(d_model=768))
    assert wider.baseline().ffn.hidden == 2048  # the defaults' FFN only fits their own width


def test_space_options_from_cli_parses_sizes_lists_and_fractions():
    opts = space_options_from_cli(space="hourglass", budget="1.2B", k_values="1,2,4", ratio_values="0.25, 0.5",
                                  tolerance="0.1%", hw_aligned=False, fix="none")
    assert opts.budget == 1_200_000_000 and opts.k_values == (1, 2, 4) and opts.ratio_values == (0.25, 0.5)
    assert opts.tolerance == pytest.approx(0.001) and opts.hw_aligned is None and opts.fix is None
    assert space_options_from_cli(budget="500k").budget == 500_000
    with pytest.raises(TypeError, match="trials"):
        space_options_from_cli(trials=3)
    with pytest.raises(UsageError):
        build_space(SpaceOptions(space="hourglass", min_plateau=3))


def test_a_long_listing_in_the_background_stops_on_kill_int(tmp_path):
    """`nas space list ... > big.json &` starts with SIGINT ignored (Python keeps it so): `kill -INT` did nothing to a
    listing of billions of members (9.7 GB written in 11 minutes); every command now stops on it with exit 130 and no
    traceback."""
    with open(tmp_path / "big.json", "w") as out:
        proc = subprocess.Popen([*NAS, "space", "list", "--space", "prism", "--layers", "96", "--d-model", "12288",
                                 "--heads", "96", "--format", "json"], stdout=out, stderr=subprocess.PIPE, text=True,
                                env=nas_env(), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        deadline = time.monotonic() + 60
        while (tmp_path / "big.json").stat().st_size < 10_000 and time.monotonic() < deadline:  # it is listing
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        said = proc.stderr.read()
        assert code == 130 and "Traceback" not in said, (code, said)
