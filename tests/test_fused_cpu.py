"""The fused C kernels (nas/fused_cpu.c) against the PyTorch ops they replace, and their build/fallback logic."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nas.arch import ArchConfig, FFNShape
from nas.model import fused_cpu
from nas.model.kernels import RotaryQKV
from nas.model.transformer import RotaryTable, Transformer

pytestmark = pytest.mark.skipif(fused_cpu.library() is None, reason=f"fused CPU kernels: {fused_cpu.status()}")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    previous = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(previous)


@pytest.mark.parametrize("shape", [(7,), (3, 5), (4096, 33), (129, 257)])  # below and above the parallel threshold
def test_swiglu_matches_autograd(shape, threads) -> None:
    torch.manual_seed(0)
    gate, up, d_out = torch.randn(shape) * 4, torch.randn(shape), torch.randn(shape)
    gate.view(-1)[:6] = torch.tensor([-100.0, 100.0, 0.0, -88.5, 88.5, 1e-30])[: gate.numel()]
    g, u = gate.clone().requires_grad_(), up.clone().requires_grad_()
    expected = F.silu(g) * u
    expected.backward(d_out)
    out = fused_cpu.swiglu_forward(gate, up)
    d_gate, d_up = fused_cpu.swiglu_backward(d_out, gate, up)
    torch.testing.assert_close(out, expected.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(d_gate, g.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(d_up, u.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows,width", [(1, 1), (3, 7), (1000, 96), (4096, 256)])
def test_rmsnorm_matches_autograd(rows, width, threads) -> None:
    torch.manual_seed(1)
    x, weight, d_y = torch.randn(rows, width) * 3, torch.randn(width), torch.randn(rows, width)
    xr, wr = x.clone().requires_grad_(), weight.clone().requires_grad_()
    expected = F.rms_norm(xr, (width,), wr, 1e-5)
    expected.backward(d_y)
    y, rstd = fused_cpu.rmsnorm_forward(x, weight, 1e-5)
    dx, d_weight = fused_cpu.rmsnorm_backward(d_y, x, weight, rstd)
    assert rstd.shape == (rows,)
    torch.testing.assert_close(y, expected.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx, xr.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(d_weight, wr.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch,seq,heads,head_dim", [(1, 1, 1, 1), (2, 5, 3, 7), (4, 64, 12, 8), (2, 128, 8, 32)])
def test_rope_qkv_matches_the_pytorch_path(batch, seq, heads, head_dim, threads) -> None:
    torch.manual_seed(2)
    cos, sin = RotaryTable(head_dim, 10_000.0).table(seq, torch.device("cpu"), torch.float32)
    qkv = torch.randn(batch, seq, 3 * heads * head_dim)
    grads = [torch.randn(batch, heads, seq, head_dim) for _ in range(3)]
    with fused_cpu.enabled(False):
        reference = qkv.clone().requires_grad_()
        expected = RotaryQKV.apply(reference, cos, sin, heads, head_dim ** -0.5)
        torch.autograd.backward(expected, grads)
    out = fused_cpu.rope_qkv_forward(qkv, cos, sin, heads, head_dim ** -0.5)
    grad = fused_cpu.rope_qkv_backward(*grads, cos, sin, head_dim ** -0.5)
    torch.testing.assert_close(out, torch.stack(expected).detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, reference.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("heads,block,r0", [(1, 1, 0), (3, 5, 0), (3, 5, 7), (48, 64, 64), (128, 64, 192)])
def test_causal_softmax_matches_a_masked_softmax(heads, block, r0, threads) -> None:
    torch.manual_seed(4)
    scores = torch.randn(heads, block, r0 + block) * 6
    mask = torch.ones(block, r0 + block, dtype=torch.bool).tril(r0)  # query r0 + i sees keys <= r0 + i
    expected = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    out = fused_cpu.causal_softmax_(scores.clone(), r0)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-7)
    assert (out[:, ~mask] == 0).all()


def _reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T + causal mask) v in float64, as (B, T, H, Dh); k, v repeated as HF's ``repeat_kv`` does."""
    T, group = q.shape[2], q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-1, -2)).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)


