"""``nas report`` on studies made with Optuna's API (no training): every section, or its one-line "no data"."""

from __future__ import annotations

import re
from html import unescape
from html.parser import HTMLParser

import optuna
import pytest
from typer.testing import CliRunner

from benchmarks.synthetic_studies import SyntheticSpec, synthetic_study
from nas.arch import uniform
from nas.cli import app
from nas.study.records import shape_attrs
from reports.attention import attention_section
from reports.frame import outcome_counts, read_study
from reports.html import build_report
from reports.summary import summarise
from reports.training import training_section

SECTIONS = ("summary", "leaderboard", "rules", "staircases", "width-depth", "dynamics", "training", "attention",
            "reruns")


class Page(HTMLParser):
    """What a reader sees: each section's one-line 'empty' text, its figure divs, and every <script> tag."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.section: str | None = None
        self.in_empty = False
        self.empty: dict[str, str] = {}
        self.figures: dict[str, int] = {}
        self.scripts: list[dict] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.section = attrs["id"]
            self.figures[self.section] = 0
        elif tag == "p" and attrs.get("class") == "empty":
            self.in_empty = True
        elif tag == "div" and attrs.get("class") == "figure":
            self.figures[self.section] += 1
        elif tag == "script":
            self.scripts.append(attrs)

    def handle_endtag(self, tag):
        self.in_empty = self.in_empty and tag != "p"

    def handle_data(self, data):
        if self.in_empty:
            self.empty[self.section] = self.empty.get(self.section, "") + data


def page_of(study: optuna.Study, **kwargs) -> tuple[str, Page]:
    html = build_report(read_study(study), **kwargs)
    return html, Page(html)


@pytest.fixture(autouse=True)
def quiet():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_a_prism_study_has_staircases_and_attention_and_says_it_has_no_width_depth_axis():
    html, page = page_of(synthetic_study(SyntheticSpec(space="prism", trials=160)))
    assert list(page.figures) == list(SECTIONS)
    assert page.figures["staircases"] == 1 and page.figures["attention"] == 2 and page.figures["training"] == 2
    assert page.figures["dynamics"] == 3  # history, intermediate values, importances
    assert page.figures["rules"] == 3  # forest, partial residuals, error distribution functions
    assert "log2_first_heads" in html and "halving the first layer&#x27;s heads" in html
    assert "a prism study keeps d_model and L fixed" in page.empty["width-depth"]
    assert "no full-scale re-runs are stored for this study yet" in page.empty["reruns"]
    assert set(page.empty) == {"width-depth", "reruns"}
    assert len([s for s in page.scripts if not s.get("src")]) == 1 + sum(page.figures.values())  # plotly.js once
    assert html.count("Plotly.newPlot") == sum(page.figures.values())


@pytest.mark.parametrize("space", ["hourglass", "joint"])
def test_hourglass_and_joint_studies_draw_the_three_curves(space):
    html, page = page_of(synthetic_study(SyntheticSpec(space=space, trials=120)))
    assert page.figures["width-depth"] == 3 and "width-depth" not in page.empty
    assert "Fit: loss = a + b x + c x^2 in x = log(d_model/L)" in html and "minimum at d_model/L = " in html
    # the grid reaches 2 layers (d_model/L up to ~180): the paper's band lies inside it, and the fit is stated beside it
    assert "beside the Hourglass paper's 100-250 at 113M parameters" in unescape(html)
    if space == "hourglass":
        assert "hourglass study" in page.empty["staircases"] and "hourglass study" in page.empty["attention"]
    else:
        assert page.figures["staircases"] == 1


def test_the_width_depth_minimum_found_is_the_synthetic_truth():
    """The width-depth figure's fit and the design rules' U (Fieller's interval) both find the synthetic bottom."""
    from benchmarks.synthetic_studies import OPTIMUM_RATIO

    html, page = page_of(synthetic_study(SyntheticSpec(space="hourglass", trials=150, seed=3)))
    minimum = float(re.search(r"minimum at d_model/L = ([0-9.]+)", html).group(1))
    low, high = (float(v) for v in re.search(r"95 % bootstrap interval \[([0-9.]+), ([0-9.]+)\]", html).groups())
    assert low <= OPTIMUM_RATIO <= high and abs(minimum - OPTIMUM_RATIO) / OPTIMUM_RATIO < 0.3
    bottom, low, high = (float(v) for v in re.search(
        r"The width-depth U: lowest near d_model/L = ([0-9.]+) \[([0-9.]+), ([0-9.]+)\]", html).groups())
    assert low <= OPTIMUM_RATIO <= high and abs(bottom - OPTIMUM_RATIO) / OPTIMUM_RATIO < 0.3
    assert page.figures["rules"] == 3


def test_an_empty_study_says_so_in_every_section():
    study = optuna.create_study(study_name="empty")
    study.set_user_attr("nas:baseline_key", uniform(4, 32, 4, 256).key())
    _, page = page_of(study)
    assert set(page.empty) == set(SECTIONS) - {"summary"} and sum(page.figures.values()) == 0
    assert "no shape has completed a training yet" in page.empty["leaderboard"]


def test_a_study_of_failures_only_counts_them_by_reason_and_draws_nothing():
    study = synthetic_study(SyntheticSpec(space="prism", trials=12, failures_only=True))
    data = read_study(study)
    assert outcome_counts(data) == {"complete": 0, "pruned": 0, "failed (diverged)": 12, "duplicates": 1}
    html, page = page_of(study)
    assert "12 failed (diverged)" in html and "no shape has completed a training yet" in html
    assert sum(page.figures.values()) == 0


def test_the_answer_says_what_happened_when_every_training_failed_the_baseline_failed_or_only_it_trained():
    """All diverged read 'no completed trials yet'; a diverged baseline 'has no completed training yet'; a study of the
    baseline alone 'No shape beats the baseline ... The baseline has the lowest loss'."""
    failed = summarise(read_study(synthetic_study(SyntheticSpec(space="prism", trials=12, failures_only=True))))
    assert failed.sentence == ("No shape has a score: every training that ended failed (12 diverged); nothing to "
                               "compare.")
    alone = summarise(read_study(synthetic_study(SyntheticSpec(space="prism", preset="tiny", trials=1))))
    assert alone.sentence == "Only the baseline has completed a training: no other shape to compare with it yet."
    assert not alone.detail
    # its curves were titled "none shares a seed with the baseline": there was no other shape to share one
    lone = training_section(read_study(synthetic_study(SyntheticSpec(space="prism", preset="tiny", trials=1))))
    assert [f.layout.title.text for f in lone.figures] == [
        "Validation loss during training (the baseline alone: no other shape has a completed training)",
        "Training loss (the baseline alone: no other shape has a completed training)"]
    study = synthetic_study(SyntheticSpec(space="prism", preset="tiny", trials=6, diverge_share=0.0, prune_share=0.0))
    broken = optuna.create_study(study_name="baseline-diverged")
    broken.set_user_attr("nas:identity", study.user_attrs["nas:identity"])
    for key, value in study.user_attrs.items():
        broken.set_user_attr(key, value)
    baseline = study.user_attrs["nas:baseline_key"]
    for t in study.trials:
        if t.user_attrs.get("key") == baseline:  # every seed of it
            attrs = {**t.user_attrs, "status": "diverged", "val_loss": None, "reason": "train loss nan at step 3"}
            t = optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, params=t.params,
                                          distributions=t.distributions, user_attrs=attrs)
        broken.add_trial(t)
    sentence = summarise(read_study(broken)).sentence
    assert sentence.startswith("The baseline's training diverged, so no gain over it can be read; the best shape is ")
    # the curves were titled "on common seeds" with no baseline to share a seed with
    titles = [f.layout.title.text for f in training_section(read_study(broken)).figures]
    assert titles and all("on each shape's own seeds: the baseline has no completed training" in t for t in titles)


