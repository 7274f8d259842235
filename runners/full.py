"""A full-scale run of one shape: DDP over ``torchrun`` processes, accumulation, checkpoints, exact resume.

``run_full(arch, cfg, data, options)`` trains ``arch`` for ``cfg.tokens`` tokens with the global
batch ``cfg.batch_size`` (sequences per optimiser step) whatever the number of processes:

- **Processes**: one, or every process ``torchrun --nproc-per-node N`` started (DDP; NCCL on
  CUDA, gloo on CPU; ``runners.distributed``). Each reads its own windows of each global batch
  (``runners.stream``: the proxy's seeded windows, spread over the split) in micro-batches of
  ``options.micro_batch`` sequences, accumulating
  gradients (``no_sync`` until the last micro-batch), so 1 and N processes train on the same
  batches and reach the same losses up to float summation order.
- **Precision and speed**: bf16 autocast on CUDA (``cfg.dtype``), fused AdamW where torch has
  it, ``cfg.compile`` compiles the model with its plain-PyTorch ops (``runners.proxy.compile_model``:
  the CPU kernels' ctypes calls would break the graph). Each process sets its threads (``--threads``,
  else its share of the cores; GPU runs too) and caps Inductor's compile workers at them. On CUDA
  the batches are pinned and the step losses read back every ``LOSS_READ_EVERY_CUDA`` steps in one
  transfer (``runners.device.StepLosses``; the same points on every rank, so all stop together on
  divergence), not once a step.
- **Checkpoints** (``runners.checkpoint``) every ``options.checkpoint_every`` steps and at the end:
  model, optimiser, step, stream position, RNG states, curves. Restarted with the same command,
  a run resumes from its checkpoint and reproduces, bitwise on CPU in fp32, the losses an
  uninterrupted run would have logged; a finished run (``result.json``) is not trained again.
- **Output** (rank 0): on CUDA first a line with the SDPA kernel each head dim gets
  (``runners.device.attention_kernels``); a progress line (step, loss, tokens/s, MFU against the
  measured matmul peak, ETA) on stderr at most every ``options.progress_every_s``; every step and
  evaluation as a JSON line in ``log.jsonl``; ``result.json`` at the end.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nas.arch import ArchConfig
from nas.data import TokenData, check_enough_tokens, check_vocabulary, validation_batches
from nas.errors import UsageError
from nas.model.transformer import Transformer
from nas.units import format_duration
from runners import cores
from runners.allocator import keep_freed_memory
from runners.checkpoint import (
    CHECKPOINT_NAME,
    read_checkpoint,
    rng_state,
    run_differences,
    set_rng_state,
    write_checkpoint,
)
from runners.config import TrainConfig
from runners.device import StepLosses, attention_kernels, autocast, configure_threads
from runners.distributed import Processes, all_sum, barrier, setup, teardown
from runners.memory import check_fits
from runners.peak import measure_matmul_peak
from runners.proxy import build_optimizer, compile_model, lr_multiplier, update_average
from runners.stream import ORDER as STREAM_ORDER
from runners.stream import TokenStream, check_batch_split
from runners.throughput import TrainClock

MAX_CURVE_POINTS = 256


@dataclass(frozen=True)
class RunOptions:
    """How a full run is kept: where, how often it checkpoints, how it splits its batch."""

    out: Path | None = None  # the run's folder (checkpoint, log.jsonl, result.json); None: keep nothing
    checkpoint_every: int = 0  # steps between checkpoints; 0: about every 10 % of the run
    micro_batch: int = 0  # sequences per forward on each process; 0: the process's whole share of the batch
    progress_every_s: float = 5.0  # seconds between progress lines
    progress: bool = True


def run_identity(arch: ArchConfig, cfg: TrainConfig, data: TokenData) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: the shape, the training config, the data."""
    train = cfg.result_fields()  # how a run executes (threads, device...) is not what it computes
    return json.loads(json.dumps({"arch": arch.key(), "train": train, "data": data.fingerprint,
                                  "stream": STREAM_ORDER}, sort_keys=True))


