"""Fused fp32 CPU kernels (``fused_cpu.c``): compiled on first use with the system C compiler, loaded with ctypes.

Why: on a 2-core CPU a training step's elementwise work (RoPE, RMSNorm, the SwiGLU gate, the
causal softmax) is bound by memory bandwidth and per-op overhead. PyTorch's eager ops make 3-6
passes over memory for each of these and its CPU build has no fused kernels for them;
``torch.compile`` fuses them but costs more time per model shape than a proxy trial lasts. These
kernels make one pass each (per-kernel and per-step timings: benchmarks/RESULTS.md, "Design measurements";
``benchmarks/`` figure 4 has the efficiency this gives). The causal attention itself, at head dims 8 to 32, is
one call forward and one backward (``causal_attention_forward``/``_backward``): there the batched matmuls it replaces
have an inner dimension of 8-32, which a GEMM library runs far below its peak.

How: ``cc -O3 -march=native -fopenmp -fno-math-errno -fno-trapping-math -shared`` builds
``fused_cpu.c`` (plain C99, no PyTorch headers; 5-11 CPU-seconds: the attention kernels are unrolled per head
dim) into ``$NAS_CACHE/kernels/fused_cpu-<key>.so``, keyed by the source, the flags, the compiler and
the CPU's feature flags, written atomically with its SHA-256 beside it (a library that no longer matches it, cut
short or overwritten, is built again: loading a truncated one ends the process with SIGBUS). Concurrent first uses
(a fresh search's workers) build it once: the first takes a lock file beside it, the others wait on it and load
what it built.
OpenMP resolves to the ``libgomp.so.1`` torch already loaded, so both share one thread pool;
each call passes ``torch.get_num_threads()``.

Falls back to the PyTorch paths (same results up to float rounding) when no compiler works,
on non-x86/ARM platforms the build rejects, or when ``NAS_FUSED_CPU=0``. ``status()`` says
which and why.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from nas.errors import UsageError

SOURCE = Path(__file__).with_name("fused_cpu.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-shared")
ENV_SWITCH = "NAS_FUSED_CPU"  # "0" disables the kernels (PyTorch ops instead)
BUILD_TIMEOUT_S = 120

_P, _I64, _INT, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
_SIGNATURES = {
    "swiglu_forward": [_P, _P, _P, _I64, _INT],
    "swiglu_backward": [_P, _P, _P, _P, _P, _I64, _INT],
    "rmsnorm_forward": [_P, _P, _P, _P, _I64, _I64, _F32, _INT],
    "rmsnorm_backward": [_P, _P, _P, _P, _P, _P, _P, _I64, _I64, _INT],
    "rope_qkv_forward": [_P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _F32, _INT],
    "rope_qkv_backward": [_P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _F32, _INT],
    "rope_qkv_grouped_forward": [_P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _F32, _INT],
    "rope_qkv_grouped_backward": [_P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _F32, _INT],
    "causal_softmax_": [_P, _I64, _I64, _I64, _INT],
    "causal_attention_forward": [_P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _INT],
    "causal_attention_backward": [_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _INT],
    "causal_attention_supports": [_I64],
    "attention_vectors_in_registers": [],
    "attention_workspace": [_I64, _I64],
}

_RETURNS = {"causal_attention_supports": ctypes.c_int, "attention_vectors_in_registers": ctypes.c_int,
            "attention_workspace": _I64}  # the rest return nothing

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_reason: str | None = None  # why the kernels are off; None until the first load attempt
_loaded = False
_enabled = True  # switched by ``enabled`` (A/B benchmarks and tests compare both paths in one process)


def _cpu_flags() -> str:
    """The CPU's feature flags (``-march=native`` depends on them), empty where /proc/cpuinfo is absent."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:  # not Linux: the compiler and machine name still key the cache
        return ""
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(("flags", "Features"))), "")


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc"))


