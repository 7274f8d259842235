"""One prepared script for a machine with a GPU: the CUDA paths of a run, each checked and timed as its own step.

    python -m benchmarks.gpu_check            # on a GPU: every step; JSON to benchmarks/data/gpu_check-<gpu>.json
    python -m benchmarks.gpu_check --smoke    # the same steps at tiny sizes on the CPU: checks the script itself

Every step records ``pass``, ``fail`` (with the error's first line) or ``skipped`` (with the reason),
whatever the others did, and the report is rewritten after each one, so a step that dies leaves the
steps before it on disk. The exit code is 1 when a step failed. Steps, in order:

- ``machine``: the GPU (name, compute capability, memory, MIG), CUDA, cuDNN, torch, the host CPU;
- ``matmul_peak``: the bf16 matmul peak a run's MFU is measured against (``runners.peak``), and
  what the ``gpu-prism`` estimate's speed would read as against it;
- ``attention_kernels``: for every head dim of the ``gpu-prism`` space (d768: 768 ... 64), the SDPA
  kernel ``runners.device.sdpa_kernel`` predicts, torch's own ``can_use_*_attention`` answers (GPU),
  and the time of a causal attention forward + backward at T = 1024 (ratio to the baseline's 64): what
  a head dim above 256 costs, which ``--max-head-dim 256`` keeps out of the GPU presets;
- ``compile_graph``: a Prism schedule with the plain-PyTorch ops traced by Dynamo: zero graph breaks
  (and how many the model's custom functions would have made);
- ``recompiles``: ten schedules compiled one after another in one process through
  ``runners.proxy.compile_model`` (a worker's trials): each still compiled, none fallen back to eager;
- ``timing``: ``gpt2-124m`` steps on random tokens (nothing is downloaded) for the uniform baseline, a
  hardware-aligned Prism schedule (``3x2,6x2,12x8``: head dims 256, 128, 64) and one with layers above
  256 (``1x2,2x2,12x8``: 768, 384), each in bf16 with fused AdamW and ``torch.compile``, in interleaved
  blocks: tokens/s, MFU against the measured peak, achieved TFLOP/s, the cold compile, each schedule's
  SDPA kernels, and the step time when the loss is read every step against every 16 (a host-device sync);
- ``grouped_query``: grouped-query attention on the device: a Prism schedule with 3 query heads per key/value
  head gives the logits of its multi-head twin (key/value weights repeated; the model's ops and the plain
  ones), traces with zero graph breaks, and, compiled in bf16, trains at what tokens/s against the multi-head
  baseline (``gpt2-124m``, attention alone: the baseline's FFN; SDPA's ``enable_gqa`` shares the key/value
  heads without copying them);
- ``host``: what a step waits for on the CPU: drawing a batch's windows, pinning and copying it;
- ``resume``: a full run on the device checkpointed and resumed (``map_location`` the device: the RNG
  states must come back to the CPU), and the device's generator state restored exactly;
- ``threads``: the runner's thread setting on this device and the cap on Inductor's compile workers;
- ``oom_halving``: GPT-2 small with a batch of 1024 sequences of 1024 tokens on random tokens (1M
  validation tokens: more than the builtin data has), which no single GPU holds: it must train as
  accumulated micro-batches and be evaluated in them, not fail; with ``--smoke`` an out-of-memory error
  is injected on the CPU into every forward of more than 2 sequences, training and evaluation alike;
- ``search``: a real ``nas search`` on the ``gpu-prism`` preset (4 trials of 2M tokens, ``--workers 2``
  placed on the GPUs present; what each trial trained on is read back from the study);
- ``nccl``: a 2-process DDP all-reduce (two or more GPUs); ``mig``: each listed MIG instance seen by its
  own process (a ``CUDA_VISIBLE_DEVICES`` of ``MIG-...`` UUIDs).

About 8 minutes on one H200 (the cold compiles dominate: ``timing`` 168 s, ``search`` 141 s, ``grouped_query`` 120 s;
``benchmarks/data/gpu_check-nvidia-h200.json``); ``--smoke`` about 30 s on 2 CPU cores. ``--only`` runs the named
steps alone (the others recorded as skipped): a rerun of a step that failed or did not finish.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
ALIGNED = (3, 3, 6, 6) + (12,) * 8  # head dims 256, 128, 64 at d768: all within FlashAttention's range
ABOVE_FLASH = (1, 1, 2, 2) + (12,) * 8  # head dims 768, 384: above 256, no flash kernel
SMOKE_SCHEDULES = ((1, 1, 4, 4), (1, 1, 2, 2))  # the tiny preset's staircases (d32: head dims 32, 16 and 8)
STEPS = ("matmul_peak", "attention_kernels", "compile_graph", "recompiles", "timing", "grouped_query", "host",
         "resume", "threads", "oom_halving", "search", "nccl", "mig")


class Skipped(Exception):
    """A step that does not apply here; its message says why."""


class Check:
    """The report: every step's status and figures, rewritten to ``path`` after each step."""

    def __init__(self, path: Path, header: dict[str, Any], only: set[str] | None = None) -> None:
        self.path, self.report, self.only = path, {**header, "steps": {}}, only
        self.write()

    def step(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            if self.only is not None and name not in self.only:
                raise Skipped("not among --only's steps")
            result = {"status": "pass", **fn()}
        except Skipped as why:
            result = {"status": "skipped", "reason": str(why)}
        except (Exception, SystemExit) as error:  # noqa: BLE001 - a failed step is recorded, the next one runs
            first = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
            result = {"status": "fail", "reason": f"{type(error).__name__}: {first}",
                      "traceback": traceback.format_exc()[-2000:]}
        result["seconds"] = round(time.perf_counter() - started, 2)
        self.report["steps"][name] = result
        line = result.get("summary", "") if result["status"] == "pass" else result["reason"]
        print(f"{name:<18} {result['status']:<8} {line}", flush=True)
        self.write()
        return result

    def write(self) -> None:
        steps = self.report["steps"].values()
        self.report["summary"] = {s: sum(r["status"] == s for r in steps) for s in ("pass", "fail", "skipped")}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.report, indent=1, default=str))
        tmp.replace(self.path)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def machine(device) -> dict[str, Any]:
    import torch

    from benchmarks.harness import cpu_model

    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(), "cpu": cpu_model(),
                            "cores": os.cpu_count(), "cores_usable": len(os.sched_getaffinity(0))
                            if hasattr(os, "sched_getaffinity") else os.cpu_count(), "device": str(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, capability=list(torch.cuda.get_device_capability(device)),
                    memory_gib=round(props.total_memory / 2**30, 1), gpus=torch.cuda.device_count(),
                    cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                    visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
        try:
            info["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                                timeout=30).stdout.strip().splitlines()
        except (OSError, subprocess.SubprocessError):
            info["nvidia_smi"] = None
    info["summary"] = f"{info.get('gpu', 'cpu')}, torch {torch.__version__}, {info['cpu']}"
    return info


def matmul_peak(device, dtype) -> dict[str, Any]:
    from runners.peak import measure_matmul_peak
    from runners.presets import get_preset

    peak = measure_matmul_peak(device, dtype)
    estimate = get_preset("gpu-prism").gpu
    summary = f"{peak / 1e12:.3g} TFLOP/s measured ({dtype})"
    if device.type == "cuda":
        summary += (f"; the gpu-prism estimate's {estimate.achieved_flops / 1e12:.0f} TFLOP/s would read as "
                    f"{100 * estimate.run_mfu(peak):.0f} % MFU here")
    return {"peak_flops": peak, "estimate_achieved_flops": estimate.achieved_flops,
            "estimate_run_mfu": estimate.run_mfu(peak), "summary": summary}


def head_dims(smoke: bool) -> list[int]:
    """Every head dim of the gpu-prism Prism space (d768), largest first; the tiny preset's with --smoke."""
    from runners.presets import get_preset
    from search_spaces.prism import PrismSpace

    base = get_preset("tiny" if smoke else "gpu-prism").baseline
    space = PrismSpace(base.n_layers, base.d_model, base.heads[0])
    return [base.d_model // h for h in (*space.candidates, base.heads[0])]


def attention_kernels(device, smoke: bool) -> dict[str, Any]:
    """What each head dim gets from SDPA and what it costs: causal attention forward + backward, T = 1024, d768."""
    import torch
    import torch.nn.functional as F

    from runners.device import FLASH_MAX_HEAD_DIM, sdpa_kernel

    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    d_model, seq_len, batch, repeats = (32, 32, 2, 3) if smoke else (768, 1024, 8, 20)
    dims = head_dims(smoke)
    rows, times = [], {}
    for dim in dims:
        q, k, v = (torch.randn(batch, d_model // dim, seq_len, dim, device=device, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        row: dict[str, Any] = {"head_dim": dim, "heads": d_model // dim,
                               "predicted": sdpa_kernel(dim, capability, dtype),
                               "predicted_sm90": sdpa_kernel(dim, (9, 0), torch.bfloat16)}
        if device.type == "cuda":
            from torch.backends.cuda import (
                SDPAParams,
                can_use_cudnn_attention,
                can_use_efficient_attention,
                can_use_flash_attention,
            )

            params = SDPAParams(q, k, v, None, 0.0, True, False)
            usable = {"cudnn": can_use_cudnn_attention(params, False), "flash": can_use_flash_attention(params, False),
                      "efficient": can_use_efficient_attention(params, False)}
            row["torch_can_use"] = usable
            row["torch_fused_flash"] = usable["cudnn"] or usable["flash"]
        for _ in range(2):  # warm-up, then the timed repeats
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        _sync(device)
        start = time.perf_counter()
        for _ in range(repeats):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        _sync(device)
        times[dim] = (time.perf_counter() - start) / repeats
        row["fwd_bwd_ms"] = 1e3 * times[dim]
        rows.append(row)
    reference = times[dims[-1]]  # the baseline's head dim (64 at d768)
    for row in rows:
        row["vs_baseline_head_dim"] = times[row["head_dim"]] / reference
    wrong = [r["head_dim"] for r in rows if "torch_fused_flash" in r
             and r["torch_fused_flash"] != (r["predicted"] == "flash")]
    if wrong:
        raise AssertionError(f"sdpa_kernel mispredicts the flash-family kernel for head dims {wrong}: {rows}")
    above = [r for r in rows if r["head_dim"] > FLASH_MAX_HEAD_DIM]
    if not smoke and any(r["predicted_sm90"] == "flash" for r in above):
        raise AssertionError(f"head dims above {FLASH_MAX_HEAD_DIM} predicted flash on sm90: {above}")
    worst = max(rows, key=lambda r: r["vs_baseline_head_dim"])
    return {"rows": rows, "summary": "; ".join(f"{r['head_dim']}: {r['predicted']} {r['fwd_bwd_ms']:.2f} ms"
                                               for r in rows) + f" (slowest {worst['vs_baseline_head_dim']:.2f}x "
                                                                 f"the baseline's)"}


def _model(arch, device):
    from nas.model.transformer import Transformer

    return Transformer(arch).to(device)


def compile_graph(device, smoke: bool) -> dict[str, Any]:
    """Dynamo's trace of a Prism schedule's forward and loss: the plain ops give one graph, no break."""
    import warnings

    import torch
    import torch._dynamo

    from runners.presets import get_preset

    base = get_preset("tiny" if smoke else "gpt2-124m").baseline
    arch = base.replace(n_layers=2, heads=(base.heads[0] // 4, base.heads[0]))  # two layers: a step and the top
    x = torch.randint(0, arch.vocab_size, (2, 64), device=device)
    model = _model(arch, device)
    torch._dynamo.reset()
    with warnings.catch_warnings():  # Dynamo's warnings about the custom functions it breaks on: what is counted
        warnings.simplefilter("ignore")
        custom = torch._dynamo.explain(model)(x, x).graph_break_count  # what the proxy compiled before its fix
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model.use_reference_ops())(x, x)
    if explained.graph_break_count:
        raise AssertionError(f"{explained.graph_break_count} graph breaks with the plain ops: "
                             f"{[str(r.reason)[:200] for r in explained.break_reasons]}")
    return {"graph_breaks": 0, "graphs": explained.graph_count, "breaks_with_custom_functions": custom,
            "summary": f"0 breaks ({custom} with the model's custom functions)"}


def recompiles(device, smoke: bool) -> dict[str, Any]:
    """Ten schedules in one process, as a worker's trials: every one is compiled (a frame compiled for each)."""
    import torch
    from torch._dynamo.testing import CompileCounter

    from nas.model.transformer import Transformer
    from runners.presets import get_preset
    from runners.proxy import compile_model

    base = get_preset("tiny").baseline.replace(n_layers=2, d_model=64, heads=(4, 4))
    schedules = [(1, 2), (1, 4), (1, 8), (1, 16), (2, 4), (2, 8), (2, 16), (4, 8), (4, 16), (8, 16)]
    counter = CompileCounter()
    x = torch.randint(0, base.vocab_size, (2, 16), device=device)
    compiled = []
    for schedule in schedules:
        arch = base.replace(heads=schedule)
        before = counter.frame_count
        compile_model(Transformer(arch).to(device), backend=counter)(x, x).backward()
        compiled.append(counter.frame_count > before)
    if not all(compiled):
        raise AssertionError(f"schedules {[s for s, c in zip(schedules, compiled) if not c]} ran eager")
    return {"schedules": len(schedules), "compiled": sum(compiled), "summary": f"{sum(compiled)}/{len(schedules)}"
                                                                                " schedules compiled"}


def _step_fn(model, optimizer, x, y, device, dtype):
    import torch

    from runners.device import autocast

    def step():
        with autocast(device, dtype):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def _timed(step, steps: int, device, read_every: int = 0) -> float:
    """Seconds for ``steps`` steps; ``read_every``: the loss read back (a host-device sync) every that many steps."""
    _sync(device)
    start = time.perf_counter()
    for i in range(steps):
        loss = step()
        if read_every and (i + 1) % read_every == 0:
            float(loss)
    _sync(device)
    return time.perf_counter() - start


def timing(device, args, peak: float | None) -> dict[str, Any]:
    import torch
    import torch._dynamo

    from runners.config import TrainConfig
    from runners.device import attention_kernels as kernels_of
    from runners.presets import get_preset
    from runners.proxy import build_optimizer

    smoke = args.smoke
    base = get_preset("tiny" if smoke else "gpt2-124m").baseline
    schedules = SMOKE_SCHEDULES if smoke else (ALIGNED, ABOVE_FLASH)
    shapes = {"uniform": base, **{"prism " + ",".join(map(str, s)): base.replace(heads=s) for s in schedules}}
    seq_len, batch = (32, 2) if smoke else (1024, args.batch)
    dtype = "bf16" if device.type == "cuda" else "fp32"
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    x = torch.randint(0, base.vocab_size, (batch, seq_len), device=device)
    y = torch.randint(0, base.vocab_size, (batch, seq_len), device=device)
    cfg = TrainConfig(batch_size=batch, seq_len=seq_len, lr=6e-4, device=str(device), dtype=dtype)
    backend = "eager" if smoke else "inductor"  # --smoke: Dynamo's trace only, no code generation
    torch._dynamo.reset()
    steps, rows = {}, []
    for name, arch in shapes.items():
        torch.manual_seed(0)
        model = _model(arch, device)
        # compiled as compile_model does (its RoPE tables filled first), without its reset: the blocks alternate
        # between the three compiled models
        model.fill_rotary_tables(seq_len, torch.bfloat16 if dtype == "bf16" else torch.float32)
        forward = model if args.no_compile else torch.compile(model.use_reference_ops(), backend=backend)
        step = _step_fn(forward, build_optimizer(model, cfg, device), x, y, device, dtype)
        start = time.perf_counter()
        first = float(step())  # compiles
        step()  # and once more: a recompile in the second call (the tables grown in the first did it) counts too
        rows.append({"shape": name, "compile_s": time.perf_counter() - start, "first_loss": first,
                     "attention": kernels_of(arch.head_dims(), capability)})
        steps[name] = step
    per_block = 1 if smoke else args.steps
    seconds: dict[str, list[float]] = {n: [] for n in shapes}
    for _ in range(1 if smoke else args.rounds):
        for name in shapes:
            seconds[name].append(_timed(steps[name], per_block, device))
    tokens = batch * seq_len * per_block
    estimate = get_preset("gpu-prism").gpu
    for row, (name, arch) in zip(rows, shapes.items()):
        speed = tokens / statistics.median(seconds[name])
        achieved = arch.flops_per_token(seq_len) * speed
        row.update(tokens_per_s=speed, achieved_tflops=achieved / 1e12, mfu=achieved / peak if peak else None,
                   mfu_of_datasheet=achieved / estimate.peak_flops,
                   over_uniform=statistics.median(u / s for u, s in zip(seconds["uniform"], seconds[name])))
    uniform = steps["uniform"]  # the host-device sync a step pays when its loss is read every step
    synced = statistics.median(_timed(uniform, per_block * 2, device, 1) for _ in range(1 if smoke else 3))
    deferred = statistics.median(_timed(uniform, per_block * 2, device, 16) for _ in range(1 if smoke else 3))
    return {"rows": rows, "read_every_step_over_every_16": synced / deferred,
            "summary": "; ".join(f"{r['shape']} {r['tokens_per_s']:,.0f} tok/s ({r['over_uniform']:.3f}x uniform)"
                                 for r in rows)}


def grouped_query(device, args) -> dict[str, Any]:
    """Grouped-query layers on the device: equal to the multi-head twin, traced whole, and timed (module docstring)."""
    import torch
    import torch._dynamo

    from runners.config import TrainConfig
    from runners.presets import get_preset
    from runners.proxy import build_optimizer

    smoke = args.smoke
    base = get_preset("tiny" if smoke else "gpt2-124m").baseline
    h = base.heads[0]
    g = 3 if h % 3 == 0 else 2  # 3 query heads per key/value head at gpt2-124m's 12 (2 at the tiny preset's 4)
    schedule = (h // 4,) * 2 + (h,) * (base.n_layers - 2) if h % 12 == 0 else (h,) * base.n_layers
    arch = base.replace(heads=list(schedule), kv_heads=[n // g for n in schedule])
    small = arch.replace(n_layers=2, heads=list(arch.heads[:2]), kv_heads=list(arch.kv_heads[:2]))
    torch.manual_seed(0)
    model = _model(small, device)
    twin = _model(small.replace(kv_heads=list(small.heads)), device)
    state = model.state_dict()
    for i, (heads, kv) in enumerate(zip(small.heads, small.kv_heads)):
        dh = small.d_model // heads
        q, k, v = state[f"blocks.{i}.attn.qkv.weight"].split([heads * dh, kv * dh, kv * dh])
        state[f"blocks.{i}.attn.qkv.weight"] = torch.cat(
            [q, *(w.view(kv, dh, -1).repeat_interleave(heads // kv, 0).reshape(heads * dh, -1) for w in (k, v))])
    twin.load_state_dict(state)
    x = torch.randint(0, small.vocab_size, (2, 64), device=device)
    errors = {}
    with torch.no_grad():
        for reference in (False, True):
            ours, theirs = model.use_reference_ops(reference)(x), twin.use_reference_ops(reference)(x)
            errors["reference ops" if reference else "model ops"] = float((ours - theirs).abs().max()
                                                                           / theirs.abs().max())
    if max(errors.values()) > 1e-4:
        raise AssertionError(f"a grouped layer differs from its multi-head twin: relative error {errors}")
    torch._dynamo.reset()
    breaks = torch._dynamo.explain(model.use_reference_ops())(x, x).graph_break_count
    if breaks:
        raise AssertionError(f"{breaks} graph breaks in a grouped-query model with the plain ops")
    seq_len, batch = (32, 2) if smoke else (1024, args.batch)
    dtype = "bf16" if device.type == "cuda" else "fp32"
    cfg = TrainConfig(batch_size=batch, seq_len=seq_len, lr=6e-4, device=str(device), dtype=dtype)
    xs = torch.randint(0, base.vocab_size, (batch, seq_len), device=device)
    grouped = f"{g} per key/value head"
    shapes = {"multi-head": base, grouped: base.replace(kv_heads=[h // g] * base.n_layers)}
    steps = {}
    for name, shape in shapes.items():
        torch.manual_seed(0)
        trained = _model(shape, device)
        forward = trained if args.no_compile else torch.compile(trained.use_reference_ops(),
                                                                backend="eager" if smoke else "inductor")
        steps[name] = _step_fn(forward, build_optimizer(trained, cfg, device), xs, xs, device, dtype)
        steps[name]()
        steps[name]()  # compiled, and recompiled for the grown rotary tables
    seconds: dict[str, list[float]] = {n: [] for n in shapes}
    for _ in range(1 if smoke else args.rounds):
        for name in shapes:
            seconds[name].append(_timed(steps[name], 1 if smoke else args.steps, device))
    ratio = statistics.median(m / t for m, t in zip(seconds["multi-head"], seconds[grouped]))
    cache = {name: shape.kv_cache_bytes_per_token() for name, shape in shapes.items()}
    return {"relative_error": errors, "graph_breaks": 0, "over_multi_head": ratio, "kv_cache_bytes_per_token": cache,
            "summary": f"equal to the multi-head twin ({max(errors.values()):.1e}), 0 graph breaks, "
                       f"{ratio:.3f}x the multi-head baseline's tokens/s, KV cache {cache[grouped]:,} "
                       f"bytes/token against {cache['multi-head']:,}"}


def host(device, smoke: bool) -> dict[str, Any]:
    """The CPU side of a step at the gpu-prism batch: draw the windows, pin them, copy them to the device."""
    import numpy as np

    from nas.data import BatchSampler

    batch, seq_len, repeats = (4, 32, 5) if smoke else (32, 1024, 50)
    tokens = np.random.default_rng(0).integers(0, 50304, size=10_000_000 if not smoke else 100_000, dtype=np.uint16)
    sampler = BatchSampler(tokens, batch, seq_len, 0)
    times: dict[str, list[float]] = {"draw": [], "pin": [], "copy": []}
    for _ in range(repeats):
        start = time.perf_counter()
        x, y = sampler.next()
        times["draw"].append(time.perf_counter() - start)
        if device.type == "cuda":
            start = time.perf_counter()
            x, y = x.pin_memory(), y.pin_memory()
            times["pin"].append(time.perf_counter() - start)
            start = time.perf_counter()
            x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            _sync(device)
            times["copy"].append(time.perf_counter() - start)
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items() if v}
    return {"batch": [batch, seq_len], "median_ms": ms,
            "summary": ", ".join(f"{k} {v:.2f} ms" for k, v in ms.items()) + " per batch"}


def resume(device, smoke: bool) -> dict[str, Any]:
    """A full run checkpointed on the device and resumed (map_location the device), and the RNG restored."""
    import torch

    from nas.data import load_data
    from runners.checkpoint import read_checkpoint, rng_state, set_rng_state, write_checkpoint
    from runners.full import RunOptions, run_full
    from runners.presets import get_preset

    tiny = get_preset("tiny")
    cfg = tiny.train.with_(tokens=4 * 128, device=str(device), threads=1)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "run"
        first = run_full(tiny.baseline, cfg, load_data("builtin"), RunOptions(out=out, checkpoint_every=2,
                                                                             progress=False))
        (out / "result.json").unlink()  # the same command again: it resumes from the last checkpoint
        again = run_full(tiny.baseline, cfg, load_data("builtin"), RunOptions(out=out, checkpoint_every=2,
                                                                             progress=False))
        if again["resumed_from_step"] != first["steps"] or again["val_loss"] != first["val_loss"]:
            raise AssertionError(f"resumed from step {again['resumed_from_step']} of {first['steps']}, val loss "
                                 f"{again['val_loss']} vs {first['val_loss']}")
        torch.rand(1, device=device)  # the device's generator in use
        path = Path(folder) / "rng.pt"
        write_checkpoint(path, {"run": {}, "rng": rng_state()})
        expected = torch.rand(4, device=device)
        set_rng_state(read_checkpoint(path, {}, map_location=device)["rng"])
        if not torch.equal(torch.rand(4, device=device), expected):
            raise AssertionError("the restored generator draws other numbers")
    return {"resumed_from_step": again["resumed_from_step"], "summary": f"resumed at step {again['resumed_from_step']}"
                                                                        " with the same val loss; RNG restored"}


def threads(device) -> dict[str, Any]:
    import torch

    from nas.study.placement import GPU_WORKER_THREADS
    from runners.device import configure_threads

    before = torch.get_num_threads()
    try:
        configure_threads(GPU_WORKER_THREADS if device.type == "cuda" else 1, compiling=True)
        import torch._inductor.config as inductor

        got = (torch.get_num_threads(), inductor.compile_threads)
    finally:
        torch.set_num_threads(before)
    want = GPU_WORKER_THREADS if device.type == "cuda" else 1
    if got[0] != want or got[1] > want:
        raise AssertionError(f"threads {got[0]}, compile workers {got[1]}; want {want} and at most {want}")
    return {"threads": got[0], "compile_threads": got[1], "summary": f"{got[0]} threads, {got[1]} compile workers"}


def random_tokens(n_train: int, n_val: int, vocab: int):
    """Token data drawn at random (nothing is downloaded): enough of both splits for any batch the check uses."""
    import numpy as np

    from nas.data import TokenData

    rng = np.random.default_rng(0)
    return TokenData(train=rng.integers(0, vocab, n_train, dtype=np.uint16), val=rng.integers(0, vocab, n_val,
                     dtype=np.uint16), vocab_size=vocab, name="random", fingerprint=f"random-{n_train}-{n_val}")


def oom_halving(device, smoke: bool) -> dict[str, Any]:
    """A batch too big for the device is trained and evaluated as accumulated micro-batches, not a failed trial."""
    import torch

    import runners.proxy
    from runners.presets import get_preset

    preset = get_preset("tiny" if smoke else "gpt2-124m")
    batch, seq_len = (8, 32) if smoke else (1024, 1024)
    tokens = batch * seq_len
    cfg = preset.train.with_(tokens=tokens, batch_size=batch, seq_len=seq_len, eval_every=tokens, eval_tokens=tokens,
                             prune_eval_tokens=0, device=str(device), compile=False)
    data = random_tokens(4 * tokens, tokens + 1, preset.baseline.vocab_size)
    training, forwards = runners.proxy._train, []

    def too_big_on_the_cpu(model, cfg, *rest):  # --smoke: what the allocator says, for more than 2 sequences
        forward = model.forward

        def limited(x, *args, **kwargs):
            forwards.append((model.training, x.shape[0]))
            if x.shape[0] > 2:  # in training and in evaluation alike
                raise torch.OutOfMemoryError("CUDA out of memory (injected by --smoke)")
            return forward(x, *args, **kwargs)

        model.forward = limited
        return training(model, cfg, *rest)

    if smoke:
        runners.proxy._train = too_big_on_the_cpu
    try:
        result = runners.proxy.run(preset.baseline, cfg, data)
    finally:
        runners.proxy._train = training
    if result.status != "ok" or result.micro_batch >= batch:
        raise AssertionError(f"status {result.status} at micro-batch {result.micro_batch}: {result.reason}")
    evaluated = [rows for train, rows in forwards if not train]
    return {"batch": batch, "micro_batch": result.micro_batch, "reason": result.reason,
            "peak_memory_mb": result.peak_memory_mb, "largest_eval_forward": max(evaluated, default=None),
            "summary": f"batch {batch} trained and evaluated as micro-batches of {result.micro_batch}"}


def search(device, smoke: bool) -> dict[str, Any]:
    """A real ``nas search`` on the GPU proxy preset: 4 short trials, ``--workers 2`` placed on the devices present
    (``nas.study.placement``); what each trial trained on, read back from the study."""
    import optuna

    from nas.study.records import counts

    with tempfile.TemporaryDirectory() as folder:
        storage = f"sqlite:///{Path(folder) / 'gpu_check_search.db'}"
        preset, tokens = ("tiny", "2k") if smoke else ("gpu-prism", "2M")
        args = [sys.executable, "-m", "nas.cli", "search", "--space", "prism", "--preset", preset, "--tokens", tokens,
                "--trials", "4", "--workers", "2", "--device", "cuda" if device.type == "cuda" else "cpu",
                "--storage", storage, "--study-name", "gpu-check"]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=1200)
        if proc.returncode != 0:
            raise AssertionError(f"nas search exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
        trials = optuna.load_study(study_name="gpu-check", storage=storage).get_trials()
    # the trainings: a duplicate answered from the store or a surplus trial of two workers racing for the last
    # slot is COMPLETE too, but trained nothing (seen on the slower 2-core machine: 5 COMPLETE for 4 trainings)
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and counts(t)]
    placed = sorted({t.user_attrs.get("placed_on", "?") for t in done})
    if len(done) != 4:
        raise AssertionError(f"{len(done)} trainings of 4: {proc.stderr.strip()[-400:]}")
    return {"trials": len(done), "placed_on": placed, "trial_s": [round(t.user_attrs.get("wall_time_s", 0.0), 1)
                                                                  for t in done],
            "first_line": proc.stderr.splitlines()[0][:300] if proc.stderr else "",
            "summary": f"{len(done)} trials on {placed}"}


def nccl(device) -> dict[str, Any]:
    """A 2-process NCCL all-reduce through torchrun's launcher."""
    import torch

    if device.type != "cuda" or torch.cuda.device_count() < 2:
        raise Skipped(f"{torch.cuda.device_count() if device.type == 'cuda' else 0} GPU(s); NCCL needs 2")
    code = ("import os, torch, torch.distributed as d; r = int(os.environ['LOCAL_RANK']); torch.cuda.set_device(r); "
            "d.init_process_group('nccl'); t = torch.ones(1, device='cuda') * (r + 1); d.all_reduce(t); "
            "assert t.item() == 3, t; d.destroy_process_group()")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "--no-python", sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(proc.stderr.strip()[-300:])
    return {"summary": "2-process all-reduce"}


def mig(device) -> dict[str, Any]:
    """Each MIG instance of an inherited ``CUDA_VISIBLE_DEVICES`` list seen by its own process, as workers are."""
    from nas.study.placement import mig_devices, plan_placements

    listed = mig_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if device.type != "cuda" or len(listed) < 2:
        raise Skipped("CUDA_VISIBLE_DEVICES lists fewer than 2 MIG instances")
    places = plan_placements(len(listed), "cuda", len(listed), os.cpu_count() or 1,
                             visible=os.environ["CUDA_VISIBLE_DEVICES"])
    code = "import torch; p = torch.cuda.get_device_properties(0); print(torch.cuda.device_count(), p.uuid)"
    seen = []
    for place in places:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              env={**os.environ, **place.env})
        seen.append(proc.stdout.strip())
    if len(set(seen)) != len(places):
        raise AssertionError(f"workers saw {seen}")
    return {"instances": len(places), "seen": seen, "summary": f"{len(places)} workers, one instance each"}


def report_path(args, info: dict[str, Any]) -> Path:
    if args.out:
        return Path(args.out) / "gpu_check.json"
    if args.smoke:
        return Path("gpu_check.json")
    slug = re.sub(r"[^a-z0-9]+", "-", str(info.get("gpu", "gpu")).lower()).strip("-")
    return DATA / f"gpu_check-{slug}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few steps, on the CPU: checks the script")
    parser.add_argument("--device", default=None, help="default: cuda, or cpu with --smoke")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8, help="sequences per timed step (T = 1024)")
    parser.add_argument("--no-compile", action="store_true", help="time the models eager")
    parser.add_argument("--out", default=None, help="folder of gpu_check.json (default: benchmarks/data/"
                        "gpu_check-<gpu>.json; with --smoke the current folder)")
    parser.add_argument("--only", default=None, help="comma-separated steps to run, the others recorded as skipped "
                        f"(a rerun of what failed or did not finish; steps: {', '.join(STEPS)})")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else set(STEPS)
    if only - set(STEPS):
        parser.error(f"--only {args.only}: unknown step {', '.join(sorted(only - set(STEPS)))}; "
                     f"steps are {', '.join(STEPS)}")

    import torch

    from nas.errors import UsageError
    from runners.device import resolve_device

    name = args.device or ("cpu" if args.smoke else "cuda")
    try:
        device = resolve_device(name)
    except UsageError as error:
        print(f"error: {error}; run with --smoke to check the script on the CPU", file=sys.stderr)
        return 2
    if device.type != "cuda" and not args.smoke:
        print(f"error: --device {name} is not a GPU; run with --smoke to check the script on the CPU",
              file=sys.stderr)
        return 2
    info = machine(device)
    check = Check(report_path(args, info), {"smoke": args.smoke, "device": str(device), "machine": info,
                                            "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
                  only=only)
    check.report["steps"]["machine"] = {"status": "pass", **info}
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    peak = check.step("matmul_peak", lambda: matmul_peak(device, dtype)).get("peak_flops")
    check.step("attention_kernels", lambda: attention_kernels(device, args.smoke))
    check.step("compile_graph", lambda: compile_graph(device, args.smoke))
    check.step("recompiles", lambda: recompiles(device, args.smoke))
    check.step("timing", lambda: timing(device, args, peak))
    check.step("grouped_query", lambda: grouped_query(device, args))
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the timed models leave the device to the steps after
    check.step("host", lambda: host(device, args.smoke))
    check.step("resume", lambda: resume(device, args.smoke))
    check.step("threads", lambda: threads(device))
    check.step("oom_halving", lambda: oom_halving(device, args.smoke))
    check.step("search", lambda: search(device, args.smoke))
    check.step("nccl", lambda: nccl(device))
    check.step("mig", lambda: mig(device))
    summary = check.report["summary"]
    print(f"{summary['pass']} passed, {summary['fail']} failed, {summary['skipped']} skipped: {check.path}")
    return 1 if summary["fail"] else 0


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path.home() / ".cache" / "prism-nas" / "inductor"))
    sys.exit(main())