def test_importances_are_not_drawn_from_a_handful_of_trainings():
    """fANOVA drew 'ffn_draw 0.92' from two completed trainings."""
    from reports.dynamics import MIN_IMPORTANCE_TRIALS, dynamics_section

    few = dynamics_section(read_study(synthetic_study(SyntheticSpec(space="prism", preset="tiny", trials=4,
                                                                    diverge_share=0.0, prune_share=0.0))))
    assert any(n.startswith("Parameter importances: not drawn from ") and f"at least {MIN_IMPORTANCE_TRIALS}" in n
               for n in few.notes), few.notes
    assert not any("importances" in (f.layout.title.text or "").lower() for f in few.figures)


def test_re_runs_at_the_proxys_own_tokens_are_no_longer_budget_for_the_rules():
    """A plain `nas rerun --preset tiny` of a tiny study was read as a fidelity check of the rules."""
    import pandas as pd

    data = read_study(synthetic_study(SyntheticSpec(space="prism", preset="tiny", trials=12)))
    tokens = data.identity["train"]["tokens"]
    keys = list(data.scores)[:4]
    data.reruns = pd.DataFrame([{"preset": preset, "proxy_key": key, "key": key, "seed": 0, "role": "member",
                                 "val_loss": 3.0 + 0.01 * i, "tokens_per_s": 1.0, "mfu": 0.1, "tokens": budget}
                                for preset, budget in (("tiny", tokens), ("tiny (8,192 tokens)", 2 * tokens))
                                for i, key in enumerate(keys)])
    inputs = data.rule_inputs(data.rules())
    assert [budget.label for budget in inputs.budgets] == ["tiny (8,192 tokens)"]


