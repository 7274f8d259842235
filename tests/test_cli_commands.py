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
    assert "note:" not in result.stderr  # 2,048 tokens are 16 whole steps of 4 x 32
    rounded = invoke("train", "--config", str(config), "--preset", "tiny", "--tokens", "1k", "-o", str(out))
    assert rounded.exit_code == 0, rounded.output  # it trained 896 tokens where every line named 1,000, silently
    assert "note: 1,000 tokens are no whole number of steps of 4 x 32 = 128 tokens: each run trains 7 steps, 896 " \
           "tokens" in rounded.stderr and json.loads(out.read_text())["tokens_seen"] == 896
    # a `nas rerun` child: its launcher said the note once for all its runs (it came once more from each run)
    from runners.config import STEPS_NOTE_SHOWN

    child = CliRunner().invoke(app, ["train", "--config", str(config), "--preset", "tiny", "--tokens", "1k"],
                               env={STEPS_NOTE_SHOWN: "1"})
    assert child.exit_code == 0 and "note:" not in child.stderr, child.stderr


@pytest.mark.parametrize("args, says", [
    (["--config", "missing.json"], "does not exist"),
    (["--config", "arch.json", "--preset", "huge"], "unknown preset 'huge'"),
    (["--config", "arch.json", "--tokens", "lots"], "--tokens 'lots' is not a size"),
    (["--config", "arch.json", "--tokens", "0.5"], "--tokens '0.5' must be at least 1 (it rounds to 0)"),
    # it was rounded, then refused as "tokens=2 is less than one step", a value the user never typed
    (["--config", "arch.json", "--tokens", "1.5"], "--tokens '1.5' is 1.5, not a whole number: give a count"),
    (["--config", "arch.json", "--rank", "2"], "--rank 2 needs a list of rows"),
    (["--config", "arch.json", "--data", "/no/such/data"], "not found"),
    # a micro-batch that cannot split the batch is said as such, not as 33 TB of activations
    (["--config", "arch.json", "--preset", "tiny", "--micro-batch", "99999999"],
     "--micro-batch 99999999 is invalid: it must divide the 4 sequences the one process takes per step"),
])
def test_train_with_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, args, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "arch.json").write_text(ArchConfig(n_layers=2, d_model=32, heads=(4, 4), ffn=FFNShape(1, 64),
                                                   vocab_size=256).to_json())
    result = invoke("train", *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.stderr


# the two shapes: ~1.7e11 parameters (under MAX_PARAMS, ~690 GB of fp32 weights) and 3,800 layers (~1.9e11,
# no single large tensor)
WIDE = ArchConfig(n_layers=52, d_model=16384, heads=(128,) * 52, ffn=FFNShape(1, 43690), vocab_size=256)
DEEP = ArchConfig(n_layers=3800, d_model=2048, heads=(16,) * 3800, ffn=FFNShape(1, 5461), vocab_size=256)


def test_a_file_of_the_users_named_log_jsonl_in_out_is_refused_not_replaced(tmp_path):
    """A stray result.json was refused, while a log.jsonl of the user's was rewritten as the run's log."""
    arch = ArchConfig(n_layers=4, d_model=32, heads=(2, 2, 4, 4), ffn=FFNShape(2, 16), vocab_size=256)
    (tmp_path / "arch.json").write_text(arch.to_json())
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "log.jsonl").write_text("my notes\n")
    result = invoke("train", "--config", str(tmp_path / "arch.json"), "--preset", "tiny", "--out",
                    str(tmp_path / "run"))
    assert result.exit_code == 2 and "log.jsonl' is not a run's log" in result.stderr, result.output
    assert (tmp_path / "run" / "log.jsonl").read_text() == "my notes\n"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["log.jsonl"]


@pytest.mark.parametrize("arch", [WIDE, DEEP], ids=["1.7e11-parameters", "3800-layers"])
def test_a_shape_this_machine_cannot_train_is_refused_before_it_is_built_and_makes_no_folder(tmp_path, arch):
    """Issue 52: neither was refused up front: the allocator's RuntimeError traceback, and an empty --out folder."""
    (tmp_path / "arch.json").write_text(arch.to_json())
    result = invoke("train", "--config", str(tmp_path / "arch.json"), "--out", str(tmp_path / "run" / "a"),
                    "--threads", "1")
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and f"training {arch.label()} needs at least " in lines[0], result.stderr
    assert f"({arch.n_params()['total']:,} parameters: weights, gradients and optimiser state " in lines[0]
    assert not (tmp_path / "run").exists()


