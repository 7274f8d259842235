"""Grouped-query attention through the search (issue 38): the kv_cache objective, study identity, the report's
loss-KV cache front and answer, nas best / export rows, carrying a grouped shape to a target preset, and (slow) a
real search, export and training of grouped shapes."""

from __future__ import annotations

import json
from types import SimpleNamespace

import optuna
import pytest
from search_helpers import load_trials, run_nas, sqlite_url
from typer.testing import CliRunner

from nas.arch import uniform
from nas.cli import app
from nas.errors import UsageError
from nas.study.config import SearchConfig, precheck
from nas.study.identity import default_identity, default_study_name, identity, train_config
from nas.study.records import shape_attrs
from reports.export import export_rows
from reports.frame import read_study
from reports.html import build_report
from reports.kv_cache import kv_points, pareto_front
from reports.summary import summarise
from runners.presets import get_preset
from search_spaces.factory import SpaceOptions, build_space
from search_spaces.transfer import transfer_shape

BASE = uniform(4, 32, 4, 256)  # the tiny preset's baseline
DATA = SimpleNamespace(fingerprint="builtin-test", vocab_size=256)


@pytest.fixture(autouse=True)
def quiet():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def name_of(space: SpaceOptions, objectives: tuple[str, ...] = ("loss",)) -> str:
    config = SearchConfig(space=space, preset="cpu", objectives=objectives)
    preset = get_preset("cpu")
    built = build_space(preset.space_options(config.space), defaults=preset.baseline)
    return default_study_name(config, identity(config, built, train_config(config), DATA),
                              default_identity(config, DATA))


def test_the_default_study_names_are_unchanged_and_gqa_options_name_their_own_study():
    assert name_of(SpaceOptions(space="prism")) == "prism-cpu"
    assert name_of(SpaceOptions(space="joint")) == "joint-cpu"
    grouped = {name_of(SpaceOptions(space="prism", kv_groups=(2,))), name_of(SpaceOptions(space="prism",
                                                                                          kv_groups=(4,))),
               name_of(SpaceOptions(space="prism", kv_schedule=True)),
               name_of(SpaceOptions(space="prism", kv_groups=(2,)), ("loss", "kv_cache"))}
    assert len(grouped) == 4 and all(n.startswith("prism-cpu-") for n in grouped)


def test_the_kv_cache_objective_needs_grouped_key_value_heads_and_bad_objectives_name_it():
    precheck(SearchConfig(space=SpaceOptions(space="prism", kv_groups=(2,)), objectives=("loss", "kv_cache")))
    with pytest.raises(UsageError, match="--objectives loss,kv_cache needs a space with grouped key/value heads"):
        precheck(SearchConfig(space=SpaceOptions(space="prism"), objectives=("loss", "kv_cache")))
    with pytest.raises(UsageError, match="use loss, loss,params, loss,tokens_per_s or loss,kv_cache"):
        SearchConfig(objectives=("loss", "kv")).validate()
    from nas.study.trial import objective_values

    search = SimpleNamespace(config=SearchConfig(objectives=("loss", "kv_cache")))
    gqa = BASE.replace(kv_heads=[1] * 4)
    assert objective_values(search, gqa, 3.5, 1000.0) == [3.5, float(gqa.kv_cache_bytes_per_token())] == [3.5, 128.0]


def grouped_study(storage: str | None = None) -> optuna.Study:
    """A study without training: the baseline, a multi-query shape as good as it, a GQA one, a worse Prism one."""
    study = optuna.create_study(study_name="gqa", storage=storage, directions=["minimize", "minimize"])
    study.set_user_attr("nas:baseline_key", BASE.key())
    study.set_user_attr("nas:identity", {"objectives": ["loss", "kv_cache"], "space": {"space": "prism"}})
    mqa, gqa, prism = BASE.replace(kv_heads=[1] * 4), BASE.replace(kv_heads=[2] * 4), BASE.replace(heads=[1, 1, 4, 4])
    losses = {BASE: 3.00, mqa: 3.001, gqa: 3.002, prism: 3.6}
    for seed in range(3):
        for index, (arch, loss) in enumerate(losses.items()):
            role = "baseline" if arch == BASE and seed == 0 else "member" if seed == 0 else "replicate"
            value = loss + 0.05 * seed + 0.01 * ((7 * index + 3 * seed) % 5 - 2)  # seed luck and noise
            study.add_trial(optuna.trial.create_trial(values=[value, float(arch.kv_cache_bytes_per_token())],
                                                      user_attrs={**shape_attrs(arch, seed, role), "val_loss": value}))
    return study


