"""The GPU path on the CPU: each defect a reading of the CUDA code found (issue 33), caught here without a GPU.

Where the CPU cannot reproduce a defect (an allocator's cache, a CUDA kernel's choice, MIG enumeration) the
test says so and pins the part the CPU can run; ``python -m benchmarks.gpu_check`` checks the rest on a GPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import runners.device
import runners.full
import runners.proxy
from nas.arch import ArchConfig, FFNShape
from nas.cli import app
from nas.data import check_enough_tokens, load_data
from nas.errors import UsageError
from nas.model.transformer import Transformer
from nas.study.placement import (
    database_connections,
    mig_devices,
    plan_placements,
    resolve_workers,
    usable_gpus,
)
from runners.checkpoint import read_checkpoint, rng_state, set_rng_state, write_checkpoint
from runners.device import (
    FLASH_MAX_HEAD_DIM,
    StepLosses,
    compiles_by_default,
    configure_threads,
    sdpa_kernel,
)
from runners.presets import get_preset
from runners.proxy import compile_model, final_evaluation
from search_spaces.factory import SpaceOptions, build_space
from search_spaces.prism import PrismSpace

ROOT = Path(__file__).resolve().parents[1]
TINY = ArchConfig(n_layers=2, d_model=32, heads=(2, 4), ffn=FFNShape(1, 64), vocab_size=256)


# ----------------------------------------------------------------- 1. resuming on another device
@pytest.mark.parametrize("map_location", ["meta", {"cpu": "meta"}], ids=["meta-device", "mapping"])
def test_a_checkpoint_loaded_onto_another_device_gives_back_cpu_rng_states_that_resume_the_stream(tmp_path,
                                                                                                map_location):
    """A GPU run loads its checkpoint with ``map_location=<its device>``; the saved RNG states must still reach
    ``torch.set_rng_state`` as CPU bytes (version 1 stored uint8 tensors, moved off the CPU: TypeError)."""
    path = tmp_path / "checkpoint.pt"
    torch.manual_seed(7)
    write_checkpoint(path, {"run": {"id": 1}, "model": Transformer(TINY).state_dict(), "rng": rng_state()})
    expected = torch.rand(5)  # what the generator draws next, after the state was saved
    torch.manual_seed(123)  # anything else meanwhile
    saved = read_checkpoint(path, {"id": 1}, map_location=map_location)
    assert saved["model"]["embed.weight"].device.type == "meta"  # the map location was honoured for the weights
    set_rng_state(saved["rng"])
    assert torch.equal(torch.rand(5), expected)


def test_a_version_1_checkpoint_with_tensor_rng_states_is_still_resumed(tmp_path):
    path = tmp_path / "checkpoint.pt"
    state = torch.get_rng_state()
    torch.save({"format": "prism-nas-checkpoint", "version": 1, "run": {}, "rng": {"torch": state}}, path)
    expected = torch.rand(3)
    set_rng_state(read_checkpoint(path, {}, map_location={"cpu": "cpu"})["rng"])
    assert torch.equal(torch.rand(3), expected)


# ----------------------------------------------------------------- 2. the analysis forward and the micro-batch
def _batches(n: int, rows: int, seq_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 256, (rows, seq_len), generator=g), torch.randint(0, 256, (rows, seq_len), generator=g))
            for _ in range(n)]


def _forward_rows(model: torch.nn.Module) -> list[int]:
    seen: list[int] = []
    model.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[0]))
    return seen


def test_the_attention_analysis_takes_a_forward_per_gpu_batch_not_the_analysed_batches_joined():
    """A GPU preset's validation batches (32 x 1024 tokens, two analysed) went through one 64-sequence forward
    whatever the micro-batch; here batches of 32 x 64 tokens, which ``evaluate`` never merges, stand for them."""
    torch.manual_seed(0)
    model = Transformer(TINY)
    seen = _forward_rows(model)
    batches = _batches(4, 32, 64)
    loss, distances = final_evaluation(model, batches, 2, torch.device("cpu"), "fp32")
    assert seen == [32, 32, 32, 32]
    reference, joined = runners.proxy.evaluate(model, batches, torch.device("cpu"), "fp32"), []
    assert loss == pytest.approx(reference, rel=1e-6)
    for chunk in (batches[:1], batches[1:2]):  # D_l over the two analysed batches = the mean of each one's
        joined.append(final_evaluation(model, chunk, 1, torch.device("cpu"), "fp32")[1])
    assert distances == pytest.approx([(a + b) / 2 for a, b in zip(*joined)], rel=1e-6)


def test_after_out_of_memory_every_evaluation_forward_holds_at_most_the_micro_batch():
    torch.manual_seed(0)
    model = Transformer(TINY)
    seen = _forward_rows(model)
    batches = runners.proxy.in_rows(_batches(4, 8, 32), 2)  # a batch of 8 halved to micro-batches of 2
    loss, distances = final_evaluation(model, batches, 2 * 4, torch.device("cpu"), "fp32", max_rows=2)
    assert max(seen) == 2 and len(distances) == TINY.n_layers
    unbounded = final_evaluation(model, batches, 2 * 4, torch.device("cpu"), "fp32")
    assert loss == pytest.approx(unbounded[0], rel=1e-6) and distances == pytest.approx(unbounded[1], rel=1e-5)


def test_the_cpu_proxy_still_scores_and_analyses_in_one_merged_forward(builtin_data):
    """The CPU preset's speed path is unchanged: its first forward merges 4 batches, the first one analysed."""
    preset = get_preset("cpu")
    model = Transformer(preset.baseline)
    seen = _forward_rows(model)
    val = runners.proxy.validation_batches(builtin_data.val, 4, 128, preset.train.eval_tokens)
    final_evaluation(model, val, preset.train.attention_batches, torch.device("cpu"), "fp32")
    assert len(val) == 2 and seen == [8]  # 2 batches of 4 x 128 tokens: one forward of 1,024 tokens


