"""``nas version``, ``nas presets`` and ``nas train`` as a user runs them."""

from __future__ import annotations

import json
import math
import re

import optuna
import pytest
import torch
from typer.testing import CliRunner

from nas.arch import ArchConfig, FFNShape
from nas.cli import app
from runners.presets import PRESETS


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_version_names_prism_nas_and_its_main_libraries():
    result = invoke("version")
    assert result.exit_code == 0
    assert re.fullmatch(r"prism-nas \S+ \(torch \S+, optuna \S+, python \d+\.\d+\.\d+\)\n", result.stdout)
    assert f"torch {torch.__version__}" in result.stdout and f"optuna {optuna.__version__}" in result.stdout


def test_presets_lists_every_preset_with_its_shape_and_exact_parameter_count():
    result = invoke("presets")
    assert result.exit_code == 0
    lines = [line for line in result.stdout.splitlines() if not line.startswith(" ")]
    assert len(lines) == len(PRESETS)
    for line, preset in zip(lines, PRESETS.values()):
        b = preset.baseline
        assert line.startswith(preset.name + " ") and f"L{b.n_layers} d{b.d_model} h{b.heads[0]}" in line
        assert f"({b.n_params()['total']:,} params)" in line and f"{preset.train.tokens:,} tokens" in line
    # gpt2-124m by hand: V d + 12 (4 d^2 + 3 d 2048 + 2 d) + d = 38,633,472 + 28,311,552 + 56,623,104 + 19,200
    assert "(123,587,328 params)" in result.stdout
    # a GPU proxy states its arithmetic: 100M tokens x 0.855 GFLOP / (0.43 x 989 TFLOP/s) + a 57 s cold compile (both
    # measured on an H200) = 4.3 min a trial, over the 53 schedules whose head dims FlashAttention takes
    assert "0.855 GFLOP/token" in result.stdout and "4.3 min a trial" in result.stdout
    assert "the 53-member prism walk 3.8 h on 1 GPU, 0.5 h on 8" in result.stdout


def test_train_runs_one_shape_and_writes_its_result(tmp_path):
    arch = ArchConfig(n_layers=4, d_model=32, heads=(2, 2, 4, 4), ffn=FFNShape(2, 16), vocab_size=256)
    config, out = tmp_path / "arch.json", tmp_path / "result.json"
    config.write_text(arch.to_json())
    result = invoke("train", "--config", str(config), "--preset", "tiny", "--tokens", "2048", "--seed", "3",
                    "-o", str(out))
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    assert ArchConfig.from_dict(written["arch"]) == arch
    assert written["train"]["tokens"] == 2048 and written["train"]["seed"] == 3
    assert written["status"] == "ok" and math.isfinite(written["val_loss"]) and written["tokens_seen"] == 2048
    assert written["params"]["total"] == arch.n_params()["total"] and written["steps"] == 16
    assert 0 < written["mfu"] < 1 and written["tokens_per_s"] > 0 and written["world_size"] == 1


@pytest.mark.parametrize("args, says", [
    (["--config", "missing.json"], "does not exist"),
    (["--config", "arch.json", "--preset", "huge"], "unknown preset 'huge'"),
    (["--config", "arch.json", "--tokens", "lots"], "--tokens 'lots' is not a size"),
    (["--config", "arch.json", "--rank", "2"], "--rank 2 needs a list of rows"),
    (["--config", "arch.json", "--data", "/no/such/data"], "not found"),
])
def test_train_with_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, args, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "arch.json").write_text(ArchConfig(n_layers=2, d_model=32, heads=(4, 4), ffn=FFNShape(1, 64),
                                                   vocab_size=256).to_json())
    result = invoke("train", *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.stderr
