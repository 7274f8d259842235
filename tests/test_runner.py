"""The proxy runner: real training on real data, reproducibility, divergence, pruning, attention distance."""

from __future__ import annotations

import json
import math
import mmap
import resource
from pathlib import Path

import pytest
import torch

from nas.arch import ArchConfig, FFNShape, uniform
from nas.model.transformer import Transformer
from runners.attention_distance import layer_attention_distances, mean_attention_distance
from runners.config import TrainConfig
from runners.device import is_out_of_memory
from runners.presets import PRESETS, get_preset
from runners.proxy import evaluate, final_evaluation, lr_multiplier, run
from runners.result import TrialResult

TINY = get_preset("tiny")


def test_same_seed_gives_the_same_loss_curve(builtin_data) -> None:
    arch = TINY.baseline
    first = run(arch, TINY.train, builtin_data)
    second = run(arch, TINY.train, builtin_data)
    assert first.status == second.status == "ok"
    assert first.train_curve == second.train_curve
    assert first.eval_curve == second.eval_curve
    other = run(arch, TINY.train.with_(seed=1), builtin_data)
    assert other.train_curve != first.train_curve


@pytest.mark.slow
def test_default_proxy_trial_learns_real_text(cpu_baseline_result) -> None:
    """The `cpu` preset's baseline must get 2.2 nats/byte below the uniform guess ln 256 = 5.55 (it reaches ~2.9,
    below the unigram entropy of Python source, 3.18; seeds spread by ~0.1)."""
    preset, result = get_preset("cpu"), cpu_baseline_result
    assert result.status == "ok", result.reason
    assert result.tokens_seen == preset.train.tokens
    assert result.val_loss < math.log(256) - 2.2, result.eval_curve
    assert result.eval_curve[-1][1] < result.eval_curve[0][1]
    assert len(result.attention_distance) == preset.baseline.n_layers


def test_absurd_learning_rate_diverges_early_with_a_reason(builtin_data) -> None:
    cfg = TINY.train.with_(lr=1e4, warmup_frac=0.0, grad_clip=1e9)
    result = run(TINY.baseline, cfg, builtin_data)
    assert result.status == "diverged"
    assert result.steps < cfg.steps
    assert "loss" in result.reason
    assert result.attention_distance == []


def test_report_can_prune_the_run(builtin_data) -> None:
    seen = []

    def report(tokens: int, loss: float) -> bool:
        seen.append((tokens, loss))
        return True

    result = run(TINY.baseline, TINY.train, builtin_data, report)
    assert result.status == "pruned"
    assert len(seen) == 1 and result.tokens_seen == TINY.train.eval_every
    assert result.eval_curve == seen


def test_result_records_what_the_report_needs(builtin_data) -> None:
    arch = ArchConfig(n_layers=4, d_model=32, heads=(1, 1, 4, 4), ffn=FFNShape(2, 16), vocab_size=256)
    result = run(arch, TINY.train, builtin_data)
    assert result.ok and result.tokens_per_s > 0 and result.wall_time_s >= result.train_time_s > 0
    assert result.params == arch.n_params() and result.flops_per_token == arch.flops_per_token(TINY.train.seq_len)
    assert [t for t, _ in result.eval_curve] == [1024, 2048, 3072, 4096]
    assert len(result.attention_distance) == 4 and all(d >= 0 for d in result.attention_distance)
    again = TrialResult.from_dict(json.loads(result.to_json()))
    assert again == result


