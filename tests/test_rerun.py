"""``nas export`` and ``nas rerun`` end to end on a tiny study and a tiny preset, resumed after a kill."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from search_helpers import NAS, TINY, nas_env, run_nas, sqlite_url
from typer.testing import CliRunner

from nas.cli import app
from nas.study.records import rerun_study_name
from reports.frame import read_study
from reports.html import build_report
from reports.reruns import read_reruns

pytestmark = pytest.mark.slow

RERUN = ["rerun", "--preset", "tiny", "--tokens", "2560", "--top", "2", "--seeds", "2", "--checkpoint-every", "3",
         "--threads", "1"]


@pytest.fixture
def proxy_study(tiny_study, one_thread) -> str:
    """The session's tiny 4-trial study ``proxy``, this test's own copy (``tests/conftest.py``)."""
    return tiny_study


def test_export_writes_rows_that_train_and_carry_the_proxys_intervals(proxy_study, tmp_path):
    out = tmp_path / "best.json"
    result = CliRunner().invoke(app, ["export", "--storage", proxy_study, "--top", "2", "-o", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [r["rank"] for r in rows] == sorted(r["rank"] for r in rows) and any(r["is_baseline"] for r in rows)
    for r in rows:
        assert {"arch", "mean_loss", "ci95", "paired_gain_pct", "paired_gain_low", "tied_with_best", "study",
                "preset"} <= set(r) and r["study"] == "proxy" and r["preset"] == "tiny"
    trained = run_nas("train", "--config", str(out), "--rank", "2", *TINY, "--tokens", "512", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    assert json.loads(trained.stdout)["arch"] == rows[1]["arch"]


def runs_logged(folder: Path) -> int:
    return sum(line.count('"loss"') for path in folder.rglob("log.jsonl") for line in path.read_text().splitlines())


def test_rerun_trains_the_best_shapes_and_the_baseline_resumes_after_a_kill_and_records_them(proxy_study, tmp_path):
    runs = tmp_path / "runs"
    command = [*NAS, *RERUN, "--storage", proxy_study, "--runs", str(runs)]
    proc = subprocess.Popen(command, cwd=tmp_path, env=nas_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while runs_logged(runs) < 20 * 2 + 8 and time.monotonic() < deadline:  # in the third run (20 steps each)
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # the rerun and, with it, the run it was training
    proc.wait(timeout=60)
    time.sleep(0.5)
    unfinished = [p.parent for p in runs.rglob("log.jsonl") if not (p.parent / "result.json").exists()]
    assert unfinished and all((f / "checkpoint.pt").exists() for f in unfinished)
    again = run_nas(*RERUN, "--storage", proxy_study, "--runs", str(runs), cwd=tmp_path, timeout=600, cores=None)
    assert again.returncode == 0, again.stderr
    assert "recorded already" in again.stderr and "Kendall tau" in again.stderr
    assert re.search(r": val loss \d+\.\d{4}, [\d,]+ tok/s", again.stderr), again.stderr  # 4 decimals, not a raw float
    resumed = [json.loads((f / "result.json").read_text()) for f in unfinished]
    assert any(r["resumed_from_step"] > 0 for r in resumed)  # the killed run went on from its checkpoint

    reruns = read_reruns(proxy_study, "proxy")
    assert len(reruns) == 3 * 2 and set(reruns["seed"]) == {0, 1}  # 2 shapes + the baseline, 2 seeds each
    assert set(reruns["role"]) == {"baseline", "candidate"} and (reruns["tokens"] == 2560).all()
    study = optuna.load_study(study_name=rerun_study_name("proxy", "tiny"), storage=proxy_study)
    proxy = read_study(optuna.load_study(study_name="proxy", storage=proxy_study))
    for t in study.trials:  # each run linked to the proxy trials of its shape
        assert t.user_attrs["proxy_trials"] == list(proxy.scores[t.user_attrs["proxy_key"]].trials)
        folder = Path(t.user_attrs["run_dir"])
        assert json.loads((folder / "result.json").read_text())["val_loss"] == t.values[0]

    third = run_nas(*RERUN, "--storage", proxy_study, "--runs", str(runs), cwd=tmp_path, timeout=300)
    assert third.returncode == 0 and third.stderr.count("recorded already") == 6 and "training in" not in third.stderr
    html = build_report(read_study(optuna.load_study(study_name="proxy", storage=proxy_study),
                                   read_reruns(proxy_study, "proxy")))
    assert "preset tiny (2,560 tokens, data builtin): Kendall tau" in html and "no full-scale re-runs" not in html


@pytest.mark.parametrize("args, says", [
    (["--top", "0"], "--top 0 is invalid"),
    (["--seeds", "0"], "--seeds 0 is invalid"),
    (["--seeds", "100000000"], "--seeds 100000000 is invalid: give 1-1,000"),  # planned 1e8 runs in silence
    (["--nproc", "3"], "--nproc 3 does not divide the preset's global batch of 4"),
    (["--preset", "huge"], "unknown preset 'huge'"),
    (["--study-name", "nope"], "no study 'nope'"),
])
def test_rerun_with_bad_input_is_one_line_and_exit_2(proxy_study, tmp_path, args, says):
    result = CliRunner().invoke(app, [*RERUN, "--storage", proxy_study, "--runs", str(tmp_path / "r"), *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and says in lines[0], result.stderr


def processes_naming(text: str) -> list[str]:
    """The command lines of running processes that mention ``text`` (a run's folder)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(cmdline)
    return found


@pytest.mark.parametrize("stop", ["terminal Ctrl-C", "kill -INT to a background job"])
def test_ctrl_c_while_the_next_run_launches_stops_the_child_as_quietly_as_the_parent(tmp_path, stop):
    """Issue 52: a terminal's Ctrl-C reaches the whole foreground process group; the launched `nas train`, still
    importing, printed its own KeyboardInterrupt traceback (or an "Exception ignored in atexit callback" one) under
    the parent's line. A background job (`nas rerun ... &`) starts with SIGINT ignored, and `kill -INT` did nothing
    to it (Python keeps an inherited SIG_IGN) until the command installed its own handler."""
    from benchmarks.synthetic_studies import SyntheticSpec, synthetic_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = sqlite_url(tmp_path / "nas.db")
    synthetic_study(SyntheticSpec(space="prism", preset="tiny", trials=6), storage=storage, name="proxy")
    background = stop != "terminal Ctrl-C"

    def as_started() -> None:  # whatever the test runner's own SIGINT is (a suite started with `&` ignores it)
        signal.signal(signal.SIGINT, signal.SIG_IGN if background else signal.SIG_DFL)

    runs = tmp_path / "runs"
    proc = subprocess.Popen([*NAS, *RERUN, "--storage", storage, "--runs", str(runs)], cwd=tmp_path, env=nas_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,  # its own group: the test's Ctrl-C reaches it and its children
                            preexec_fn=as_started)
    lines = [proc.stderr.readline()]
    assert ": training in " in lines[0], lines  # the first run is being launched
    deadline = time.monotonic() + 60
    while not processes_naming(f"--out {runs}") and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.2)  # the child is importing: the window of the issue
    if background:
        os.kill(proc.pid, signal.SIGINT)  # `kill -INT PID`: the parent alone
    else:
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: every process of the group
    rest = proc.stderr.read()
    said = "".join(lines) + rest
    assert proc.wait(timeout=60) == 130, said
    assert "Traceback" not in said and "Exception ignored" not in said and "KeyboardInterrupt" not in said, said
    assert rest.strip().splitlines() == ["interrupted: finished runs are recorded; re-run the same command to resume"]
    time.sleep(0.5)
    assert processes_naming(str(runs)) == []  # the run did not go on alone
