"""``nas dashboard``: optuna-dashboard on 127.0.0.1 for a study's storage, showing what ``nas search`` stored."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from search_helpers import nas_env, sqlite_url, start_nas, stop, wait_for
from typer.testing import CliRunner

from nas.cli import app
from nas.study.config import SearchConfig
from nas.study.parallel import run_search
from reports.dashboard_note import NoteRefresher
from search_spaces.factory import SpaceOptions


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        return json.load(response)


@pytest.mark.slow
def test_dashboard_serves_the_study_and_its_trial_attrs(tmp_path, one_thread):
    storage = sqlite_url(tmp_path / "dash.db")
    run_search(SearchConfig(space=SpaceOptions(space="prism"), preset="tiny", storage=storage, trials=1,
                            study_name="dash-demo"), note=NoteRefresher())  # as `nas search` passes it
    port, log = free_port(), tmp_path / "dashboard.log"
    server = start_nas("dashboard", "--storage", storage, "--port", str(port), cwd=tmp_path, log=log)
    try:
        api = f"http://127.0.0.1:{port}/api/studies"
        studies = wait_for(lambda: get_json(api), 90, "the dashboard's API", process=server, log=log)
        (summary,) = studies["study_summaries"]
        assert summary["study_name"] == "dash-demo"
        detail = get_json(f"{api}/{summary['study_id']}")
        baseline = detail["trials"][0]
        attrs = {a["key"]: a["value"] for a in baseline["user_attrs"]}
        assert attrs["role"] == "baseline" and json.loads(attrs["heads"]) == [4, 4, 4, 4]
        assert {"val_loss", "params", "flops_per_token", "tokens_per_s", "eval_curve", "seed"} <= set(attrs)
        assert baseline["state"] == "Complete" and baseline["intermediate_values"]  # the pruner's curve
        # the study note says what the report says: the shape-level answer, not the luckiest single trial
        note = detail["note"]["body"]
        assert note.startswith("## dash-demo") and "Ranked by expected gain" in note
        assert "| 1 | h=4x4 K1x88 d32 L4 (baseline) | 1 |" in note
        # Ctrl-C (here `kill -INT`) stops it as it stops every command: one line, exit 130 (its server catches the
        # interrupt itself and returned as if it had ended by itself: exit 0)
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=30) == 130
    finally:
        stop(server, signal.SIGKILL)
    said = log.read_text()
    assert f"http://127.0.0.1:{port}/" in said  # it says where to look
    assert said.rstrip().splitlines()[-1] == "stopped: the dashboard is closed; the study is as the searches left it"
    assert "Traceback" not in said


@pytest.mark.parametrize("args, says", [
    (["--port", "0"], "--port 0 is invalid"),
    (["--port", "70000"], "--port 70000 is invalid"),
    (["--storage", "not a url"], "is malformed"),
])
def test_dashboard_with_a_bad_option_value_prints_one_line_and_exits_2(tmp_path, args, says):
    result = CliRunner().invoke(app, ["dashboard", "--storage", sqlite_url(tmp_path / "x.db"), *args])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and says in result.stderr


NOTE_WRITER_SCRIPT = """
import sys
import optuna
from reports import dashboard_note

optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.create_study()
dashboard_note.dashboard_save_note()(study, "## light")
light = ("optuna_dashboard" in sys.modules, "sklearn" in sys.modules)
from optuna_dashboard import get_note
light_body = get_note(study)
# a layout where the module does not load alone: the package's own save_note
dashboard_note.dashboard_save_note.cache_clear()
def refuse(*args, **kwargs):
    raise ImportError("no such layout")
dashboard_note.importlib.util.spec_from_file_location = refuse
dashboard_note.dashboard_save_note()(study, "## fallback")
print(light, light_body, dashboard_note.dashboard_save_note().__module__, get_note(study))
"""


def test_the_note_is_written_without_importing_the_dashboard_server_and_reads_back_in_the_dashboard():
    """A search process writes the study note with optuna-dashboard's own ``save_note`` loaded from its module alone:
    neither the package (its server) nor scikit-learn (under ``optuna.importance``) is imported, ~1-2 s of CPU per
    search; where the module does not load alone the package's ``save_note`` writes it; optuna-dashboard reads both."""
    done = subprocess.run([sys.executable, "-c", NOTE_WRITER_SCRIPT], env=nas_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["(False,", "False)", "##", "light", "optuna_dashboard._note", "##", "fallback"], \
        done.stdout


def test_a_ctrl_c_while_a_request_is_answered_stops_the_server_after_answering_it():
    """Served by optuna-dashboard's own ``run_server`` (wsgiref in the main thread), a Ctrl-C landing inside a request
    was printed as that request's error and the server served on: a stop lost. Here the request that is being
    answered when SIGINT comes is answered whole, and the server then closes."""
    import os
    import threading

    from nas.cli.serving import serve_until_interrupted

    def answer_while_stopped(environ, start_response):
        os.kill(os.getpid(), signal.SIGINT)  # the stop lands while this request is answered
        time.sleep(0.3)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"answered whole"]

    port, got = free_port(), {}

    def client() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                got["body"] = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30).read()
                return
            except OSError:
                time.sleep(0.05)  # not listening yet

    asking = threading.Thread(target=client, daemon=True)
    asking.start()
    before = signal.getsignal(signal.SIGINT)
    fallback = threading.Timer(60, os.kill, (os.getpid(), signal.SIGINT))  # no request came: fail, do not hang
    fallback.start()
    try:
        assert serve_until_interrupted(answer_while_stopped, "127.0.0.1", port) is True
    finally:
        fallback.cancel()
    asking.join(timeout=30)
    assert got == {"body": b"answered whole"}
    assert signal.getsignal(signal.SIGINT) is before  # the caller's handler is back
