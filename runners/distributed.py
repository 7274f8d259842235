"""The processes of a full-scale run: one, or ``torchrun --nproc-per-node N`` of them (DDP: NCCL on CUDA, gloo on CPU).

``torchrun`` sets ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` (and the rendezvous address) in every
process it starts; ``setup`` reads them and joins the process group, each CUDA process on its own
device (``cuda:LOCAL_RANK``). Without them the run is one process and nothing is initialised.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch
import torch.distributed as dist

from runners.device import resolve_device
from runners.orphans import die_with_parent


@dataclass(frozen=True)
class Processes:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def main(self) -> bool:
        """Rank 0 writes checkpoints, logs, results and the progress line."""
        return self.rank == 0


def setup(device_name: str) -> Processes:
    """Join the process group when started by torchrun; the device this process trains on."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name)
    if world > 1:
        die_with_parent()
        if device.type == "cuda":
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Processes(rank, world, local_rank, device)


PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "NCCL communicator was aborted",
             "remote process exited")


def lost_a_peer(error: BaseException) -> bool:
    """Whether ``error`` is a collective that failed because another process of the run is gone (killed, out of
    memory, stopped): gloo's "Connection reset/closed by peer" and NCCL's aborted communicator, raised as
    ``torch.distributed.DistBackendError`` or as a plain ``RuntimeError``; by their words only, so that a backend's
    out-of-memory error or timeout is not read as a lost peer."""
    return any(phrase in str(error) for phrase in PEER_LOST)


def peer_lost_text(error: BaseException) -> str:
    """What ``error`` says of the lost peer, short: gloo's "Read error [127.0.0.1]:7603: Connection reset by peer"
    without its source location and advice; else its first line."""
    text = str(error).strip()
    found = re.search(r"(?:^\[[^\]]*\]\s*)?(.*?(?:" + "|".join(map(re.escape, PEER_LOST)) + "))", text)
    if found:
        return found.group(1).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


def teardown(processes: Processes) -> None:
    if processes.world > 1 and dist.is_initialized():
        dist.destroy_process_group()


def all_sum(value: torch.Tensor, processes: Processes) -> torch.Tensor:
    """``value`` summed over every process (itself with one process)."""
    if processes.world > 1:
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def barrier(processes: Processes) -> None:
    if processes.world > 1:
        dist.barrier()