def check_run_log(path: Path) -> None:
    """``UsageError`` when ``path`` holds something other than a run's log: a run rewrites its ``log.jsonl``, and a
    user's own file of that name in ``--out`` was replaced without a word. A log cut inside its first line (a kill)
    is still a run's."""
    if not path.is_file():
        return
    with open(path, "rb") as f:
        first = f.readline(1 << 16)
    if not first.endswith(b"\n"):
        return
    try:
        entry = json.loads(first)
    except ValueError:
        entry = None
    if not (isinstance(entry, dict) and "step" in entry):
        raise UsageError(f"{str(path)!r} is not a run's log (its first line is no step of one); move it away or "
                         "choose another --out")


class RunLog:
    """``log.jsonl`` of rank 0: one JSON line per step and per evaluation; on resume, cut back to the checkpoint."""

    def __init__(self, path: Path | None, keep_until_step: int) -> None:
        self.path = path
        if path is None:
            return
        kept = []
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a kill
                    continue
                if entry.get("step", 0) <= keep_until_step:
                    kept.append(line)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(path)
        self._file = open(path, "a", encoding="utf-8")

    def write(self, entry: dict[str, Any]) -> None:
        if self.path is not None:
            self._file.write(json.dumps(entry) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self.path is not None:
            self._file.close()


def _evaluate(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], processes: Processes,
              micro: int, cfg: TrainConfig) -> float:
    """Mean next-token loss over the validation windows, each process scoring its share of every batch."""
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=processes.device)  # (loss sum, tokens)
    with torch.no_grad():
        for x, y in batches:
            share = x.shape[0] // processes.world
            rows = slice(processes.rank * share, (processes.rank + 1) * share)
            for i in range(rows.start, rows.stop, micro):
                xb, yb = x[i:min(i + micro, rows.stop)].to(processes.device), y[i:min(i + micro, rows.stop)]
                with autocast(processes.device, cfg.dtype):
                    loss = model(xb, yb.to(processes.device))
                total += torch.tensor([float(loss) * yb.numel(), yb.numel()], dtype=torch.float64,
                                      device=processes.device)
    model.train()
    total = all_sum(total, processes)
    return float(total[0] / total[1])


def _sparse(curve: list[list[float]]) -> list[list[float]]:
    stride = max(1, math.ceil(len(curve) / MAX_CURVE_POINTS))
    return [p for i, p in enumerate(curve) if i % stride == 0 or i == len(curve) - 1]


def run_full(arch: ArchConfig, cfg: TrainConfig, data: TokenData, options: RunOptions) -> dict[str, Any]:
    """Train ``arch`` (see the module docstring); returns the result (also ``out/result.json`` on rank 0)."""
    keep_freed_memory()  # the allocator a training process runs best with (runners.allocator)
    processes = setup(cfg.device)
    try:
        result = _run(arch, cfg, data, options, processes)
        gc.collect()  # the DDP wrapper (and its reducer's pending work) goes before the process group does
        barrier(processes)  # every rank is done with the group before any destroys it
        return result
    finally:
        teardown(processes)


def read_result(folder: Path) -> dict[str, Any] | None:
    """A run folder's ``result.json``, None when it has none yet; ``UsageError`` when it is damaged (it is written
    atomically, so damage came from outside: the user decides whether to delete it and train again)."""
    path = folder / "result.json"
    if not path.exists():
        return None
    try:
        result = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UsageError(f"{str(path)!r} is damaged ({error}): delete it and run the same command to train (or "
                         "resume) the run again") from None
    if not isinstance(result, dict):
        raise UsageError(f"{str(path)!r} holds no run result: delete it and run the same command again")
    return result