def test_a_study_whose_every_trial_was_pruned_draws_no_importances_and_logs_no_warning():
    """Issue 52: ``nas report`` on an all-pruned study printed Optuna's ``[W ...] Study instance does not contain
    completed trials.`` (its importances plot logs it); the section says so in its own words instead."""
    import logging

    from reports.dynamics import dynamics_section

    trained = synthetic_study(SyntheticSpec(space="prism", trials=6, diverge_share=0.0))
    study = optuna.create_study(study_name="pruned")
    for key, value in trained.user_attrs.items():
        study.set_user_attr(key, value)
    for t in trained.trials:
        study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, params=t.params,
                                                  distributions=t.distributions, user_attrs=t.user_attrs,
                                                  intermediate_values=t.intermediate_values))
    logged: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(record.getMessage())

    handler = Keep(logging.WARNING)
    logging.getLogger("optuna").addHandler(handler)
    try:
        section = dynamics_section(read_study(study))
    finally:
        logging.getLogger("optuna").removeHandler(handler)
    assert logged == []
    assert any("Parameter importances: not available (no trial has completed a training" in n for n in section.notes)


@pytest.mark.parametrize("objective", ["params", "tokens_per_s"])
def test_a_multi_objective_study_draws_its_pareto_front(objective):
    html, page = page_of(synthetic_study(SyntheticSpec(space="hourglass", trials=40, objectives=("loss", objective))))
    # the history (the loss as the board ranks it; left out before, without a word), importances, the front
    assert "Pareto front" in html and page.figures["dynamics"] == 3
    assert "Intermediate values: none for a study of several objectives" in html
    from reports.dynamics import dynamics_section

    study = synthetic_study(SyntheticSpec(space="hourglass", trials=40, objectives=("loss", objective)))
    (front,) = [f for f in dynamics_section(read_study(study)).figures if f.layout.title.text == "Pareto front"]
    # the front in one solid colour (trial 0 was drawn near-white), and a hover of the trial and its two values,
    # not the trial's whole JSON
    assert {t.name: t.marker.color for t in front.data} == {"on the front": "#c0392b", "other trials": "#9aa5b1"}
    assert all(t.text is None and t.hovertemplate.startswith("trial %{customdata}<br>loss %{x}") for t in front.data)
    for trace in front.data:  # each point under the study's own trial number (the copy it is drawn from renumbers)
        assert all(study.trials[n].values[0] == x for n, x in zip(trace.customdata, trace.x))


