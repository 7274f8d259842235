"""The proxy runner: train one ``ArchConfig`` on a fixed token budget and score it.

Every trial of a study sees the same number of training tokens drawn in the same order
(seeded), and is scored on the same validation windows, spread evenly over the whole
validation split (``nas.data.validation_batches``), so trials differ only by shape (and by
seed for replicates). AdamW with linear warmup and cosine decay, global
gradient clipping, early stop on divergence. Out of memory restarts the run with half the
micro-batch (gradients accumulated over the same batch: the same training up to float summation
order; every evaluation forward then holds at most a micro-batch too), down to one sequence; only
then is it reported as ``oom``, never raised. ``cfg.compile`` compiles the model's plain-PyTorch ops
from empty Dynamo caches (``compile_model``); on CUDA the batches are pinned and the step losses
are read back every ``runners.device.LOSS_READ_EVERY_CUDA`` steps (``StepLosses``), not every step.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable

import torch

from nas.arch import ArchConfig
from nas.data.loading import BatchSampler, TokenData, check_enough_tokens, check_vocabulary, validation_batches
from nas.model.transformer import Transformer
from runners.attention_distance import AttentionDistance
from runners.config import TrainConfig
from runners.device import (
    StepLosses,
    autocast,
    configure_threads,
    is_out_of_memory,
    peak_memory_mb,
    reset_peak_memory,
    resolve_device,
)
from runners.optimizer import AdamW
from runners.result import TrialResult
from runners.throughput import TrainClock

# (tokens seen, validation loss) -> True to stop the run now (the search's pruner said so)
ReportFn = Callable[[int, float], bool]

MAX_CURVE_POINTS = 64  # train-loss points kept in the result (the curve is for plots, not for resuming)


def lr_multiplier(step: int, total_steps: int, warmup_frac: float, min_ratio: float) -> float:
    """Linear warmup over ``warmup_frac * total`` steps, then cosine from 1 to ``min_ratio`` at the last step."""
    warmup = int(warmup_frac * total_steps)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup - 1)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only; the fused kernel where torch has one for the device. torch's AdamW,
    run without importing ``torch._dynamo`` (``runners.optimizer``: 1.7 CPU-s a process that trains)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = device.type in ("cpu", "cuda")
    return AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)


# validation batches are merged into evaluation forwards of up to this many tokens (on 2 CPU cores 1-2k tokens per
# forward is ~15 % faster than 512; more spills the (T, T) attention scores out of cache) and this many logits
EVAL_TOKENS_PER_FORWARD = 2_048
EVAL_LOGITS = 2**24  # 64 MB in fp32


def compile_model(model: Transformer, module: torch.nn.Module | None = None,
                  backend: str | Callable = "inductor", seq_len: int = 0, dtype: str = "fp32") -> Callable:
    """``torch.compile`` of ``model`` as a trial (and a full run) compiles it: its plain-PyTorch ops, from empty
    Dynamo caches.

    - ``use_reference_ops``: the CPU kernels' ctypes calls and, on CUDA, the custom RoPE function's ``out=``
      writes into non-contiguous views break Dynamo's graph in every layer; the plain ops trace whole (zero
      graph breaks: ``tests/test_gpu_path.py``);
    - ``torch._dynamo.reset()``: a worker compiles a new schedule every trial, and Dynamo guards on each layer's
      head count, so each schedule is a recompile of the same ``Transformer.forward``; past
      ``recompile_limit`` (8) the later trials would run eager without a word. Each trial starts from empty
      caches instead (Inductor's on-disk cache still serves a schedule compiled before);
    - the RoPE tables built for ``seq_len`` positions at the run's ``dtype`` before the first call: grown inside it,
      they failed the guard Dynamo put on their size, and every compiled run compiled its forward twice.

    ``module`` is what is compiled when it is not ``model`` itself (a full run's DDP wrapper of it).
    """
    import torch._dynamo

    torch._dynamo.reset()
    model.use_reference_ops()
    if seq_len:
        model.fill_rotary_tables(seq_len, torch.bfloat16 if dtype == "bf16" else torch.float32)
    return torch.compile(model if module is None else module, backend=backend)


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device,
             dtype: str, max_rows: int = 0) -> float:
    """Mean next-token loss over fixed validation batches (all batches have the same size).

    Consecutive batches are concatenated into forwards of at most ``EVAL_TOKENS_PER_FORWARD``
    tokens and ``EVAL_LOGITS`` logits (one batch per forward for the GPU presets), and of at most
    ``max_rows`` sequences when given (the micro-batch, once out of memory halved it). The batches
    are equal-sized, so the mean of chunk means weighted by chunk size is the same mean.
    """
    model.eval()
    per_forward = _batches_per_forward(model, batches[0][0], max_rows)
    total = 0.0
    with autocast(device, dtype):
        for i in range(0, len(batches), per_forward):
            chunk = batches[i:i + per_forward]
            x = torch.cat([b[0] for b in chunk]) if len(chunk) > 1 else chunk[0][0]
            y = torch.cat([b[1] for b in chunk]) if len(chunk) > 1 else chunk[0][1]
            total += float(model(x.to(device), y.to(device))) * len(chunk)
    model.train()
    return total / len(batches)


def in_rows(batches: list[tuple[torch.Tensor, torch.Tensor]], micro: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The validation batches cut into equal pieces of ``micro`` sequences (``micro`` divides the batch; 0 or the
    batch size: unchanged). Equal pieces keep the mean over all of them the same mean."""
    rows = batches[0][0].shape[0]
    if not micro or micro >= rows:
        return batches
    return [(x[i:i + micro], y[i:i + micro]) for x, y in batches for i in range(0, rows, micro)]


def _batches_per_forward(model: torch.nn.Module, x0: torch.Tensor, max_rows: int = 0) -> int:
    """How many (equal-sized) validation batches one evaluation forward takes (see ``EVAL_TOKENS_PER_FORWARD``),
    holding at most ``max_rows`` sequences when given."""
    vocab = getattr(getattr(model, "arch", None), "vocab_size", None)
    if not vocab:
        return 1
    merged = max(1, min(EVAL_TOKENS_PER_FORWARD // x0.numel(), EVAL_LOGITS // (x0.numel() * vocab)))
    return min(merged, max(1, max_rows // x0.shape[0])) if max_rows else merged


@torch.no_grad()
def final_evaluation(model: Transformer, batches: list[tuple[torch.Tensor, torch.Tensor]], attention_batches: int,
                     device: torch.device, dtype: str, max_rows: int = 0) -> tuple[float, list[float]]:
    """The score and the per-layer attention distance ``D_l`` in one pass over the validation batches.

    The first ``attention_batches`` batches go through forwards as ``evaluate`` would cut them
    (merged up to ``EVAL_TOKENS_PER_FORWARD`` tokens, at most ``max_rows`` sequences), each with an
    ``AttentionDistance`` observer counting only the analysed batches' rows; the rest go through
    ``evaluate``. The loss is the mean over all batches, equal to ``evaluate``'s up to float
    rounding; ``D_l`` is over the analysed batches, each forward's weighted by its rows (empty when
    ``attention_batches`` is 0). Observed forwards instead of an explicit-attention pass plus an
    ordinary one (timings: benchmarks/RESULTS.md, "Design measurements"). At the CPU proxy's sizes
    the analysed batches fit in one forward; a GPU preset's 32 x 1024 batches take one forward each
    (joined, two of them were 64 sequences whatever the micro-batch: out of memory on 40-48 GB cards).
    """
    n = min(attention_batches, len(batches))
    if n == 0:
        return evaluate(model, batches, device, dtype, max_rows), []
    per_forward = _batches_per_forward(model, batches[0][0], max_rows)
    rows = batches[0][0].shape[0]
    total, observed, start = 0.0, [], 0
    model.eval()
    while start < n:
        chunk = batches[start:start + per_forward]
        x, y = (torch.cat([b[i] for b in chunk]).to(device) for i in (0, 1))
        observer = AttentionDistance(model.arch.heads, rows=min(n - start, len(chunk)) * rows, seq_len=x.shape[1])
        with autocast(device, dtype):
            total += float(model(x, y, observe=observer)) * len(chunk)
        observed.append((observer.rows, observer.distances()))
        start += len(chunk)
    model.train()
    if start < len(batches):
        total += evaluate(model, batches[start:], device, dtype, max_rows) * (len(batches) - start)
    if len(observed) == 1:
        return total / len(batches), observed[0][1]
    counted = sum(r for r, _ in observed)
    return total / len(batches), [sum(r * d[layer] for r, d in observed) / counted
                                  for layer in range(len(model.arch.heads))]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(arch: ArchConfig, cfg: TrainConfig, data: TokenData, report: ReportFn | None = None) -> TrialResult:
    """Train ``arch`` for ``cfg.tokens`` tokens of ``data`` and return its scores.

    Validation loss is measured every ``cfg.eval_every`` tokens and at the end; each value
    goes to ``report``, which may stop the run (status ``pruned``). NaN/inf or a train loss
    above ``diverge_factor`` times its first value stops it as ``diverged``; running out of
    memory gives ``oom``. Other exceptions propagate: they are bugs, not results.
    """
    started = time.perf_counter()
    check_vocabulary(arch.vocab_size, data)
    check_enough_tokens(data, cfg.batch_size, cfg.seq_len)
    device = resolve_device(cfg.device)
    configure_threads(cfg.threads, compiling=cfg.compile)  # on a GPU too: see configure_threads
    reset_peak_memory(device)
    result = TrialResult(status="ok", val_loss=math.nan, params=arch.n_params(),
                         flops_per_token=arch.flops_per_token(cfg.seq_len), seed=cfg.seed, device=str(device))
    val = validation_batches(data.val, cfg.batch_size, cfg.seq_len, cfg.eval_tokens)
    micro = cfg.micro_batch or cfg.batch_size
    try:
        while True:  # out of memory: the same run again from its start, with half the micro-batch
            try:
                building = time.perf_counter()
                torch.manual_seed(cfg.seed)
                model = Transformer(arch).to(device)
                result.build_time_s = time.perf_counter() - building
                result.micro_batch = micro
                _train(model, cfg.with_(micro_batch=micro), data, val, device, report, result)
                break
            except Exception as error:
                if not is_out_of_memory(error):
                    raise
                failure = str(error).splitlines()[0][:200]
            # out here, not in the except block: there the traceback still held the failed attempt's frames (its
            # optimizer, gradients and activations), so empty_cache() freed nothing
            model = None
            if micro == 1:
                result.status, result.reason = "oom", f"out of memory: {failure}"
                break
            micro = smaller_micro_batch(cfg.batch_size, micro)
            result = _fresh(result)
            release_memory(device)
            reset_peak_memory(device)  # the peak of the attempt that is kept, not of the one that failed
    finally:
        result.peak_memory_mb = peak_memory_mb(device)
        result.wall_time_s = time.perf_counter() - started
    if result.micro_batch < cfg.batch_size and result.status == "ok":
        result.reason = f"micro-batch halved to {result.micro_batch} of {cfg.batch_size} sequences after out of memory"
    return result


def release_memory(device: torch.device) -> None:
    """Collect what a failed attempt left (reference cycles too) and, on CUDA, hand the allocator's cached blocks
    back to the device, so the retry starts from a clean device rather than a fragmented cache."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def smaller_micro_batch(batch_size: int, micro: int) -> int:
    """The largest divisor of ``batch_size`` at most half of ``micro`` (so accumulation covers the batch exactly)."""
    return max(d for d in range(1, micro // 2 + 1) if batch_size % d == 0)


def _fresh(result: TrialResult) -> TrialResult:
    """A result as before training (its shape's accounting kept): for a retry after out of memory."""
    return TrialResult(status="ok", val_loss=math.nan, params=result.params, flops_per_token=result.flops_per_token,
                       seed=result.seed, device=result.device)


@torch.no_grad()
def update_average(average: list[torch.Tensor], params: list[torch.Tensor], decay: float) -> None:
    """``a <- decay * a + (1 - decay) * p`` for every parameter, in one fused call (the step's weight average)."""
    torch._foreach_lerp_(average, params, 1.0 - decay)


def _train(model: Transformer, cfg: TrainConfig, data: TokenData, val: list, device: torch.device,
           report: ReportFn | None, result: TrialResult) -> None:
    steps = cfg.steps
    building = time.perf_counter()
    optimizer = build_optimizer(model, cfg, device)
    result.build_time_s += time.perf_counter() - building
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_multiplier(s, steps, cfg.warmup_frac, cfg.min_lr_ratio))
    forward = compile_model(model, seq_len=cfg.seq_len, dtype=cfg.dtype) if cfg.compile else model
    sampler = BatchSampler(data.train, cfg.batch_size, cfg.seq_len, cfg.seed)
    eval_interval = max(1, cfg.eval_every // cfg.tokens_per_step)
    # intermediate evaluations read the first batches of the same spread windows (themselves spread over the
    # split): cheap, and equal for every trial
    n_prune_batches = max(1, (cfg.prune_eval_tokens or cfg.eval_tokens) // cfg.tokens_per_step)
    curve_stride = max(1, steps // MAX_CURVE_POINTS)
    # the score's extra full evaluations, evenly over the last quarter of training (score_evals > 1)
    score_steps = {steps - 1 - round(i * steps / (4 * cfg.score_evals)) for i in range(1, cfg.score_evals)}
    score_values: list[float] = []
    params = [p for p in model.parameters() if p.requires_grad]
    ema = [p.detach().clone() for p in params] if cfg.ema_decay > 0 else None
    first_loss: float | None = None
    model.train()
    chunks = cfg.batch_size // (cfg.micro_batch or cfg.batch_size)  # micro-batches per step, gradients accumulated
    # evaluation forwards hold at most a micro-batch once it is smaller than the batch (out of memory halved it)
    max_rows = cfg.micro_batch if cfg.micro_batch and cfg.micro_batch < cfg.batch_size else 0
    losses = StepLosses(device)
    pinned = device.type == "cuda"  # a copy from pageable memory waits for the device's queue; a pinned one does not
    clock = TrainClock.for_run(steps)
    for step in range(steps):
        x, y = sampler.next()
        if pinned:
            x, y = x.pin_memory(), y.pin_memory()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if clock.steady_from(step):
            _sync(device)  # CUDA: the warm-up steps' kernels finish before the steady steps' clock starts
        tick = time.perf_counter()
        if chunks == 1:
            with autocast(device, cfg.dtype):
                loss = forward(x, y)
            loss.backward()
        else:  # the batch's mean loss and gradient, one micro-batch at a time
            loss = torch.zeros((), device=device)
            for xs, ys in zip(x.chunk(chunks), y.chunk(chunks)):  # (micro, T) each
                with autocast(device, cfg.dtype):
                    part = forward(xs, ys)
                (part / chunks).backward()
                loss += part.detach() / chunks
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        if ema is not None:
            update_average(ema, params, cfg.ema_decay)
        losses.add(loss)
        evaluating = (step + 1) % eval_interval == 0 or step == steps - 1 or step in score_steps
        if not (losses.due or evaluating):  # CUDA: the loss stays on the device until the next read
            clock.add(step, time.perf_counter() - tick)
            continue
        values = losses.read()  # the CPU: this step's loss; CUDA: the steps' since the last read (one sync)
        clock.add(step, time.perf_counter() - tick)
        result.steps, result.tokens_seen = step + 1, (step + 1) * cfg.tokens_per_step
        for at, loss_value in enumerate(values, start=step + 1 - len(values)):
            first_loss = loss_value if first_loss is None else first_loss
            if at % curve_stride == 0 or at == steps - 1:
                result.train_curve.append(((at + 1) * cfg.tokens_per_step, loss_value))
            if not math.isfinite(loss_value) or loss_value > cfg.diverge_factor * first_loss:
                result.status = "diverged"
                result.reason = (f"train loss {loss_value:.4g} at step {at + 1} "
                                 f"(first {first_loss:.4g}, limit {cfg.diverge_factor:g}x)")
                break
        if result.status == "diverged":
            break
        evaluation = time.perf_counter()
        if step in score_steps:
            score_values.append(evaluate(model, in_rows(val, cfg.micro_batch), device, cfg.dtype, max_rows))
            result.eval_time_s += time.perf_counter() - evaluation
            evaluation = time.perf_counter()
        if (step + 1) % eval_interval == 0 or step == steps - 1:
            if step == steps - 1:  # the score, and the attention maps of the trained model
                if ema is not None:  # score the averaged weights
                    with torch.no_grad():
                        for average, p in zip(ema, params):
                            p.copy_(average)
                rows = in_rows(val, cfg.micro_batch)  # a batch too big to train at once is evaluated in pieces too
                analysed = cfg.attention_batches * len(rows) // len(val)
                result.val_loss, distances = final_evaluation(model, rows, analysed, device, cfg.dtype, max_rows)
                result.attention_distance = distances if math.isfinite(result.val_loss) else []
                if score_values and math.isfinite(result.val_loss):
                    result.val_loss = (sum(score_values) + result.val_loss) / (len(score_values) + 1)
            else:
                result.val_loss = evaluate(model, in_rows(val[:n_prune_batches], cfg.micro_batch), device, cfg.dtype,
                                           max_rows)
            result.eval_curve.append((result.tokens_seen, result.val_loss))
            result.eval_time_s += time.perf_counter() - evaluation
            if not math.isfinite(result.val_loss):
                result.status, result.reason = "diverged", f"validation loss {result.val_loss} at step {step + 1}"
                break
            if report is not None and report(result.tokens_seen, result.val_loss) and step < steps - 1:
                result.status, result.reason = "pruned", f"pruned after {result.tokens_seen} tokens"
                break
    _sync(device)
    result.train_time_s = clock.total_s
    result.tokens_per_s = clock.tokens_per_s(result.steps, cfg.tokens_per_step)  # past the process's one-off costs
