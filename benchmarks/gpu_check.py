"""One prepared script for a machine with a GPU: the CUDA paths of a full-scale run, checked and timed.

    python -m benchmarks.gpu_check                 # gpt2-124m, bf16, torch.compile, on cuda
    python -m benchmarks.gpu_check --smoke         # the same code on a tiny shape (CPU is fine): checks the script

It trains ``gpt2-124m`` steps on random tokens (nothing is downloaded) for the uniform baseline
and one hardware-aligned Prism schedule (``3x2,6x2,12x8``: head dims 256, 128, 64, all powers of
two), each with bf16 autocast, fused AdamW and ``torch.compile`` (the model's plain-PyTorch ops),
interleaving blocks of steps baseline / Prism / baseline ... and reporting the median tokens/s
ratio (the Prism paper's zero-overhead claim on a GPU) and each one's MFU against the measured
bf16 matmul peak. With two or more GPUs it then checks NCCL: a 2-process DDP all-reduce.
Writes ``gpu_check.json`` next to the printed table.
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
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "dtype": dtype,
              "compile": not args.no_compile, "peak_flops": peak, "rows": rows,
              "prism_over_uniform_tokens_per_s": ratio, "nccl": _nccl_check() if device.type == "cuda" else "skipped",
              "torch": torch.__version__, "smoke": args.smoke}
    for row in rows:
        print(f"{row['shape']:<28} {row['tokens_per_s']:>12,.0f} tok/s  MFU {100 * row['mfu']:5.1f}%  "
              f"compile {row['compile_s']:.0f} s")
    print(f"Prism / uniform tokens/s: {ratio:.3f} (median over rounds); NCCL: {report['nccl']}")
    Path(args.out, "gpu_check.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path.home() / ".cache" / "prism-nas" / "inductor"))
    sys.exit(main())