def test_a_study_of_a_thousand_trials_reports_every_section():
    study = synthetic_study(SyntheticSpec(space="joint", trials=1000, seed=5))
    assert len(study.trials) > 1000
    _, page = page_of(study)
    assert page.figures["width-depth"] == 3 and page.figures["staircases"] == 1 and page.figures["dynamics"] == 3


def test_every_stored_string_is_escaped():
    evil = "<script>alert(1)</script>"
    study = optuna.create_study(study_name=evil)
    base = uniform(4, 32, 4, 256)
    study.set_user_attr("nas:baseline_key", base.key())
    study.set_user_attr("nas:data", '<img src=x onerror="alert(2)">')
    study.set_user_attr("nas:preset", "<b>cpu</b>")
    study.add_trial(optuna.trial.create_trial(value=3.0, user_attrs={**shape_attrs(base, 0, "baseline"),
                                                                     "val_loss": 3.0, "tokens_per_s": 1.0,
                                                                     "eval_curve": [[10, 3.0]],
                                                                     "reason": "</td><script>alert(3)</script>"}))
    html, page = page_of(study)
    assert "<script>alert" not in html and "<img src=x" not in html and "<b>cpu</b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert all(s.get("type") == "text/javascript" or s.get("src") is None for s in page.scripts)


def test_the_summary_sentence_names_a_real_gain_and_otherwise_the_tied_set():
    # the synthetic prism gain (0.1 % for wide-headed first plateaus) against seed noise of 0.03 nats, with 6 spare
    # trials after the 129 members: nothing can be resolved; the board's best is a replicated shape (the shrunk
    # ranking does not put a one-seed shape's luck first), whose one seed besides the selecting one gives no
    # interval (and so no minimum detectable gain: one paired seed tests nothing the answer states)
    data = read_study(synthetic_study(SyntheticSpec(space="prism", trials=135, seed=2)))
    short = summarise(data)
    # the first sentence is the verdict and its resolution, in one breath; the tied set is a count and a pointer
    assert short.sentence == ("No shape is distinguishable from the baseline at this proxy; how small a gain this "
                              "study could detect is not known yet.")
    assert data.scores[short.best].n >= 2 and short.gain is not None and not short.gain.significant
    assert short.best in short.tied and len(short.tied) > 10
    assert f"{len(short.tied) - 1} other shapes are tied with the best (the leaderboard's 'tied' column)" in \
        short.detail and "h=" not in short.detail
    study = optuna.create_study(study_name="clear")
    base, better = uniform(4, 32, 4, 256), uniform(4, 32, 4, 256).replace(heads=[2, 2, 4, 4])
    study.set_user_attr("nas:baseline_key", base.key())
    for seed in range(6):
        for arch, role, loss in ((base, "baseline" if seed == 0 else "replicate", 3.0 + 0.05 * seed),
                                 (better, "member" if seed == 0 else "replicate", 2.9 + 0.05 * seed + 0.001 * seed)):
            study.add_trial(optuna.trial.create_trial(value=loss, user_attrs={**shape_attrs(arch, seed, role),
                                                                              "val_loss": loss}))
    clear = summarise(read_study(study))
    assert clear.sentence.startswith("h=2x2,4x2 K1x88 d32 L4 beats the baseline by 3.") and "5 paired seeds" in \
        clear.sentence  # seed 0 selected it: the interval uses the 5 others
    assert clear.gain.n == 5 and clear.gain.low_pct > 0


def test_nas_report_writes_the_file_and_cdn_mode_is_small(tmp_path):
    storage = f"sqlite:///{tmp_path / 'r.db'}"
    synthetic_study(SyntheticSpec(space="prism", trials=30), storage=storage, name="prism-cpu")
    out = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["report", "--storage", storage, "-o", str(out)])  # the only study
    assert result.exit_code == 0, result.output
    assert re.fullmatch(r"wrote \S+report\.html \(\d\.\d MB, 3\d trials, \d+\.\d s\)\n", result.stderr)
    assert 4_000_000 < out.stat().st_size < 8_000_000  # plotly.js inline, once
    small = tmp_path / "small.html"
    result = CliRunner().invoke(app, ["report", "--storage", storage, "--plotlyjs", "cdn", "-o", str(small)])
    assert result.exit_code == 0 and small.stat().st_size < 1_000_000
    assert re.search(r'<script src="https://cdn\.plot\.ly/plotly-[0-9.]+\.min\.js"', small.read_text())


