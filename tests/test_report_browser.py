"""The report in a real browser (headless Chromium, networking off), and read while a search writes its study.

Screenshots of every section go to ``$NAS_REPORT_SCREENSHOTS`` when it is set (a folder), else
to the test's temporary folder.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import optuna
import pytest
from search_helpers import SPACE5, TINY, load_trials, run_nas, sqlite_url, start_nas, stop
from typer.testing import CliRunner

from benchmarks.synthetic_studies import SyntheticSpec, synthetic_study
from nas.arch import uniform
from nas.cli import app
from nas.study.records import shape_attrs
from reports.frame import read_study
from reports.html import write_report

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


def open_in_chromium(path: Path, shots: Path | None) -> dict:
    """Load ``path`` offline; what a reader's browser did: console errors, requests, dialogs, rendered figures."""
    playwright = pytest.importorskip("playwright.sync_api")
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install chromium; .ci/run installs it)")
    seen: dict = {"console": [], "page_errors": [], "requests": [], "dialogs": []}
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(offline=True, viewport={"width": 1300, "height": 900})
            context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                          else route.abort())
            page = context.new_page()
            page.on("console", lambda m: seen["console"].append((m.type, m.text)))
            page.on("pageerror", lambda e: seen["page_errors"].append(str(e)))
            page.on("request", lambda r: seen["requests"].append(r.url))
            page.on("dialog", lambda d: (seen["dialogs"].append(d.message), d.dismiss()))
            page.goto(path.resolve().as_uri())
            page.wait_for_load_state("load")
            page.wait_for_function("Array.from(document.querySelectorAll('div.figure'))"
                                   ".every(d => d.querySelector('.main-svg'))", timeout=60_000)
            seen["figures"] = page.evaluate("Array.from(document.querySelectorAll('div.figure')).map(d => "
                                            "[d.dataset.figure, d.querySelectorAll('.main-svg').length, "
                                            "d.querySelectorAll('g.trace').length])")
            seen["sections"] = page.evaluate("Array.from(document.querySelectorAll('section')).map(s => s.id)")
            # the page itself never scrolls sideways: a wide board scrolls inside its column
            seen["page_width"] = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
            if shots is not None:
                page.add_style_tag(content="nav { position: static }")
                for section in page.query_selector_all("section"):
                    section.screenshot(path=str(shots / f"{path.stem}-{section.get_attribute('id')}.png"))
        finally:
            browser.close()
    return seen


def screenshot_folder(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("NAS_REPORT_SCREENSHOTS") or tmp_path / "shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.mark.parametrize("spec", [SyntheticSpec(space="prism", trials=160), SyntheticSpec(space="hourglass", trials=80),
                                  SyntheticSpec(space="joint", trials=120, objectives=("loss", "tokens_per_s"))],
                         ids=["prism", "hourglass", "joint-two-objectives"])
def test_the_report_renders_every_figure_offline_with_no_console_error(tmp_path, spec):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = tmp_path / f"{spec.space}-{len(spec.objectives)}.html"
    write_report(read_study(synthetic_study(spec)), path)
    seen = open_in_chromium(path, screenshot_folder(tmp_path))
    assert seen["page_errors"] == [] and [m for m in seen["console"] if m[0] in ("error", "warning")] == []
    assert [r for r in seen["requests"] if not r.startswith("file:")] == []  # no request of any kind
    assert seen["figures"] and all(svgs >= 1 and traces >= 1 for _, svgs, traces in seen["figures"]), seen["figures"]
    assert seen["sections"][:3] == ["summary", "leaderboard", "rules"] and len(seen["sections"]) == 9
    assert seen["page_width"][0] <= seen["page_width"][1], seen["page_width"]  # the rules' board ran off the window


def test_a_study_named_like_a_script_shows_as_text_and_runs_nothing(tmp_path):
    study = optuna.create_study(study_name="<script>alert(1)</script>")
    base = uniform(4, 32, 4, 256)
    study.set_user_attr("nas:baseline_key", base.key())
    study.set_user_attr("nas:data", "<img src=x onerror=alert(2)>")
    for seed in range(2):
        study.add_trial(optuna.trial.create_trial(
            value=3.0 + seed, user_attrs={**shape_attrs(base, seed, "baseline"), "val_loss": 3.0 + seed,
                                          "eval_curve": [[10, 3.5], [20, 3.0 + seed]], "tokens_per_s": 1.0}))
    path = tmp_path / "evil.html"
    write_report(read_study(study), path)
    seen = open_in_chromium(path, screenshot_folder(tmp_path))
    assert seen["dialogs"] == [] and seen["page_errors"] == []
    assert "<script>alert(1)</script>" in path.read_text().replace("&lt;", "<").replace("&gt;", ">")


def test_nas_report_reads_a_study_that_a_search_is_writing(tmp_path):
    """Neither side sees "database is locked": the report reads one snapshot (a plain BEGIN in WAL mode) while the
    search's workers write."""
    storage = sqlite_url(tmp_path / "nas.db")
    log = tmp_path / "search.log"
    search = start_nas("search", *SPACE5, *TINY, "--tokens", "4k", "--trials", "16", "--storage", storage,
                       "--study-name", "live", cwd=tmp_path, log=log, cores=None)
    reports = 0
    try:
        deadline = time.monotonic() + 240
        while search.poll() is None and time.monotonic() < deadline:
            try:
                trials = load_trials(storage, "live")
            except (KeyError, optuna.exceptions.OptunaError, Exception):  # noqa: BLE001 - not created yet
                trials = []
            if trials:
                result = CliRunner().invoke(app, ["report", "--storage", storage, "--study-name", "live",
                                                  "-o", str(tmp_path / f"live{reports}.html"), "--plotlyjs", "cdn"])
                assert result.exit_code == 0, result.output
                assert "locked" not in result.output
                reports += 1
            time.sleep(0.2)
        assert search.wait(timeout=240) == 0, log.read_text()
    finally:
        stop(search)
    assert reports >= 3 and "locked" not in log.read_text() and "Traceback" not in log.read_text()
    assert "nas report --study-name live" in log.read_text()  # the search names the next command
    final = run_nas("report", "--storage", storage, "-o", str(tmp_path / "final.html"), cwd=tmp_path)
    assert final.returncode == 0, final.stderr