def _inject_out_of_memory(monkeypatch, rows: int, spike_bytes: int = 0) -> list[tuple[bool, int]]:
    """Every forward of more than ``rows`` sequences raises the allocator's error, in training and evaluation; the
    first attempt first fills ``spike_bytes`` of memory (a failed attempt's activations)."""
    training, forwards = runners.proxy._train, []

    def attempt(model, cfg, *rest):
        forward = model.forward
        if spike_bytes and not forwards:
            spike = torch.ones(spike_bytes // 4)  # noqa: F841 - held by this frame, as activations would be
            forwards.append((True, 0))
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")

        def limited(x, *args, **kwargs):
            forwards.append((model.training, x.shape[0]))
            if x.shape[0] > rows:
                raise torch.OutOfMemoryError("CUDA out of memory (injected)")
            return forward(x, *args, **kwargs)

        model.forward = limited
        return training(model, cfg, *rest)

    monkeypatch.setattr(runners.proxy, "_train", attempt)
    return forwards


def test_a_trial_halved_by_out_of_memory_is_evaluated_in_micro_batches_not_recorded_oom(monkeypatch, builtin_data):
    forwards = _inject_out_of_memory(monkeypatch, rows=2)
    preset = get_preset("tiny")
    cfg = preset.train.with_(tokens=8 * 32, batch_size=8, seq_len=32, eval_every=256, eval_tokens=256,
                             device="cpu", threads=1)
    result = runners.proxy.run(preset.baseline, cfg, builtin_data)
    assert result.status == "ok" and result.micro_batch == 2, result.reason
    assert max(rows for training, rows in forwards[-8:]) == 2 and any(not training for training, _ in forwards)


def _peak_after_a_retry() -> tuple[float, float, int]:
    """(peak before, the trial's peak, its micro-batch) of a tiny trial whose first attempt fills 768 MiB and fails."""
    from nas.data.loading import load_data

    monkeypatch = pytest.MonkeyPatch()
    _inject_out_of_memory(monkeypatch, rows=2, spike_bytes=768 * 2**20)
    preset = get_preset("tiny")
    cfg = preset.train.with_(tokens=4 * 32, batch_size=4, seq_len=32, eval_every=128, eval_tokens=128,
                             device="cpu", threads=1)
    before = runners.device.peak_memory_mb(torch.device("cpu"))
    result = runners.proxy.run(preset.baseline, cfg, load_data("builtin"))
    monkeypatch.undo()
    return before, result.peak_memory_mb, result.micro_batch


def test_the_peak_memory_of_a_trial_is_its_kept_attempts_not_the_failed_ones(nas_cache):
    """The retry's cleanup runs after the except block, with the failed attempt's tensors released, and the peak
    starts again. (On CUDA the allocator's cached blocks also go back to the device then: ``gpu_check``.)

    Measured in a process of its own with glibc's default malloc settings: with the README's MALLOC_MMAP_MAX_=0 and
    a huge MALLOC_TRIM_THRESHOLD_ (as CI exports) freed memory stays resident by design, so no resident-set peak
    could fall after a failed attempt, whatever the tool does."""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("the peak resident set is reset through Linux's /proc/self/clear_refs")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import test_gpu_path as t; "
            "print(json.dumps(t._peak_after_a_retry()))")
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], env=env, capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    before, peak, micro_batch = json.loads(done.stdout.strip().splitlines()[-1])
    assert micro_batch == 2
    assert peak < before + 384, (peak, before)