@pytest.mark.parametrize("args, says", [
    (["--study-name", "nope"], "no study 'nope'"),
    (["--top", "0"], "--top 0 is invalid"),
    (["-o", "."], "is a directory"),
    (["-o", "no/such/folder/r.html"], "does not exist"),
    (["--plotlyjs", "svg"], "'svg' is not one of 'inline', 'cdn'"),
    (["--storage", "sqlite:///missing.db"], "storage file 'missing.db' does not exist"),
])
def test_nas_report_with_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, args, says):
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path / 'r.db'}"
    synthetic_study(SyntheticSpec(space="prism", trials=5), storage=storage, name="one")
    result = CliRunner().invoke(app, ["report", "--storage", storage, *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.stderr
    assert not (tmp_path / "missing.db").exists()  # a report never creates a storage


def test_nas_report_without_a_study_name_lists_the_studies(tmp_path):
    storage = f"sqlite:///{tmp_path / 'two.db'}"
    for name in ("alpha", "beta"):
        synthetic_study(SyntheticSpec(space="prism", trials=3), storage=storage, name=name)
    result = CliRunner().invoke(app, ["report", "--storage", storage])
    assert result.exit_code == 2, result.output
    assert "holds 2 shape searches; its studies: alpha (shape search), beta (shape search)" in result.stderr


def test_a_storage_without_a_shape_search_says_so_instead_of_asking_for_a_study_name(tmp_path):
    storage = f"sqlite:///{tmp_path / 'foreign.db'}"
    optuna.create_study(storage=storage, study_name="lr")
    result = CliRunner().invoke(app, ["report", "--storage", storage])
    assert result.exit_code == 2, result.output
    assert result.stderr == (f"error: {storage} holds no shape search (`nas search --storage ...` makes one); its "
                             "studies: lr (not a shape search)\n")  # "give --study-name", which no name could satisfy


def test_training_curves_and_attention_distances_are_compared_on_common_seeds():
    # seed 0 is 0.11 nats luckier than the baseline's other eight seeds; a shape trained on seed 0 alone that
    # learns exactly as the baseline does on seed 0 must show no head start (not "0.45x the tokens")
    study = optuna.create_study(study_name="lucky-seed")
    base, shape = uniform(4, 32, 4, 256), uniform(4, 32, 4, 256).replace(heads=[2, 2, 4, 4])
    study.set_user_attr("nas:baseline_key", base.key())

    def add(arch, seed: int, role: str) -> None:
        final = 3.0 - (0.11 if seed == 0 else 0.0)
        curve = [[t, final + 2.4 * (1 - t / 4096) ** 2] for t in (1024, 2048, 3072, 4096)]
        distances = [1.0, 2.0, 3.0, 4.0] if seed == 0 else [2.0, 3.0, 4.0, 5.0]
        study.add_trial(optuna.trial.create_trial(value=final, user_attrs={
            **shape_attrs(arch, seed, role), "val_loss": final, "eval_curve": curve, "train_curve": curve,
            "attention_distance": distances}))

    for seed in range(9):
        add(base, seed, "baseline" if seed == 0 else "replicate")
    add(shape, 0, "member")
    data = read_study(study)
    html = training_section(data).html
    rows = re.findall(r"<tr>(.*?)</tr>", html, re.S)
    shape_row = next(unescape(r) for r in rows if "h=2x2,4x2" in r)
    assert "seed 0<" in shape_row and "1.00x" in shape_row and "2.8900" in shape_row, shape_row
    names = [trace.name for trace in training_section(data).figures[0].data]
    assert "baseline (seed 0)" in names and any(n.endswith("(seed 0)") and n.startswith("h=2x2") for n in names)
    colours = {trace.name: trace.line.color for trace in training_section(data).figures[0].data}
    # the baseline's orange, and no shape in it (Plotly's own colours for the shapes came near it)
    assert all((colour == "#d95f02") == name.startswith("baseline") for name, colour in colours.items()), colours
    figure = attention_section(data).figures[1]
    (delta,) = figure.data
    assert list(delta.y) == [0.0, 0.0, 0.0, 0.0] and delta.name.endswith("(seed 0)")
    assert figure.layout.showlegend  # one shape's bars: Plotly hid the legend, and with it which shape they are


def test_rules_with_too_few_shapes_draw_no_empty_effect_figure_and_no_fitted_line(tmp_path):
    """On a study of three shapes no rule has a number: the effect figure was a pair of empty axes, and the partial
    residuals drew a 'fitted effect' that was an exact line through the points."""
    from nas.study.existing import load_existing_study
    from reports.rules import rules_section

    storage = f"sqlite:///{tmp_path / 'three.db'}"
    synthetic_study(SyntheticSpec(space="prism", preset="tiny", trials=6), storage=storage, name="three")
    section = rules_section(read_study(load_existing_study(storage, "three")))
    assert "too few shapes to say" in section.html
    titles = [figure.layout.title.text for figure in section.figures]
    assert not any(title.startswith("Design rules: effect") for title in titles), titles
    (residuals,) = [f for f in section.figures if f.layout.title.text.startswith("Partial residuals")]
    assert residuals.data and all(trace.mode == "markers" for trace in residuals.data)
    # each group's distribution rises from 0 at its lowest loss to 1: a one-shape group was a lone point, not drawn
    (edf,) = [f for f in section.figures if f.layout.title.text.startswith("Error distribution")]
    assert edf.data and all(len(t.x) >= 2 and t.y[0] == 0 and t.y[-1] == 1 and t.x[0] == t.x[1] for t in edf.data)


def test_the_staircase_titles_give_the_leaderboards_seed_adjusted_loss():
    """They gave each shape's raw mean over its own few seeds beside the baseline's mean over all of its seeds: a
    shape worse than the baseline on common seeds read 0.03 nats better."""
    from reports.staircases import staircase_section

    data = read_study(synthetic_study(SyntheticSpec(space="prism", preset="tiny", trials=12)))
    titles = [a.text for a in staircase_section(data).figures[0].layout.annotations]
    board = data.board.set_index("rank")
    for title in titles:
        rank = "baseline" if title.startswith("baseline") else int(title.split(":")[0].removeprefix("rank "))
        row = data.board[data.board["is_baseline"]].iloc[0] if rank == "baseline" else board.loc[rank]
        assert title.endswith(f"seed-adj. loss {row['adjusted_loss']:.4f}"), title


def test_the_re_run_hint_names_the_storage_it_was_read_from():
    """It left --storage out, so the command as printed looked for the default nas.db."""
    from nas.study.config import hidden_password_note
    from reports.reruns import reruns_section

    data = read_study(synthetic_study(SyntheticSpec(space="prism", preset="tiny", trials=6)))
    assert "--storage" not in reruns_section(data).empty  # the default storage: nothing to add
    data.storage = "postgresql://nas:***@db/nas"  # as nas report sets them
    data.storage_note = hidden_password_note("postgresql://nas:secret@db/nas")
    hint = reruns_section(data).empty
    assert "--storage 'postgresql://nas:***@db/nas' --top K" in hint and "secret" not in hint
    assert hint.endswith("(*** stands for the storage's password, not printed)")


def test_a_study_without_replicates_says_how_to_get_them():
    """A sampled study trains each shape once: "It needs a shape with two seeds in common with the baseline" left a
    user adding trials below the space's size, which never replicates."""
    detail = summarise(read_study(synthetic_study(SyntheticSpec(space="hourglass", trials=10, replicate_top=0)))).detail
    assert ("the search replicates once it has walked every member of the space (--trials at least `nas space count` "
            "with the same options), or `nas rerun --seeds 2` trains the best again.") in detail


def test_staircases_below_uniform_leaders_say_which_ranks_they_are():
    """The panels drew ranks 10, 14 and 15 of 16 under "which head counts the best schedules use" without a word."""
    import pandas as pd

    from reports.staircases import staircase_section

    data = read_study(synthetic_study(SyntheticSpec(space="joint", preset="tiny", trials=40, seed=2)))
    assert not [n for n in staircase_section(data).notes if n.startswith("The leaderboard's")]  # a staircase leads
    uniform = data.board["arch"].map(lambda a: len(set(a["heads"])) == 1)
    data.board = pd.concat([data.board[uniform], data.board[~uniform]], ignore_index=True)  # uniform shapes lead
    data.board["rank"] = range(1, len(data.board) + 1)
    first = int(uniform.sum()) + 1
    (said,) = [n for n in staircase_section(data).notes if n.startswith("The leaderboard's")]
    assert said.startswith(f"The leaderboard's ranks 1-{first - 1} have a uniform head count (no staircase); the "
                           f"panels are its best non-uniform schedules: rank {first}, rank {first + 1}")


def test_the_summary_says_what_its_tokens_per_s_ratio_is_and_a_slow_run_moves_it_least():
    """The summary's "tokens/s vs baseline" was a ratio of means over each side's runs, with no word of what it is:
    one run slowed by another process moved it (7.7x was read between shapes of one size on a loaded machine)."""
    from html import unescape

    study = optuna.create_study(study_name="speeds")
    base, other = uniform(4, 32, 4, 256), uniform(4, 32, 4, 256).replace(heads=[2, 2, 4, 4])
    study.set_user_attr("nas:baseline_key", base.key())
    for seed in range(3):
        for arch, role, loss, speed in ((base, "baseline" if seed == 0 else "replicate", 3.0, 1000.0),
                                        (other, "member" if seed == 0 else "replicate", 2.9, 100.0 if seed == 2
                                         else 1000.0)):  # one run of the shape shared the machine
            study.add_trial(optuna.trial.create_trial(value=loss + 0.01 * seed, user_attrs={
                **shape_attrs(arch, seed, role), "val_loss": loss + 0.01 * seed, "tokens_per_s": speed}))
    data = read_study(study)
    ratios = {row[""]: row["tokens/s vs baseline"] for row in summarise(data).rows}
    assert ratios == {"best": 1.0, "baseline": 1.0}  # medians: the mean would say 0.70x
    html, _ = page_of(study)
    assert ("tokens/s vs baseline: the median tokens/s of the shape's 3 runs over the baseline's 3, each run timed "
            "beside whatever else shared its machine then") in unescape(html)
    alone = optuna.create_study(study_name="baseline-alone")  # the baseline is the answer: its row alone, no note
    alone.set_user_attr("nas:baseline_key", base.key())
    alone.add_trial(optuna.trial.create_trial(value=3.0, user_attrs={**shape_attrs(base, 0, "baseline"),
                                                                     "val_loss": 3.0, "tokens_per_s": 1000.0}))
    assert "tokens/s vs baseline: the median" not in unescape(page_of(alone)[0])


def test_the_baseline_has_its_own_legend_entry_and_each_k_a_circle():
    """The baseline's star sat inside the K=1 trace, and the legend drew "K=1" as a star (the trace's first point)."""
    from reports.curves import _scatter_by_k, _shape_rows

    rows = _shape_rows(read_study(synthetic_study(SyntheticSpec(space="hourglass", trials=40))))
    traces = _scatter_by_k(rows, "ratio")
    ks = sorted({r["k"] for r in rows})
    assert [t.name for t in traces] == [*(f"K={k}" for k in ks), "baseline (K=1)"]
    assert [t.marker.symbol for t in traces] == ["circle"] * len(ks) + ["star"]
    assert traces[-1].marker.color == traces[0].marker.color  # the baseline in its K's colour
    assert sum(len(t.x) for t in traces) == len(rows)