def test_tokens_per_s_leaves_out_the_one_off_costs_of_a_processs_first_steps(builtin_data, monkeypatch) -> None:
    """A process's first optimizer step imported torch._dynamo (~0.8 s), its first forward loads the kernels: the first
    trial of every search, the baseline, read 1,053 tokens/s against 10,827-23,779 for shapes of its size. A 1 s
    first step must not move the figure; the training time still holds it."""
    import time

    import runners.proxy

    run(TINY.baseline, TINY.train, builtin_data)  # this process's own one-off costs (it may be its first run)
    steady = run(TINY.baseline, TINY.train, builtin_data)
    made = runners.proxy.build_optimizer

    def slow_first_step(*args, **kwargs):
        optimizer, calls = made(*args, **kwargs), []

        def first_is_slow(*_):
            if not calls:
                time.sleep(1.0)
            calls.append(1)

        optimizer.register_step_pre_hook(first_is_slow)
        return optimizer

    monkeypatch.setattr(runners.proxy, "build_optimizer", slow_first_step)
    slowed = run(TINY.baseline, TINY.train, builtin_data)
    assert slowed.train_time_s >= 1.0
    assert slowed.tokens_per_s > 0.5 * steady.tokens_per_s, (slowed.tokens_per_s, steady.tokens_per_s)


def test_the_clock_counts_the_steps_past_the_warm_up_and_all_of_them_when_a_run_stops_within_it() -> None:
    from runners.throughput import TrainClock, warmup_steps

    assert [warmup_steps(n) for n in (1, 2, 7, 8, 64)] == [0, 1, 1, 2, 2]
    clock = TrainClock.for_run(steps=64, first=10)  # a run resumed at step 10
    for step, seconds in ((10, 5.0), (11, 1.0), (12, 0.5), (13, 0.5)):
        clock.add(step, seconds)
    assert clock.total_s == 7.0 and clock.tokens_per_s(14, 100) == 200 / 1.0
    stopped = TrainClock.for_run(steps=64)
    stopped.add(0, 2.0)
    assert stopped.tokens_per_s(1, 100) == 50.0  # diverged at its first step: the only time there is


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux resets the peak resident set")
def test_peak_memory_is_the_runs_own_not_the_processes_lifetime_peak(builtin_data) -> None:
    """Touch 1 GiB in an anonymous map and unmap it (the process's lifetime peak rises by 1 GiB, its resident set
    falls back); a tiny run afterwards must report its own peak, far below that lifetime peak."""
    size = 2**30
    block = mmap.mmap(-1, size)
    for offset in range(0, size, mmap.PAGESIZE):
        block[offset] = 1
    block.close()
    lifetime_peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    result = run(TINY.baseline, TINY.train, builtin_data)
    assert result.ok and result.peak_memory_mb < lifetime_peak_mb - 512, (result.peak_memory_mb, lifetime_peak_mb)


def test_vocab_smaller_than_the_data_is_a_usage_error(builtin_data) -> None:
    from nas.errors import UsageError

    with pytest.raises(UsageError, match="vocab_size=100 is smaller than the data's vocabulary 256"):
        run(uniform(2, 32, 4, 100), TINY.train, builtin_data)


# ----------------------------------------------------------------- attention distance
def test_distance_of_hand_built_patterns() -> None:
    T = 8
    identity = torch.eye(T).expand(2, 3, T, T)
    assert mean_attention_distance(identity) == 0.0
    previous = torch.zeros(1, 1, T, T)
    previous[0, 0, 0, 0] = 1.0
    for i in range(1, T):
        previous[0, 0, i, i - 1] = 1.0
    assert mean_attention_distance(previous) == pytest.approx((T - 1) / T)


def test_model_with_uniform_attention_has_distance_t_minus_1_over_4() -> None:
    """W_Q = W_K = 0 makes every score 0, so query i spreads evenly over keys 0..i: D = mean_i(i/2) = (T-1)/4."""
    torch.manual_seed(0)
    arch = ArchConfig(n_layers=3, d_model=24, heads=(1, 2, 6), ffn=FFNShape(1, 16), vocab_size=50)
    model = Transformer(arch).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[: 2 * arch.d_model].zero_()
    T = 16
    distances = layer_attention_distances(model, [torch.randint(0, 50, (2, T))])
    assert distances == pytest.approx([(T - 1) / 4] * 3, rel=1e-6)


@pytest.mark.parametrize("seq_len,kernel", [(70, "blocked"), (200, "blocked"), (70, "explicit")],
                         ids=["T70-one-block", "T200-three-blocks", "T70-explicit"])
