"""One prepared script for a machine with a GPU: the CUDA paths of a full-scale run, checked and timed.

    python -m benchmarks.gpu_check                 # gpt2-124m, bf16, torch.compile, on cuda
    python -m benchmarks.gpu_check --smoke         # the same code on a tiny shape (CPU is fine): checks the script

It trains ``gpt2-124m`` steps on random tokens (nothing is downloaded) for the uniform baseline
and one hardware-aligned Prism schedule (``3x2,6x2,12x8``: head dims 256, 128, 64, all powers of
two), each with bf16 autocast, fused AdamW and ``torch.compile`` (the model's plain-PyTorch ops),
interleaving blocks of steps baseline / Prism / baseline ... and reporting the median tokens/s
ratio (the Prism paper's zero-overhead claim on a GPU) and each one's MFU against the measured
bf16 matmul peak. With two or more GPUs it then checks NCCL: a 2-process DDP all-reduce. Then a
real ``nas search`` on the ``gpu-prism`` proxy preset (4 trials of 2M tokens, ``--workers 2``
placed on the GPUs present: what each trial trained on is read back from the study), and the
out-of-memory path: GPT-2 small with a batch of 1024 sequences of 1024 tokens, which no single
GPU holds, must train as accumulated micro-batches rather than fail. About 5 minutes on one
H100-class GPU (the compiles dominate); ``--smoke`` runs the same code on the CPU (tiny shapes,
an injected out-of-memory). Writes ``gpu_check.json`` next to the printed table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

PRISM_SCHEDULE = (3, 3, 6, 6) + (12,) * 8


def _step_fn(model, optimizer, x, y, device, dtype):
    import torch

    from runners.device import autocast

    def step() -> float:
        with autocast(device, dtype):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def _timed(step, steps: int, device) -> float:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _nccl_check() -> str:
    """A 2-process NCCL all-reduce through torchrun's launcher, or why it was not run."""
    import subprocess

    import torch

    if torch.cuda.device_count() < 2:
        return f"skipped: {torch.cuda.device_count()} GPU(s), NCCL needs 2"
    code = ("import os, torch, torch.distributed as d; r = int(os.environ['LOCAL_RANK']); torch.cuda.set_device(r); "
            "d.init_process_group('nccl'); t = torch.ones(1, device='cuda') * (r + 1); d.all_reduce(t); "
            "assert t.item() == 3, t; d.destroy_process_group()")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "--no-python", sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    return "ok: 2-process all-reduce" if proc.returncode == 0 else f"FAILED: {proc.stderr.strip()[-300:]}"


def _search_check(smoke: bool, device: str, out: Path) -> dict:
    """A real ``nas search`` on the GPU proxy preset: 4 short trials, ``--workers 2`` placed on the GPUs present
    (``nas.study.placement``); what each trial trained on, read back from the study."""
    import subprocess

    import optuna

    storage = f"sqlite:///{out / 'gpu_check_search.db'}"
    preset, tokens = ("tiny", "2k") if smoke else ("gpu-prism", "2M")
    args = [sys.executable, "-m", "nas.cli", "search", "--space", "prism", "--preset", preset, "--tokens", tokens,
            "--trials", "4", "--workers", "2", "--device", device, "--storage", storage, "--study-name", "gpu-check"]
    started = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=420)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        return {"status": f"FAILED (exit {proc.returncode}): {proc.stderr.strip()[-400:]}", "seconds": seconds}
    from nas.study.records import counts

    trials = optuna.load_study(study_name="gpu-check", storage=storage).get_trials()
    # the trainings: a duplicate answered from the store or a surplus trial of two workers racing for the last
    # slot is COMPLETE too, but trained nothing (seen on the slower 2-core machine: 5 COMPLETE for 4 trainings)
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and counts(t)]
    return {"status": "ok", "seconds": seconds, "trials": len(done),
            "placed_on": sorted({t.user_attrs.get("placed_on", "?") for t in done}),
            "trial_s": [round(t.user_attrs.get("wall_time_s", 0.0), 1) for t in done],
            "first_line": proc.stderr.splitlines()[0][:300] if proc.stderr else ""}