def library_path(compiler: str) -> Path:
    """Where the built library for this source, compiler, flags and CPU lives in the cache."""
    from nas.data.cache import cache_root

    key = hashlib.sha256("\n".join([SOURCE.read_text(), compiler, " ".join(FLAGS), platform.machine(),
                                    _cpu_flags()]).encode()).hexdigest()[:16]
    return cache_root() / "kernels" / f"fused_cpu-{key}.so"


def _digest_path(library: Path) -> Path:
    return library.with_suffix(".sha256")


def _digest(path: Path | str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _intact(library: Path) -> bool:
    """The library is the file its build wrote: its SHA-256 matches the one written beside it at the build. Loading a
    truncated library (a full disk, a copy cut short) ends the process with SIGBUS, which no ``except`` can catch."""
    try:
        return _digest_path(library).read_text().strip() == _digest(library)
    except OSError:  # either file missing or unreadable: build it again
        return False


def _build(compiler: str, target: Path) -> None:
    """Compile into a private temporary file, write its digest beside the target, then rename: concurrent builders
    never see a partial file, and a reader that sees the new digest before the new file waits on the build lock (the
    folder exists: ``_build_lock`` made it)."""
    fd, tmp = tempfile.mkstemp(prefix=target.stem + ".", suffix=".so.tmp", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True,
                                timeout=BUILD_TIMEOUT_S)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
            raise RuntimeError(f"{compiler} failed: {last}")
        os.chmod(tmp, 0o755)
        from nas.data.cache import atomic_write

        digest = _digest(tmp)
        atomic_write(_digest_path(target), lambda f: f.write(digest + "\n"), mode="w")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):  # mkstemp's own name: nothing else can be there
            os.unlink(tmp)


@contextlib.contextmanager
def _build_lock(target: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``<target>.lock`` for the block (released by the kernel if the holder dies)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _load() -> None:
    global _library, _reason
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        _reason = f"disabled by {ENV_SWITCH}"
        return
    compiler = _compiler()
    if compiler is None:
        _reason = f"no C compiler ({os.environ.get('CC', 'cc')!r} not found; set CC)"
        _warn()
        return
    try:
        path = library_path(compiler)
        if not _intact(path):  # not built yet, or damaged since (it is built again)
            with _build_lock(path):
                if not _intact(path):  # another process may have built it while this one waited
                    _build(compiler, path)
        lib = ctypes.CDLL(str(path))
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, _RETURNS.get(name)
    except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError, UsageError) as exc:  # UsageError: no
        # writable cache folder; the PyTorch ops still work
        _reason = f"build or load failed: {exc}"
        _warn()
        return
    _library = lib


def _warn() -> None:
    warnings.warn(f"fused CPU kernels unavailable, using the slower PyTorch ops ({_reason}; {ENV_SWITCH}=0 "
                  "silences this)", RuntimeWarning, stacklevel=4)


def library() -> ctypes.CDLL | None:
    """The loaded kernels, building them on first use; None when they are unavailable (see ``status``)."""
    global _loaded
    if not _loaded:
        with _lock:
            if not _loaded:
                _load()
                _loaded = True  # only now: a thread that skips the lock must not see a half-done load
    return _library


def status() -> str:
    """One line for logs and benchmark headers: ``"on (<path>)"`` or ``"off: <reason>"``."""
    lib = library()
    return f"on ({lib._name})" if lib is not None else f"off: {_reason}"


def usable(*tensors: torch.Tensor) -> bool:
    """Whether these tensors can take the fused kernels: CPU, float32, no autocast, kernels built and enabled."""
    return (_enabled and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
            and not torch.is_autocast_enabled("cpu") and library() is not None)


@contextlib.contextmanager
def enabled(flag: bool) -> Iterator[None]:
    """Within the block, use the fused kernels (``True``, where usable) or the PyTorch ops (``False``)."""
    global _enabled
    previous, _enabled = _enabled, flag
    try:
        yield
    finally:
        _enabled = previous


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