def _run(arch: ArchConfig, cfg: TrainConfig, data: TokenData, options: RunOptions,
         processes: Processes) -> dict[str, Any]:
    check_vocabulary(arch.vocab_size, data)
    check_enough_tokens(data, cfg.batch_size, cfg.seq_len)  # one line naming the data, before any file is made
    val = validation_batches(data.val, cfg.batch_size, cfg.seq_len, cfg.eval_tokens)
    if cfg.score_evals > 1:
        raise UsageError(f"score_evals={cfg.score_evals}: a full-scale run is scored by its final evaluation; use 1")
    identity = run_identity(arch, cfg, data)
    out = options.out
    if out is not None:
        result = read_result(out)
        if result is not None:
            if result.get("run") == identity:
                return {**result, "resumed": "finished"}
            raise UsageError(f"{str(out)!r} holds the result of another run (it differs in "
                             f"{', '.join(run_differences(result.get('run'), identity))}); choose another --out")
        check_run_log(out / "log.jsonl")
    device = processes.device
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # torchrun's processes share the cores: a share each
    # before anything is built or made: a shape this machine cannot hold is one line, not the allocator's traceback
    # the split first: a micro-batch that cannot divide the batch was blamed on memory (33 TB for 99,999,999 rows)
    micro = check_batch_split(cfg.batch_size, processes.world, options.micro_batch or None)
    check_fits(arch, cfg, device, micro, local)
    configure_threads(cfg.threads or max(1, cores.available_cores() // local), compiling=cfg.compile)
    started = time.perf_counter()
    torch.manual_seed(cfg.seed)
    model = Transformer(arch).to(device)
    optimizer = build_optimizer(model, cfg, device)
    params = [p for p in model.parameters() if p.requires_grad]
    ema = [p.detach().clone() for p in params] if cfg.ema_decay > 0 else None  # as runners.proxy scores
    stream = TokenStream(data.train, cfg.batch_size, cfg.seq_len, processes.rank, processes.world,
                         options.micro_batch or None, cfg.seed)
    steps = cfg.steps
    checkpoint_every = options.checkpoint_every or max(1, steps // 10)
    curves: dict[str, list[list[float]]] = {"train": [], "eval": []}
    first_step = 0
    checkpoint = out / CHECKPOINT_NAME if out is not None else None
    if checkpoint is not None and checkpoint.exists():
        saved = read_checkpoint(checkpoint, identity, map_location=device)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        first_step, stream.position, curves = int(saved["step"]), int(saved["position"]), saved["curves"]
        set_rng_state(saved["rng"])
        if ema is not None:
            for average, value in zip(ema, saved["ema"], strict=True):
                average.copy_(value)
    wrapped: torch.nn.Module = model
    if processes.world > 1:
        wrapped = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    forward = compile_model(model, wrapped, seq_len=cfg.seq_len, dtype=cfg.dtype) if cfg.compile else wrapped
    if out is not None:  # made once training can start: a run refused or failed before it leaves no folder
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UsageError(f"--out {str(out)!r} cannot be a run's folder: {error.strerror or error}") from None
    log = RunLog(out / "log.jsonl" if out is not None and processes.main else None, first_step)
    peak = measure_matmul_peak(device, torch.bfloat16 if cfg.dtype == "bf16" and device.type == "cuda"
                               else torch.float32)
    flops = arch.flops_per_token(cfg.seq_len)
    kernels = attention_kernels(arch.head_dims(), torch.cuda.get_device_capability(device), torch.bfloat16 if
                                cfg.dtype == "bf16" else torch.float32) if device.type == "cuda" else None
    if kernels is not None and processes.main and options.progress:
        print(f"attention (SDPA on {torch.cuda.get_device_name(device)}): {kernels}", file=sys.stderr, flush=True)
    eval_interval = max(1, cfg.eval_every // cfg.tokens_per_step)
    status, reason, last_print = "ok", None, 0.0
    first_loss = curves["train"][0][1] if curves["train"] else None
    val_loss = curves["eval"][-1][1] if curves["eval"] else math.nan
    losses = StepLosses(device)
    unread: list[tuple[int, float, float]] = []  # (step, lr, train time after it) of steps whose loss is unread
    pinned = device.type == "cuda"  # a copy from pageable memory waits for the device's queue
    clock = TrainClock.for_run(steps, first_step)
    for step in range(first_step, steps):
        if clock.steady_from(step) and device.type == "cuda":
            torch.cuda.synchronize(device)  # the warm-up steps' kernels finish before the steady steps' clock starts
        tick = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * lr_multiplier(step, steps, cfg.warmup_frac, cfg.min_lr_ratio)
        micro_batches = stream.step()
        loss_sum = torch.zeros((), device=device)
        for i, (x, y) in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            sync = contextlib.nullcontext() if processes.world == 1 or last else wrapped.no_sync()
            if pinned:
                x, y = x.pin_memory(), y.pin_memory()
            with sync:
                with autocast(device, cfg.dtype):
                    loss = forward(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
                (loss / len(micro_batches)).backward()
            loss_sum += loss.detach() / len(micro_batches)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if ema is not None:  # every rank holds the same weights after the step, hence the same average
            update_average(ema, params, cfg.ema_decay)
        losses.add(all_sum(loss_sum, processes) / processes.world)  # the global batch's mean loss, on the device
        evaluating = (step + 1) % eval_interval == 0 or step == steps - 1
        saving = checkpoint is not None and ((step + 1) % checkpoint_every == 0 or step == steps - 1)
        # read points depend on the step alone, so every rank reads, and stops on divergence, at the same step
        reading = losses.due or evaluating or saving or step == first_step
        values = losses.read() if reading else []
        clock.add(step, time.perf_counter() - tick)
        unread.append((step, optimizer.param_groups[0]["lr"], clock.total_s))
        if not reading:
            continue
        for (at, lr, elapsed), train_loss in zip(unread, values, strict=True):
            tokens = (at + 1) * cfg.tokens_per_step
            curves["train"].append([tokens, train_loss])
            first_loss = train_loss if first_loss is None else first_loss
            speed = (at + 1 - first_step) * cfg.tokens_per_step / elapsed
            log.write({"step": at + 1, "tokens": tokens, "loss": train_loss, "lr": lr, "tokens_per_s": speed,
                       "mfu": flops * speed / (processes.world * peak)})
            if not math.isfinite(train_loss) or train_loss > cfg.diverge_factor * first_loss:
                status, reason = "diverged", f"train loss {train_loss:.4g} at step {at + 1}"
                break
        unread.clear()
        if status == "diverged":
            break
        tokens, done = (step + 1) * cfg.tokens_per_step, step + 1 - first_step
        speed = done * cfg.tokens_per_step / clock.total_s
        mfu = flops * speed / (processes.world * peak)
        if evaluating:
            if step == steps - 1 and ema is not None:  # the score is the averaged weights'
                with torch.no_grad():
                    for average, p in zip(ema, params):
                        p.copy_(average)
            val_loss = _evaluate(model, val, processes, options.micro_batch or cfg.batch_size // processes.world,
                                 cfg)
            curves["eval"].append([tokens, val_loss])
            log.write({"step": step + 1, "tokens": tokens, "val_loss": val_loss})
        if processes.main and options.progress and (time.perf_counter() - last_print >= options.progress_every_s
                                                    or step in (first_step, steps - 1)):
            last_print = time.perf_counter()
            eta = (steps - step - 1) * clock.total_s / done
            print(f"step {step + 1}/{steps} | loss {train_loss:.4f} | {speed:,.0f} tok/s | MFU {100 * mfu:.1f}% "
                  f"| ETA {format_duration(eta)}", file=sys.stderr, flush=True)
        if saving:
            if processes.main:
                write_checkpoint(checkpoint, {"run": identity, "model": model.state_dict(),
                                              "optimizer": optimizer.state_dict(), "step": step + 1,
                                              "position": stream.position, "curves": curves, "rng": rng_state(),
                                              **({"ema": ema} if ema is not None else {})})
            barrier(processes)
    log.close()
    tokens_seen = len(curves["train"]) * cfg.tokens_per_step
    speed = clock.tokens_per_s(len(curves["train"]), cfg.tokens_per_step)  # past the process's one-off costs
    result = {
        "run": identity, "status": status, "reason": reason, "val_loss": val_loss if status == "ok" else None,
        "eval_curve": curves["eval"], "train_curve": _sparse(curves["train"]), "tokens_seen": tokens_seen,
        "steps": len(curves["train"]), "tokens_per_s": speed, "mfu": flops * speed / (processes.world * peak),
        "peak_flops": peak, "world_size": processes.world, "params": arch.n_params(), "flops_per_token": flops,
        "arch": arch.to_dict(), "train": cfg.to_dict(), "seed": cfg.seed, "device": str(device),
        "wall_time_s": time.perf_counter() - started, "resumed_from_step": first_step,
        "attention_kernels": kernels, "loss_read_wait_s": losses.wait_s,
    }
    if out is not None and processes.main:
        tmp = out / "result.json.tmp"
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out / "result.json")
    return result