# ----------------------------------------------------------------- 4, 5. compiling a schedule a trial
def test_a_prism_schedule_compiled_as_a_trial_compiles_it_has_no_graph_break():
    """``compile_model`` (the proxy's and the full run's) switches to the plain-PyTorch ops: Dynamo traces one graph.
    The model's own functions break it in every layer (the CPU kernels here; on CUDA the RoPE function's ``out=``
    writes into strided views, which gpu_check's ``compile_graph`` step traces on the GPU)."""
    import torch._dynamo

    x = torch.randint(0, 256, (2, 16))
    torch._dynamo.reset()  # what the proxy compiled before (one layer: Dynamo's explain of each break is slow)
    assert torch._dynamo.explain(Transformer(TINY.replace(n_layers=1, heads=(2,))))(x, x).graph_break_count > 0
    model = Transformer(TINY)
    compile_model(model)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x, x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_the_tenth_schedule_a_worker_compiles_is_still_compiled_not_run_eager():
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    x = torch.randint(0, 256, (2, 16))
    for i, heads in enumerate([1, 2, 3, 4, 6, 8, 12, 16, 24, 32], start=1):  # one layer (fast), ten head counts
        with torch.no_grad():
            compile_model(Transformer(TINY.replace(n_layers=1, d_model=96, heads=(heads,))), backend=counter)(x, x)
        assert counter.frame_count == i, f"schedule {i} ({heads}) ran eager"