@pytest.mark.parametrize("attention_batches", [0, 1, 3])
def test_final_evaluation_scores_like_evaluate_and_measures_distance_on_the_first_batches(
        attention_batches, seq_len, kernel, monkeypatch) -> None:
    """One pass gives the score (the mean over every batch) and D_l of the first batches, whichever attention path
    shows the probabilities; the reference is ``Transformer.analyse`` (explicit attention, one batch at a time)."""
    import nas.model.attention_kernels
    import runners.proxy

    if kernel == "explicit":  # the path GPUs and long contexts take: P materialised, then observed
        monkeypatch.setattr(nas.model.attention_kernels, "BLOCKED_ATTENTION_MAX_T", 0)
    monkeypatch.setattr(runners.proxy, "EVAL_TOKENS_PER_FORWARD", 2 * 2 * seq_len)  # 2 of the 5 batches per forward
    torch.manual_seed(0)
    arch = ArchConfig(n_layers=2, d_model=48, heads=(3, 6), ffn=FFNShape(1, 32), vocab_size=50)
    model = Transformer(arch)
    batches = [(torch.randint(0, 50, (2, seq_len)), torch.randint(0, 50, (2, seq_len))) for _ in range(5)]
    cpu = torch.device("cpu")
    loss, distances = final_evaluation(model, batches, attention_batches, cpu, "fp32")
    assert loss == pytest.approx(evaluate(model, batches, cpu, "fp32"), rel=1e-6)
    expected = layer_attention_distances(model, [x for x, _ in batches[:attention_batches]])
    assert distances == (pytest.approx(expected, rel=1e-6) if attention_batches else [])
    assert model.training  # handed back in training mode


def test_attention_observers_refuse_to_run_with_gradients() -> None:
    model = Transformer(ArchConfig(n_layers=1, d_model=16, heads=(4,), ffn=FFNShape(1, 16), vocab_size=20))
    with pytest.raises(RuntimeError, match="torch.no_grad"):
        model(torch.randint(0, 20, (1, 8)), observe=lambda layer, r0, p: None)


# ----------------------------------------------------------------- pieces
def test_learning_rate_warms_up_then_decays_to_the_floor() -> None:
    total = 100
    assert lr_multiplier(0, total, 0.1, 0.1) == pytest.approx(0.1)
    assert lr_multiplier(9, total, 0.1, 0.1) == pytest.approx(1.0)
    assert lr_multiplier(10, total, 0.1, 0.1) == pytest.approx(1.0)
    assert lr_multiplier(99, total, 0.1, 0.1) == pytest.approx(0.1)
    assert all(lr_multiplier(s, total, 0.1, 0.1) >= lr_multiplier(s + 1, total, 0.1, 0.1) for s in range(10, 99))


def test_out_of_memory_errors_are_recognised() -> None:
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1"))
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("shape mismatch"))


def test_train_config_rejects_bad_values() -> None:
    from nas.errors import UsageError

    with pytest.raises(UsageError, match="device='tpu' is invalid"):
        TrainConfig(device="tpu")
    for malformed in ("cuda:x", "cuda:", "cuda:-1"):  # malformed, not "not available on this machine"
        with pytest.raises(UsageError, match=f"device='{malformed}' is invalid: choose auto, cpu, cuda, cuda:N or mps"):
            TrainConfig(device=malformed)
    assert TrainConfig(device="cuda:1").device == "cuda:1"
    with pytest.raises(UsageError, match="tokens=0 is invalid"):
        TrainConfig(tokens=0)


def test_every_preset_is_well_formed() -> None:
    from search_spaces.factory import DEFAULT_BASELINE

    assert get_preset("cpu").baseline == DEFAULT_BASELINE  # `nas space` and `nas search` default to one shape
    for preset in PRESETS.values():
        assert preset.baseline.heads == (preset.baseline.heads[0],) * preset.baseline.n_layers
        train = preset.train  # a budget of at least one step and one evaluation interval, not one clamped up to it
        assert train.tokens >= train.tokens_per_step and train.tokens >= train.eval_every, preset.name
        assert preset.baseline.d_model % preset.baseline.heads[0] == 0
