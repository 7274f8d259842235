"""The training stream of a full-scale run: contiguous windows read in order from memory-mapped tokens.

llm.c / modded-nanogpt style: the training split (FineWeb ``.bin`` shards, viewed end to end
without copying, or any other token source) is read as one long sequence. Step ``s`` of the run
takes the global batch of ``B`` windows of ``T + 1`` tokens starting at ``position``::

    window j = tokens[position + j T : position + j T + T + 1]        j = 0 .. B-1

and then ``position += B T`` (wrapping at the end of the split). Rank ``r`` of ``W`` reads only
its own windows, ``j`` in ``[r B / W, (r + 1) B / W)``, split into micro-batches for gradient
accumulation; so the global batch of a step is the same whatever the number of processes,
and ``position`` (in the checkpoint) is the whole state of the stream. The start is
``seed * START_STRIDE`` modulo the split's length: each seed reads the data in its own order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from nas.errors import UsageError

START_STRIDE = 1_000_003  # tokens between the starting points of consecutive seeds (a prime: no short cycle)


class TokenStream:
    """Global batches in order; ``rank``'s micro-batches of each (see the module docstring)."""

    def __init__(self, tokens: Any, batch_size: int, seq_len: int, rank: int = 0, world: int = 1,
                 micro_batch: int | None = None, position: int = 0) -> None:
        if batch_size % world:
            raise UsageError(f"the global batch of {batch_size} sequences does not split over {world} processes: "
                             f"give --nproc a divisor of {batch_size}")
        share = batch_size // world
        micro = share if not micro_batch else micro_batch
        if micro < 1 or share % micro:
            raise UsageError(f"--micro-batch {micro} is invalid: it must divide the {share} sequences each of the "
                             f"{world} processes takes per step")
        need = batch_size * seq_len + 1
        if len(tokens) < need:
            raise UsageError(f"the training split holds {len(tokens)} tokens; one global batch of "
                             f"{batch_size}x{seq_len} needs {need}")
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.rank, self.world, self.micro = rank, world, micro
        self.position = position % (len(tokens) - 1)

    @staticmethod
    def start(tokens: Any, seed: int) -> int:
        return (seed * START_STRIDE) % (len(tokens) - 1)

    @property
    def accumulation(self) -> int:
        """Micro-batches per step on this rank."""
        return self.batch_size // self.world // self.micro

    def _window(self, start: int) -> np.ndarray:
        n, end = len(self.tokens), start + self.seq_len + 1
        if end <= n:
            return np.asarray(self.tokens[start:end])
        return np.concatenate([np.asarray(self.tokens[start:n]), np.asarray(self.tokens[0:end - n])])  # wrap

    def step(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's micro-batches ``x, y`` (int64 (micro, T) each) of the next global batch; the stream advances."""
        share = self.batch_size // self.world
        length = len(self.tokens) - 1
        mine = range(self.rank * share, (self.rank + 1) * share)
        starts = [(self.position + j * self.seq_len) % length for j in mine]
        self.position = (self.position + self.batch_size * self.seq_len) % length
        batches = []
        for i in range(0, share, self.micro):
            buf = torch.from_numpy(np.stack([self._window(s) for s in starts[i:i + self.micro]]).astype(np.int64))
            batches.append((buf[:, :-1], buf[:, 1:]))  # (micro, T) each; y[b, t] = x[b, t + 1]
        return batches
