"""Where each local worker of ``nas search --workers N`` trains: its device, its environment, its threads.

A pure function of what the machine has (``plan_placements``), applied first thing in each
worker process (``apply_placement``), before anything there initialises CUDA:

- ``--device cuda`` (or ``auto`` on a machine with GPUs) and ``N`` workers: worker ``i`` trains on
  GPU ``i mod n_gpus`` and sees only that one (``CUDA_VISIBLE_DEVICES`` set to it, so inside the
  worker it is ``cuda:0``; an inherited ``CUDA_VISIBLE_DEVICES`` list is respected: worker ``i``
  gets its ``i mod n``-th entry). Threads: ``GPU_WORKER_THREADS`` each (a GPU worker's CPU work
  is the data loader and the Python loop; ``cores / N`` threads would only contend);
- ``--device cuda:K``: every worker on device ``K``, as given;
- MIG: an inherited ``CUDA_VISIBLE_DEVICES`` of ``MIG-...`` UUIDs is one device per UUID. A CUDA
  process enumerates one MIG instance only (NVIDIA's MIG user guide, "CUDA device enumeration"),
  so torch counts 1 whatever the list holds; ``gpu_count`` counts the UUIDs, and each worker sees
  its own (``--workers auto``: one per UUID; ``--workers 7`` on 7 slices: one each, not all on the first);
- CPU: ``cores / N`` threads each (``--threads`` overrides it either way).

The runners set the threads on every device (``runners.device.configure_threads``) and cap
Inductor's compile workers at them, so 8 GPU workers on one node use 8 x 4 cores, not 8 x all.

``--workers auto`` is one worker per visible GPU on a GPU machine, and on a CPU one worker per
core with one thread each: on 2 cores two 1-thread workers trained 1.20x the trials per minute
of one 2-thread worker at the default proxy (``benchmarks/worker_layout.py``). It is the default.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path

from nas.errors import UsageError

GPU_WORKER_THREADS = 4  # torch intra-op threads of a worker that trains on a GPU
AUTO = "auto"


@dataclass(frozen=True)
class Placement:
    """One worker's place: the device it trains on (as it names it) and the machine's device it is."""

    worker: int
    device: str  # what the worker passes to torch: "cpu", "cuda" (its only visible GPU) or "cuda:K"
    label: str  # the machine's device, for progress lines: "cpu", "cuda:3"
    threads: int
    env: dict[str, str] = field(default_factory=dict)  # set in the worker before CUDA is initialised


def mig_devices(visible: str | None) -> list[str]:
    """The MIG instances an inherited ``CUDA_VISIBLE_DEVICES`` lists (``MIG-<uuid>`` or the older
    ``MIG-GPU-<uuid>/<gi>/<ci>``), in order; empty when it lists whole GPUs or nothing."""
    ids = [v.strip() for v in (visible or "").split(",") if v.strip()]
    return ids if ids and all(v.startswith("MIG-") for v in ids) else []


def usable_gpus(torch_count: int, visible: str | None) -> int:
    """Devices the workers may use, from torch's count in this process and the inherited ``CUDA_VISIBLE_DEVICES``:
    torch's count, or, when the list holds MIG instances, their number (this process sees only the first of them;
    each worker will see its own)."""
    return (len(mig_devices(visible)) or torch_count) if torch_count else 0


def gpu_count() -> int:
    """GPUs (or MIG instances) this process's workers may use (``usable_gpus`` of torch's count); 0 without importing
    torch where the installed build has no GPU backend (``torch_builds_for_gpus``)."""
    if not torch_builds_for_gpus():
        return 0
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return usable_gpus(count, os.environ.get("CUDA_VISIBLE_DEVICES"))


def torch_builds_for_gpus(version_file: Path | None = None) -> bool:
    """Whether the installed torch was built for CUDA or ROCm, read from its ``torch/version.py`` (``cuda = '12.8'``
    or ``None``, ``hip`` likewise) without importing it: a CPU build's count is 0, and a search's parent, which trains
    nothing when its workers do, is spared torch's import (1.2-1.7 CPU-s and ~150 MB on a 2-core machine). True
    when the file cannot be read or says anything else: torch itself is asked then."""
    if version_file is None:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.origin:
            return True
        version_file = Path(spec.origin).parent / "version.py"
    try:
        tree = ast.parse(version_file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return True
    built: dict[str, object] = {}
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id in ("cuda", "hip") and node.value is not None:
            try:
                built[target.id] = ast.literal_eval(node.value)
            except ValueError:
                return True
    return set(built) != {"cuda", "hip"} or any(value is not None for value in built.values())


def cpu_cores() -> int:
    from runners import cores

    return cores.available_cores()


def resolve_workers(workers: int | str, device: str, n_gpus: int, cores: int) -> int:
    """``--workers``: a count, or ``auto`` (one per GPU on a GPU device, else one per core)."""
    if workers != AUTO:
        return int(workers)
    uses_gpu = device.startswith("cuda") or (device == "auto" and n_gpus > 0)
    if uses_gpu and device.startswith("cuda:"):
        return 1  # pinned to one device: one worker (more would share it; ask for them by number)
    return max(1, n_gpus) if uses_gpu else max(1, cores)


def plan_placements(workers: int, device: str, n_gpus: int, cores: int, threads: int = 0,
                    visible: str | None = None) -> list[Placement]:
    """Every worker's ``Placement`` (see the module docstring). ``device`` is the resolved training device name
    (``auto``, ``cpu``, ``cuda``, ``cuda:K``, ``mps``); ``visible`` the inherited ``CUDA_VISIBLE_DEVICES``."""
    if workers < 1:
        raise UsageError(f"--workers {workers} is invalid: give at least 1 or auto")
    per_cpu_worker = threads or max(1, cores // workers)
    per_gpu_worker = threads or min(GPU_WORKER_THREADS, max(1, cores // workers))
    if device.startswith("cuda:"):
        index = int(device.split(":", 1)[1])
        if index >= n_gpus:
            raise UsageError(f"--device {device} does not exist: this machine has {n_gpus} visible GPU(s)"
                             + (f" (cuda:0..cuda:{n_gpus - 1})" if n_gpus else "; use --device cpu"))
        return [Placement(w, device, device, per_gpu_worker) for w in range(workers)]
    if device == "cuda" and n_gpus == 0:
        raise UsageError("--device cuda: this machine has no visible GPU; use --device cpu or auto")
    if device == "cuda" or (device == "auto" and n_gpus > 0):
        ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else [str(i) for i in range(n_gpus)]
        # a list of MIG instances is dealt out whole: torch's count for it is 1 (one instance per process)
        ids = mig_devices(visible) or ids[:n_gpus] or [str(i) for i in range(n_gpus)]
        if workers == 1:  # one worker keeps the whole machine's view, as a plain `nas search --device cuda`
            return [Placement(0, "cuda", f"cuda:{ids[0]}", per_gpu_worker)]
        return [Placement(w, "cuda", ids[w % len(ids)] if ids[w % len(ids)].startswith("MIG-")
                          else f"cuda:{ids[w % len(ids)]}", per_gpu_worker,
                          {"CUDA_VISIBLE_DEVICES": ids[w % len(ids)]}) for w in range(workers)]
    label = "cpu" if device in ("auto", "cpu") else device
    return [Placement(w, device, label, per_cpu_worker) for w in range(workers)]


def database_connections(nodes: int, workers_per_node: int, readers: int = 0) -> int:
    """Connections a multi-node search holds at once on a server database (PostgreSQL's ``max_connections``).

    Each worker process holds two: Optuna's ``RDBStorage`` gives every thread its own session, and a worker's
    main thread (asking, telling, reading the study) and its heartbeat thread (``nas.study.heartbeat``) both
    use the storage. The parent of ``--workers N`` holds one more (it opened the study and reads it for the
    progress line); each reader (``nas report``, ``nas best``, optuna-dashboard) one.
    """
    per_node = 2 * workers_per_node + (1 if workers_per_node > 1 else 0)
    return nodes * per_node + readers


def apply_placement(placement: Placement) -> None:
    """Set the worker's environment (before CUDA is initialised in this process: call it first)."""
    os.environ.update(placement.env)