def test_the_report_draws_loss_against_kv_cache_and_the_answer_names_the_cheapest_tied_shape():
    data = read_study(grouped_study())
    summary = summarise(data)
    mqa = BASE.replace(kv_heads=[1] * 4)
    assert mqa.key() in summary.tied and BASE.replace(heads=[1, 1, 4, 4]).key() not in summary.tied
    assert summary.answer.cheapest == mqa.key()
    assert summary.detail.endswith(f"The cheapest shape tied with the best is {mqa.label()}: 128 bytes of KV "
                                   "cache per token, 25 % of the baseline's 512.")
    points = kv_points(data)
    assert {p.kv_bytes for p in points} == {512, 256, 128} and [p.kv_bytes for p in pareto_front(points)][0] == 128
    html = build_report(data)
    assert '<section id="kv-cache">' in html and "Loss against KV cache" in html
    assert 'data-figure="kv-cache-0"' in html and "cheapest tied with the best" in html
    rows = export_rows(data, 10)
    by_key = {r["key"]: r for r in rows}
    assert by_key[mqa.key()]["kv_heads"] == "1x4" and by_key[mqa.key()]["kv_cache_bytes_per_token"] == 128
    assert by_key[BASE.key()]["kv_cache_bytes_per_token"] == 512
    assert by_key[mqa.key()]["arch"]["kv_heads"] == [1] * 4  # a row is a nas train --config
    from reports.dashboard_note import note_text

    note = note_text(data)  # optuna-dashboard's note: the same sentence, the shapes with their key/value heads
    assert "kv=1x4" in note and "The cheapest shape tied with the best" in note


def test_a_study_without_grouped_shapes_has_no_kv_section_and_keeps_its_sentence():
    study = optuna.create_study(study_name="mha")
    study.set_user_attr("nas:baseline_key", BASE.key())
    for seed in range(2):
        for arch, loss in ((BASE, 3.0), (BASE.replace(heads=[2, 2, 4, 4]), 3.1)):
            study.add_trial(optuna.trial.create_trial(value=loss + seed, user_attrs={
                **shape_attrs(arch, seed, "baseline" if arch == BASE and not seed else "member"), "val_loss": loss}))
    data = read_study(study)
    assert "KV cache" not in summarise(data).sentence and '<section id="kv-cache">' not in build_report(data)


def test_nas_best_shows_key_value_heads_and_their_cache_for_a_grouped_study(tmp_path):
    storage = sqlite_url(tmp_path / "gqa.db")
    grouped_study(storage)
    result = CliRunner().invoke(app, ["best", "--storage", storage, "--study-name", "gqa"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("rank"))
    assert "kv heads" in header and "KV B/tok" in header
    assert any("1x4" in line and " 128 " in line for line in lines)


def test_a_grouped_shape_carries_its_group_sizes_to_a_target_preset():
    cpu, gpt2, medium = (get_preset(name).baseline for name in ("cpu", "gpt2-124m", "gpt2-354m"))
    space = build_space(SpaceOptions(space="prism", kv_groups=(3,)), defaults=cpu)
    arch = next(a for a in space if a.grouped and len(set(a.heads)) > 1)  # a Prism schedule, 3 heads per KV head
    carried = transfer_shape(arch, space.describe(), space.baseline(), gpt2)
    assert carried.ok, carried.refused
    assert carried.target.heads == arch.heads and carried.target.kv_groups() == arch.kv_groups()
    budget = gpt2.n_params()["total"]
    assert abs(carried.target.n_params()["total"] - budget) <= 1e-4 * budget
    assert carried.target.ffn.hidden > gpt2.ffn.hidden  # the target's FFN takes what its key/value heads save
    assert "group sizes h_l/kv_l 3x12 carried unchanged" in " ".join(carried.rules)
    refused = transfer_shape(arch, space.describe(), space.baseline(), medium)  # h_base 16: 3 does not divide it
    assert not refused.ok and "group size 3 does not divide the" in refused.refused


@pytest.mark.slow
def test_a_grouped_search_stores_the_cache_trains_exports_and_trains_again(tmp_path, one_thread):
    """``nas search --kv-groups 2,4 --objectives loss,kv_cache`` on the tiny preset: every trial stores its KV cache
    and kv_heads, the second objective is the cache, and the best grouped row exports and trains."""
    storage = sqlite_url(tmp_path / "s.db")
    result = run_nas("search", "--space", "prism", "--preset", "tiny", "--kv-groups", "2,4", "--objectives",
                     "loss,kv_cache", "--trials", "6", "--tokens", "1k", "--storage", storage, "--workers", "1",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    (name,) = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    trials = [t for t in load_trials(storage, name) if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(trials) >= 6 and any(len(set(t.user_attrs["kv_heads"])) == 1 and t.user_attrs["kv_heads"][0] < 4
                                    for t in trials)
    for t in trials:
        per_layer = [n * 32 // h for n, h in zip(t.user_attrs["kv_heads"], t.user_attrs["heads"])]
        assert t.values[1] == t.user_attrs["kv_cache_bytes_per_token"] == 2 * 2 * sum(per_layer)
    rows = json.loads(CliRunner().invoke(app, ["export", "--storage", storage, "--study-name", name]).stdout)
    row = next(r for r in rows if r["arch"].get("kv_heads"))
    (tmp_path / "row.json").write_text(json.dumps(row))
    trained = run_nas("train", "--config", str(tmp_path / "row.json"), "--preset", "tiny", "--tokens", "1k",
                      "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    exported = run_nas("export", "--storage", storage, "--study-name", name, "--format", "hf", "--rank",
                       str(row["rank"]), "-o", str(tmp_path / "hf"), cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-2000:]
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["num_key_value_heads"] == row["arch"]["kv_heads"]