@pytest.mark.parametrize("batch,heads,kv,seq,head_dim", [
    (1, 1, 1, 1, 8), (2, 3, 3, 5, 8), (1, 2, 2, 16, 12), (2, 2, 2, 17, 16), (4, 12, 12, 128, 8), (1, 6, 6, 200, 16),
    (3, 8, 8, 37, 12), (2, 4, 4, 37, 24), (1, 3, 3, 130, 32),
    # grouped-query: 12 query heads on 4 and on 1 key/value heads, 6 on 2 at head dim 16, 4 on 2 at 32
    (2, 12, 4, 40, 8), (3, 12, 1, 33, 8), (1, 6, 2, 50, 16), (2, 4, 2, 21, 32)])
def test_fused_attention_matches_float64_attention_and_its_gradients(batch, heads, kv, seq, head_dim,
                                                                     threads) -> None:
    """FusedCausalAttention at every head dim it has a kernel for, multi-head and grouped, contexts on and off its
    16-key chunks, one key (T = 1) and more heads than threads; forward alone (evaluation) gives the training
    forward's output."""
    from nas.model.attention_kernels import FusedCausalAttention
    from nas.model.kernels import apply_function

    torch.manual_seed(5)
    # scores as sharp at every head dim as unscaled ones at 8 (the model scales q by head_dim ** -0.5)
    q64 = torch.randn(batch, heads, seq, head_dim, dtype=torch.float64) * (8 / head_dim) ** 0.5
    k64, v64 = (torch.randn(batch, kv, seq, head_dim, dtype=torch.float64) for _ in range(2))
    q, k, v = (t.float().requires_grad_() for t in (q64, k64, v64))
    out = FusedCausalAttention.apply(q, k, v)  # (B, T, H, Dh)
    expected = _reference_attention(*(t.requires_grad_() for t in (q64, k64, v64)))
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=5e-6)
    d_out = torch.randn_like(expected)
    out.backward(d_out.float())
    expected.backward(d_out)
    for mine, reference in ((q, q64), (k, k64), (v, v64)):
        torch.testing.assert_close(mine.grad.double(), reference.grad, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(apply_function(FusedCausalAttention, q, k, v), out.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("seq", [1, 2, 5, 8, 9, 15, 16, 17, 40])
def test_fused_attention_keeps_each_rows_softmax_statistics_for_its_own_head(seq, threads) -> None:
    """The rows' max and inverse sum (what the backward recomputes P from), head after head, as float64 gives them:
    contexts below one 16-query block (whose lanes past T must store nothing: past a head's rows lie the next
    head's, maybe another thread's), at one block, and on and off the blocks; enough heads for the parallel path."""
    torch.manual_seed(7)
    batch, heads, head_dim = 16, 4, 32
    q = torch.randn(batch, heads, seq, head_dim) * head_dim ** -0.5
    k, v = torch.randn_like(q), torch.randn_like(q)
    stats = fused_cpu.causal_attention_forward(q, k, v, keep_stats=True)[1].double()  # (B, H, 2, T)
    scores = (q.double() @ k.double().transpose(-1, -2)).masked_fill(
        torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    row_max = scores.amax(-1)
    torch.testing.assert_close(stats[:, :, 0], row_max, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(stats[:, :, 1], 1 / (scores - row_max[..., None]).exp().sum(-1), rtol=1e-6, atol=1e-7)


def test_fused_attention_reads_strided_inputs_as_their_values() -> None:
    """q, k, v as transposed views (not contiguous): the same output as from contiguous copies."""
    from nas.model.attention_kernels import FusedCausalAttention

    torch.manual_seed(6)
    q, k, v = (torch.randn(2, 20, 3, 8).transpose(1, 2) for _ in range(3))  # (B, H, T, Dh) views
    assert not q.is_contiguous()
    expected = FusedCausalAttention.apply(q.contiguous(), k.contiguous(), v.contiguous())
    torch.testing.assert_close(FusedCausalAttention.apply(q, k, v), expected, rtol=0, atol=0)


def test_fused_attention_refuses_a_head_dim_without_a_kernel() -> None:
    """The C side computes nothing for an unsupported head dim: the wrapper refuses rather than return garbage."""
    q = torch.zeros(1, 2, 4, 48)
    with pytest.raises(ValueError, match="no fused attention"):
        fused_cpu.causal_attention_forward(q, q, q, keep_stats=False)


def test_the_fused_attention_is_the_default_only_where_its_vectors_fit_registers(monkeypatch) -> None:
    """By default the model takes it on a CPU with AVX-512 only (without, it measured 0.2-0.6x the blocked path);
    ``FUSED_ATTENTION_FORCED`` turns it on or off wherever it can run."""
    from nas.model import attention_kernels

    with_avx512 = "avx512f" in fused_cpu._cpu_flags().split()
    assert attention_kernels.fused_attention_pays() is with_avx512
    q = torch.zeros(2, 3, 64, 8)
    assert attention_kernels.use_fused_attention(q) is with_avx512
    monkeypatch.setattr(attention_kernels, "FUSED_ATTENTION_FORCED", True)
    assert attention_kernels.use_fused_attention(q)
    monkeypatch.setattr(attention_kernels, "FUSED_ATTENTION_FORCED", False)
    assert not attention_kernels.use_fused_attention(q)


def test_the_model_takes_fused_attention_where_it_has_a_kernel(fused_attention_everywhere) -> None:
    """Head dims 8 to 32 in fp32 on CPU take FusedCausalAttention, grouped or not; 48, fp64 and autocast do not."""
    from nas.model.attention_kernels import use_fused_attention

    for head_dim, taken in ((8, True), (12, True), (16, True), (24, True), (32, True), (48, False)):
        assert use_fused_attention(torch.zeros(2, 3, 64, head_dim)) is taken
    assert not use_fused_attention(torch.zeros(2, 3, 64, 8, dtype=torch.float64))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not use_fused_attention(torch.zeros(2, 3, 64, 8))
    arch = ArchConfig(n_layers=3, d_model=96, heads=(12, 2, 12), ffn=FFNShape(1, 64), vocab_size=50,
                      kv_heads=(12, 2, 3))
    model = Transformer(arch)
    loss = model(torch.randint(0, 50, (2, 20)), torch.randint(0, 50, (2, 20)))
    nodes, stack = set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in nodes:
            nodes.add(node)
            stack.extend(next_node for next_node, _ in node.next_functions)
    names = {type(node).__name__ for node in nodes}
    assert {"FusedCausalAttentionBackward", "BlockedCausalAttentionBackward"} <= names  # layers 0 and 2; layer 1
    assert "GroupedBlockedCausalAttentionBackward" not in names  # layer 2 (grouped, head dim 8) is fused too


def test_model_gives_the_same_loss_and_gradients_with_and_without_the_kernels(fused_attention_everywhere) -> None:
    """A Prism schedule with an hourglass FFN (K=2) and an odd head dim: every fused path, end to end."""
    arch = ArchConfig(n_layers=3, d_model=42, heads=(2, 6, 6), ffn=FFNShape(2, 24), vocab_size=50)
    torch.manual_seed(3)
    model = Transformer(arch)
    idx, targets = torch.randint(0, 50, (3, 40)), torch.randint(0, 50, (3, 40))
    results = {}
    for flag in (False, True):
        model.zero_grad(set_to_none=True)
        with fused_cpu.enabled(flag):
            loss = model(idx, targets)
            loss.backward()
        results[flag] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(results[True][0], results[False][0], rtol=1e-6, atol=1e-6)
    for name, grad in results[False][1].items():
        torch.testing.assert_close(results[True][1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def _status_in_subprocess(env: dict[str, str]) -> dict:
    code = ("import json, warnings, torch\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    from nas.model import fused_cpu\n"
            "    from nas.arch import uniform\n"
            "    from nas.model.transformer import Transformer\n"
            "    model = Transformer(uniform(2, 16, 4, 32))\n"
            "    model(torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))).backward()\n"
            "    print(json.dumps({'status': fused_cpu.status(), 'warnings': [str(w.message) for w in caught]}))\n")
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_disabled_by_the_environment_variable(tmp_path) -> None:
    out = _status_in_subprocess({fused_cpu.ENV_SWITCH: "0", "NAS_CACHE": str(tmp_path)})
    assert out["status"] == f"off: disabled by {fused_cpu.ENV_SWITCH}"
    assert not any("fused CPU kernels" in w for w in out["warnings"])
    assert not (tmp_path / "kernels").exists()


def test_falls_back_to_pytorch_without_a_compiler(tmp_path) -> None:
    out = _status_in_subprocess({"CC": str(tmp_path / "no-such-cc"), "NAS_CACHE": str(tmp_path)})
    assert out["status"].startswith("off: no C compiler"), out
    assert any("fused CPU kernels unavailable" in w for w in out["warnings"])


def test_falls_back_with_a_warning_when_the_build_fails(tmp_path) -> None:
    (tmp_path / "kernels").mkdir()
    mine = {"notes.txt": b"my notes\n", "nas.db": b"SQLite format 3\x00", "x.so.tmp.sha256": b"mine\n"}
    for name, content in mine.items():  # the user's own files in the folder the build writes to: none may go
        (tmp_path / "kernels" / name).write_bytes(content)
    out = _status_in_subprocess({"CC": "false", "NAS_CACHE": str(tmp_path)})  # a "compiler" that always fails
    assert out["status"].startswith("off: build or load failed"), out
    assert any("fused CPU kernels unavailable" in w for w in out["warnings"])
    # no partial library left behind (only the build's lock file, which stays: removing it would race a waiter)
    left = {p.name: p.read_bytes() for p in (tmp_path / "kernels").iterdir() if p.suffix != ".lock"}
    assert left == mine


def test_the_command_line_says_the_fallback_in_one_warning_line(tmp_path) -> None:
    """Python's own format printed the file, line and source line of the warning call."""
    from nas.arch import uniform

    (tmp_path / "arch.json").write_text(uniform(2, 16, 4, 256).to_json())
    (tmp_path / "corpus.txt").write_text("Attention heads grow with depth. " * 400)  # no build of the builtin data
    command = [sys.executable, "-m", "nas.cli", "train", "--config", str(tmp_path / "arch.json"), "--preset", "tiny",
               "--tokens", "128", "--data", str(tmp_path / "corpus.txt")]
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc"), "NAS_CACHE": str(tmp_path / "cache")}
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "fused CPU kernels" in line]
    assert line.startswith("warning: fused CPU kernels unavailable, using the slower PyTorch ops (no C compiler"), line
    assert "fused_cpu.py" not in result.stderr and "library()" not in result.stderr, result.stderr


@pytest.mark.slow
def test_concurrent_first_uses_build_the_library_once_and_share_it(tmp_path) -> None:
    """Three processes start on an empty cache at once (a fresh search's workers): one compiles, the others wait on
    its lock and load the same file; a later process loads it without building."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler: the kernels are not built here")
    calls = tmp_path / "compiler-calls"
    compiler = tmp_path / "logging-cc"
    # with PREBUILT set it copies that file to its -o target instead of compiling (a rebuild without its CPU cost)
    compiler.write_text(f'#!/bin/sh\necho "$$" >> {calls}\nif [ -n "$PREBUILT" ]; then\n'
                        '  while [ $# -gt 0 ]; do [ "$1" = -o ] && exec cp "$PREBUILT" "$2"; shift; done\nfi\n'
                        f'exec {shutil.which("cc")} "$@"\n')
    compiler.chmod(0o755)
    env = {**os.environ, "NAS_CACHE": str(tmp_path / "cache"), "CC": str(compiler)}
    code = "from nas.model import fused_cpu; print(fused_cpu.status())"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert all(out.startswith("on (") for out, _ in outputs), outputs
    assert len(calls.read_text().splitlines()) == 1, calls.read_text()  # one compile for the three
    built = list((tmp_path / "cache" / "kernels").glob("*.so"))
    assert len(built) == 1, built
    assert not list((tmp_path / "cache" / "kernels").glob("*.tmp")), "a temporary build file was left"
    mtime = built[0].stat().st_mtime_ns
    assert _status_in_subprocess({"NAS_CACHE": str(tmp_path / "cache"), "CC": str(compiler)})["status"].startswith(
        "on (")
    assert built[0].stat().st_mtime_ns == mtime and len(calls.read_text().splitlines()) == 1  # loaded, not rebuilt
    # a library cut short (a full disk, a copy interrupted) ended every later process with SIGBUS: it is built again
    whole = tmp_path / "whole.so"
    shutil.copy(built[0], whole)
    (built[0].parent / "notes.txt").write_text("my notes\n")  # the user's own: the rebuild leaves it
    with open(built[0], "r+b") as f:
        f.truncate(1000)
    again = _status_in_subprocess({"NAS_CACHE": str(tmp_path / "cache"), "CC": str(compiler), "PREBUILT": str(whole)})
    assert again["status"].startswith("on ("), again
    assert len(calls.read_text().splitlines()) == 2 and built[0].read_bytes() == whole.read_bytes()
    assert (built[0].parent / "notes.txt").read_text() == "my notes\n"
    assert not [p for p in built[0].parent.iterdir() if p.name.endswith(".tmp")], "a temporary file was left"
