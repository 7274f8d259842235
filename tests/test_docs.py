"""The docs cannot rot: the site builds strictly, and every `nas` command in the docs and the README runs or parses.

``mkdocs build --strict`` (offline, into a temporary folder) fails on a broken link, a missing page, an
include that is not there or any other warning; the CLI reference and the presets table are generated
from the code at that build (``nas/cli/reference.py``, ``docs/hooks.py``). Each ``nas ...`` line of a
fenced code block runs for real in a scratch folder, training ones with the ``tiny`` preset and a few
trials of 1k tokens; the GPU, cluster and long-running ones (``dashboard``, ``bench``) are parsed only:
their command's ``--help`` must accept every option they give.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nas.cli import app

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
# long-running or needing what a test machine has not: parsed only (`--confirm` runs end to end in test_cli_rules.py)
PARSE_ONLY = ("dashboard", "bench", "cuda", "postgresql://", "gpu-", "gpt2-", "torchrun", "--nproc", "fineweb",
              "--confirm")


def doc_commands() -> list[str]:
    commands: dict[str, None] = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        # a fence opens at the start of a line; ``text`` and other languages' blocks are skipped whole
        shell = re.sub(r"^```(?!bash\n|sh\n)\w+\n.*?^```", "", path.read_text(), flags=re.S | re.M)
        for block in re.findall(r"^```(?:bash|sh)?\n(.*?)^```", shell, re.S | re.M):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.split(r"\s+#", line.strip())[0].strip()
                if line.startswith("nas "):
                    commands[line] = None
    return list(commands)


def test_the_site_builds_strictly_offline(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-3000:]
    reference = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "--workers" in reference and "nas studies" in reference  # generated from the app
    assert "gpu-prism" in (tmp_path / "site" / "reference" / "presets" / "index.html").read_text()


SCALED_DOWN = {"--top": "2", "--seeds": "1", "--workers": "1"}  # reruns of 2 shapes on 1 seed, one worker


def tiny(args: list[str]) -> list[str]:
    """A training command as the test runs it: the tiny preset, 1k tokens, 2 trials, a rerun of 2 shapes on 1 seed,
    one worker (the concurrency tests start several)."""
    for option, value in SCALED_DOWN.items():
        if option in args:
            args[args.index(option) + 1] = value
    if "--preset" in args:
        args[args.index("--preset") + 1] = "tiny"
    else:
        args += ["--preset", "tiny"]
    if "--trials" in args:
        args[args.index("--trials") + 1] = "2"
    elif args[0] == "search":
        args += ["--trials", "2"]
    if args[0] == "rerun":
        args += ["--runs", "runs"]
    return args + ["--tokens", "1k"]


def test_every_nas_command_in_the_docs_runs_or_parses(tmp_path, monkeypatch, one_thread):
    commands = doc_commands()
    assert len(commands) >= 15, commands
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    made = runner.invoke(app, ["search", "--space", "prism", "--preset", "tiny", "--trials", "6", "--tokens", "1k",
                               "--study-name", "prism-cpu"])
    assert made.exit_code == 0, made.output
    for line in commands:
        redirect = None
        if ">" in line:
            line, redirect = (part.strip() for part in line.split(">", 1))
        args = shlex.split(line)[1:]
        if any(marker in line for marker in PARSE_ONLY):
            result = runner.invoke(app, [*args, "--help"])
        else:
            result = runner.invoke(app, tiny(args) if args[0] in ("search", "train", "rerun") else args)
        assert result.exit_code == 0, (line, result.output[-2000:])
        if redirect:
            Path(redirect).write_text(result.stdout)


def test_no_placeholder_is_left_in_the_prose():
    """A figure meant to be filled in from a measurement (``BOARD_SHRUNK``, ``TODO``, ``XXX``) never reaches a
    reader: every all-capitals word with an underscore in the prose (outside code spans and blocks) is one."""
    left = []
    for path in [ROOT / "README.md", ROOT / "benchmarks" / "RESULTS.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        prose = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        prose = re.sub(r"`[^`\n]*`", "", prose)
        left += [f"{path.relative_to(ROOT)}: {word}" for word in re.findall(r"\b(?:[A-Z]+_[A-Z_]+|TODO|XXX)\b", prose)]
    assert not left, left
