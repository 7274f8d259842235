"""A storage password is never printed, logged or written down; the dashboard stays on this machine unless told.

The throw-away PostgreSQL server trusts local connections, so a URL with a password connects
and the whole flow runs with the password in the URL: search, best, export, report, dashboard.
"""

from __future__ import annotations

import json
import signal
import socket
import urllib.request
from pathlib import Path

import optuna
import pytest
from search_helpers import SPACE3, TINY, run_nas, start_nas, stop, wait_for

from nas.study.storage import make_storage

pytestmark = pytest.mark.slow

SECRET = "s3cr3t-Pa55"


def with_password(url: str) -> str:
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a socket listening on ``port`` (``/proc/net/tcp``, IPv4 and IPv6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if int(hex_port, 16) == port and state == "0A":  # LISTEN
                found.add(address)
    return found


def test_a_password_in_the_storage_url_appears_in_no_output_file_or_stored_attribute(tmp_path, postgres_url):
    url = with_password(postgres_url)
    outputs = []
    search = run_nas("search", *SPACE3, *TINY, "--trials", "3", "--storage", url, "--study-name", "secret",
                     cwd=tmp_path)
    assert search.returncode == 0, search.stderr
    outputs += [search.stdout, search.stderr]
    for args in (["best", "--study-name", "secret"], ["best", "--study-name", "secret", "--format", "json"],
                 ["export", "--study-name", "secret", "-o", str(tmp_path / "best.json")],
                 ["report", "--study-name", "secret", "-o", str(tmp_path / "report.html"), "--plotlyjs", "cdn"]):
        done = run_nas(*args, "--storage", url, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        outputs += [done.stdout, done.stderr]
    outputs += [(tmp_path / "best.json").read_text(), (tmp_path / "report.html").read_text()]
    storage = make_storage(postgres_url)
    study = optuna.load_study(study_name="secret", storage=storage)
    system = storage.get_study_system_attrs(storage.get_study_id_from_name("secret"))
    outputs.append(json.dumps([study.user_attrs, system,
                               [[t.user_attrs, t.system_attrs] for t in study.trials]], default=str))
    assert "***" in search.stderr  # the URL is shown, masked, and its Next: hints say that *** is no password
    assert search.stderr.strip().endswith("-o report.html (*** stands for the storage's password, not printed)")
    leaks = [text[max(0, text.find(SECRET) - 80):text.find(SECRET) + 80] for text in outputs if SECRET in text]
    assert not leaks, leaks


@pytest.mark.parametrize("command", [["search", *SPACE3, *TINY, "--trials", "1"], ["best"], ["report"], ["dashboard"]])
def test_a_storage_that_refuses_the_connection_is_one_line_without_the_password(tmp_path, command):
    url = f"postgresql://nas:{SECRET}@127.0.0.1:1/nas"  # nothing listens on port 1
    done = run_nas(*command, "--storage", url, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    assert SECRET not in done.stderr + done.stdout and "***" in done.stderr


@pytest.mark.parametrize("password", ["e", "p", "nas1"])
def test_a_short_password_is_masked_as_a_value_not_as_letters_of_the_message(tmp_path, password):
    """Every occurrence of the password's characters was masked: 'e' printed 'conn***ction to s***rv***r'."""
    done = run_nas("best", "--storage", f"postgresql://nas:{password}@127.0.0.1:1/nas", cwd=tmp_path)
    assert done.returncode == 2 and "postgresql://nas:***@127.0.0.1:1/nas" in done.stderr, done.stderr
    assert "connection to server at" in done.stderr and "port 1 failed" in done.stderr, done.stderr


def test_a_password_a_driver_echoes_is_masked_where_it_stands_as_a_value():
    from nas.study.storage import without_password

    echoed = "password=s3cr3t! host=db; postgresql://u:s3cr3t%21@db/x"
    assert without_password(echoed, "s3cr3t!") == "password=*** host=db; postgresql://u:***@db/x"
    assert without_password("could not translate host name", "o") == "could not translate host name"


def test_the_dashboard_listens_on_loopback_only_unless_host_says_and_then_warns(tmp_path, postgres_url):
    url = with_password(postgres_url)
    assert run_nas("search", *SPACE3, *TINY, "--trials", "1", "--storage", url, cwd=tmp_path).returncode == 0
    for host, loopback in (("127.0.0.1", True), ("0.0.0.0", False)):
        port, log = free_port(), tmp_path / f"dashboard-{port_name(host)}.log"
        args = ["dashboard", "--storage", url, "--port", str(port)] + ([] if loopback else ["--host", host])
        server = start_nas(*args, cwd=tmp_path, log=log)
        try:
            api = f"http://127.0.0.1:{port}/api/studies"
            wait_for(lambda url=api: urllib.request.urlopen(url, timeout=5).status == 200, 90, "the dashboard",
                     process=server, log=log)
            addresses = listening_addresses(port)
        finally:
            stop(server, signal.SIGTERM)
        text = log.read_text()
        assert SECRET not in text
        if loopback:
            assert addresses == {"0100007F"}, addresses  # 127.0.0.1 only
            assert "warning" not in text
        else:
            assert "00000000" in addresses, addresses
            assert "reachable from other machines" in text


def port_name(host: str) -> str:
    return host.replace(".", "-")