# ----------------------------------------------------------------- wrappers (contiguous fp32 CPU tensors)
def swiglu_forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``; gate, up contiguous and of one shape."""
    out = torch.empty_like(gate)
    library().swiglu_forward(_ptr(gate), _ptr(up), _ptr(out), gate.numel(), torch.get_num_threads())
    return out


def swiglu_backward(d_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(d_gate, d_up) of ``silu(gate) * up`` given its gradient ``d_out``; all contiguous, one shape."""
    d_gate, d_up = torch.empty_like(gate), torch.empty_like(up)
    library().swiglu_backward(_ptr(d_out), _ptr(gate), _ptr(up), _ptr(d_gate), _ptr(d_up), gate.numel(),
                              torch.get_num_threads())
    return d_gate, d_up


def rmsnorm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd): ``y = x rstd weight`` over the last dim of contiguous ``x``; rstd has shape x.shape[:-1]."""
    D = x.shape[-1]
    y = torch.empty_like(x)
    rstd = x.new_empty(x.shape[:-1])
    library().rmsnorm_forward(_ptr(x), _ptr(weight), _ptr(y), _ptr(rstd), x.numel() // D, D, eps,
                              torch.get_num_threads())
    return y, rstd


def rmsnorm_backward(d_y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                     rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, d_weight) of ``rmsnorm_forward``; d_y, x contiguous."""
    D = x.shape[-1]
    threads = torch.get_num_threads()
    dx, d_weight = torch.empty_like(x), torch.empty_like(weight)
    partial = x.new_empty(threads, D)  # per-thread d_weight sums
    library().rmsnorm_backward(_ptr(d_y), _ptr(x), _ptr(weight), _ptr(rstd), _ptr(dx), _ptr(d_weight),
                               _ptr(partial), x.numel() // D, D, threads)
    return dx, d_weight


def rope_qkv_forward(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int,
                     q_scale: float = 1.0) -> torch.Tensor:
    """(3, B, H, T, Dh): q (times ``q_scale``) and k rotated, v copied, from the contiguous (B, T, 3 H Dh) qkv."""
    B, T, three_d = qkv.shape
    head_dim = three_d // (3 * n_heads)
    out = qkv.new_empty(3, B, n_heads, T, head_dim)
    library().rope_qkv_forward(_ptr(qkv), _ptr(cos), _ptr(sin), _ptr(out), B, T, n_heads, head_dim, cos.shape[-1],
                               q_scale, torch.get_num_threads())
    return out


def rope_qkv_backward(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, cos: torch.Tensor,
                      sin: torch.Tensor, q_scale: float = 1.0) -> torch.Tensor:
    """The (B, T, 3 H Dh) gradient of ``rope_qkv_forward`` from contiguous dq, dk, dv (B, H, T, Dh)."""
    B, H, T, Dh = dq.shape
    grad = dq.new_empty(B, T, 3 * H * Dh)
    library().rope_qkv_backward(_ptr(dq), _ptr(dk), _ptr(dv), _ptr(cos), _ptr(sin), _ptr(grad), B, T, H, Dh,
                                cos.shape[-1], q_scale, torch.get_num_threads())
    return grad


def rope_qkv_grouped_forward(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, n_kv: int,
                             q_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Grouped-query attention's ``rope_qkv_forward``: q (B, H, T, Dh) times ``q_scale`` and rotated, k rotated and v
    copied (B, KV, T, Dh) each, views of one buffer, from the contiguous (B, T, (H + 2 KV) Dh) qkv."""
    B, T, width = qkv.shape
    head_dim = width // (n_heads + 2 * n_kv)
    out = qkv.new_empty(B * T * width)
    library().rope_qkv_grouped_forward(_ptr(qkv), _ptr(cos), _ptr(sin), _ptr(out), B, T, n_heads, n_kv, head_dim,
                                       cos.shape[-1], q_scale, torch.get_num_threads())
    q, k, v = out.split([B * n_heads * T * head_dim, B * n_kv * T * head_dim, B * n_kv * T * head_dim])
    return (q.view(B, n_heads, T, head_dim), k.view(B, n_kv, T, head_dim), v.view(B, n_kv, T, head_dim))


def rope_qkv_grouped_backward(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, cos: torch.Tensor,
                              sin: torch.Tensor, q_scale: float = 1.0) -> torch.Tensor:
    """The (B, T, (H + 2 KV) Dh) gradient of ``rope_qkv_grouped_forward`` from contiguous dq (B, H, T, Dh), dk, dv
    (B, KV, T, Dh)."""
    B, H, T, Dh = dq.shape
    KV = dk.shape[1]
    grad = dq.new_empty(B, T, (H + 2 * KV) * Dh)
    library().rope_qkv_grouped_backward(_ptr(dq), _ptr(dk), _ptr(dv), _ptr(cos), _ptr(sin), _ptr(grad), B, T, H, KV,
                                        Dh, cos.shape[-1], q_scale, torch.get_num_threads())
    return grad


def causal_softmax_(scores: torch.Tensor, r0: int) -> torch.Tensor:
    """In place: contiguous (N, Tb, r0 + Tb) scores of queries ``r0 ..`` -> causal softmax probabilities (0 above)."""
    N, Tb, width = scores.shape
    assert width == r0 + Tb, (scores.shape, r0)
    library().causal_softmax_(_ptr(scores), N, Tb, r0, torch.get_num_threads())
    return scores


def causal_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             keep_stats: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(output (B, T, H, Dh), if ``keep_stats`` each query row's softmax statistics (B, H, 2, T): its max
    ``m_i = max_{j <= i} S_ij``, then ``1 / l_i``, ``l_i = sum_{j <= i} exp(S_ij - m_i)``: what the backward
    recomputes ``P_ij = exp(S_ij - m_i) / l_i`` from) of causal attention ``softmax(q k^T + mask) v`` from
    contiguous q (B, H, T, Dh) (already times 1/sqrt(Dh)) and k, v (B, KV, T, Dh), KV dividing H (query head h reads
    key/value head h // (H / KV))."""
    B, H, T, Dh = q.shape
    KV = k.shape[1]
    if not library().causal_attention_supports(Dh) or H % KV or k.shape != v.shape or k.shape != (B, KV, T, Dh):
        raise ValueError(f"no fused attention for q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    out = q.new_empty(B, T, H, Dh)
    stats = q.new_empty(B, H, 2, T) if keep_stats else None
    threads = torch.get_num_threads()
    workspace = _attention_workspace(q, threads)  # held here: the call only sees its address
    library().causal_attention_forward(_ptr(q), _ptr(k), _ptr(v), _ptr(out), _ptr(stats) if keep_stats else None,
                                       _ptr(workspace), B, H, KV, T, Dh, threads)
    return out, stats


def _attention_workspace(q: torch.Tensor, threads: int) -> torch.Tensor:
    """Each thread's scratch for the attention kernels (the forward's transposed queries and block of scores; the
    backward's transposed queries and output gradients, a block of P and dS, and one head's P and dS triangles)."""
    T, Dh = q.shape[-2:]
    return q.new_empty(threads * library().attention_workspace(T, Dh))


def causal_attention_backward(d_out: torch.Tensor, out: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                              v: torch.Tensor, stats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv), shaped as q, k, v, of ``causal_attention_forward`` given the contiguous (B, T, H, Dh) ``d_out``
    and the forward's own ``out`` and ``stats`` (P is recomputed from q, k and them)."""
    B, H, T, Dh = q.shape
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    threads = torch.get_num_threads()
    workspace = _attention_workspace(q, threads)  # held here: the call only sees its address
    library().causal_attention_backward(_ptr(d_out), _ptr(out), _ptr(q), _ptr(k), _ptr(v), _ptr(stats), _ptr(dq),
                                        _ptr(dk), _ptr(dv), _ptr(workspace), B, H, k.shape[1], T, Dh, threads)
    return dq, dk, dv