# ----------------------------------------------------------------- 6. head dims FlashAttention takes
def test_sdpa_gives_head_dims_above_256_its_memory_efficient_kernel_not_flash():
    h100, a10, v100 = (9, 0), (8, 6), (7, 0)
    assert [sdpa_kernel(768 // h, h100) for h in (1, 2, 3, 4, 6, 8, 12)] == ["efficient"] * 2 + ["flash"] * 5
    assert sdpa_kernel(224, a10) == "efficient" and sdpa_kernel(224, a10, training=False) == "flash"
    assert sdpa_kernel(64, v100) == "efficient" and sdpa_kernel(64, h100, torch.float32) == "efficient"
    assert sdpa_kernel(6, h100, torch.float32) == "math" and sdpa_kernel(64, None) == "cpu"


def test_the_gpu_presets_keep_every_layer_of_every_schedule_on_flash_and_say_what_that_removes():
    gpu = get_preset("gpu-prism")
    every = build_space(SpaceOptions(space="prism"), defaults=gpu.baseline)
    capped = build_space(gpu.space_options(SpaceOptions(space="prism")), defaults=gpu.baseline)
    slow = [s for s in every.schedules() if any(768 // h > FLASH_MAX_HEAD_DIM for h in s)]
    assert (every.count(), len(slow), sum(768 // h > 256 for s in every.schedules() for h in s)) == (129, 76, 218)
    assert capped.count() == 53 == every.count() - len(slow)
    assert all(sdpa_kernel(768 // h, (9, 0)) == "flash" for s in capped.schedules() for h in s)
    result = CliRunner().invoke(app, ["presets"])
    assert "keeps the 53 of 129 Prism schedules" in result.stdout and "76 have a layer above 256" in result.stdout


def test_max_head_dim_is_a_prism_option_that_the_user_can_widen_and_old_studies_never_see():
    space = PrismSpace(12, 768, 12, max_head_dim=256)
    assert space.candidates == (3, 4, 6, 8) and space.count() == 53
    assert "layer 1: 2 heads gives head dim 384 > max_head_dim=256" in space.validate_schedule((2,) * 2 + (12,) * 10)
    assert "max_head_dim" not in PrismSpace(12, 96, 12).describe()  # part of a study's identity: unchanged
    gpu = get_preset("gpu-prism")
    assert gpu.space_options(SpaceOptions(space="prism", max_head_dim=768)).max_head_dim == 768
    assert gpu.space_options(SpaceOptions(space="hourglass")) == SpaceOptions(space="hourglass")
    assert get_preset("cpu").space_options(SpaceOptions()) == SpaceOptions()
    runner = CliRunner()
    assert runner.invoke(app, ["space", "count", "--d-model", "768", "--max-head-dim", "256"]).stdout == "53\n"
    for bad in (["--max-head-dim", "0"], ["--space", "hourglass", "--max-head-dim", "256"]):
        result = runner.invoke(app, ["space", "count", *bad])
        assert result.exit_code == 2 and result.output.count("\n") == 1, result.output


# ----------------------------------------------------------------- 7. the Slurm script
def test_the_slurm_script_gives_srun_its_cpus_and_counts_two_connections_a_worker():
    script = (ROOT / "examples" / "slurm" / "nas-search.sbatch").read_text()
    assert re.search(r'^srun --cpus-per-task="\$SLURM_CPUS_PER_TASK" ', script, re.M)
    count = re.search(r"(\d+) nodes x \((\d+) workers x 2 \+ 1 parent\) \+ (\d+) readers = (\d+)", script)
    nodes, workers, readers, total = map(int, count.groups())
    assert database_connections(nodes, workers, readers) == total == 71


def test_a_worker_with_its_heartbeat_holds_two_postgresql_connections(postgres_url):
    """What ``database_connections`` counts, on a real server: the main thread's session and the heartbeat's."""
    import time

    import optuna
    import psycopg2

    from nas.study.heartbeat import Heartbeat
    from nas.study.storage import make_storage

    storage = make_storage(postgres_url, heartbeat_interval=1)
    study = optuna.create_study(storage=storage, study_name="connections")
    trial = study.ask()
    database = postgres_url.rsplit("/", 1)[1]
    watcher = psycopg2.connect(postgres_url)
    try:
        with Heartbeat(storage, trial._trial_id, trial.number):
            for _ in range(3):  # the main thread reads while the heartbeat thread beats
                study.get_trials()
                time.sleep(1.1)
            cursor = watcher.cursor()
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                           (database,))
            held = cursor.fetchone()[0]
    finally:
        watcher.close()
        storage.engine.dispose()
    assert held == 2 == database_connections(1, 1)


# ----------------------------------------------------------------- 8. MIG slices
MIGS = ",".join(f"MIG-{i:08x}-aaaa-bbbb-cccc-{i:012x}" for i in range(7))


def test_each_listed_mig_instance_gets_its_own_worker():
    """A process enumerates one MIG instance, so torch counts 1 for seven listed UUIDs; the list itself is dealt out.
    (Whether each worker then sees its own instance needs MIG hardware: gpu_check's ``mig`` step.)"""
    assert usable_gpus(1, MIGS) == 7 and usable_gpus(0, MIGS) == 0 and usable_gpus(2, "0,1") == 2
    assert resolve_workers("auto", "cuda", n_gpus=usable_gpus(1, MIGS), cores=64) == 7
    seven = plan_placements(7, "cuda", n_gpus=1, cores=64, visible=MIGS)
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in seven] == MIGS.split(",") == [p.label for p in seven]
    assert mig_devices("0,MIG-x") == [] and mig_devices(None) == []


# ----------------------------------------------------------------- smaller items
def test_runner_threads_are_set_on_any_device_and_cap_the_compile_workers():
    """A GPU worker's threads: the CPU cannot run a CUDA trial, so the setting the runners make for every device is
    checked here, and on a GPU by gpu_check's ``threads`` step."""
    import torch._inductor.config as inductor

    threads, workers = torch.get_num_threads(), inductor.compile_threads
    try:
        assert configure_threads(1, compiling=True) == 1 == torch.get_num_threads()
        assert inductor.compile_threads == 1
    finally:
        torch.set_num_threads(threads)
        inductor.compile_threads = workers
    source = (ROOT / "runners" / "proxy.py").read_text()
    assert 'if device.type == "cpu":\n        set_threads' not in source and "configure_threads(cfg.threads" in source


def test_losses_read_every_few_steps_give_the_same_trial_as_every_step(monkeypatch, builtin_data):
    """CUDA keeps the step losses on the device between reads; on the CPU the same bookkeeping, forced to read every
    5 steps, must give the same curve, score and divergence verdict as reading every step."""
    preset = get_preset("tiny")
    cfg = preset.train.with_(device="cpu", threads=1)
    every_step = runners.proxy.run(preset.baseline, cfg, builtin_data)
    monkeypatch.setattr(runners.proxy, "StepLosses", lambda device: StepLosses(device, every=5))
    deferred = runners.proxy.run(preset.baseline, cfg, builtin_data)
    assert deferred.train_curve == every_step.train_curve and deferred.val_loss == every_step.val_loss
    assert deferred.steps == every_step.steps == cfg.steps
    diverging = cfg.with_(diverge_factor=0.999)  # the second step's loss is above 0.999 x the first's
    monkeypatch.undo()
    first = runners.proxy.run(preset.baseline, diverging, builtin_data)
    monkeypatch.setattr(runners.proxy, "StepLosses", lambda device: StepLosses(device, every=5))
    second = runners.proxy.run(preset.baseline, diverging, builtin_data)
    assert first.status == second.status == "diverged" and first.reason == second.reason


def test_a_full_run_reading_its_losses_every_few_steps_logs_the_same_losses(monkeypatch, tmp_path):
    preset = get_preset("tiny")
    cfg = preset.train.with_(tokens=12 * 128, device="cpu", threads=1)
    data = load_data("builtin")
    run_full = runners.full.run_full
    every = run_full(TINY, cfg, data, runners.full.RunOptions(out=tmp_path / "a", progress=False, checkpoint_every=4))
    monkeypatch.setattr(runners.full, "StepLosses", lambda device: StepLosses(device, every=3))
    deferred = run_full(TINY, cfg, data, runners.full.RunOptions(out=tmp_path / "b", progress=False,
                                                                 checkpoint_every=4))
    logs = [(tmp_path / d / "log.jsonl").read_text().splitlines() for d in ("a", "b")]
    strip = [[re.sub(r', "tokens_per_s": [^,]+, "mfu": [^}]+', "", line) for line in log] for log in logs]
    assert strip[0] == strip[1] and len(strip[0]) > 12 and every["val_loss"] == deferred["val_loss"]


def test_nas_train_compiles_by_default_on_a_gpu_only(tmp_path):
    assert compiles_by_default(torch.device("cuda")) and not compiles_by_default(torch.device("cpu"))
    config = tmp_path / "arch.json"
    config.write_text(TINY.to_json())
    result = CliRunner().invoke(app, ["train", "--config", str(config), "--preset", "tiny", "--tokens", "512",
                                      "--device", "cpu", "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert '"compile": false' in result.stdout


def test_the_gpu_estimate_counts_the_cold_compile_and_converts_its_mfu_to_a_runs():
    preset = get_preset("gpu-prism")
    g, b, t = preset.gpu, preset.baseline, preset.train
    assert g.minutes_per_trial(b, t) == pytest.approx((t.tokens / g.tokens_per_s(b, t) + g.compile_s) / 60)
    assert g.run_mfu(800e12) == pytest.approx(0.43 * 989 / 800)  # the H200-measured share of the datasheet peak


def test_the_torch_floor_has_f_rms_norm():
    floor = re.search(r'^\s*"torch>=(\d+)\.(\d+)', (ROOT / "pyproject.toml").read_text(), re.M)
    assert tuple(map(int, floor.groups())) >= (2, 4)


# ----------------------------------------------------------------- 3. gpu_check: every step recorded
def test_a_failing_gpu_check_step_is_recorded_and_the_report_written_and_the_next_step_runs(tmp_path, builtin_data):
    """The out-of-memory step's old failure: one 1024 x 1024 batch needs more validation tokens than the builtin
    data has, and the UsageError stopped the script before it wrote anything."""
    from benchmarks.gpu_check import Check, Skipped

    check = Check(tmp_path / "gpu_check.json", {"smoke": True})
    check.step("oom_halving", lambda: check_enough_tokens(builtin_data, 1024, 1024) or {})
    check.step("nccl", lambda: (_ for _ in ()).throw(Skipped("1 GPU(s); NCCL needs 2")))
    check.step("host", lambda: {"summary": "ok"})
    import json

    report = json.loads((tmp_path / "gpu_check.json").read_text())
    steps = report["steps"]
    assert steps["oom_halving"]["status"] == "fail" and "UsageError" in steps["oom_halving"]["reason"]
    assert steps["nccl"] == {**steps["nccl"], "status": "skipped", "reason": "1 GPU(s); NCCL needs 2"}
    assert steps["host"]["status"] == "pass" and report["summary"] == {"pass": 1, "fail": 1, "skipped": 1}
    with pytest.raises(UsageError):
        check_enough_tokens(builtin_data, 1024, 1024)


@pytest.mark.slow
def test_gpu_check_smoke_runs_with_no_options_on_the_cpu_and_writes_every_steps_status(tmp_path, nas_cache):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--smoke"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NAS_CACHE": nas_cache, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import json

    report = json.loads((tmp_path / "gpu_check.json").read_text())
    steps = report["steps"]
    assert report["device"] == "cpu" and report["summary"]["fail"] == 0
    assert all(s["status"] in ("pass", "skipped") and (s["status"] == "pass" or s["reason"]) for s in steps.values())
    assert {"attention_kernels", "compile_graph", "recompiles", "timing", "grouped_query", "resume", "oom_halving",
            "search"} <= {name for name, s in steps.items() if s["status"] == "pass"}
    assert steps["oom_halving"]["micro_batch"] == 2 and steps["oom_halving"]["largest_eval_forward"] == 2
    assert steps["search"]["trials"] == 4 and steps["search"]["placed_on"] == ["cpu"]
    assert len(steps["timing"]["rows"]) == 3 and steps["recompiles"]["compiled"] == 10
    assert proc.stdout.count(" pass ") >= 7 and "failed" in proc.stdout.splitlines()[-1]


def test_gpu_check_only_runs_the_named_steps_and_refuses_an_unknown_one_in_a_line(tmp_path, nas_cache, capsys):
    """``--only``: the rerun of a step that failed on a leased GPU (the others recorded as skipped, saying why)."""
    from benchmarks.gpu_check import STEPS, main

    assert main(["--smoke", "--out", str(tmp_path), "--only", "host,threads"]) == 0
    steps = json.loads((tmp_path / "gpu_check.json").read_text())["steps"]
    assert {k for k, s in steps.items() if s["status"] == "pass"} == {"machine", "host", "threads"}
    assert all(steps[k]["reason"] == "not among --only's steps" for k in STEPS if k not in ("host", "threads"))
    with pytest.raises(SystemExit) as exit_:
        main(["--smoke", "--out", str(tmp_path), "--only", "host,flash"])
    assert exit_.value.code == 2 and "--only host,flash: unknown step flash; steps are matmul_peak" in \
        capsys.readouterr().err


def test_the_h200_record_has_every_step_and_the_estimate_quotes_its_figures():
    """The GPU presets' estimate (``runners.presets.GpuEstimate``) is read off the committed H200 record, not assumed:
    its MFU of the datasheet peak and its cold compile are the record's batch-32 timing, rounded."""
    from benchmarks.gpu_check import STEPS

    record = json.loads((ROOT / "benchmarks" / "data" / "gpu_check-nvidia-h200.json").read_text())
    assert record["machine"]["gpu"] == "NVIDIA H200" and record["summary"] == {"pass": 12, "fail": 0, "skipped": 2}
    assert set(STEPS) <= set(record["steps"]) and record["steps"]["search"]["placed_on"] == ["cuda:0"]
    rows = {r["shape"]: r for r in record["timing_batch_32"]["timing"]["rows"]}
    estimate = get_preset("gpu-prism").gpu
    assert estimate.mfu == pytest.approx(rows["uniform"]["mfu_of_datasheet"], abs=0.005)
    assert estimate.compile_s == pytest.approx(max(r["compile_s"] for r in rows.values()), abs=1.0)
