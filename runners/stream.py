"""The training stream of a full-scale run: the proxy's seeded windows, spread over the whole training split.

Step ``s`` of a run with seed ``q`` takes the global batch of ``B`` windows of ``T + 1`` tokens
that the proxy's ``nas.data.BatchSampler(tokens, B, T, q)`` draws at its step ``s``: starts
uniform over the whole split (FineWeb ``.bin`` shards viewed end to end without copying, or any
other token source)::

    window j = tokens[start_j : start_j + T + 1],   start_j ~ U[0, len - T)   j = 0 .. B-1

So a full run sees the same batches as a proxy trial of the same seed and batch shape, every
part of a corpus sorted by file is read from the first step on (an in-order stream read the
first files only, and two seeds of one shape then ended 0.3 nats apart on different files), and
two shapes on one seed see the same data. Rank ``r`` of ``W`` reads only its own windows, ``j``
in ``[r B / W, (r + 1) B / W)``, split into micro-batches for gradient accumulation; so the
global batch of a step is the same whatever the number of processes. ``position`` (in the
checkpoint) is the number of global batches drawn: resuming replays that many draws of the
generator (a few milliseconds for a million steps' worth of window starts).
"""

from __future__ import annotations

from typing import Any

import torch

from nas.data.loading import BatchSampler
from nas.errors import UsageError

ORDER = "spread windows, the proxy's seeded BatchSampler"  # part of a run's identity: older in-order runs are refused


def check_batch_split(batch_size: int, world: int, micro_batch: int | None) -> int:
    """The sequences of one forward (``micro_batch``, or a process's whole share of the global batch when 0/None);
    ``UsageError`` unless the global batch splits evenly over the processes and each share into micro-batches."""
    if batch_size % world:
        raise UsageError(f"the global batch of {batch_size} sequences does not split over {world} processes: "
                         f"give --nproc a divisor of {batch_size}")
    share = batch_size // world
    micro = share if not micro_batch else micro_batch
    if micro < 1 or share % micro:
        each = "the one process takes" if world == 1 else f"each of the {world} processes takes"
        raise UsageError(f"--micro-batch {micro} is invalid: it must divide the {share} sequences {each} per step")
    return micro


class TokenStream:
    """Global batches of spread windows; ``rank``'s micro-batches of each (see the module docstring)."""

    def __init__(self, tokens: Any, batch_size: int, seq_len: int, rank: int = 0, world: int = 1,
                 micro_batch: int | None = None, seed: int = 0, position: int = 0) -> None:
        micro = check_batch_split(batch_size, world, micro_batch)
        need = batch_size * seq_len + 1
        if len(tokens) < need:
            raise UsageError(f"the training split holds {len(tokens)} tokens; one global batch of "
                             f"{batch_size}x{seq_len} needs {need}")
        self.tokens, self.batch_size, self.seq_len, self.seed = tokens, batch_size, seq_len, seed
        self.rank, self.world, self.micro = rank, world, micro
        self.position = position

    @property
    def position(self) -> int:
        """Global batches drawn so far (the whole state of the stream)."""
        return self._position

    @position.setter
    def position(self, batches: int) -> None:
        self._sampler = BatchSampler(self.tokens, self.batch_size, self.seq_len, self.seed)
        for _ in range(batches):  # replay the draws: the generator is then where the run left it
            self._sampler.next_starts()
        self._position = batches

    @property
    def accumulation(self) -> int:
        """Micro-batches per step on this rank."""
        return self.batch_size // self.world // self.micro

    def step(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's micro-batches ``x, y`` (int64 (micro, T) each) of the next global batch; the stream advances."""
        share = self.batch_size // self.world
        starts = self._sampler.next_starts()[self.rank * share:(self.rank + 1) * share]
        self._position += 1
        return [self._sampler.windows(starts[i:i + self.micro]) for i in range(0, share, self.micro)]