def _oom_check(smoke: bool, device: str) -> dict:
    """A batch too big for the device is halved into accumulated micro-batches, not a failed trial: on a GPU a
    real out-of-memory (GPT-2 small, 1024 sequences of 1024 tokens); with ``--smoke`` one injected on the CPU."""
    import torch

    import runners.proxy
    from nas.data import load_data
    from runners.presets import get_preset

    preset = get_preset("tiny" if smoke else "gpt2-124m")
    batch, seq_len = (8, 32) if smoke else (1024, 1024)
    cfg = preset.train.with_(tokens=batch * seq_len, batch_size=batch, seq_len=seq_len, eval_every=batch * seq_len,
                             eval_tokens=batch * seq_len, prune_eval_tokens=0, device=device, compile=False)
    training = runners.proxy._train

    def too_big_on_the_cpu(model, cfg, *rest):  # --smoke: what the allocator says, for more than 2 sequences
        forward = model.forward

        def limited(x, *args, **kwargs):
            if model.training and x.shape[0] > 2:
                raise torch.OutOfMemoryError("CUDA out of memory (injected by --smoke)")
            return forward(x, *args, **kwargs)

        model.forward = limited
        return training(model, cfg, *rest)

    if smoke:
        runners.proxy._train = too_big_on_the_cpu
    try:
        started = time.perf_counter()
        result = runners.proxy.run(preset.baseline, cfg, load_data("builtin"))
    finally:
        runners.proxy._train = training
    return {"status": result.status, "batch": batch, "micro_batch": result.micro_batch, "reason": result.reason,
            "seconds": time.perf_counter() - started, "peak_memory_mb": result.peak_memory_mb}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny shape for a few steps: checks the script")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8, help="sequences per step (T = 1024)")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)

    import torch

    from nas.model.transformer import Transformer
    from runners.config import TrainConfig
    from runners.device import resolve_device
    from runners.peak import measure_matmul_peak
    from runners.presets import get_preset
    from runners.proxy import build_optimizer

    device = resolve_device(args.device)
    if device.type != "cuda" and not args.smoke:
        print(f"error: --device {args.device} is not a GPU here; run with --smoke to check the script on CPU",
              file=sys.stderr)
        return 2
    preset = get_preset("tiny" if args.smoke else "gpt2-124m")
    base = preset.baseline
    seq_len = 32 if args.smoke else 1024
    dtype = "bf16" if device.type == "cuda" else "fp32"
    schedule = (1, 1, 4, 4) if args.smoke else PRISM_SCHEDULE
    shapes = {"uniform": base, "prism " + ",".join(map(str, schedule)): base.replace(heads=list(schedule))}
    peak = measure_matmul_peak(device, torch.bfloat16 if dtype == "bf16" else torch.float32)
    x = torch.randint(0, base.vocab_size, (args.batch, seq_len), device=device)
    y = torch.randint(0, base.vocab_size, (args.batch, seq_len), device=device)
    cfg = TrainConfig(batch_size=args.batch, seq_len=seq_len, lr=6e-4, device=str(device), dtype=dtype)
    steps, warm = {}, {}
    compile_s = {}
    for name, arch in shapes.items():
        torch.manual_seed(0)
        model = Transformer(arch).to(device)
        compiled = model
        if not args.no_compile:
            model.use_reference_ops()
            compiled = torch.compile(model)
        step = _step_fn(compiled, build_optimizer(model, cfg, device), x, y, device, dtype)
        start = time.perf_counter()
        warm[name] = step()  # compiles
        compile_s[name] = time.perf_counter() - start
        steps[name] = step
    names = list(shapes)
    seconds: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(1 if args.smoke else args.rounds):
        for name in names:
            seconds[name].append(_timed(steps[name], 1 if args.smoke else args.steps, device))
    tokens = args.batch * seq_len * (1 if args.smoke else args.steps)
    rows = []
    for name, arch in shapes.items():
        speed = tokens / statistics.median(seconds[name])
        rows.append({"shape": name, "tokens_per_s": speed, "mfu": arch.flops_per_token(seq_len) * speed / peak,
                     "compile_s": compile_s[name], "first_loss": warm[name]})
    ratio = statistics.median(u / p for u, p in zip(seconds[names[0]], seconds[names[1]]))
    del steps, model, compiled  # the timed models leave the device to the search and the out-of-memory check
    if device.type == "cuda":
        torch.cuda.empty_cache()
    search = _search_check(args.smoke, "cpu" if device.type != "cuda" else "cuda", Path(args.out))
    oom = _oom_check(args.smoke, str(device))
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "dtype": dtype,
              "compile": not args.no_compile, "peak_flops": peak, "rows": rows,
              "prism_over_uniform_tokens_per_s": ratio, "nccl": _nccl_check() if device.type == "cuda" else "skipped",
              "search": search, "oom_halving": oom, "torch": torch.__version__, "smoke": args.smoke}
    for row in rows:
        print(f"{row['shape']:<28} {row['tokens_per_s']:>12,.0f} tok/s  MFU {100 * row['mfu']:5.1f}%  "
              f"compile {row['compile_s']:.0f} s")
    print(f"Prism / uniform tokens/s: {ratio:.3f} (median over rounds); NCCL: {report['nccl']}")
    print(f"search (2 workers): {search['status']}, {search.get('trials', 0)} trials on {search.get('placed_on')} in "
          f"{search['seconds']:.0f} s; out of memory: {oom['status']}, batch {oom['batch']} trained as micro-batches "
          f"of {oom['micro_batch']} ({oom['seconds']:.0f} s)")
    Path(args.out, "gpu_check.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path.home() / ".cache" / "prism-nas" / "inductor"))
    sys.exit(main())