def test_under_an_address_space_limit_the_limit_is_what_a_shape_is_checked_against(tmp_path):
    """The issue's setting, ``ulimit -v`` 4 GB, in a child process: refused in one line naming the limit."""
    import resource
    import subprocess
    import sys

    (tmp_path / "arch.json").write_text(WIDE.to_json())
    limit = 4 * 2**30
    child = subprocess.run([sys.executable, "-m", "nas.cli", "train", "--config", str(tmp_path / "arch.json"),
                            "--out", str(tmp_path / "run"), "--threads", "1"], capture_output=True, text=True,
                           timeout=120, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert child.returncode == 2, child.stderr
    assert child.stderr.count("\n") == 1 and "but the address-space limit (ulimit -v) leaves " in child.stderr
    assert not (tmp_path / "run").exists()


def test_the_memory_a_run_needs_counts_its_state_and_what_autograd_keeps():
    from runners.memory import activation_bytes, training_need

    cfg = PRESETS["cpu"].train  # scores a weight average: 20 bytes a parameter
    need = training_need(WIDE, cfg, rows=4)
    assert need.state == WIDE.n_params()["total"] * 20
    assert need.activations == 4 * 128 * (256 * 8 + activation_bytes(WIDE, 4))
    # attention: its input (fp32), normed input, projection input, q, k, v; then the one sub-MLP
    per_layer = 4 * 16384 + 5 * 16384 * 4 + 4 * 16384 + (16384 + 3 * 43690) * 4
    assert activation_bytes(WIDE, 4) == 52 * per_layer
    bf16 = training_need(WIDE, cfg.with_(ema_decay=0.0, dtype="bf16"), rows=4)
    assert bf16.state == WIDE.n_params()["total"] * 18  # and the weights' bf16 copies under autocast
    assert bf16.activations == 4 * 128 * (256 * 10 + activation_bytes(WIDE, 2))
    assert training_need(WIDE, cfg.with_(compile=True), rows=4).activations == 4 * 128 * (256 * 8 + 52 * 2 * 4 * 16384)


def test_a_run_that_passes_the_check_and_runs_out_of_memory_ends_in_one_line(tmp_path, monkeypatch):
    """The check is a lower bound: a run past it that the allocator refuses ended in a traceback (and a rerun then
    pointed at a log that was never written)."""
    import runners.full

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                           "memory: you tried to allocate 824180736 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(runners.full, "run_full", out_of_memory)
    arch = ArchConfig(n_layers=4, d_model=32, heads=(2, 2, 4, 4), ffn=FFNShape(2, 16), vocab_size=256)
    (tmp_path / "arch.json").write_text(arch.to_json())
    result = invoke("train", "--config", str(tmp_path / "arch.json"), "--preset", "tiny", "--micro-batch", "2")
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert f"training {arch.label()} ran out of memory on auto (an allocation of 824180736 bytes failed): a forward "\
           "of 2 sequences of 32 tokens needs more than this machine gives; give a smaller --micro-batch" in line, line


@pytest.mark.parametrize(("arch", "dtype"), [
    (ArchConfig(n_layers=2, d_model=64, heads=(4, 4), ffn=FFNShape(1, 176), vocab_size=2048), "fp32"),
    (ArchConfig(n_layers=3, d_model=96, heads=(3, 6, 12), ffn=FFNShape(3, 40), vocab_size=256,
                kv_heads=(1, 3, 4)), "fp32"),
    (ArchConfig(n_layers=2, d_model=64, heads=(4, 4), ffn=FFNShape(1, 176), vocab_size=2048), "bf16"),
], ids=["llama", "hourglass-gqa-staircase", "bf16"])
def test_the_activations_counted_are_at_most_what_a_real_forward_keeps_and_at_least_half(arch, dtype):
    """The count was the logits and one value a layer: a GPT-2 small run of 32 x 1024 tokens on a CPU passed at
    "5.9 GB" and took the machine's 24 GB. Measured here: every tensor autograd saves that is no parameter, and the
    logits (and under bf16 their fp32 copy), alive beside them as the forward ends (autocast's bf16 weight copies are
    counted with the state)."""
    import torch

    from nas.model.transformer import Transformer
    from runners.memory import training_need

    torch.manual_seed(0)
    model = Transformer(arch)
    rows, seq = 4, 64
    x, y = torch.randint(0, arch.vocab_size, (rows, seq)), torch.randint(0, arch.vocab_size, (rows, seq))
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16")
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), autocast:
        model(x, y)
    width = 2 if dtype == "bf16" else 4
    bf16_weights = 2 * sum(p.numel() for p in model.parameters()) if dtype == "bf16" else 0
    logits = rows * seq * arch.vocab_size * (width + (4 if dtype == "bf16" else 0))  # and their fp32 copy
    measured = sum(n for ptr, n in kept.items() if ptr not in weights) - bf16_weights + logits
    counted = training_need(arch, PRESETS["tiny"].train.with_(seq_len=seq, dtype=dtype), rows).activations
    assert 0.45 * measured <= counted <= measured, (counted, measured)
