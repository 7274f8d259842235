"""The confirmed-answer chain of the width-depth-FFN axis, end to end on the ``tiny`` preset, as a user runs it:
``nas search --space hourglass``, ``nas best``, ``nas rerun --top N`` at a longer budget, ``nas report`` (the how-to
``docs/how-to/confirm-an-answer.md`` runs the same commands on the ``cpu-hourglass`` setup)."""

from __future__ import annotations

import re
from html import unescape

import pytest
from search_helpers import run_nas, sqlite_url

pytestmark = pytest.mark.slow


def test_search_best_rerun_and_report_confirm_or_refute_the_pick_at_full_length(tmp_path):
    storage = sqlite_url(tmp_path / "nas.db")
    search = run_nas("search", "--space", "hourglass", "--preset", "tiny", "--trials", "7", "--storage", storage,
                     "--study-name", "hg", "--workers", "1", cwd=tmp_path, timeout=600)
    assert search.returncode == 0, search.stderr[-3000:]
    best = run_nas("best", "--storage", storage, "--study-name", "hg", "--top", "3", cwd=tmp_path)
    assert best.returncode == 0 and "(baseline)" in best.stdout, best.stderr
    # one seed a shape: the chain's verdict is the same sentence; the re-runs' resume and a bootstrap over several
    # seeds are test_rerun.py's
    rerun = run_nas("rerun", "--storage", storage, "--study-name", "hg", "--preset", "tiny", "--tokens", "4096",
                    "--top", "2", "--seeds", "1", "--runs", str(tmp_path / "runs"), "--threads", "1",
                    cwd=tmp_path, timeout=900, cores=None)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "Kendall tau" in rerun.stderr
    report = run_nas("report", "--storage", storage, "--study-name", "hg", "-o", str(tmp_path / "r.html"),
                     cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    html = unescape((tmp_path / "r.html").read_text())
    verdict = re.search(r"preset tiny \(4,096 tokens[^)]*\)[^<]*Kendall tau [+-][0-9.]+[^<]*", html) or \
        re.search(r"preset tiny[^<]*Kendall tau [+-][0-9.]+[^<]*", html)
    assert verdict, "the re-runs' verdict is missing from the report"
    # the answer's pick, checked at full length: held, reversed, not resolved, or the pick was the baseline
    assert re.search(r"(the proxy's gain (held|reversed|not resolved at this many seeds)|picked the baseline)",
                     verdict.group(0)), verdict.group(0)
